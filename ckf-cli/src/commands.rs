//! Running each subcommand: argument -> workload/connection -> output. No rule lives here.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use ckf_core::access::Secret;
use ckf_proto::v1::FindMatchesRequest;
use ckf_proto::v1::ingest_client::IngestClient;
use ckf_proto::v1::query_client::QueryClient;
use ckf_proto::v1::{
    FindMatchesByTokensRequest, GetSourceSequenceRequest, LaneState, ListLanesRequest,
    MultimodalItem, RetireReason, SourceSequence,
};
use ckf_svc_kit::access::{authed, read_token_file, with_bearer};
use ckf_svc_kit::errors::error_chain;
use ckf_svc_kit::tls::{ClientTls, ClientTlsConfig, warn_if_plaintext_remote};
use serde_json::json;
use tonic::Request;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::cli::{
    DEFAULT_SYNTHETIC_REQUESTS, FleetArgs, HealthArgs, LanesArgs, QueryArgs, ReplayArgs,
    SimulateArgs, SourceSequenceArgs, TimeoutArgs, TlsArgs, parse_token_list,
};
use crate::fleet::FleetShape;
use crate::hashing::block_hashes;
use crate::live::{self, DcTarget, LiveConfig, Workload};
use crate::policy::Policy;
use crate::sim::simulate;
use crate::synth::synthetic_workload;
use crate::trace::read_trace;

/// Loads a trace (validated whole before anything is sent) or the synthetic workload, then
/// applies the request limit.
///
/// # Errors
/// The trace's [`TraceError`](crate::trace::TraceError).
pub fn load_workload(trace: Option<&Path>, limit: Option<usize>, seed: u64) -> Result<Workload> {
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
pub fn live_config(fleet: &FleetArgs, timeouts: &TimeoutArgs, shape: FleetShape) -> LiveConfig {
    LiveConfig {
        shape,
        policy: fleet.policy,
        seed: fleet.seed,
        progress: live::want_progress(fleet.json),
        ready_timeout: Duration::from_secs(timeouts.ready_timeout_s),
        probe_timeout: Duration::from_millis(timeouts.probe_timeout_ms),
        settle_timeout: Duration::from_secs(timeouts.settle_timeout_s),
    }
}

/// Connects to a gRPC endpoint in plaintext (the in-process demo's loopback services).
///
/// # Errors
/// An invalid URL or a failed connection, naming the URL.
pub async fn connect(url: &str) -> Result<Channel> {
    connect_with(url, None).await
}

/// The client TLS material the flags name (`None` without `--ca`).
///
/// # Errors
/// A file that cannot be used, naming the flag and the path.
pub fn client_tls(args: &TlsArgs) -> Result<Option<ClientTls>> {
    let config = ClientTlsConfig {
        ca_file: args.ca.clone(),
        cert_file: args.cert.clone(),
        key_file: args.key.clone(),
        server_name: args.server_name.clone(),
    };
    Ok(config.load_as(["--ca", "--cert", "--key"].map(str::to_owned))?)
}

/// Connects to a gRPC endpoint: `https://` with `tls` (required), `http://` in plaintext
/// (refused when TLS flags were given, so `--ca` never silently means nothing).
///
/// # Errors
/// An invalid URL, `https://` without `--ca`, TLS flags with `http://`, or a failed
/// connection, naming the URL.
pub async fn connect_with(url: &str, tls: Option<&ClientTls>) -> Result<Channel> {
    warn_if_plaintext_remote(url);
    ckf_svc_kit::tls::endpoint(url, tls, true)?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| anyhow!("{}", error_chain(&e)))
        .with_context(|| format!("cannot connect to {url}"))
}

/// The token of `--token-file`, if given.
///
/// # Errors
/// An unreadable file or one that is not a token (empty, several lines), naming the path.
pub fn token_of(file: Option<&Path>) -> Result<Option<Secret>> {
    file.map(|path| read_token_file("--token-file", path).map_err(|e| anyhow!("{e}")))
        .transpose()
}

/// `ckf replay`.
///
/// # Errors
/// A bad trace, an unreachable service, or a replay failure.
pub async fn replay(args: ReplayArgs) -> Result<()> {
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
    let indexer = authed(
        connect_with(&args.indexer, tls_for(&args.indexer)).await?,
        query_token,
    );
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
    let config = live_config(&args.fleet, &args.timeouts, shape);
    let report = live::replay(&workload, indexer, targets, &config, &mut live::Feed::Grpc).await?;
    print_report(&report, args.fleet.json);
    Ok(())
}

