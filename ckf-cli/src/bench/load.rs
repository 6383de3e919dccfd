//! `ckf load`: a load generator for an indexer's Query service (in the manner of `ghz` or
//! `redis-benchmark`).
//!
//! - **Closed loop** (default): `--concurrency` request senders, each sending its next message as
//!   soon as the previous one is answered, spread round-robin over `--connections` HTTP/2
//!   connections. Latency is send to answer.
//! - **Open loop** (`--rate` queries/s): message `k` is due at `start + k x interval` whatever
//!   the answers do; a pacer thread releases each message at its due time to the next free
//!   sender, and the latency is measured **from the due time** (a message waiting for a free sender
//!   counts that wait: no coordinated omission). With too few senders for the rate the latencies
//!   grow, as they would for the real callers; the messages still unsent when `--duration`
//!   ends are not sent late but counted as `NOT_SENT` errors (at most `--concurrency` of them
//!   wait in the pacer's queue, so memory stays bounded whatever the rate).
//! - Modes: `unary` (`FindMatches`), `batch` (`FindMatchesBatch`, `--batch` queries per
//!   message), `stream` (`FindMatchesStream`: one stream per sender, `--batch` queries per
//!   message, each message's id checked in its answer), `tokens` (`FindMatchesByTokens`, the
//!   workload's blocks as `--block-size` token ids each, [`crate::bench::feed::block_tokens`]), and
//!   `health` (`grpc.health.v1.Health/Check` for `ckf.v1.Query` on the same server: no search
//!   and no query decode, so its CPU per call is the floor of a unary RPC there, HTTP/2, HPACK,
//!   protobuf, tonic and the runtime, the baseline to hold unary `FindMatches` against).
//! - Queries: the built-in synthetic workload or a Mooncake trace (`--trace`), chained into
//!   sequence block hashes ([`crate::hashing`]), sent in order and cycled.
//! - Summary: queries and messages answered per second, latency per message
//!   p50/p90/p99/p99.9/max from an HDR histogram (`hdrhistogram`), errors by gRPC status code,
//!   and the indexer's CPU time per query when its process is on this host (`--indexer-pid`, or
//!   the process listening on the URL's port, found through `/proc/net/tcp*` and
//!   `/proc/*/fd`): utime + stime from `/proc/<pid>/stat` over the run / queries answered.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use ckf_proto::v1::query_client::QueryClient;
use indicatif::{ProgressBar, ProgressStyle};
use tonic_health::pb::health_client::HealthClient;

use crate::bench::args::{LoadArgs, LoadMode};
use crate::connect::{client_tls, connect_with, query_channel, token_of};

use crate::bench::load::schedule::{Schedule, pace};
use crate::bench::load::senders::{Client, sender};

mod procfs;
mod report;
mod schedule;
mod senders;
mod tally;

#[cfg(test)]
mod tests;

pub use procfs::{cpu_ticks, listening_inodes, local_port, pid_listening_on, process_cpu};
pub use report::{LoadReport, json_report, text_report};
pub use schedule::{NOT_SENT, due_before, due_time, message_interval};
pub use senders::{HEALTH_CHECKED_SERVICE, message_queries, workload_queries};
pub use tally::{ID_MISMATCH, NOT_SERVING, Tally, code_name};

