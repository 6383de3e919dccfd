//! What a lane ingestor consumes ([`Frame`]) and the consumer's deadlines ([`LagPolicy`]).

use std::time::Duration;

use crate::frames::{DcCkfDelta, DcCkfSnapshot, DrainMarker, SnapshotChunk};
use crate::identity::StreamTag;

/// Deadlines enforced by the consumer (DESIGN.md section 4: "a lag-policy violation ... retires
/// only that lane").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LagPolicy {
    /// A lane holding a lease (awaiting its snapshot, or active and not drained) that receives no
    /// frame of its current lease for this long is retired with
    /// [`RetireReason::HeartbeatTimeout`](super::RetireReason::HeartbeatTimeout). `None` disables the check. Enforced by the
    /// [`crate::ingestion::IngestionPool`] workers, or by calling
    /// [`crate::global::GlobalCkfIndexer::check_deadlines`].
    pub heartbeat_deadline: Option<Duration>,
    /// Dirty-to-applied deadline: a delta whose `oldest_change_age_ms` plus the time it waited at
    /// the consumer exceeds this is not applied and the lane is retired with
    /// [`RetireReason::LagExceeded`](super::RetireReason::LagExceeded). `None` disables the check.
    pub apply_deadline: Option<Duration>,
}

impl Default for LagPolicy {
    /// Heartbeat deadline 10 s, dirty-to-applied deadline 10 s.
    fn default() -> Self {
        Self {
            heartbeat_deadline: Some(Duration::from_secs(10)),
            apply_deadline: Some(Duration::from_secs(10)),
        }
    }
}

impl LagPolicy {
    /// No deadlines at all (tests and offline tools).
    pub const DISABLED: Self = Self {
        heartbeat_deadline: None,
        apply_deadline: None,
    };
}

/// Liveness frame: "the stream of this lease is alive" (no content).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat {
    /// Sender and lease.
    pub tag: StreamTag,
}

/// Everything a lane ingestor consumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// One chunk of a barrier snapshot (chunks must arrive in order from bucket 0).
    Chunk(SnapshotChunk),
    /// A whole barrier snapshot in one frame (in-process use); same rules as a single chunk
    /// covering every bucket.
    Snapshot(DcCkfSnapshot),
    /// A sequenced delta of absolute bucket images.
    Delta(DcCkfDelta),
    /// Exact drain marker.
    Drain(DrainMarker),
    /// Liveness.
    Heartbeat(Heartbeat),
}

impl Frame {
    /// The frame's envelope (sender incarnation and lease).
    pub fn tag(&self) -> &StreamTag {
        match self {
            Frame::Chunk(c) => &c.tag,
            Frame::Snapshot(s) => &s.tag,
            Frame::Delta(d) => &d.tag,
            Frame::Drain(m) => &m.tag,
            Frame::Heartbeat(h) => &h.tag,
        }
    }

    /// Short name of the frame kind ("chunk", "snapshot", "delta", "drain", "heartbeat").
    pub fn kind(&self) -> &'static str {
        match self {
            Frame::Chunk(_) => "chunk",
            Frame::Snapshot(_) => "snapshot",
            Frame::Delta(_) => "delta",
            Frame::Drain(_) => "drain",
            Frame::Heartbeat(_) => "heartbeat",
        }
    }
}