/// Prints a report as text or JSON.
pub fn print_report(report: &crate::report::Report, json: bool) {
    if json {
        println!("{}", report.to_json());
    } else {
        print!("{report}");
    }
}

/// `ckf simulate`.
///
/// # Errors
/// A bad trace or fleet shape.
pub fn simulate_cmd(args: SimulateArgs) -> Result<()> {
    let workload = load_workload(args.trace.as_deref(), args.fleet.limit, args.fleet.seed)?;
    let shape = args.fleet.shape(args.dcs);
    shape.validate().map_err(|e| anyhow!(e))?;
    let hashes: Vec<Vec<u64>> = workload
        .requests
        .iter()
        .map(|r| block_hashes(&r.hash_ids))
        .collect();
    let rates: Vec<_> = Policy::ALL
        .iter()
        .map(|&p| simulate(&hashes, shape, p, args.fleet.seed))
        .collect();
    if args.fleet.json {
        let out = json!({ "workload": workload.source, "requests": hashes.len(), "fleet": shape, "routing": rates });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "{} ({} requests); {} DCs x {} workers x {} ranks, {} blocks per rank",
            workload.source,
            hashes.len(),
            shape.dcs,
            shape.workers_per_dc,
            shape.ranks_per_worker,
            shape.capacity_blocks
        );
        for r in rates {
            println!(
                "  {:<12} hit rate {:>6.2}%  ({} / {} blocks)",
                r.policy.name(),
                r.hit_rate * 100.0,
                r.blocks_reused,
                r.blocks_requested
            );
        }
    }
    Ok(())
}

/// `ckf query`: by block hashes (or `--ids`), or by token ids (`--tokens`, `--tokens-file`).
///
/// # Errors
/// An unreadable or malformed tokens file, an unreachable indexer or a failed call (the
/// indexer's `INVALID_ARGUMENT` message names a refused token query's fault).
pub async fn query(args: QueryArgs) -> Result<()> {
    let tokens = match (&args.tokens, &args.tokens_file) {
        (Some(list), _) => Some(list.0.clone()),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read --tokens-file {}", path.display()))?;
            let list = parse_token_list(&text)
                .map_err(|e| anyhow!("--tokens-file {}: {e}", path.display()))?;
            Some(list.0)
        }
        (None, None) => None,
    };
    let token = token_of(args.token_file.as_deref())?;
    let tls = client_tls(&args.tls)?;
    let mut client = QueryClient::new(connect_with(&args.indexer, tls.as_ref()).await?);
    let (count, unit, answer) = if let Some(token_ids) = tokens {
        let request = FindMatchesByTokensRequest {
            token_ids,
            lora_name: args.lora.clone().unwrap_or_default(),
            cache_salt: args.salt.clone().unwrap_or_default(),
            multimodal: args
                .multimodal
                .iter()
                .map(|m| MultimodalItem {
                    identifier: m.identifier.clone(),
                    offset: m.offset,
                    length: m.length,
                })
                .collect(),
            block_size: args.block_size.unwrap_or(0),
        };
        let count = request.token_ids.len();
        let answer = client
            .find_matches_by_tokens(with_bearer(Request::new(request), token.as_ref()))
            .await
            .context("FindMatchesByTokens")?
            .into_inner();
        (count, "tokens", answer)
    } else {
        let hashes = if args.ids {
            block_hashes(&args.hashes)
        } else {
            args.hashes.clone()
        };
        let request = FindMatchesRequest {
            block_hashes: hashes.clone(),
        };
        let answer = client
            .find_matches(with_bearer(Request::new(request), token.as_ref()))
            .await
            .context("FindMatches")?
            .into_inner();
        (hashes.len(), "blocks", answer)
    };
    if args.json {
        let lanes: Vec<_> = answer
            .matches
            .iter()
            .map(|m| {
                let pool = m.pool.clone().unwrap_or_default();
                json!({ "lane": m.lane, "domain": pool.domain, "dc": pool.dc, "depth": m.depth })
            })
            .collect();
        let out = json!({ unit: count, "ready_mask": answer.ready_mask, "matches": lanes });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!("{count} {unit}; ready lanes {:#06x}", answer.ready_mask);
    println!("{:>4}  {:<16} {:>6}", "lane", "dc", "depth");
    for m in &answer.matches {
        let dc = m.pool.as_ref().map_or("?", |p| p.dc.as_str());
        println!("{:>4}  {:<16} {:>6}", m.lane, dc, m.depth);
    }
    Ok(())
}

