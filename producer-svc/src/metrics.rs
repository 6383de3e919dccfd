//! Prometheus metrics of one producer (prefix `ckf_producer_`).
//!
//! Each producer owns its own [`Registry`] (never the process-global one) so several producers
//! can run in one process (`ckf demo`, tests) without their series colliding. The metric list,
//! with labels and units, is in the crate README ("Metrics").

mod journal;

pub use journal::JournalMetrics;

use ckf_core::dc::{DcCkfStats, RebuildStats};
use ckf_svc_kit::metrics::{
    counter, counter_vec, float_counter, gauge, histogram, histogram_vec, int_gauge, int_gauge_vec,
};
use prometheus::{
    Counter, Gauge, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Registry,
};

/// Publication states of one attachment, exported as a state set
/// (`ckf_producer_attachment_state{indexer, state}` is 1 for the current state, 0 otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachmentState {
    /// Opening the connection and the Relay stream.
    Connecting,
    /// Attach sent, waiting for the lease.
    AwaitingLease,
    /// Barrier snapshot being sent / awaiting its acknowledgement.
    Snapshotting,
    /// Snapshot installed; deltas and heartbeats flowing.
    Streaming,
    /// Drain marker sent, waiting for the drained acknowledgement.
    Draining,
    /// Drained (final state after a graceful shutdown).
    Drained,
    /// Waiting out the reconnect backoff after a failure.
    Backoff,
    /// Another producer attached for the same pool and superseded this one (set once, when
    /// told); it then stands by.
    Superseded,
    /// Superseded: retrying `IF_VACANT` under the backoff until the lane is vacant (the other
    /// producer drained, died or was retired); refusals keep it here.
    Standby,
}

impl AttachmentState {
    /// Every state, in label order.
    pub const ALL: [AttachmentState; 9] = [
        Self::Connecting,
        Self::AwaitingLease,
        Self::Snapshotting,
        Self::Streaming,
        Self::Draining,
        Self::Drained,
        Self::Backoff,
        Self::Superseded,
        Self::Standby,
    ];

    /// The `state` label value.
    pub fn label(self) -> &'static str {
        match self {
            Self::Connecting => "connecting",
            Self::AwaitingLease => "awaiting_lease",
            Self::Snapshotting => "snapshotting",
            Self::Streaming => "streaming",
            Self::Draining => "draining",
            Self::Drained => "drained",
            Self::Backoff => "backoff",
            Self::Superseded => "superseded",
            Self::Standby => "standby",
        }
    }
}

