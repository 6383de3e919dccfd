//! Shared helpers of the producer-svc integration tests.

#![allow(dead_code)]

pub mod fake_relay;

use std::collections::{HashMap, HashSet};

use ckf_core::addressing::{Addressing, TableFormat};
use ckf_core::bucket;
use ckf_proto::v1;
use ckf_proto::v1::ingest_client::IngestClient;
use ckf_proto::v1::kv_event::Kind;
use producer_svc::{ProducerConfig, RunningProducer};
use tonic::transport::Channel;

use fake_relay::{FakeRelay, GrantConfig};

/// Sum of the samples of `name` whose labels include every `labels` pair.
pub fn metric(p: &RunningProducer, name: &str, labels: &[(&str, &str)]) -> f64 {
    p.metrics
        .render()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Polls `check` every 50 ms until it holds; panics naming `what` after 10 s.
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..200 {
        if check().await {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

/// A producer on ephemeral loopback ports, publishing to `indexers`, with fast cadence and
/// short backoff so tests run quickly.
pub async fn start_producer(indexers: Vec<String>) -> RunningProducer {
    start_with(fast_config(indexers)).await
}

/// The configuration of [`start_producer`].
pub fn fast_config(indexers: Vec<String>) -> ProducerConfig {
    let mut config = ProducerConfig::for_pool("test", "dc-a", indexers);
    config.table.expected_blocks = 3_768; // 1024 buckets (3,768 / 3.68), 8 KiB: several snapshot chunks
    config.table.seed = 0x5eed;
    config.publication.max_delay_ms = 2;
    config.publication.heartbeat_interval_ms = 50;
    config.reconnect.initial_backoff_ms = 10;
    config.reconnect.max_backoff_ms = 50;
    config
}

/// A fake indexer with the default grant (consumer instance 7) and a producer publishing to it
/// with [`fast_config`] changed by `edit`, returned once the first barrier snapshot is
/// installed there.
pub async fn attached_producer(
    edit: impl FnOnce(&mut ProducerConfig),
) -> (FakeRelay, RunningProducer) {
    let fake = FakeRelay::start(GrantConfig::default(), 7).await;
    let mut config = fast_config(vec![fake.url()]);
    edit(&mut config);
    let producer = start_with(config).await;
    fake.wait_installed(0, "the first barrier snapshot installed")
        .await;
    (fake, producer)
}

pub async fn start_with(config: ProducerConfig) -> RunningProducer {
    producer_svc::serve(config, std::future::pending())
        .await
        .expect("producer starts")
}

pub async fn ingest_client(p: &RunningProducer) -> IngestClient<Channel> {
    IngestClient::connect(format!("http://{}", p.ingest_addr))
        .await
        .expect("connect")
}

pub fn member(worker_id: u64, dp_rank: u32) -> Option<v1::MemberId> {
    Some(v1::MemberId { worker_id, dp_rank })
}

pub fn stored(worker: u64, rank: u32, hashes: &[u64]) -> v1::KvEvent {
    v1::KvEvent {
        member: member(worker, rank),
        kind: Some(Kind::Stored(v1::Stored {
            block_hashes: hashes.to_vec(),
            parent_hash: None,
        })),
    }
}

pub fn removed(worker: u64, rank: u32, hashes: &[u64]) -> v1::KvEvent {
    v1::KvEvent {
        member: member(worker, rank),
        kind: Some(Kind::Removed(v1::Removed {
            block_hashes: hashes.to_vec(),
        })),
    }
}

pub fn cleared(worker: u64, rank: u32) -> v1::KvEvent {
    v1::KvEvent {
        member: member(worker, rank),
        kind: Some(Kind::Cleared(v1::Cleared {})),
    }
}

pub fn worker_removed(worker: u64) -> v1::KvEvent {
    v1::KvEvent {
        member: member(worker, 0),
        kind: Some(Kind::WorkerRemoved(v1::WorkerRemoved {})),
    }
}

pub fn batch(source: &str, sequence: u64, events: Vec<v1::KvEvent>) -> v1::KvEventBatch {
    v1::KvEventBatch {
        source_id: source.into(),
        sequence,
        events,
    }
}

/// Publishes `events` as batch `sequence` of `source` (which must be accepted), after applying
/// them to `model`.
pub async fn publish_tracked(
    client: &mut IngestClient<Channel>,
    model: &mut Model,
    source: &str,
    sequence: u64,
    events: Vec<v1::KvEvent>,
) {
    events.iter().for_each(|e| model.apply(e));
    client
        .publish_batch(batch(source, sequence, events))
        .await
        .unwrap();
}

/// Publishes one store of `hashes` by member (1, 0) as batch `sequence` of `source`; returns
/// the producer's answer.
pub async fn store_one(
    client: &mut IngestClient<Channel>,
    source: &str,
    sequence: u64,
    hashes: &[u64],
) -> v1::KvEventBatchResult {
    client
        .publish_batch(batch(source, sequence, vec![stored(1, 0, hashes)]))
        .await
        .unwrap()
        .into_inner()
}

/// The exact model of what the producer tracks: member -> block hashes.
#[derive(Debug, Default)]
pub struct Model {
    members: HashMap<(u64, u32), HashSet<u64>>,
}

impl Model {
    pub fn apply(&mut self, event: &v1::KvEvent) {
        let m = event.member.unwrap();
        match event.kind.as_ref().unwrap() {
            Kind::Stored(s) => self
                .members
                .entry((m.worker_id, m.dp_rank))
                .or_default()
                .extend(&s.block_hashes),
            Kind::Removed(r) => {
                if let Some(set) = self.members.get_mut(&(m.worker_id, m.dp_rank)) {
                    for h in &r.block_hashes {
                        set.remove(h);
                    }
                }
            }
            Kind::Cleared(_) => {
                self.members.remove(&(m.worker_id, m.dp_rank));
            }
            Kind::WorkerRemoved(_) => self.members.retain(|k, _| k.0 != m.worker_id),
        }
        self.members.retain(|_, s| !s.is_empty());
    }

    pub fn tracked(&self) -> HashSet<u64> {
        self.members.values().flatten().copied().collect()
    }
}

/// Panics unless every hash's fingerprint is in one of its two candidate buckets of `table`.
pub fn assert_all_present(format: TableFormat, table: &[u64], hashes: &HashSet<u64>) {
    let addressing = Addressing::new(&format).unwrap();
    for &h in hashes {
        let loc = addressing.locate(h);
        assert!(
            bucket::contains(table[loc.bucket_a as usize], loc.fingerprint)
                || bucket::contains(table[loc.bucket_b as usize], loc.fingerprint),
            "tracked block {h:#x} has no fingerprint in the rebuilt table"
        );
    }
}

/// Fingerprints in a table.
pub fn resident(table: &[u64]) -> u64 {
    table.iter().map(|&w| u64::from(bucket::occupied(w))).sum()
}
