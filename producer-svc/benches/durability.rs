//! Durability cost and recovery time of the producer service (`[durability]`: the exact state
//! journaled so a restart does not blind its DC), against a baseline
//! measured in the same run.
//!
//! `cargo bench -p producer-svc --bench durability` prints:
//!
//! * **ingest**: blocks/s through the real service (`serve`, 4 concurrent `Publish` streams, 64
//!   events of 16 blocks per batch, stores then removes) with durability off (the baseline) and
//!   on (`[durability] data_dir` on the working directory's disk, 50 ms group commit),
//!   interleaved, best of 3; the ratio is durable / in-memory. Target: >= 0.70 while above the
//!   1 M block ops/s the busiest pool sends.
//! * **recovery**: 10 M tracked blocks (16 members) ingested, a clean stop (final checkpoint),
//!   then the time a new producer on the same directory takes from `serve` to listening with
//!   the state rebuilt (`ckf_producer_recovery_seconds`, read from its metrics) and its
//!   checkpoint's size. Target: < 10 s.
//!
//! Figures, not pass/fail. `CKF_BENCH_DIR` picks the directory (default: a temporary one under
//! `target/`, which is on the real disk, not tmpfs).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ckf_core::addressing::fmix64;
use ckf_proto::v1;
use ckf_proto::v1::ingest_client::IngestClient;
use ckf_proto::v1::kv_event::Kind;
use producer_svc::ProducerConfig;

const EVENTS_PER_BATCH: usize = 64;
const BLOCKS_PER_EVENT: u64 = 16;
const SOURCES: u64 = 4;
const ROUNDS: usize = 3;
/// Ingest rounds: 400 batches stored then removed (409,600 blocks each way).
const INGEST_BATCHES: usize = 400;
/// The recovery workload: 10 M blocks.
const RECOVERY_BLOCKS: u64 = 10_000_000;

fn batch(source: u64, sequence: u64, index: u64, remove: bool) -> v1::KvEventBatch {
    let events = (0..EVENTS_PER_BATCH as u64)
        .map(|e| {
            let block_hashes: Vec<u64> = (0..BLOCKS_PER_EVENT)
                .map(|i| fmix64((source << 56) ^ (index << 20) ^ (e << 8) ^ i ^ 0x5bd1_e995))
                .collect();
            v1::KvEvent {
                member: Some(v1::MemberId {
                    worker_id: source,
                    dp_rank: (e % 4) as u32,
                }),
                kind: Some(if remove {
                    Kind::Removed(v1::Removed { block_hashes })
                } else {
                    Kind::Stored(v1::Stored {
                        block_hashes,
                        parent_hash: None,
                    })
                }),
            }
        })
        .collect();
    v1::KvEventBatch {
        source_id: format!("bench-{source}"),
        sequence,
        events,
    }
}

/// Per source: `batches` store batches, then (if `remove`) the same blocks removed.
fn workload(batches: usize, remove: bool) -> Vec<Vec<v1::KvEventBatch>> {
    (1..=SOURCES)
        .map(|s| {
            let per = (batches as u64).div_ceil(SOURCES);
            let mut out: Vec<_> = (0..per).map(|i| batch(s, i + 1, i, false)).collect();
            if remove {
                out.extend((0..per).map(|i| batch(s, per + i + 1, i, true)));
            }
            out
        })
        .collect()
}

fn config(expected_blocks: u64, data_dir: Option<&Path>) -> ProducerConfig {
    let mut config = ProducerConfig::for_pool("bench", "dc-a", vec!["http://127.0.0.1:1".into()]);
    config.table.expected_blocks = expected_blocks;
    config.reconnect.initial_backoff_ms = 60_000;
    config.reconnect.max_backoff_ms = 60_000;
    config.limits.max_tracked_sources = 16;
    config.durability.data_dir = data_dir.map(Path::to_owned);
    config
}