/// Every metric of one producer.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    /// Events ingested, by `kind` (stored, removed, cleared, worker_removed).
    pub events: IntCounterVec,
    /// Events rejected as malformed.
    pub events_rejected: IntCounter,
    /// Blocks in ingested events, by `kind` (stored, removed, cleared).
    pub blocks: IntCounterVec,
    /// Blocks omitted for capacity.
    pub omissions: IntCounter,
    /// Removals of blocks the member did not own (idempotent no-ops).
    pub unknown_removals: IntCounter,
    /// Source sequence gaps detected.
    pub source_gaps: IntCounter,
    /// Batches refused as replays (sequence not newer than the last one applied).
    pub duplicate_batches: IntCounter,
    /// Sources forgotten to keep the sequence tracker within `limits.max_tracked_sources`.
    pub source_evictions: IntCounter,
    /// Sources whose last batch sequence is tracked.
    pub tracked_sources: IntGauge,
    /// Estimated bytes of the source sequence tracker.
    pub tracked_source_bytes: IntGauge,
    /// Batches and events refused by a quota, by `limit` (`max_blocks_per_event`,
    /// `max_blocks_per_batch`, `max_blocks_per_member`, `max_blocks_per_source`).
    pub quota_refusals: IntCounterVec,
    /// Sources holding at least one block (quota charge table entries).
    pub charged_sources: IntGauge,
    /// Slot load factor, 0..1.
    pub load_factor: Gauge,
    /// Fingerprints resident in the table.
    pub resident_fingerprints: IntGauge,
    /// Distinct tracked block hashes.
    pub unique_blocks: IntGauge,
    /// Members owning at least one block.
    pub members: IntGauge,
    /// Estimated bytes of exact state plus table.
    pub state_bytes: IntGauge,
    /// Rebuilds of the exact block map (growths, shrinks, the reservation) since start.
    pub block_map_rebuilds: IntCounter,
    /// Seconds spent in them: each stopped ingest while it ran.
    pub block_map_rebuild_seconds: Counter,
    /// The longest one since start, in seconds.
    pub block_map_longest_rebuild_seconds: Gauge,
    /// Publication batches cut.
    pub batches: IntCounter,
    /// Publication batches cut, by `reason` (`idle`, `threshold`, `max_delay`, `barrier`,
    /// `shutdown`: `ckf_core::cadence::CutReason`).
    pub batches_cut: IntCounterVec,
    /// Batches whose due cut was postponed because an attachment queue was backed up (more
    /// than half full; counted once per batch): `ckf_core::cadence`, "Backed up".
    pub cuts_held: IntCounter,
    /// Entries (batches, snapshots, drain markers) queued toward each indexer and not yet
    /// taken by its relay task, by `indexer` (0 while it is not attached).
    pub attachment_queue_depth: IntGaugeVec,
    /// Seconds from the end of the command that first left a bucket dirty to the batch being
    /// queued for the relay clients: the delay the publication cadence adds.
    pub publish_delay_seconds: Histogram,
    /// Images per publication batch.
    pub batch_images: Histogram,
    /// Seconds the state actor spent in one unit of work, by `command` (see
    /// `crate::actor::Work`): the longest one is how long every other client waited.
    pub actor_command_seconds: HistogramVec,
    /// Ownership edges of cleared members (a `Cleared`, a `WorkerRemoved`, an engine clear)
    /// the release sweep has not dropped yet.
    pub releasing_edges: IntGauge,
    /// Relocation-order cycles broken while ordering batches.
    pub cycles_broken: IntCounter,
    /// Delta frames sent, by `indexer`.
    pub deltas_sent: IntCounterVec,
    /// Load reports sent, by `indexer`.
    pub load_reports_sent: IntCounterVec,
    /// Barrier snapshots sent (complete), by `indexer`.
    pub snapshots_sent: IntCounterVec,
    /// Snapshot chunk frames sent, by `indexer`.
    pub snapshot_chunks_sent: IntCounterVec,
    /// Heartbeats sent, by `indexer`.
    pub heartbeats_sent: IntCounterVec,
    /// Drain markers sent, by `indexer`.
    pub drain_markers_sent: IntCounterVec,
    /// Encoded bytes of Relay frames sent, by `indexer`.
    pub sent_bytes: IntCounterVec,
    /// Attachment state set, by `indexer` and `state`.
    pub attachment_state: IntGaugeVec,
    /// Reconnect attempts after a failure, by `indexer`.
    pub reconnects: IntCounterVec,
    /// Attachments ended by the indexer or the transport, by `indexer` and `reason`.
    pub detachments: IntCounterVec,
    /// `IF_VACANT` attaches refused while standing by (the lane held by another live producer),
    /// by `indexer`.
    pub standby_refusals: IntCounterVec,
    /// Last sequence the indexer acknowledged as installed, by `indexer`.
    pub acked_sequence: IntGaugeVec,
    /// Seconds from a batch's oldest change to the indexer's acknowledgement of it.
    pub change_to_ack_seconds: HistogramVec,
    /// Engine publishers (ZMQ ingest), per publisher socket.
    pub engine: crate::engines::metrics::EngineMetrics,
    /// The journal (`[durability]`) and the last start's recovery.
    pub journal: JournalMetrics,
}

