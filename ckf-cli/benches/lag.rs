//! Event-to-visible lag and relay bytes per event: the producer's timer cadence against the
//! idle cut (`publication.cut_when_idle`), measured in the same run.
//!
//! `cargo bench -p ckf-cli --bench lag` starts, per cadence and load, a real indexer and a real
//! producer in-process on loopback (the `serve` functions the binaries run), offers KV events
//! at a fixed rate through `Ingest/PublishBatch` (open loop: each source sends one batch per
//! tick and never waits for visibility), and meanwhile probes visibility: one stored block at a
//! time, its send instant taken just before its batch is sent, then `FindMatches` polled every
//! [`PROBE_POLL`] from a thread of its own (tokio's timer has 1 ms steps, too coarse here)
//! until the block's lane reports it. Relay bytes come from the producer's
//! `ckf_producer_sent_bytes_total`, read before and after the load.
//!
//! Loads: **idle** ~100 events/s (one source, one event every 10 ms) and **loaded** 50k
//! events/s (four sources, a batch every millisecond each). Each event stores 2 fresh blocks or
//! removes 2 blocks stored one second earlier (half of each), so the table stays at a steady
//! load. Cadences: **timer** (`cut_when_idle = false`: the cadence the producer had before it
//! cut a batch as soon as its command queue is empty; `batch_threshold` 256, `max_delay_ms`
//! 10) and **idle cut** (the default). The last lines give the idle cut's lag and bytes per
//! event as ratios to the timer's. Figures, not
//! pass/fail: the machine is shared, so compare within one run.
//!
//! `CKF_LAG_BENCH_SECS` sets the seconds of load per scenario (default 6).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ckf_cli::bench::stats::quantile_us;
use ckf_cli::connect::connect;
use ckf_core::addressing::fmix64;
use ckf_proto::v1;
use ckf_proto::v1::ingest_client::IngestClient;
use ckf_proto::v1::kv_event::Kind;
use ckf_proto::v1::query_client::QueryClient;
use ckf_svc_kit::scrape::{Samples, fetch};
use hdrhistogram::Histogram;
use tonic::transport::Channel;

/// How often a probe re-queries while its block is not visible yet.
const PROBE_POLL: Duration = Duration::from_micros(100);
/// A probe that has not seen its block after this long counts as a timeout.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Blocks stored per event (and removed per removal).
const BLOCKS_PER_EVENT: u64 = 2;
const DOMAIN: &str = "ckf-lag-bench";
const DC: &str = "dc-a";

#[derive(Clone, Copy)]
struct Load {
    name: &'static str,
    /// Events per second offered, all sources together.
    rate: u64,
    sources: u64,
    tick: Duration,
}

#[derive(Clone, Copy)]
struct Cadence {
    name: &'static str,
    cut_when_idle: bool,
}

