//! `ckf replay` and `ckf simulate`: a workload (a Mooncake trace or the synthetic one) replayed
//! live through producers and an indexer, or offline against the oracle, and the report.

use std::path::Path;
use std::time::Duration;

use anyhow::{Result, anyhow};
use ckf_svc_kit::access::authed;
use serde_json::json;

use crate::bench::args::{
    DEFAULT_SYNTHETIC_REQUESTS, FleetArgs, ReplayArgs, SimulateArgs, TimeoutArgs,
};
use crate::bench::fleet::FleetShape;
use crate::bench::live::{self, DcTarget, LiveConfig, Workload};
use crate::bench::report::ServingComparison;
use crate::bench::synth::synthetic_workload;
use crate::bench::trace::read_trace;
use crate::connect::{client_tls, connect_with, query_channel, token_of};
use crate::hashing::block_hashes;

/// Loads a trace (validated whole before anything is sent) or the synthetic workload, then
/// applies the request limit.
///
/// # Errors
/// The trace's [`TraceError`](crate::bench::trace::TraceError).
pub fn load_workload(trace: Option<&Path>, limit: Option<usize>, seed: u64) -> Result<Workload> {
    if limit == Some(0) {
        anyhow::bail!("--limit 0: replay at least one request");
    }
    match trace {
        Some(path) => {
            let mut requests = read_trace(path)?;
            if let Some(limit) = limit {
                requests.truncate(limit);
            }
            Ok(Workload {
                source: path.display().to_string(),
                requests,
            })
        }
        None => Ok(Workload {
            source: "synthetic".into(),
            requests: synthetic_workload(limit.unwrap_or(DEFAULT_SYNTHETIC_REQUESTS), seed),
        }),
    }
}

/// The live-replay configuration from flags.
///
/// # Errors
/// Serving-model flags that do not fit the fleet.
pub fn live_config(
    fleet: &FleetArgs,
    timeouts: &TimeoutArgs,
    shape: FleetShape,
    workload: &Workload,
) -> Result<LiveConfig> {
    Ok(LiveConfig {
        shape,
        policy: fleet.policy,
        seed: fleet.seed,
        serving: fleet
            .serving
            .model(shape.dcs, &workload.requests)
            .map_err(|e| anyhow!(e))?,
        progress: live::want_progress(fleet.json),
        ready_timeout: Duration::from_secs(timeouts.ready_timeout_s),
        probe_timeout: Duration::from_millis(timeouts.probe_timeout_ms),
        settle_timeout: Duration::from_secs(timeouts.settle_timeout_s),
        engines: None,
    })
}

/// `ckf replay`.
///
/// # Errors
/// A bad trace, an unreachable service, or a replay failure.
pub async fn replay(args: ReplayArgs) -> Result<()> {
    // Against external services there are no simulated engines to scrape.
    live::check_policy(args.fleet.policy, false)?;
    let workload = load_workload(Some(&args.trace), args.fleet.limit, args.fleet.seed)?;
    let tls = client_tls(&args.tls)?;
    // The TLS flags are for the https:// URLs: producers' Ingest is often plaintext on the
    // pool's own network while the indexer is reached over TLS.
    let urls = std::iter::once(&args.indexer).chain(args.producers.iter().map(|(_, u)| u));
    let any_https = urls.clone().any(|u| ckf_svc_kit::tls::is_https(u));
    if tls.is_some() && !any_https {
        anyhow::bail!(
            "--ca/--cert/--key are given but no URL is https://: use https:// URLs for the TLS endpoints"
        );
    }
    let tls_for = |url: &str| tls.as_ref().filter(|_| ckf_svc_kit::tls::is_https(url));
    let query_token = token_of(args.token_file.as_deref())?;
    let ingest_token = token_of(args.ingest_token_file.as_deref()).map_err(|e| {
        anyhow!(
            "{}",
            e.to_string().replace("--token-file", "--ingest-token-file")
        )
    })?;
    let indexer = query_channel(
        connect_with(&args.indexer, tls_for(&args.indexer)).await?,
        query_token,
        args.domain.as_deref(),
    )?;
    let mut targets = Vec::new();
    for (dc, url) in &args.producers {
        let metrics = args
            .producer_metrics
            .iter()
            .find(|(m, _)| m == dc)
            .map(|(_, addr)| addr.clone());
        targets.push(DcTarget {
            dc: dc.clone(),
            producer: authed(connect_with(url, tls_for(url)).await?, ingest_token.clone()),
            metrics,
        });
    }
    if let Some((dc, _)) = args
        .producer_metrics
        .iter()
        .find(|(m, _)| !args.producers.iter().any(|(p, _)| p == m))
    {
        anyhow::bail!("--producer-metrics names DC {dc}, which has no --producer");
    }
    let shape = args.fleet.shape(targets.len());
    let config = live_config(&args.fleet, &args.timeouts, shape, &workload)?;
    let report = live::replay(&workload, indexer, targets, &config, &mut live::Feed::Grpc).await?;
    print_report(&report, args.fleet.json)
}

/// Prints a report as text or JSON.
///
/// # Errors
/// Standard output closed or failing ([`crate::out`](mod@crate::out)).
pub fn print_report(report: &crate::bench::report::Report, json: bool) -> Result<()> {
    if json {
        crate::outln!("{}", report.to_json())?;
    } else {
        crate::out!("{report}")?;
    }
    Ok(())
}

/// `ckf simulate`.
///
/// # Errors
/// A bad trace, fleet shape or serving model.
pub fn simulate_cmd(args: SimulateArgs) -> Result<()> {
    let workload = load_workload(args.trace.as_deref(), args.fleet.limit, args.fleet.seed)?;
    let shape = args.fleet.shape(args.dcs);
    shape.validate().map_err(|e| anyhow!(e))?;
    let model = args
        .fleet
        .serving
        .model(args.dcs, &workload.requests)
        .map_err(|e| anyhow!(e))?;
    let hashes: Vec<Vec<u64>> = workload
        .requests
        .iter()
        .map(|r| block_hashes(&r.hash_ids))
        .collect();
    let serving =
        ServingComparison::run(&workload.requests, &hashes, shape, &model, args.fleet.seed);
    if args.fleet.json {
        let out = json!({ "workload": workload.source, "requests": hashes.len(), "fleet": shape, "serving": serving });
        crate::outln!("{}", serde_json::to_string_pretty(&out)?)?;
    } else {
        let mut out = format!(
            "{} ({} requests); {} DCs x {} workers x {} ranks, {} blocks per rank\n",
            workload.source,
            hashes.len(),
            shape.dcs,
            shape.workers_per_dc,
            shape.ranks_per_worker,
            shape.capacity_blocks
        );
        serving.write_text(&mut out)?;
        crate::out!("{out}")?;
    }
    Ok(())
}
