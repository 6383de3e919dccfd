//! The live replay: the simulated fleet driving real producers and a real indexer over gRPC.
//!
//! Per request, in trace order: query the indexer (`FindMatches`, or `Route` for expected-ttft),
//! judge the answer against the oracle, route by the policy, serve on the fleet and on the
//! serving model's pools ([`engines::EngineBoard`]), send the rank's KV events to its DC's
//! producer (`PublishBatch`) and, now and then, start a visibility probe. Expected-ttft needs the
//! load path ([`LiveConfig::engines`]): its requests are sent on the workload's clock, so the
//! load the producers scrape from the simulated engines is the pools' load at that moment. After the last request: a final
//! drain (a sentinel store per DC, waited for until visible), a re-query of every distinct request
//! with nothing in flight, producer statistics, and offline baselines for the other policies.
//!
//! Preconditions: the replay is the only writer for the fleet's members (`worker_id` 0..W, plus
//! the probe member) on every producer; it clears them before starting.

use std::collections::{HashMap, HashSet};
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use ckf_proto::v1::{self, GetStatsRequest, kv_event::Kind, query_client::QueryClient};
use ckf_svc_kit::access::AuthedChannel;
use indicatif::{ProgressBar, ProgressStyle};
use prost::Message;

use crate::bench::accuracy::Accuracy;
use crate::bench::events::{Sources, event_blocks, serve_events};
use crate::bench::fleet::{Fleet, FleetShape};
use crate::bench::policy::{Policy, Router, Signals};
use crate::bench::probe::{Probes, wait_visible};
use crate::bench::report::{
    Cost, DcCost, FinalCheck, LiveServing, Report, ServingComparison, Throughput, WorkloadInfo,
};
use crate::bench::sim::{HitRate, ModelClock, ServingModel};
use crate::bench::stats::Summary;
use crate::bench::trace::Request;
use crate::hashing::block_hashes;

mod dcs;
mod drain;
pub mod engines;
mod indexer;

use dcs::{Dc, publish, unix_seconds};
pub use dcs::{DcTarget, Feed, PROBE_WORKER, ZmqFeed};

use drain::{Sentinel, clear_members, zmq_settle};
use engines::EngineBoard;
use indexer::{ask, ask_route, map_lanes, reported_depths, wait_load_known, wait_ready};

/// A workload to replay.
#[derive(Debug, Clone)]
pub struct Workload {
    /// `"synthetic"` or the trace path.
    pub source: String,
    /// The requests, in replay order.
    pub requests: Vec<Request>,
}

/// How to run a live replay.
#[derive(Debug, Clone)]
pub struct LiveConfig {
    /// Fleet shape; `dcs` must equal the number of producers.
    pub shape: FleetShape,
    /// Routing policy of the live run.
    pub policy: Policy,
    /// Seed of the random policy.
    pub seed: u64,
    /// The serving model of the offline policy comparison.
    pub serving: ServingModel,
    /// Show a progress bar (on stderr).
    pub progress: bool,
    /// How long to wait for every lane to be ready before starting.
    pub ready_timeout: Duration,
    /// How long a visibility probe polls before giving up.
    pub probe_timeout: Duration,
    /// How long the final drain waits for each DC.
    pub settle_timeout: Duration,
    /// The simulated engines whose load the producers scrape (`ckf demo` with expected-ttft):
    /// the live run then routes by the indexer's `Route` on the workload's clock.
    pub engines: Option<LiveEngines>,
}

/// The live run's simulated engines, on the producers' load path.
#[derive(Debug, Clone)]
pub struct LiveEngines {
    /// Their pools and clock (the live run serves on them; their endpoints show them).
    pub board: Arc<EngineBoard>,
    /// The indexer's tokens per workload token: its block size / the workload's 512-token
    /// blocks (`Route`'s cached tokens are depth x its block size), so a request's prompt is
    /// sent to `Route` in the indexer's unit, as the producers' capacities and
    /// `route.queued_request_tokens` are given.
    pub token_scale: f64,
}