struct Outcome {
    events: u64,
    secs: f64,
    lag_us: Histogram<u64>,
    timeouts: u64,
    relay_bytes: f64,
    batches: f64,
    /// Mean of `ckf_producer_publish_delay_seconds` over the run, in microseconds.
    publish_delay_us: f64,
    by_reason: Vec<(&'static str, f64)>,
}

impl Outcome {
    fn bytes_per_event(&self) -> f64 {
        self.relay_bytes / self.events.max(1) as f64
    }
    fn p(&self, q: f64) -> f64 {
        quantile_us(&self.lag_us, q)
    }
}

/// Events of batch `batch` of `source`, `n` of them: the first half store fresh blocks, the
/// second half remove the blocks the same positions stored `window` batches earlier (in the first
/// window every event stores). Returns the batch and the first stored hash (the probe candidate).
fn batch(source: u64, batch: u64, n: u64, window: u64) -> (v1::KvEventBatch, u64) {
    let hashes = |b: u64, pos: u64| -> Vec<u64> {
        (0..BLOCKS_PER_EVENT)
            .map(|i| fmix64((source << 56) ^ (b << 20) ^ (pos << 4) ^ i) | 1)
            .collect()
    };
    let member = Some(v1::MemberId {
        worker_id: source,
        dp_rank: 0,
    });
    // The first window has nothing to remove yet: it stores every event (so the offered rate
    // holds from the start; those extra blocks stay, a bounded 1 s of stores).
    let stores = if batch < window { n } else { n.div_ceil(2) };
    let mut events = Vec::with_capacity(n as usize);
    for pos in 0..stores {
        events.push(v1::KvEvent {
            member,
            kind: Some(Kind::Stored(v1::Stored {
                block_hashes: hashes(batch, pos),
                parent_hash: None,
            })),
        });
    }
    for pos in 0..(n - stores) {
        events.push(v1::KvEvent {
            member,
            kind: Some(Kind::Removed(v1::Removed {
                block_hashes: hashes(batch - window, pos),
            })),
        });
    }
    let first = hashes(batch, 0)[0];
    (
        v1::KvEventBatch {
            source_id: format!("lag-bench-{source}"),
            sequence: batch,
            events,
        },
        first,
    )
}

/// One probe request: the hash, and when its batch was handed to the client.
type ProbeRequest = (u64, Instant);

/// The probe thread: its own runtime and query client; polls each requested hash until the
/// lane reports it, with a thread sleep between queries (finer than tokio's timer).
fn probe_thread(
    indexer_url: String,
    requests: std::sync::mpsc::Receiver<ProbeRequest>,
    busy: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Result<(Histogram<u64>, u64)>> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async {
            let mut query = QueryClient::new(connect(&indexer_url).await?);
            let mut lag_us = Histogram::<u64>::new(3)?;
            let mut timeouts = 0;
            while let Ok((hash, sent)) = requests.recv() {
                loop {
                    let answer = query
                        .find_matches(v1::FindMatchesRequest {
                            block_hashes: vec![hash],
                        })
                        .await?
                        .into_inner();
                    if answer.matches.iter().any(|m| m.lane == 0 && m.depth >= 1) {
                        lag_us.record(sent.elapsed().as_micros() as u64)?;
                        break;
                    }
                    if sent.elapsed() > PROBE_TIMEOUT {
                        timeouts += 1;
                        break;
                    }
                    std::thread::sleep(PROBE_POLL);
                }
                busy.store(false, Ordering::Release);
            }
            Ok((lag_us, timeouts))
        })
    })
}

fn scrape(metrics_addr: &str) -> Result<Samples> {
    Ok(Samples::parse(&fetch(
        metrics_addr,
        Duration::from_secs(5),
    )?))
}

