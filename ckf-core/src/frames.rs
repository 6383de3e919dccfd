//! Publication frames: what a producer sends a consumer (docs/design.md, "Publication
//! protocol").
//!
//! ```text
//! DcCkfSnapshot { tag, sequence, buckets }                       barrier snapshot tagged N
//! DcCkfDelta    { tag, base_sequence, sequence, images }          N -> N+1, absolute bucket images
//! DrainMarker   { tag, sequence }                                 exact final sequence N
//! Heartbeat     { tag, sequence }                                 liveness + last sent sequence
//! ```
//! A snapshot travels as [`SnapshotChunk`]s so that every transport message stays bounded. A
//! chunk carries whole bucket words as little-endian bytes; [`decode_chunk_words`] rejects
//! empty, misaligned and oversized chunks, and the consumer rejects out-of-order and truncated
//! snapshots (`docs/design.md`, "Cuckoo filter cases", case 10).

use thiserror::Error;

use crate::identity::StreamTag;

/// Liveness frame: "the stream of this lease is alive", with the last sequence the producer
/// sent under it (no content).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat {
    /// Sender and lease.
    pub tag: StreamTag,
    /// The last sequence sent under the lease: the last delta's, or the barrier snapshot's
    /// while no delta followed it (0 before any snapshot was sent). An active lane retires when
    /// it differs from the installed sequence ([`crate::lane::RetireReason::HeartbeatGap`]);
    /// a lane still awaiting its snapshot does not check it.
    pub sequence: u64,
}

/// The absolute image of one bucket after a batch: the consumer stores `image` as the bucket's
/// new value (not a diff).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BucketImage {
    /// Bucket index, `< bucket_count`.
    pub bucket: u32,
    /// Packed bucket word (four 16-bit slots, slot 0 in the low bits).
    pub image: u64,
}

/// A barrier snapshot: the complete producer table, tagged with the sequence `N` of the last
/// batch it includes. The first delta after it must be `N -> N+1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DcCkfSnapshot {
    /// Sender and lease.
    pub tag: StreamTag,
    /// Terminal sequence `N` the snapshot is equivalent to.
    pub sequence: u64,
    /// Every bucket word, `bucket_count` long, index = bucket.
    pub buckets: Vec<u64>,
}

/// One piece of a snapshot: `words` are little-endian `u64` bucket words for buckets
/// `first_bucket .. first_bucket + words.len() / 8`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotChunk {
    /// Sender and lease.
    pub tag: StreamTag,
    /// Terminal sequence `N` of the snapshot this chunk belongs to.
    pub sequence: u64,
    /// Index of the first bucket in `words`.
    pub first_bucket: u64,
    /// Whole bucket words, 8 little-endian bytes each; length a nonzero multiple of 8.
    pub words: Vec<u8>,
}

/// A sequenced batch of absolute bucket images, `base_sequence -> sequence`
/// (`sequence == base_sequence + 1` for a well-formed delta).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DcCkfDelta {
    /// Sender and lease.
    pub tag: StreamTag,
    /// The sequence the consumer must have installed for this delta to apply.
    pub base_sequence: u64,
    /// The sequence the consumer has installed after applying it.
    pub sequence: u64,
    /// Absolute images, unique buckets, non-empty, in the order they must be installed (a
    /// relocated fingerprint reaches its new bucket before it leaves its old one).
    pub images: Vec<BucketImage>,
    /// Age in milliseconds, at send time, of the oldest change in this batch, measured on the
    /// producer's monotonic clock (used by the consumer's dirty-to-applied lag policy).
    pub oldest_change_age_ms: u64,
}

/// Exact drain marker: "the last batch I sent was `sequence`". Detects a lost final delta.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainMarker {
    /// Sender and lease.
    pub tag: StreamTag,
    /// Sequence of the final batch sent under this lease.
    pub sequence: u64,
}

/// Errors decoding a snapshot chunk.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ChunkError {
    /// The chunk holds no bytes.
    #[error("snapshot chunk at bucket {first_bucket} is empty")]
    Empty {
        /// The chunk's first bucket.
        first_bucket: u64,
    },
    /// The byte length is not a multiple of 8.
    #[error("snapshot chunk at bucket {first_bucket} has {len} bytes, not a multiple of 8")]
    Misaligned {
        /// The chunk's first bucket.
        first_bucket: u64,
        /// Its byte length.
        len: usize,
    },
    /// The chunk reaches past the last bucket.
    #[error("snapshot chunk covers buckets {first_bucket}..{end} but the table has {bucket_count}")]
    Oversized {
        /// The chunk's first bucket.
        first_bucket: u64,
        /// One past its last bucket.
        end: u64,
        /// Buckets in the table.
        bucket_count: u64,
    },
}

impl DcCkfSnapshot {
    /// Splits the snapshot into chunks of at most `max_chunk_bytes` bytes of words each
    /// (rounded down to whole words, at least one word).
    pub fn chunks(&self, max_chunk_bytes: usize) -> impl Iterator<Item = SnapshotChunk> + '_ {
        let per_chunk = (max_chunk_bytes / 8).max(1);
        self.buckets
            .chunks(per_chunk)
            .enumerate()
            .map(move |(i, words)| SnapshotChunk {
                tag: self.tag,
                sequence: self.sequence,
                first_bucket: (i * per_chunk) as u64,
                words: words.iter().flat_map(|w| w.to_le_bytes()).collect(),
            })
    }
}

/// Decodes a chunk's words after checking it is non-empty, whole-word and inside a table of
/// `bucket_count` buckets.
///
/// # Errors
/// [`ChunkError::Empty`], [`ChunkError::Misaligned`] or [`ChunkError::Oversized`].
pub fn decode_chunk_words(
    first_bucket: u64,
    bytes: &[u8],
    bucket_count: u64,
) -> Result<impl ExactSizeIterator<Item = u64> + '_, ChunkError> {
    if bytes.is_empty() {
        return Err(ChunkError::Empty { first_bucket });
    }
    if !bytes.len().is_multiple_of(8) {
        return Err(ChunkError::Misaligned {
            first_bucket,
            len: bytes.len(),
        });
    }
    let end = first_bucket.saturating_add((bytes.len() / 8) as u64);
    if end > bucket_count {
        return Err(ChunkError::Oversized {
            first_bucket,
            end,
            bucket_count,
        });
    }
    Ok(bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("chunks_exact(8)"))))
}