/// Whether to draw a progress bar: not under `--json`, and only when stdout is a terminal.
pub fn want_progress(json: bool) -> bool {
    !json && std::io::stdout().is_terminal()
}

/// Replays `workload` through the producers and the indexer and builds the report.
///
/// # Errors
/// Connection or RPC failures, a DC missing from the indexer's manifest, lanes not ready within
/// `ready_timeout`, or a producer rejecting an event (a bug: every event the replay sends is
/// well-formed).
pub async fn replay(
    workload: &Workload,
    // With the Query bearer token, if any.
    indexer: AuthedChannel,
    targets: Vec<DcTarget>,
    config: &LiveConfig,
    feed: &mut Feed,
) -> Result<Report> {
    let shape = config.shape;
    shape.validate().map_err(|e| anyhow!(e))?;
    config.serving.validate(shape.dcs).map_err(|e| anyhow!(e))?;
    check_policy(config.policy, config.engines.is_some())?;
    if targets.len() != shape.dcs {
        bail!(
            "fleet has {} DCs but {} producers were given",
            shape.dcs,
            targets.len()
        );
    }
    let mut query = QueryClient::new(indexer);
    let mut dcs = map_lanes(&mut query, targets).await?;
    let lane_to_dc: HashMap<u32, usize> =
        dcs.iter().enumerate().map(|(i, d)| (d.lane, i)).collect();
    wait_ready(&mut query, &dcs, config.ready_timeout).await?;
    if config.policy == Policy::ExpectedTtft {
        // A producer's first report comes one load interval after it attaches.
        let interval = Duration::from_secs_f64(config.serving.load_interval_ms / 1e3);
        wait_load_known(&mut query, &dcs, config.ready_timeout + interval).await?;
    }

    // Per request: the block hashes the oracle and fleet work on and, for the ZMQ feed, the
    // tokens the indexer is asked with (whose canonical hashes those are).
    let mut tokens: Vec<Vec<u32>> = Vec::new();
    let hashes: Vec<Vec<u64>> = match feed {
        Feed::Grpc => workload
            .requests
            .iter()
            .map(|r| block_hashes(&r.hash_ids))
            .collect(),
        Feed::Zmq(z) => {
            check_publishers(z, shape)?;
            let mut hashes = Vec::with_capacity(workload.requests.len());
            for r in &workload.requests {
                let request = z.tokens.request(&r.hash_ids)?;
                hashes.push(request.canonical);
                tokens.push(request.tokens);
            }
            hashes
        }
    };
    let run = format!("ckf-replay-{:016x}", rand::random::<u64>());
    let mut sources = Sources::new(run.clone());
    let probes = Arc::new(Probes::new(shape.dcs));
    let mut sentinel = Sentinel {
        run_hash: crate::hashing::chain(0x5e17_13e1, rand::random()),
        next: 0,
    };
    match feed {
        Feed::Grpc => {
            clear_members(&mut dcs, &mut sources, shape).await?;
            // Start from a drained state: whatever an earlier run left must be gone.
            sentinel
                .settle(&mut dcs, &mut query, &mut sources, config.settle_timeout)
                .await?;
        }
        // Every publisher's subscription is live (a PUB socket drops what it sends before).
        Feed::Zmq(z) => {
            zmq_settle(
                z,
                &dcs,
                &mut query,
                shape.ranks_per_worker,
                config.settle_timeout,
            )
            .await?
        }
    }

    let relay_before = relay_bytes(&dcs).await;
    // The live run's choices are served on the serving model: on the simulated engines the
    // producers scrape when there are any, else on private pools.
    let routes = config.policy == Policy::ExpectedTtft;
    let board = config.engines.as_ref().map_or_else(
        || EngineBoard::new(shape, &config.serving, "ckf"),
        |e| e.board.clone(),
    );
    let token_scale = config.engines.as_ref().map_or(1.0, |e| e.token_scale);
    let rtt_ms: HashMap<String, f64> = dcs
        .iter()
        .zip(&config.serving.dcs)
        .map(|(dc, serving)| (dc.name.clone(), serving.rtt_ms))
        .collect();
    let mut clock = ModelClock::new(config.serving.speed);
    if let Some(first) = workload.requests.first() {
        board.start(clock.time_of(first));
    }
    let late_after = config.serving.load_interval_ms / 1e3;
    let (mut route_answers, mut load_known, mut late) = (0u64, 0u64, 0u64);
    let mut fleet = Fleet::new(shape);
    let mut router = Router::new(config.policy, config.seed);
    let mut accuracy = Accuracy::default();
    let mut latencies_us = Vec::with_capacity(hashes.len());
    let (mut events, mut blocks, mut wire_bytes) = (0u64, 0u64, 0u64);
    let (mut requested, mut reused) = (0u64, 0u64);
    let mut probe_tasks = tokio::task::JoinSet::new();
    let bar = progress_bar(hashes.len() as u64, config.progress);
    let started = Instant::now();
    for (i, request) in hashes.iter().enumerate() {
        let t = clock.time_of(&workload.requests[i]);
        if routes {
            board.wait_until(t).await;
            late += u64::from(board.now() - t > late_after);
        }
        // Watermarks before the query: a batch confirmed visible only while the query was in
        // flight may be newer than what the query captured.
        let watermarks = probes.watermarks();
        let asked = Instant::now();
        let (reported, fastest) = if routes {
            let prompt = workload.requests[i].input_length as f64 * token_scale;
            let answer = ask_route(&mut query, request, tokens.get(i), prompt, &rtt_ms).await?;
            let chosen = answer.ranked.iter().find(|r| r.lane == answer.chosen_lane);
            let (Some(chosen), Some(&dc)) = (chosen, lane_to_dc.get(&answer.chosen_lane)) else {
                bail!(
                    "Route chose no DC of this fleet (lane {})",
                    answer.chosen_lane
                );
            };
            route_answers += 1;
            load_known += u64::from(chosen.load_state == v1::LoadState::Known as i32);
            let depths = answer.ranked.iter().map(|r| (r.lane, r.depth));
            (reported_depths(depths, &lane_to_dc, shape.dcs), Some(dc))
        } else {
            let answer = ask(&mut query, request, tokens.get(i), "FindMatches").await?;
            let depths = answer.matches.iter().map(|m| (m.lane, m.depth));
            (reported_depths(depths, &lane_to_dc, shape.dcs), None)
        };
        latencies_us.push(asked.elapsed().as_secs_f64() * 1e6);
        accuracy.record(
            request,
            &reported,
            fleet.oracle(),
            &watermarks,
            fleet.dc_load(),
        );
        let in_flight = board.pools().in_flight(t);
        let dc = router.choose(&Signals {
            depths: &reported,
            served: fleet.dc_load(),
            in_flight: &in_flight,
            fastest,
        });
        let served = fleet.serve(dc, request);
        {
            let mut pools = board.pools();
            pools.forget_until(t);
            let input_length = workload.requests[i].input_length;
            let kv_usage = fleet.kv_usage(served.rank_id);
            pools.admit(t, served.rank_id, input_length, served.reused, kv_usage);
        }
        requested += served.requested as u64;
        reused += served.reused as u64;
        // The ZMQ feed publishes here; the gRPC one below (with the producer's omissions).
        let mut sent = None;
        if let Feed::Zmq(z) = feed {
            let batch = z.tokens.batch(&served, served.rank_id.rank, unix_seconds());
            if !batch.events.is_empty() {
                sent = Some(Instant::now());
                events += batch.events.len() as u64;
                blocks += batch.events.iter().map(engine_event_blocks).sum::<usize>() as u64;
                let payload =
                    ckf_engine::encode::encode_batch(&batch, ckf_engine::encode::Layout::Tagged);
                wire_bytes += payload.len() as u64;
                let rank_id = served.rank_id.worker * shape.ranks_per_worker + served.rank_id.rank;
                z.publishers[dc][rank_id].publish_payload(payload).await?;
            }
        }
        let batch_events = serve_events(&served);
        if !batch_events.is_empty() && matches!(feed, Feed::Grpc) {
            let worker = format!("{}/w{}", dcs[dc].name, served.rank_id.worker);
            let batch = sources.batch(&worker, batch_events);
            events += batch.events.len() as u64;
            blocks += batch.events.iter().map(event_blocks).sum::<usize>() as u64;
            wire_bytes += batch.encoded_len() as u64;
            sent = Some(Instant::now());
            let result = publish(&mut dcs[dc], batch.clone()).await?;
            for (event, outcome) in batch.events.iter().zip(&result.events) {
                if let Some(Kind::Stored(stored)) = &event.kind
                    && outcome.omitted_blocks > 0
                {
                    fleet.oracle_mut().on_omission(dc, &stored.block_hashes);
                }
            }
        }
        if let Some(sent) = sent {
            // Probe the last block this batch made the DC hold (not one another rank had).
            let fresh = served
                .stored
                .iter()
                .flat_map(|r| &r.hashes)
                .rev()
                .find(|&&h| {
                    let t = fleet.oracle().truth(dc, h);
                    t.holders == 1 && t.stored_at == served.dc_seq && !t.omission_suspect
                });
            if let Some(&hash) = fresh
                && probes.try_claim(dc)
            {
                let (mut client, probes, lane) = (query.clone(), probes.clone(), dcs[dc].lane);
                let (seq, deadline) = (served.dc_seq, sent + config.probe_timeout);
                probe_tasks.spawn(async move {
                    let seen = wait_visible(&mut client, lane, hash, deadline).await;
                    probes.finish(dc, seq, seen.ok().flatten().map(|at| at - sent));
                });
            }
        }
        bar.inc(1);
    }
    let seconds = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    while probe_tasks.join_next().await.is_some() {}

    // Final drain: once each DC's sentinel is visible, every batch before it is too.
    let settled = match feed {
        Feed::Grpc => sentinel
            .settle(&mut dcs, &mut query, &mut sources, config.settle_timeout)
            .await
            .is_ok(),
        Feed::Zmq(z) => zmq_settle(
            z,
            &dcs,
            &mut query,
            shape.ranks_per_worker,
            config.settle_timeout,
        )
        .await
        .is_ok(),
    };
    for (dc, &seq) in fleet.dc_seq().iter().enumerate() {
        if settled {
            probes.raise_watermark(dc, seq);
        }
    }
    let relay = match (relay_before, relay_bytes(&dcs).await) {
        (Some(before), Some(after)) => Some(after.saturating_sub(before)),
        _ => None,
    };
    let final_accuracy =
        final_check(&mut query, &hashes, &tokens, &fleet, &lane_to_dc, &probes).await?;

    let mut dc_costs = Vec::with_capacity(dcs.len());
    for (i, dc) in dcs.iter_mut().enumerate() {
        let stats = dc
            .ingest
            .get_stats(GetStatsRequest {})
            .await
            .with_context(|| format!("GetStats on {}", dc.name))?
            .into_inner();
        dc_costs.push(DcCost::new(
            dc.name.clone(),
            stats.unique_blocks,
            fleet.oracle().held_blocks(i) as u64,
            stats.omissions_total,
            stats.load_factor,
            stats.format.map_or(0, |f| f.bucket_count),
            stats.bytes_used,
        ));
    }

    let serving = ServingComparison::run(
        &workload.requests,
        &hashes,
        shape,
        &config.serving,
        config.seed,
    );
    let live_hit_rate = HitRate::new(config.policy, "indexer", requested, reused);
    let live_serving = LiveServing {
        serving: board
            .pools()
            .clone()
            .finish(config.policy, live_hit_rate.clone()),
        paced: routes,
        route_answers,
        load_known,
        late,
    };
    let mut routing = vec![live_hit_rate];
    routing.extend(serving.policies.iter().map(|p| p.hit_rate.clone()));
    let distinct: HashSet<u64> = hashes.iter().flatten().copied().collect();
    let queries = hashes.len() as u64;
    let rate = |n: u64| n as f64 / seconds.max(1e-9);
    Ok(Report {
        workload: WorkloadInfo {
            source: workload.source.clone(),
            requests: queries,
            blocks: hashes.iter().map(|h| h.len() as u64).sum(),
            distinct_blocks: distinct.len() as u64,
        },
        fleet: shape,
        feed: match feed {
            Feed::Grpc => "grpc",
            Feed::Zmq(_) => "zmq",
        },
        source_prefix: matches!(feed, Feed::Grpc).then(|| run.clone()),
        policy: config.policy,
        seed: config.seed,
        throughput: Throughput {
            seconds,
            queries,
            events,
            blocks,
            events_per_s: rate(events),
            blocks_per_s: rate(blocks),
            queries_per_s: rate(queries),
        },
        query_latency_us: Summary::of(&latencies_us),
        visibility_lag_ms: Summary::of(&probes.lags_ms()),
        visibility_probe_timeouts: probes.timeouts(),
        accuracy,
        final_check: FinalCheck {
            settled,
            accuracy: final_accuracy,
        },
        routing,
        serving,
        live_serving,
        cost: Cost::new(dc_costs, wire_bytes, relay, events),
    })
}