fn state_name(state: i32) -> &'static str {
    match LaneState::try_from(state) {
        Ok(LaneState::Unassigned) => "unassigned",
        Ok(LaneState::AwaitingSnapshot) => "awaiting-snapshot",
        Ok(LaneState::Active) => "active",
        Ok(LaneState::Retired) => "retired",
        _ => "unknown",
    }
}

fn reason_name(reason: i32) -> String {
    match RetireReason::try_from(reason) {
        Ok(RetireReason::Unspecified) => "-".into(),
        Ok(r) => r
            .as_str_name()
            .trim_start_matches("RETIRE_REASON_")
            .to_lowercase(),
        Err(_) => format!("unknown({reason})"),
    }
}

/// `ckf lanes`.
///
/// # Errors
/// An unreachable indexer or a failed call.
pub async fn lanes(args: LanesArgs) -> Result<()> {
    let token = token_of(args.token_file.as_deref())?;
    let tls = client_tls(&args.tls)?;
    let mut client = QueryClient::new(connect_with(&args.indexer, tls.as_ref()).await?);
    let answer = client
        .list_lanes(with_bearer(
            Request::new(ListLanesRequest {}),
            token.as_ref(),
        ))
        .await
        .context("ListLanes")?
        .into_inner();
    if args.json {
        let lanes: Vec<_> = answer
            .lanes
            .iter()
            .map(|l| {
                let pool = l.pool.clone().unwrap_or_default();
                json!({
                    "lane": l.lane, "dc": pool.dc, "state": state_name(l.state),
                    "lease_epoch": l.lease_epoch, "incarnation": l.incarnation,
                    "installed_sequence": l.installed_sequence,
                    "last_update_age_ms": l.last_update_age_ms, "load_factor": l.load_factor,
                    "retirements": l.retirements, "last_retire_reason": reason_name(l.last_retire_reason),
                    "last_retire_detail": l.last_retire_detail, "drained": l.drained,
                    "drain_grace_remaining_ms": l.drain_grace_remaining_ms,
                    "contention_count": l.contention_count,
                    "last_contender_incarnation": l.last_contender_incarnation,
                    "last_contention_holder_incarnation": l.last_contention_holder_incarnation,
                    "last_contention_age_ms": l.last_contention_age_ms,
                    "last_contention_kind": contention_name(l.last_contention_kind),
                })
            })
            .collect();
        let format = answer.format.unwrap_or_default();
        let out = json!({
            "domain": answer.domain, "consumer_instance": answer.consumer_instance,
            "bucket_count": format.bucket_count, "seed": format.seed, "lanes": lanes,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let format = answer.format.unwrap_or_default();
    println!(
        "domain {}  consumer instance {:#x}  format v{} ({} buckets, seed {})",
        answer.domain, answer.consumer_instance, format.version, format.bucket_count, format.seed
    );
    println!(
        "{:>4}  {:<12} {:<17} {:>5} {:>10} {:>9} {:>7} {:>7}  last reason",
        "lane", "dc", "state", "epoch", "installed", "age ms", "load", "retired"
    );
    for l in &answer.lanes {
        let dc = l.pool.as_ref().map_or("?", |p| p.dc.as_str());
        let age = l
            .last_update_age_ms
            .map_or_else(|| "-".to_string(), |a| a.to_string());
        let mut reason = reason_name(l.last_retire_reason);
        if !l.last_retire_detail.is_empty() {
            reason = format!("{reason}: {}", l.last_retire_detail);
        }
        println!(
            "{:>4}  {:<12} {:<17} {:>5} {:>10} {:>9} {:>6.1}% {:>7}  {}{}",
            l.lane,
            dc,
            state_name(l.state),
            l.lease_epoch,
            l.installed_sequence,
            age,
            l.load_factor * 100.0,
            l.retirements,
            reason,
            match (l.drained, l.drain_grace_remaining_ms) {
                (true, Some(ms)) => format!(" (drained, leaves the ready set in {ms} ms)"),
                (true, None) => " (drained)".to_owned(),
                _ => String::new(),
            }
        );
        if l.contention_count > 0 {
            println!(
                "      contention: {} (last {} by incarnation {:#018x} against {:#018x}, {} ms ago)",
                l.contention_count,
                contention_name(l.last_contention_kind),
                l.last_contender_incarnation,
                l.last_contention_holder_incarnation,
                l.last_contention_age_ms
                    .map_or_else(|| "-".to_string(), |a| a.to_string()),
            );
        }
    }
    Ok(())
}

/// `ckf source-sequence`: one line (or one JSON object) saying where the source stands.
///
/// # Errors
/// An unreachable producer, or its refusal (`INVALID_ARGUMENT` for a bad source id,
/// `UNAUTHENTICATED` / `PERMISSION_DENIED` under `[ingest_auth]`) with its message.
pub async fn source_sequence(args: SourceSequenceArgs) -> Result<()> {
    let token = token_of(args.token_file.as_deref())?;
    let tls = client_tls(&args.tls)?;
    let mut client = IngestClient::new(connect_with(&args.producer, tls.as_ref()).await?);
    let answer = client
        .get_source_sequence(with_bearer(
            Request::new(GetSourceSequenceRequest {
                source_id: args.source.clone(),
            }),
            token.as_ref(),
        ))
        .await
        .context("GetSourceSequence")?
        .into_inner();
    if args.json {
        let out = json!({
            "source_id": answer.source_id, "known": answer.known,
            "last_applied": answer.last_applied, "next_sequence": answer.next_sequence,
            "incarnation": answer.incarnation,
        });
        println!("{out}");
    } else {
        println!("{}", source_sequence_line(&answer));
    }
    Ok(())
}

/// The text form of a `GetSourceSequence` answer: what to send next, then the incarnation.
pub fn source_sequence_line(answer: &SourceSequence) -> String {
    let position = match (answer.known, answer.next_sequence) {
        (false, _) => "unknown to the producer (never seen, or forgotten): any sequence is \
                       accepted as its first batch"
            .to_owned(),
        (true, Some(next)) => format!("last applied {}, next {next}", answer.last_applied),
        (true, None) => format!(
            "last applied {}, no next sequence (use a new source id)",
            answer.last_applied
        ),
    };
    format!(
        "source {:?}: {position}; producer incarnation {:#018x}",
        answer.source_id, answer.incarnation
    )
}

/// The lower-case name of a wire contention kind.
fn contention_name(kind: i32) -> &'static str {
    match ckf_proto::v1::ContentionKind::try_from(kind) {
        Ok(ckf_proto::v1::ContentionKind::IfVacantRefused) => "if_vacant_refused",
        Ok(ckf_proto::v1::ContentionKind::Takeover) => "takeover",
        _ => "none",
    }
}

/// A hint for the usual causes of a connection error whose text is `chain` (an error with its
/// sources) on a connection to `url`, made with or without a client certificate: the TLS
/// failures a first deployment meets, which the error names only in rustls' or h2's terms (or,
/// for a refused client certificate under TLS 1.3, only as a broken pipe: the server's alert
/// comes after the client considers the handshake done).
pub fn hint(chain: &str, url: &str, client_certificate: bool) -> Option<&'static str> {
    let text = chain.to_ascii_lowercase();
    let has = |needles: &[&str]| needles.iter().any(|n| text.contains(n));
    let cut = has(&[
        "connection reset",
        "frame with invalid size",
        "broken pipe",
        "unexpected eof",
        "connection closed",
        // hyper cancels a request queued on a connection the server closed before it was
        // ready (a TLS listener reading a plaintext preface): the same cut, seen earlier.
        "connection was not ready",
    ]);
    let https = ckf_svc_kit::tls::is_https(url);
    if has(&[
        "ckf.v1.query: unauthenticated",
        "ckf.v1.query: no credentials",
    ]) || (has(&["query"]) && has(&["no credentials", "bearer token matches no"]))
    {
        return Some(
            "the indexer's Query needs its bearer token: pass --token-file FILE (the file of \
             its auth.query_token_file)",
        );
    }
    if has(&["ingest"]) && has(&["no credentials", "bearer token matches no"]) {
        return Some(
            "the producers' Ingest needs a source's bearer token: pass --ingest-token-file FILE \
             (an [[ingest_auth.sources]] token_file)",
        );
    }
    if has(&["certificaterequired", "certificate required"])
        || (https && cut && !client_certificate)
    {
        Some(
            "the server may require a client certificate (mutual TLS): pass --cert and --key \
             (e.g. query.crt / query.key from `ckf certs`)",
        )
    } else if has(&["unknownissuer", "unknown issuer", "badsignature"]) {
        Some("the server's certificate is not signed by the CA of --ca: pass the CA that issued it")
    } else if has(&[
        "decrypterror",
        "decrypt error",
        "badcertificate",
        "bad certificate",
    ]) {
        Some(
            "the TLS handshake failed on a certificate: the server may not trust the CA of \
             --cert, or the server's certificate is not from the CA of --ca",
        )
    } else if has(&["notvalidforname", "not valid for name"]) {
        Some(
            "the server's certificate does not name the host of the URL: use a name it has, or \
             --server-name",
        )
    } else if has(&["expired", "notvalidyet"]) {
        Some("a certificate is outside its validity period: re-issue it (`ckf certs --reissue`)")
    } else if has(&[
        "corrupt message",
        "invalidcontenttype",
        "wrong version number",
    ]) {
        Some("the server does not speak TLS: use an http:// URL (and no --ca)")
    } else if cut && !https {
        Some(
            "the connection was cut during the handshake: if the server serves TLS, use an \
             https:// URL with --ca (and --cert/--key when it requires client certificates)",
        )
    } else if cut {
        Some(
            "the server cut the connection: its log says why (a client certificate from another \
             CA or mapping to no principal, a connection limit)",
        )
    } else {
        None
    }
}

/// `ckf health`: returns the process exit code (0 SERVING, 1 other status, 2 unreachable).
pub async fn health(args: HealthArgs) -> i32 {
    let check = async {
        let tls = client_tls(&args.tls)?;
        let mut client = HealthClient::new(connect_with(&args.endpoint, tls.as_ref()).await?);
        let answer = client
            .check(HealthCheckRequest {
                service: args.service.clone(),
            })
            .await
            .context("Health/Check")?
            .into_inner();
        Ok::<_, anyhow::Error>(answer.status)
    };
    match tokio::time::timeout(Duration::from_millis(args.timeout_ms), check).await {
        Ok(Ok(status)) => {
            let name = ServingStatus::try_from(status).map_or_else(
                |_| format!("UNKNOWN({status})"),
                |s| s.as_str_name().to_string(),
            );
            println!("{}: {name}", args.endpoint);
            if status == ServingStatus::Serving as i32 {
                0
            } else {
                1
            }
        }
        Ok(Err(e)) => {
            eprintln!("{}: unhealthy: {e:#}", args.endpoint);
            if let Some(hint) = hint(&format!("{e:#}"), &args.endpoint, args.tls.cert.is_some()) {
                eprintln!("hint: {hint}");
            }
            2
        }
        Err(_) => {
            eprintln!("{}: no answer within {} ms", args.endpoint, args.timeout_ms);
            2
        }
    }
}

#[cfg(test)]
mod hint_tests {
    use super::hint;

    /// The texts tonic and hyper gave for a plaintext client on a TLS listener, seen in CI
    /// runs: each depends on when the server's close reaches the client.
    #[test]
    fn a_plaintext_client_cut_by_a_tls_listener_gets_the_https_hint() {
        for chain in [
            "ListLanes: transport error: connection reset by peer",
            "ListLanes: transport error: broken pipe",
            "ListLanes: code: 'The operation was cancelled', message: \"operation was canceled\", \
             source: tonic::transport::Error(Transport, hyper::Error(Canceled, \"connection was \
             not ready\")): transport error: operation was canceled: connection was not ready",
        ] {
            let got = hint(chain, "http://127.0.0.1:1", false).unwrap_or("");
            assert!(
                got.contains("use an https:// URL with --ca"),
                "{chain}: {got}"
            );
        }
    }

    /// The same cut over https, without a client certificate, points at mutual TLS; an
    /// unrelated error gets no hint.
    #[test]
    fn cuts_over_https_point_at_client_certificates_and_other_errors_get_none() {
        let cut = "transport error: operation was canceled: connection was not ready";
        assert!(
            hint(cut, "https://h:1", false)
                .unwrap()
                .contains("client certificate")
        );
        assert_eq!(
            hint(
                "status: NotFound, message: \"no lane\"",
                "http://h:1",
                false
            ),
            None
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_sequence_lines_say_what_to_send_next() {
        let mut answer = SourceSequence {
            source_id: "router-1".into(),
            known: true,
            last_applied: 41,
            next_sequence: Some(42),
            incarnation: 0xab,
        };
        assert_eq!(
            source_sequence_line(&answer),
            "source \"router-1\": last applied 41, next 42; producer incarnation \
             0x00000000000000ab"
        );
        answer.next_sequence = None;
        answer.last_applied = u64::MAX;
        assert!(
            source_sequence_line(&answer).contains("no next sequence (use a new source id)"),
            "{}",
            source_sequence_line(&answer)
        );
        answer.known = false;
        answer.last_applied = 0;
        assert!(
            source_sequence_line(&answer).contains("unknown to the producer"),
            "{}",
            source_sequence_line(&answer)
        );
    }
}
