//! What a lane ingestor consumes: [`Frame`], the union of the publication frames of
//! [`crate::frames`].

use crate::frames::{DcCkfDelta, DcCkfSnapshot, DrainMarker, Heartbeat, SnapshotChunk};
use crate::identity::StreamTag;

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