/// Whether a live run can route by `policy`, with or without the `load_path` (simulated
/// engines the producers scrape).
///
/// # Errors
/// Expected-ttft without the load path, naming where it runs.
pub fn check_policy(policy: Policy, load_path: bool) -> Result<()> {
    if !policy.runs_live(load_path) {
        bail!(
            "--policy {}: the live run routes by the indexer's Route only where producers scrape \
             simulated engines' load: run it with `ckf demo` (zmq feed); the report compares \
             every policy on the serving model",
            policy.name()
        );
    }
    Ok(())
}

/// Relay bytes all producers have sent so far, when every DC has a metrics endpoint.
async fn relay_bytes(dcs: &[Dc]) -> Option<u64> {
    let mut total = 0.0;
    for dc in dcs {
        total += crate::bench::scrape::scrape_sum(
            dc.metrics.as_deref()?,
            crate::bench::scrape::RELAY_BYTES,
        )
        .await
        .ok()?;
    }
    Some(total as u64)
}

/// Publisher rank_ids per DC must match the fleet shape.
fn check_publishers(z: &ZmqFeed, shape: FleetShape) -> Result<()> {
    if z.publishers.len() != shape.dcs
        || z.publishers.iter().any(|p| p.len() != shape.ranks_per_dc())
    {
        bail!(
            "the ZMQ feed needs {} DCs x {} publishers",
            shape.dcs,
            shape.ranks_per_dc()
        );
    }
    Ok(())
}