impl Metrics {
    /// Registers every metric in a fresh registry.
    pub fn new() -> Self {
        let r = Registry::new();
        let load_factor = gauge(
            &r,
            "ckf_producer_load_factor",
            "Resident fingerprints / table slots, 0..1.",
        );
        let batch_images = histogram(
            &r,
            "ckf_producer_batch_images",
            "Bucket images per publication batch.",
            prometheus::exponential_buckets(1.0, 4.0, 10).expect("valid buckets"),
        );
        let batches_cut = counter_vec(
            &r,
            "ckf_producer_batches_cut_total",
            "Publication batches cut, by reason (idle, threshold, max_delay, barrier, shutdown).",
            &["reason"],
        );
        // Every reason exported from the start: a rate over a series that appears late is wrong.
        for reason in ckf_core::cadence::CutReason::ALL {
            batches_cut.with_label_values(&[reason.label()]);
        }
        let publish_delay_seconds = histogram(
            &r,
            "ckf_producer_publish_delay_seconds",
            "Seconds from the first change of a batch (end of its command) to the batch being queued for the indexers.",
            // 10 us .. ~0.33 s: the idle cut lands in the first buckets, max_delay_ms up to 300.
            prometheus::exponential_buckets(0.000_01, 2.0, 16).expect("valid buckets"),
        );
        let actor_command_seconds = histogram_vec(
            &r,
            "ckf_producer_actor_command_seconds",
            "Seconds the state actor spent in one command or slice of work, by command; every other client waited that long.",
            &["command"],
            // 25 us .. ~1.6 s by 4x; 0.05 is a bucket bound (the alert's threshold).
            vec![
                0.000_025, 0.0001, 0.0004, 0.0016, 0.0064, 0.0125, 0.025, 0.05, 0.1, 0.4, 1.6,
            ],
        );
        let change_to_ack_seconds = histogram_vec(
            &r,
            "ckf_producer_change_to_ack_seconds",
            "Seconds from the oldest change of a delta to the indexer acknowledging it.",
            &["indexer"],
            prometheus::exponential_buckets(0.0005, 2.0, 16).expect("valid buckets"),
        );
        Self {
            events: counter_vec(
                &r,
                "ckf_producer_events_total",
                "KV events applied, by kind.",
                &["kind"],
            ),
            events_rejected: counter(
                &r,
                "ckf_producer_events_rejected_total",
                "KV events rejected as malformed (nothing applied).",
            ),
            blocks: counter_vec(
                &r,
                "ckf_producer_blocks_total",
                "Blocks in applied KV events, by kind (for cleared: blocks the member held).",
                &["kind"],
            ),
            omissions: counter(
                &r,
                "ckf_producer_omissions_total",
                "Blocks omitted because the filter had no room within the kick bound.",
            ),
            unknown_removals: counter(
                &r,
                "ckf_producer_unknown_removals_total",
                "Removals of blocks the member did not own (idempotent no-ops).",
            ),
            source_gaps: counter(
                &r,
                "ckf_producer_source_gaps_total",
                "Per-source batch sequence gaps detected.",
            ),
            duplicate_batches: counter(
                &r,
                "ckf_producer_duplicate_batches_total",
                "Ingest batches refused as replays of an already applied sequence.",
            ),
            source_evictions: counter(
                &r,
                "ckf_producer_source_evictions_total",
                "Least recently used sources forgotten by the sequence tracker when full (their next batch counts as a first batch).",
            ),
            tracked_sources: int_gauge(
                &r,
                "ckf_producer_tracked_sources",
                "Sources whose last batch sequence is tracked (at most limits.max_tracked_sources).",
            ),
            tracked_source_bytes: int_gauge(
                &r,
                "ckf_producer_tracked_source_bytes",
                "Estimated bytes of the per-source sequence tracker.",
            ),
            quota_refusals: counter_vec(
                &r,
                "ckf_producer_quota_refusals_total",
                "Ingest batches (size limits) and events (holding limits) refused by a quota, by limit.",
                &["limit"],
            ),
            charged_sources: int_gauge(
                &r,
                "ckf_producer_charged_sources",
                "Ingest sources holding at least one block (entries of the quota charge table).",
            ),
            load_factor,
            resident_fingerprints: int_gauge(
                &r,
                "ckf_producer_resident_fingerprints",
                "Fingerprints resident in the filter table.",
            ),
            unique_blocks: int_gauge(
                &r,
                "ckf_producer_unique_blocks",
                "Distinct block hashes tracked (refcount > 0).",
            ),
            members: int_gauge(
                &r,
                "ckf_producer_members",
                "Members (worker, dp rank) owning at least one block.",
            ),
            state_bytes: int_gauge(
                &r,
                "ckf_producer_state_bytes",
                "Estimated bytes of exact ownership state plus the filter table.",
            ),
            block_map_rebuilds: counter(
                &r,
                "ckf_producer_block_map_rebuilds_total",
                "Rehashes of the exact block map (growth at 90% load, shrink, reservation); each stops ingest while it runs.",
            ),
            block_map_rebuild_seconds: float_counter(
                &r,
                "ckf_producer_block_map_rebuild_seconds_total",
                "Seconds the producer spent in block map rehashes, ingest standing still (the reservation's at start included).",
            ),
            block_map_longest_rebuild_seconds: gauge(
                &r,
                "ckf_producer_block_map_longest_rebuild_seconds",
                "The longest block map rehash since start, in seconds (table.reserve_blocks avoids growths below it).",
            ),
            batches: counter(
                &r,
                "ckf_producer_batches_total",
                "Publication batches cut from the dirty buckets.",
            ),
            batches_cut,
            cuts_held: counter(
                &r,
                "ckf_producer_cuts_held_total",
                "Publication batches whose due cut was postponed because an indexer's attachment queue was more than half full (counted once per batch).",
            ),
            attachment_queue_depth: int_gauge_vec(
                &r,
                "ckf_producer_attachment_queue_depth",
                "Entries queued toward the indexer's relay task and not yet taken (publication.attachment_queue at most), by indexer.",
                &["indexer"],
            ),
            publish_delay_seconds,
            batch_images,
            actor_command_seconds,
            releasing_edges: int_gauge(
                &r,
                "ckf_producer_releasing_edges",
                "Ownership edges of cleared members and removed workers the release sweep has not dropped yet.",
            ),
            cycles_broken: counter(
                &r,
                "ckf_producer_relocation_cycles_broken_total",
                "Relocation-order cycles broken while ordering batch images.",
            ),
            deltas_sent: counter_vec(
                &r,
                "ckf_producer_deltas_sent_total",
                "Delta frames sent, by indexer.",
                &["indexer"],
            ),
            load_reports_sent: counter_vec(
                &r,
                "ckf_producer_load_reports_sent_total",
                "Load reports of the pool sent, by indexer (only to indexers that take them).",
                &["indexer"],
            ),
            snapshots_sent: counter_vec(
                &r,
                "ckf_producer_snapshots_sent_total",
                "Complete barrier snapshots sent, by indexer.",
                &["indexer"],
            ),
            snapshot_chunks_sent: counter_vec(
                &r,
                "ckf_producer_snapshot_chunks_sent_total",
                "Snapshot chunk frames sent, by indexer.",
                &["indexer"],
            ),
            heartbeats_sent: counter_vec(
                &r,
                "ckf_producer_heartbeats_sent_total",
                "Heartbeat frames sent, by indexer.",
                &["indexer"],
            ),
            drain_markers_sent: counter_vec(
                &r,
                "ckf_producer_drain_markers_sent_total",
                "Drain markers sent, by indexer.",
                &["indexer"],
            ),
            sent_bytes: counter_vec(
                &r,
                "ckf_producer_sent_bytes_total",
                "Encoded bytes of Relay frames sent, by indexer.",
                &["indexer"],
            ),
            attachment_state: int_gauge_vec(
                &r,
                "ckf_producer_attachment_state",
                "1 for the attachment's current state, 0 for the others, by indexer and state.",
                &["indexer", "state"],
            ),
            reconnects: counter_vec(
                &r,
                "ckf_producer_reconnects_total",
                "Reconnect attempts after a failed or retired attachment, by indexer.",
                &["indexer"],
            ),
            detachments: counter_vec(
                &r,
                "ckf_producer_detachments_total",
                "Attachments ended other than by a graceful drain, by indexer and reason.",
                &["indexer", "reason"],
            ),
            standby_refusals: counter_vec(
                &r,
                "ckf_producer_standby_refusals_total",
                "IF_VACANT attaches refused while standing by after a supersession (the lane is held by another live producer), by indexer.",
                &["indexer"],
            ),
            acked_sequence: int_gauge_vec(
                &r,
                "ckf_producer_acked_sequence",
                "Last sequence the indexer acknowledged as installed, by indexer.",
                &["indexer"],
            ),
            change_to_ack_seconds,
            engine: crate::engines::metrics::EngineMetrics::new(&r),
            journal: JournalMetrics::new(&r),
            registry: r,
        }
    }