/// `ckf load`.
///
/// # Errors
/// Bad flags, an unreadable trace or token file, or an indexer that cannot be reached. Errors
/// of individual requests are counted, not returned.
pub async fn run(args: LoadArgs) -> Result<()> {
    let per_message = match args.mode {
        LoadMode::Batch | LoadMode::Stream => args.batch,
        LoadMode::Unary | LoadMode::Tokens | LoadMode::Health => 1,
    };
    if per_message == 0 || args.concurrency == 0 || args.connections == 0 {
        bail!("--batch, --concurrency and --connections must be at least 1");
    }
    if args.mode == LoadMode::Tokens && args.block_size == 0 {
        bail!("--block-size must be at least 1 token (the indexer's block size)");
    }
    let interval = args
        .rate
        .map(|rate| message_interval(rate, per_message))
        .transpose()?;
    let queries = Arc::new(workload_queries(
        args.trace.as_deref(),
        args.limit,
        args.seed,
    )?);
    let token = token_of(args.token_file.as_deref())?;
    let tls = client_tls(&args.tls)?;
    let mut clients = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        let channel = query_channel(
            connect_with(&args.indexer, tls.as_ref()).await?,
            token.clone(),
            args.domain.as_deref(),
        )?;
        clients.push(Client {
            query: QueryClient::new(channel.clone())
                .max_decoding_message_size(64 << 20)
                .max_encoding_message_size(64 << 20),
            health: HealthClient::new(channel),
        });
    }
    let pid = args
        .indexer_pid
        .or_else(|| local_port(&args.indexer).and_then(pid_listening_on));
    let duration = match args.requests {
        Some(_) => args.duration,
        None => Some(args.duration.unwrap_or(Duration::from_secs(10))),
    };
    // A pid the user gave must be readable (a typo would otherwise print "not measured"); one
    // found from the port is measured when it can be.
    let cpu_before = match (args.indexer_pid, pid) {
        (Some(given), _) => Some(process_cpu(given).context("--indexer-pid")?),
        (None, Some(found)) => process_cpu(found).ok(),
        (None, None) => None,
    };
    let start = Instant::now() + Duration::from_millis(1);
    let schedule = Arc::new(Schedule {
        next: AtomicU64::new(0),
        start,
        end: duration.map(|d| start + d),
        messages: args.requests,
        interval,
        stopped: AtomicBool::new(false),
    });
    let bar = progress(&args, duration);
    let ticker = {
        let bar = bar.clone();
        let schedule = Arc::clone(&schedule);
        let by_messages = args.requests.is_some() && duration.is_none();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let position = if by_messages {
                    schedule.next.load(Ordering::Relaxed)
                } else {
                    start.elapsed().as_millis() as u64
                };
                bar.set_position(position);
            }
        })
    };
    let (pacer, paced) = if interval.is_some() {
        // Bounded: a rate above what the senders sustain must not queue messages without bound.
        let (tx, rx) = flume::bounded(args.concurrency);
        (Some(pace(Arc::clone(&schedule), tx)), Some(rx))
    } else {
        (None, None)
    };
    let senders: Vec<_> = (0..args.concurrency)
        .map(|i| {
            tokio::spawn(sender(
                clients[i % clients.len()].clone(),
                args.mode,
                per_message,
                args.block_size,
                Arc::clone(&queries),
                Arc::clone(&schedule),
                paced.clone(),
            ))
        })
        .collect();
    let interrupted = {
        let schedule = Arc::clone(&schedule);
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                schedule.stopped.store(true, Ordering::Relaxed);
            }
        })
    };
    drop(paced);
    let mut tally = Tally::new();
    for sender in senders {
        tally.merge(&sender.await.context("a load sender panicked")?);
    }
    let elapsed = start.elapsed();
    if let Some(pacer) = pacer {
        let not_sent = pacer
            .join()
            .map_err(|_| anyhow!("the open-loop pacer panicked"))?;
        if not_sent > 0 {
            *tally.errors.entry(NOT_SENT).or_default() += not_sent;
        }
    }
    ticker.abort();
    interrupted.abort();
    bar.finish_and_clear();
    let indexer_cpu = match (pid, cpu_before) {
        (Some(pid), Some(before)) => process_cpu(pid)
            .ok()
            .map(|after| (pid, after.saturating_sub(before))),
        _ => None,
    };
    let report = LoadReport {
        tally,
        elapsed,
        indexer_cpu,
    };
    if args.json {
        crate::outln!(
            "{}",
            serde_json::to_string_pretty(&json_report(&args, per_message, &report))?
        )?;
    } else {
        crate::out!("{}", text_report(&args, per_message, &report))?;
    }
    Ok(())
}

fn progress(args: &LoadArgs, duration: Option<Duration>) -> ProgressBar {
    if !crate::bench::live::want_progress(args.json) {
        return ProgressBar::hidden();
    }
    let (len, unit) = match (duration, args.requests) {
        (Some(d), _) => (d.as_millis() as u64, "ms"),
        (None, Some(n)) => (n, "messages"),
        (None, None) => (0, ""),
    };
    let bar = ProgressBar::with_draw_target(Some(len), indicatif::ProgressDrawTarget::stderr());
    let template =
        format!("{{spinner}} load [{{elapsed_precise}}] {{wide_bar}} {{pos}}/{{len}} {unit}");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style);
    }
    bar
}
