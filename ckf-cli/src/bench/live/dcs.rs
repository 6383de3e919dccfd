//! The DCs of a live run: how it reaches each one (its producer, its lane) and how its events
//! get there (the feed); publishing one batch.

use anyhow::{Context, Result, bail};
use ckf_proto::v1::{self, EventStatus, KvEventBatch, ingest_client::IngestClient};
use ckf_svc_kit::access::AuthedChannel;

use crate::bench::feed::TokenFeed;
use crate::bench::publisher::EnginePublisher;

/// The member the replay uses for drain sentinels: `(worker_id = u64::MAX, dp_rank = 0)`.
pub const PROBE_WORKER: u64 = u64::MAX;

/// How the replay feeds the producers and asks the indexer.
#[derive(Debug)]
pub enum Feed {
    /// `Ingest/PublishBatch` over gRPC with the trace's chained block hashes; `FindMatches`.
    Grpc,
    /// vLLM events over ZMQ from built-in engine publishers, which the producers subscribe to
    /// (their `[[engines]]`); `FindMatchesByTokens`. See [`crate::bench::feed`] for the token
    /// rules.
    Zmq(ZmqFeed),
}

/// The ZMQ feed's state.
#[derive(Debug)]
pub struct ZmqFeed {
    /// Tokens, canonical and engine hashes of the workload.
    pub tokens: TokenFeed,
    /// Per DC, per rank (`worker * ranks_per_worker + rank`), its publisher; the
    /// producer of that DC subscribes to each as engine `worker_id = worker`, DP rank `rank`.
    pub publishers: Vec<Vec<EnginePublisher>>,
    /// Counter for fresh drain-sentinel blocks.
    pub(super) next_sentinel: u64,
}

impl ZmqFeed {
    /// A feed over `publishers` (see the field) with `tokens`.
    pub fn new(tokens: TokenFeed, publishers: Vec<Vec<EnginePublisher>>) -> Self {
        Self {
            tokens,
            publishers,
            next_sentinel: 0,
        }
    }
}

/// One DC's connection.
#[derive(Debug, Clone)]
pub struct DcTarget {
    /// The DC id, as in the indexer's manifest (`PoolId.dc`).
    pub dc: String,
    /// The DC's producer (with the Ingest bearer token, if any).
    pub producer: AuthedChannel,
    /// The producer's Prometheus endpoint (`host:port`), for the relay wire cost; optional.
    pub metrics: Option<String>,
}

/// A DC of the run: its lane and its producer.
pub(super) struct Dc {
    pub(super) name: String,
    pub(super) lane: u32,
    pub(super) ingest: IngestClient<AuthedChannel>,
    pub(super) metrics: Option<String>,
}

/// Sends one batch and checks the producer's answer.
pub(super) async fn publish(dc: &mut Dc, batch: KvEventBatch) -> Result<v1::KvEventBatchResult> {
    let source = batch.source_id.clone();
    let result = dc
        .ingest
        .publish_batch(batch)
        .await
        .with_context(|| format!("PublishBatch to {}", dc.name))?
        .into_inner();
    if result.duplicate || result.gap.is_some() {
        bail!(
            "producer {} saw source {source} out of order (duplicate {}, gap {:?})",
            dc.name,
            result.duplicate,
            result.gap
        );
    }
    if let Some(bad) = result
        .events
        .iter()
        .find(|e| e.status == EventStatus::Rejected as i32)
    {
        bail!("producer {} rejected an event: {}", dc.name, bad.error);
    }
    Ok(result)
}

/// Seconds since the Unix epoch (0 if the clock is before it), the batch `ts`.
pub(super) fn unix_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