fn engine_event_blocks(event: &ckf_engine::encode::Event) -> usize {
    match event {
        ckf_engine::encode::Event::Stored(s) => s.block_hashes.len(),
        ckf_engine::encode::Event::Removed(r) => r.block_hashes.len(),
        ckf_engine::encode::Event::AllCleared => 0,
    }
}

/// Re-queries every distinct request against the final oracle.
async fn final_check(
    query: &mut QueryClient<AuthedChannel>,
    hashes: &[Vec<u64>],
    tokens: &[Vec<u32>],
    fleet: &Fleet,
    lane_to_dc: &HashMap<u32, usize>,
    probes: &Probes,
) -> Result<Accuracy> {
    let mut accuracy = Accuracy::default();
    let mut seen = HashSet::new();
    let watermarks = probes.watermarks();
    for (i, request) in hashes.iter().enumerate() {
        if request.last().is_none_or(|last| !seen.insert(*last)) {
            continue;
        }
        let answer = ask(query, request, tokens.get(i), "FindMatches (final check)").await?;
        let depths = answer.matches.iter().map(|m| (m.lane, m.depth));
        let reported = reported_depths(depths, lane_to_dc, fleet.shape().dcs);
        accuracy.record(
            request,
            &reported,
            fleet.oracle(),
            &watermarks,
            fleet.dc_load(),
        );
    }
    Ok(accuracy)
}

fn progress_bar(len: u64, show: bool) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(len), indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(
        "{spinner} replay [{elapsed_precise}] {wide_bar} {pos}/{len} requests ({per_sec}, eta {eta})",
    ) {
        bar.set_style(style);
    }
    bar
}