async fn run(load: Load, cadence: Cadence, secs: f64) -> Result<Outcome> {
    let expected_blocks = 1 << 20;
    let mut config = indexer_svc::IndexerConfig::for_lanes(DOMAIN, &[DC]);
    config.table.expected_blocks = expected_blocks;
    let indexer = indexer_svc::serve(config, std::future::pending())
        .await
        .context("starting the indexer")?;
    let indexer_url = format!("http://{}", indexer.grpc_addr);
    let mut config = producer_svc::ProducerConfig::for_pool(DOMAIN, DC, vec![indexer_url.clone()]);
    config.table.expected_blocks = expected_blocks;
    config.publication.cut_when_idle = cadence.cut_when_idle;
    let producer = producer_svc::serve(config, std::future::pending())
        .await
        .context("starting the producer")?;
    let metrics_addr = producer.metrics_addr.to_string();
    let ingest: IngestClient<Channel> =
        IngestClient::new(connect(&format!("http://{}", producer.ingest_addr)).await?);

    // Ready: a warm-up block is visible (the barrier snapshot is installed, deltas flow).
    let (warm, hash) = batch(99, 0, 1, u64::MAX);
    ingest.clone().publish_batch(warm).await?;
    let mut query = QueryClient::new(connect(&indexer_url).await?);
    let ready_by = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = query
            .find_matches(v1::FindMatchesRequest {
                block_hashes: vec![hash],
            })
            .await?
            .into_inner();
        if answer.matches.iter().any(|m| m.lane == 0 && m.depth >= 1) {
            break;
        }
        if Instant::now() > ready_by {
            bail!("the lane was not ready within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let before = scrape(&metrics_addr)?;
    let (probe_tx, probe_rx) = std::sync::mpsc::channel::<ProbeRequest>();
    let busy = Arc::new(AtomicBool::new(false));
    let prober = probe_thread(indexer_url, probe_rx, Arc::clone(&busy));
    let events = Arc::new(AtomicU64::new(0));
    let per_source_rate = load.rate as f64 / load.sources as f64;
    let ticks_per_s = 1.0 / load.tick.as_secs_f64();
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for source in 0..load.sources {
        let mut client = ingest.clone();
        let (events, busy, probe_tx) = (Arc::clone(&events), Arc::clone(&busy), probe_tx.clone());
        let window = ticks_per_s.ceil() as u64; // one second of batches
        tasks.push(tokio::spawn(async move {
            let mut ticker = tokio::time::interval(load.tick);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // Owed events follow the clock, not the ticks: a tick lost to a slow answer is made
            // up by the next batch, so the offered rate holds while the producer keeps up.
            let mut offered = 0u64;
            let mut b = 0u64;
            while Instant::now() < end {
                ticker.tick().await;
                let due = (per_source_rate * start.elapsed().as_secs_f64()) as u64;
                let n = due.saturating_sub(offered);
                if n == 0 {
                    continue;
                }
                offered = due;
                let (message, first) = batch(source, b, n, window);
                let sent_events = message.events.len() as u64;
                b += 1;
                let sent = Instant::now();
                let result = client.publish_batch(message).await?.into_inner();
                if result.duplicate || result.refused.is_some() {
                    bail!("batch refused: {result:?}");
                }
                events.fetch_add(sent_events, Ordering::Relaxed);
                // One probe in flight: claim it for this batch's first stored block.
                if !busy.swap(true, Ordering::AcqRel) {
                    let _ = probe_tx.send((first, sent));
                }
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    drop(probe_tx);
    for t in tasks {
        t.await??;
    }
    let secs = start.elapsed().as_secs_f64();
    let (lag_us, timeouts) = tokio::task::spawn_blocking(move || prober.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the probe thread panicked"))??;
    // The tail is published at once (idle cut) or within max_delay: let it go out.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let after = scrape(&metrics_addr)?;
    let delta = |name: &str, labels: &[(&str, &str)]| {
        after.sum(name, labels).unwrap_or(0.0) - before.sum(name, labels).unwrap_or(0.0)
    };
    let outcome = Outcome {
        events: events.load(Ordering::Relaxed),
        secs,
        lag_us,
        timeouts,
        relay_bytes: delta("ckf_producer_sent_bytes_total", &[]),
        batches: delta("ckf_producer_batches_total", &[]),
        publish_delay_us: delta("ckf_producer_publish_delay_seconds_sum", &[]) * 1e6
            / delta("ckf_producer_publish_delay_seconds_count", &[]).max(1.0),
        by_reason: ["idle", "threshold", "max_delay"]
            .into_iter()
            .map(|r| (r, delta("ckf_producer_batches_cut_total", &[("reason", r)])))
            .collect(),
    };
    producer.shutdown();
    producer.wait().await.context("producer shutdown")?;
    indexer.shutdown();
    indexer.wait().await.context("indexer shutdown")?;
    Ok(outcome)
}

fn main() -> Result<()> {
    let secs: f64 = std::env::var("CKF_LAG_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6.0);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let loads = [
        Load {
            name: "idle ~100 events/s",
            rate: 100,
            sources: 1,
            tick: Duration::from_millis(10),
        },
        Load {
            name: "loaded 50k events/s",
            rate: 50_000,
            sources: 4,
            tick: Duration::from_millis(1),
        },
    ];
    let cadences = [
        Cadence {
            name: "timer (10 ms)",
            cut_when_idle: false,
        },
        Cadence {
            name: "idle cut",
            cut_when_idle: true,
        },
    ];
    println!(
        "event-to-visible lag, {secs} s per scenario, 1 indexer + 1 producer on loopback (FindMatches probes poll every {} us)",
        PROBE_POLL.as_micros()
    );
    for load in loads {
        let mut outcomes = Vec::new();
        for cadence in cadences {
            let o = rt.block_on(run(load, cadence, secs))?;
            println!(
                "{:<20} {:<14} {:>8.0} events/s  lag p50 {:>6.2} ms  p99 {:>6.2} ms  max {:>6.2} ms  ({} probes, {} timeouts)  relay {:>6.1} B/event  {:>6.0} batches/s (cadence delay mean {:.0} us)  cut by idle/threshold/max_delay {}",
                load.name,
                cadence.name,
                o.events as f64 / o.secs,
                o.p(0.5),
                o.p(0.99),
                o.lag_us.max() as f64 / 1e3,
                o.lag_us.len(),
                o.timeouts,
                o.bytes_per_event(),
                o.batches / o.secs,
                o.publish_delay_us,
                o.by_reason
                    .iter()
                    .map(|(_, n)| format!("{n:.0}"))
                    .collect::<Vec<_>>()
                    .join("/"),
            );
            outcomes.push(o);
        }
        let (old, new) = (&outcomes[0], &outcomes[1]);
        println!(
            "{:<20} idle cut / timer: lag p50 {:.2}x, p99 {:.2}x; relay bytes per event {:.2}x",
            load.name,
            new.p(0.5) / old.p(0.5),
            new.p(0.99) / old.p(0.99),
            new.bytes_per_event() / old.bytes_per_event(),
        );
    }
    Ok(())
}