/// Sends every source's batches over its own stream; returns the blocks sent and the time.
async fn ingest(
    producer: &producer_svc::RunningProducer,
    work: Vec<Vec<v1::KvEventBatch>>,
) -> (u64, Duration) {
    let url = format!("http://{}", producer.ingest_addr);
    let blocks: u64 = work.iter().map(|w| w.len() as u64).sum::<u64>()
        * EVENTS_PER_BATCH as u64
        * BLOCKS_PER_EVENT;
    let start = Instant::now();
    let tasks: Vec<_> = work
        .into_iter()
        .map(|batches| {
            let url = url.clone();
            tokio::spawn(async move {
                let mut client = IngestClient::connect(url)
                    .await
                    .unwrap()
                    .max_decoding_message_size(64 << 20);
                let n = batches.len();
                let mut results = client
                    .publish(tokio_stream::iter(batches))
                    .await
                    .unwrap()
                    .into_inner();
                for _ in 0..n {
                    let r = results.message().await.unwrap().unwrap();
                    assert!(
                        r.events
                            .iter()
                            .all(|e| e.status() == v1::EventStatus::Applied)
                    );
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    (blocks, start.elapsed())
}

async fn ingest_rate(data_dir: Option<&Path>) -> f64 {
    if let Some(dir) = data_dir {
        let _ = std::fs::remove_dir_all(dir);
    }
    let expected = (INGEST_BATCHES * EVENTS_PER_BATCH) as u64 * BLOCKS_PER_EVENT;
    let producer = producer_svc::serve(config(expected, data_dir), std::future::pending())
        .await
        .unwrap();
    let (blocks, took) = ingest(&producer, workload(INGEST_BATCHES, true)).await;
    let stats = producer.stats().await.unwrap();
    assert_eq!((stats.unique_blocks, stats.omissions_total), (0, 0));
    producer.shutdown();
    producer.wait().await.unwrap();
    blocks as f64 / took.as_secs_f64()
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(f64::NAN)
}

async fn recovery(dir: &Path) -> (f64, f64, u64, u64, f64) {
    let _ = std::fs::remove_dir_all(dir);
    let batches = (RECOVERY_BLOCKS / (EVENTS_PER_BATCH as u64 * BLOCKS_PER_EVENT)) as usize;
    let producer = producer_svc::serve(config(RECOVERY_BLOCKS, Some(dir)), std::future::pending())
        .await
        .unwrap();
    ingest(&producer, workload(batches, false)).await;
    let before = producer.stats().await.unwrap();
    let first_metrics = producer.metrics.clone();
    producer.shutdown();
    producer.wait().await.unwrap();
    // The checkpoints' images: the longest step of each one's capture (the actor, and so
    // ingest, stops at most that long at a time), summed over the checkpoints of the run.
    let text = ckf_svc_kit::metrics::render_text(first_metrics.registry());
    let image = metric(&text, "ckf_producer_journal_checkpoint_image_seconds_sum");
    let on_disk: u64 = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum();

    let start = Instant::now();
    let producer = producer_svc::serve(config(RECOVERY_BLOCKS, Some(dir)), std::future::pending())
        .await
        .unwrap();
    let to_listening = start.elapsed().as_secs_f64();
    let after = producer.stats().await.unwrap();
    assert_eq!(
        after.ownership_edges, before.ownership_edges,
        "every edge recovered"
    );
    let text = ckf_svc_kit::metrics::render_text(producer.metrics.registry());
    let recovery = metric(&text, "ckf_producer_recovery_seconds");
    producer.shutdown();
    producer.wait().await.unwrap();
    (
        to_listening,
        recovery,
        before.ownership_edges,
        on_disk,
        image,
    )
}

fn bench_dir() -> PathBuf {
    std::env::var_os("CKF_BENCH_DIR").map_or_else(
        || {
            let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-durability");
            std::fs::create_dir_all(&base).unwrap();
            base
        },
        PathBuf::from,
    )
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = bench_dir();
    let state = dir.join("state");
    let mut best = [0f64; 2];
    for _ in 0..ROUNDS {
        best[0] = best[0].max(rt.block_on(ingest_rate(None)));
        best[1] = best[1].max(rt.block_on(ingest_rate(Some(&state))));
    }
    println!(
        "producer ingest through serve(): {SOURCES} Publish streams, {EVENTS_PER_BATCH} events x {BLOCKS_PER_EVENT} blocks per batch, best of {ROUNDS}, interleaved"
    );
    println!("{:<44} {:>14} {:>10}", "path", "blocks/s", "x memory");
    println!(
        "{:<44} {:>14.0} {:>10.3}",
        "durability off (baseline)", best[0], 1.0
    );
    println!(
        "{:<44} {:>14.0} {:>10.3}",
        "durability on (50 ms group commit)",
        best[1],
        best[1] / best[0]
    );
    let (listening, recovery, edges, bytes, image) = rt.block_on(recovery(&state));
    println!(
        "recovery of {edges} tracked blocks after a clean stop: {recovery:.2} s rebuilding \
         ({listening:.2} s from serve() to listening); state on disk {:.1} MiB ({:.1} bytes/block)",
        bytes as f64 / (1 << 20) as f64,
        bytes as f64 / edges as f64
    );
    println!(
        "capturing the checkpoint images of {edges} blocks stopped the state actor at most {image:.3} s per step (longest steps, summed over the run's checkpoints)"
    );
    let _ = std::fs::remove_dir_all(&state);
}