    /// The registry to expose on `/metrics`.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Sets the state gauges of one producer state.
    pub fn observe_stats(&self, stats: &DcCkfStats) {
        self.load_factor.set(stats.load_factor);
        self.resident_fingerprints
            .set(clamp_i64(stats.resident_fingerprints));
        self.unique_blocks
            .set(clamp_i64(stats.unique_blocks as u64));
        self.members.set(clamp_i64(stats.members as u64));
        self.state_bytes.set(clamp_i64(stats.bytes_used));
    }

    /// Sets the block map's rebuild metrics from the state's totals
    /// (`DcCkfState::block_map_rebuilds`).
    pub fn observe_rebuilds(&self, rebuilds: &RebuildStats) {
        // The state's figures are totals since it was built: the counters advance by the
        // difference (a state rebuilt from scratch starts lower and adds nothing until it
        // passes the old total).
        self.block_map_rebuilds
            .inc_by(rebuilds.count.saturating_sub(self.block_map_rebuilds.get()));
        let seconds = rebuilds.total.as_secs_f64() - self.block_map_rebuild_seconds.get();
        if seconds > 0.0 {
            self.block_map_rebuild_seconds.inc_by(seconds);
        }
        self.block_map_longest_rebuild_seconds
            .set(rebuilds.longest.as_secs_f64());
    }

    /// Sets the source tracker gauges: `tracked` sources using an estimated `bytes`.
    pub fn observe_sources(&self, tracked: usize, bytes: usize) {
        self.tracked_sources.set(clamp_i64(tracked as u64));
        self.tracked_source_bytes.set(clamp_i64(bytes as u64));
    }

    /// Moves `indexer`'s attachment state set to `state`.
    pub fn set_attachment_state(&self, indexer: &str, state: AttachmentState) {
        for s in AttachmentState::ALL {
            self.attachment_state
                .with_label_values(&[indexer, s.label()])
                .set(i64::from(s == state));
        }
    }

    /// Text exposition of every metric (what `/metrics` serves).
    pub fn render(&self) -> String {
        use prometheus::Encoder;
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding of gathered metrics");
        String::from_utf8(out).expect("text exposition is UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn clamp_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}
