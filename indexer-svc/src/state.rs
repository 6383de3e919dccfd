//! What every handler of one indexer shares: the core consumer, its ingestion workers, the
//! metrics, the limits and the shutdown signal. Built once by [`crate::serve`].

use std::sync::Arc;

use ckf_core::global::GlobalCkfIndexer;
use ckf_core::ingestion::IngestionWorkers;
use ckf_proto::v1::{self, relay_frame::Frame as WireFrame};
use ckf_svc_kit::Shutdown;
use prost::Message;
use tokio::sync::Semaphore;

use crate::config::LimitsConfig;
use crate::metrics::{IndexerMetrics, LaneLabels};

/// The state the Relay and Query handlers share (one `Arc` per server).
#[derive(Debug)]
pub struct IndexerState {
    /// The transposed global consumer (leases, lane state machine, table, search).
    pub indexer: Arc<GlobalCkfIndexer>,
    /// One serialized ingestor thread per lane behind bounded queues.
    pub workers: IngestionWorkers,
    /// Prometheus metrics.
    pub metrics: IndexerMetrics,
    /// `lane` / `dc` label values per lane.
    pub labels: Vec<LaneLabels>,
    /// Resource limits.
    pub limits: LimitsConfig,
    /// Heartbeat deadline told to producers (0 = none).
    pub heartbeat_deadline_ms: u64,
    /// Permits for open relay streams (`limits.max_relay_streams`).
    pub relay_streams: Arc<Semaphore>,
    /// Permits for open `FindMatchesStream` calls (`limits.max_query_streams`).
    pub query_streams: Arc<Semaphore>,
    /// `[auth]`: who may attach for which pool, and the Query token.
    pub access: Arc<crate::access::IndexerAccess>,
    /// Stops every stream and the servers.
    pub shutdown: Shutdown,
    /// `Route`: the kept load reports, the bookings, the `[route]` model and round trips
    /// (shared with every [`crate::EmbeddedQuery`] of this indexer).
    pub router: crate::router::Router,
}

impl IndexerState {
    /// Labels of `lane` (a manifest lane).
    pub fn labels(&self, lane: u8) -> &LaneLabels {
        &self.labels[usize::from(lane)]
    }

    /// Counts one received relay frame by kind and encoded size.
    pub fn count_frame(&self, frame: &v1::RelayFrame) {
        let kind = frame.frame.as_ref().map_or("empty", wire_kind);
        self.metrics
            .frames_received
            .with_label_values(&[kind])
            .inc();
        self.metrics
            .bytes_received
            .inc_by(frame.encoded_len() as u64);
    }
}

/// The `kind` label (and `NoAttach` text) of a wire frame.
pub fn wire_kind(frame: &WireFrame) -> &'static str {
    match frame {
        WireFrame::Attach(_) => "attach",
        WireFrame::SnapshotChunk(_) => "snapshot_chunk",
        WireFrame::Delta(_) => "delta",
        WireFrame::Heartbeat(_) => "heartbeat",
        WireFrame::DrainMarker(_) => "drain_marker",
        WireFrame::Load(_) => "load",
    }
}
