//! One engine message in: the checks a publisher socket's message passes before the sequence
//! rule sees it, and the rule's entry for a message read.
//!
//! [`Read::live`] (a SUB-socket message) and [`Read::replayed`] (a replay reply) check, in
//! order: the message's size (all parts), its parts ([`EngineMessage`]), its msgpack batch
//! ([`decode_batch`]) and the dp rank the batch names. [`PublisherSequence::take`] then hands
//! the read to the sequence rule, which returns the actions to execute. A message that fails a
//! check keeps its place in the sequence when its sequence part can be read (so it is no gap)
//! but carries no batch: it never reaches the state. The caller turns [`Read::rejected`] and
//! the batch's [`DecodeNotes`](crate::event::DecodeNotes) into metrics and logs.

use thiserror::Error;

use crate::event::EngineBatch;
use crate::message::{EngineMessage, MessageError};
use crate::sequence::{Action, PublisherSequence};
use crate::wire::{DecodeError, DecodeLimits, decode_batch};

/// A batch as it travels through the sequence rule: `None` when a check dropped it (it still
/// takes its sequence number, so it is not mistaken for a gap).
pub type Batch = Option<EngineBatch>;

/// Bounds on one publisher's messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntakeLimits {
    /// Bounds on one payload's decoding.
    pub decode: DecodeLimits,
    /// Messages above this many bytes (all parts together) are dropped without being decoded.
    pub max_message_bytes: usize,
    /// Batches naming a dp rank at or above this are dropped: a hostile rank could otherwise
    /// create members at will.
    pub max_dp_rank: u32,
}

/// Why a message carries no batch.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Rejection {
    /// The message is larger than [`IntakeLimits::max_message_bytes`].
    #[error("{bytes} bytes > engine.max_frame_bytes ({max})")]
    Oversize {
        /// Its size, all parts together.
        bytes: usize,
        /// The bound.
        max: usize,
    },
    /// Its parts are not an engine message.
    #[error(transparent)]
    Message(#[from] MessageError),
    /// Its payload is not a batch.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// The batch names a dp rank at or above [`IntakeLimits::max_dp_rank`] (one outside
    /// `u32` reads as `u32::MAX`).
    #[error("batch dp_rank {rank} >= {max}")]
    DpRank {
        /// The rank named.
        rank: u32,
        /// The bound.
        max: u32,
    },
}

impl Rejection {
    /// A short stable label for metrics: `"oversize"`, `"dp_rank"`, or the message's or the
    /// decoder's own label ([`MessageError::kind_label`], [`DecodeError::kind_label`]).
    pub fn kind_label(&self) -> &'static str {
        match self {
            Self::Oversize { .. } => "oversize",
            Self::Message(e) => e.kind_label(),
            Self::Decode(e) => e.kind_label(),
            Self::DpRank { .. } => "dp_rank",
        }
    }
}

/// One message as read.
#[derive(Debug, Clone, PartialEq)]
pub struct Read {
    /// Its place in the publisher's sequence; `None` when no sequence could be read (the
    /// message is dropped whole).
    pub sequence: Option<i64>,
    /// Its batch; `None` when a check dropped it or it is a replay's end marker.
    pub batch: Batch,
    /// A replay reply that ends the replay (sequence -1 or an empty payload, as vLLM and
    /// SGLang send it after every replay). It is not decoded: counting it as malformed would
    /// raise a decode error on every healthy replay.
    pub replay_end: bool,
    /// Why the message carries no batch, when a check failed.
    pub rejected: Option<Rejection>,
    /// The identity the sequence rule keeps for this message: its batch's
    /// ([`EngineBatch::identity`]), or for a message a check dropped, a digest of its payload
    /// bytes. A replay repeats a message byte for byte, so either verifies when it is the last
    /// one applied; `None` only without a sequence (or for the end marker).
    pub identity: Option<u64>,
    /// Whether it came from the replay socket.
    replayed: bool,
}

impl Read {
    /// Reads a message from the live (SUB) socket: `[topic, sequence, payload]`.
    pub fn live(parts: &[&[u8]], limits: &IntakeLimits) -> Self {
        Self::check(parts, false, limits)
    }

    /// Reads a reply from the replay socket: `[sequence, payload]`, or the end marker.
    pub fn replayed(parts: &[&[u8]], limits: &IntakeLimits) -> Self {
        Self::check(parts, true, limits)
    }

    fn check(parts: &[&[u8]], replayed: bool, limits: &IntakeLimits) -> Self {
        let mut read = Read {
            sequence: None,
            batch: None,
            replay_end: false,
            rejected: None,
            identity: None,
            replayed,
        };
        let bytes: usize = parts.iter().map(|p| p.len()).sum();
        // The payload is the last part, live (`[topic, sequence, payload]`) and replayed.
        let payload_digest = || parts.last().map(|p| xxhash_rust::xxh3::xxh3_64(p));
        if bytes > limits.max_message_bytes {
            read.sequence = EngineMessage::sequence_of(parts);
            read.identity = read.sequence.and(payload_digest());
            read.rejected = Some(Rejection::Oversize {
                bytes,
                max: limits.max_message_bytes,
            });
            return read;
        }
        let message = match EngineMessage::parse(parts) {
            Ok(message) => message,
            Err(e) => {
                read.rejected = Some(e.into());
                return read;
            }
        };
        read.sequence = Some(message.sequence);
        if replayed && message.is_replay_end() {
            read.replay_end = true;
            return read;
        }
        match decode_batch(&message.payload, &limits.decode) {
            Ok(batch) => match batch.dp_rank {
                Some(rank) if rank >= limits.max_dp_rank => {
                    read.rejected = Some(Rejection::DpRank {
                        rank,
                        max: limits.max_dp_rank,
                    });
                }
                _ => {
                    read.identity = Some(batch.identity());
                    read.batch = Some(batch);
                }
            },
            Err(e) => read.rejected = Some(e.into()),
        }
        if read.rejected.is_some() {
            read.identity = payload_digest();
        }
        read
    }
}

impl PublisherSequence<Batch> {
    /// Hands one read message to the sequence rule: a live message to
    /// [`PublisherSequence::live`], a replay reply to [`PublisherSequence::replayed`], the end
    /// marker to [`PublisherSequence::replay_end`], each batch with its identity. A message
    /// without a sequence gives no action.
    pub fn take(&mut self, read: Read) -> Vec<Action<Batch>> {
        let Some(sequence) = read.sequence else {
            return Vec::new();
        };
        if read.replay_end {
            return self.replay_end();
        }
        if read.replayed {
            self.replayed(sequence, read.identity, read.batch)
        } else {
            self.live(sequence, read.identity, read.batch)
        }
    }
}

#[cfg(test)]
mod tests;
