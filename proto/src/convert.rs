//! Wire <-> `ckf-core` conversions: the single place where a `ckf.v1` message becomes a core
//! value (and back).
//!
//! Wire -> core conversions are fallible and return a [`WireError`] naming the message and field
//! at fault: a required sub-message is missing, a name breaks the `[A-Za-z0-9._-]{1,64}` rule, a
//! table format is not one this build speaks, a number does not fit its core type, or a delta's
//! `buckets` and `images` differ in length. Protocol rules (lease currency, sequence contiguity,
//! bucket ranges, uniqueness) are *not* checked here: they belong to `ckf-core`'s consumer.
//! Core -> wire conversions are infallible `From` impls.

use ckf_core::addressing::{FormatError, TableFormat};
use ckf_core::frames::{BucketImage, DcCkfDelta, DcCkfSnapshot, DrainMarker, SnapshotChunk};
use ckf_core::global::AttachMode;
use ckf_core::identity::{
    LaneLease, NameError, PoolId, ProducerIdentity, ProducerIncarnation, StreamTag,
};
use ckf_core::lane::{ContentionKind, LaneState, RetireReason};
use thiserror::Error;

use crate::v1;

/// A wire value that cannot become a core value.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    /// A required sub-message is absent (proto3 message fields are optional on the wire).
    #[error("{message}.{field} is required")]
    MissingField {
        /// The message that lacks it, e.g. `"Attach"`.
        message: &'static str,
        /// The field, e.g. `"pool"`.
        field: &'static str,
    },
    /// A domain or DC name breaks the naming rule.
    #[error("{field}: {source}")]
    BadName {
        /// The field, e.g. `"PoolId.dc"`.
        field: &'static str,
        /// The rule that failed.
        source: NameError,
    },
    /// The table format is not one this build speaks (version, fingerprint width, slots per
    /// bucket, or a bucket count that is odd or out of range).
    #[error("TableFormat: {0}")]
    BadFormat(#[from] FormatError),
    /// A number does not fit the core type's range.
    #[error("{field} = {value} is out of range (at most {max})")]
    OutOfRange {
        /// The field, e.g. `"LaneLease.lane"`.
        field: &'static str,
        /// The received value.
        value: u64,
        /// The largest accepted value.
        max: u64,
    },
    /// A delta's `buckets` and `images` have different lengths.
    #[error("Delta has {buckets} buckets but {images} images")]
    LengthMismatch {
        /// `buckets.len()`.
        buckets: usize,
        /// `images.len()`.
        images: usize,
    },
}

fn required<T>(
    value: Option<T>,
    message: &'static str,
    field: &'static str,
) -> Result<T, WireError> {
    value.ok_or(WireError::MissingField { message, field })
}

fn narrow<T: TryFrom<u64>>(field: &'static str, value: u64, max: T) -> Result<T, WireError>
where
    u64: From<T>,
{
    T::try_from(value).map_err(|_| WireError::OutOfRange {
        field,
        value,
        max: u64::from(max),
    })
}

// ---- table format -------------------------------------------------------------------------

impl From<TableFormat> for v1::TableFormat {
    fn from(f: TableFormat) -> Self {
        Self {
            version: u32::from(f.version),
            seed: f.seed,
            bucket_count: f.bucket_count,
            fingerprint_bits: u32::from(f.fingerprint_bits),
            slots_per_bucket: u32::from(f.slots_per_bucket),
        }
    }
}

impl TryFrom<v1::TableFormat> for TableFormat {
    type Error = WireError;

    /// Narrows and validates every field ([`TableFormat::validate`]).
    fn try_from(w: v1::TableFormat) -> Result<Self, WireError> {
        let format = TableFormat {
            version: narrow("TableFormat.version", u64::from(w.version), u16::MAX)?,
            seed: w.seed,
            bucket_count: w.bucket_count,
            fingerprint_bits: narrow(
                "TableFormat.fingerprint_bits",
                u64::from(w.fingerprint_bits),
                u8::MAX,
            )?,
            slots_per_bucket: narrow(
                "TableFormat.slots_per_bucket",
                u64::from(w.slots_per_bucket),
                u8::MAX,
            )?,
        };
        format.validate()?;
        Ok(format)
    }
}

// ---- pool, lease, identity ----------------------------------------------------------------

impl From<&PoolId> for v1::PoolId {
    fn from(p: &PoolId) -> Self {
        Self {
            domain: p.domain.as_str().to_owned(),
            dc: p.dc.as_str().to_owned(),
        }
    }
}

impl From<PoolId> for v1::PoolId {
    fn from(p: PoolId) -> Self {
        Self::from(&p)
    }
}

impl TryFrom<v1::PoolId> for PoolId {
    type Error = WireError;

    fn try_from(w: v1::PoolId) -> Result<Self, WireError> {
        Ok(PoolId {
            domain: ckf_core::IndexerDomainId::new(w.domain).map_err(|source| {
                WireError::BadName {
                    field: "PoolId.domain",
                    source,
                }
            })?,
            dc: ckf_core::DcId::new(w.dc).map_err(|source| WireError::BadName {
                field: "PoolId.dc",
                source,
            })?,
        })
    }
}

impl From<LaneLease> for v1::LaneLease {
    fn from(l: LaneLease) -> Self {
        Self {
            consumer_instance: l.consumer_instance,
            lane: u32::from(l.lane),
            epoch: l.epoch,
        }
    }
}

/// Largest lane index on the wire (`MAX_LANES - 1`).
const MAX_LANE: u8 = (ckf_core::bucket::MAX_LANES - 1) as u8;

impl TryFrom<v1::LaneLease> for LaneLease {
    type Error = WireError;

    /// Checks that `lane` is at most 63; whether the lane exists in a manifest is the
    /// consumer's question.
    fn try_from(w: v1::LaneLease) -> Result<Self, WireError> {
        let lane = narrow("LaneLease.lane", u64::from(w.lane), u8::MAX)?;
        if lane > MAX_LANE {
            return Err(WireError::OutOfRange {
                field: "LaneLease.lane",
                value: u64::from(w.lane),
                max: u64::from(MAX_LANE),
            });
        }
        Ok(LaneLease {
            consumer_instance: w.consumer_instance,
            lane,
            epoch: w.epoch,
        })
    }
}

impl From<&ProducerIdentity> for v1::Attach {
    fn from(id: &ProducerIdentity) -> Self {
        Self {
            pool: Some((&id.pool).into()),
            incarnation: id.incarnation.0,
            format: Some(id.format.into()),
            mode: v1::AttachMode::Takeover as i32,
        }
    }
}

impl From<AttachMode> for v1::AttachMode {
    fn from(mode: AttachMode) -> Self {
        match mode {
            AttachMode::Takeover => Self::Takeover,
            AttachMode::IfVacant => Self::IfVacant,
        }
    }
}

/// The attach mode of a wire `Attach` (absent = `TAKEOVER`, proto3's default).
///
/// # Errors
/// [`WireError::OutOfRange`] for a value this build does not define.
pub fn attach_mode(w: &v1::Attach) -> Result<AttachMode, WireError> {
    match v1::AttachMode::try_from(w.mode) {
        Ok(v1::AttachMode::Takeover) => Ok(AttachMode::Takeover),
        Ok(v1::AttachMode::IfVacant) => Ok(AttachMode::IfVacant),
        Err(_) => Err(WireError::OutOfRange {
            field: "Attach.mode",
            value: u64::from(w.mode as u32),
            max: v1::AttachMode::IfVacant as u64,
        }),
    }
}

impl From<ContentionKind> for v1::ContentionKind {
    fn from(kind: ContentionKind) -> Self {
        match kind {
            ContentionKind::IfVacantRefused => Self::IfVacantRefused,
            ContentionKind::Takeover => Self::Takeover,
        }
    }
}

impl TryFrom<v1::Attach> for ProducerIdentity {
    type Error = WireError;

    fn try_from(w: v1::Attach) -> Result<Self, WireError> {
        Ok(ProducerIdentity {
            pool: required(w.pool, "Attach", "pool")?.try_into()?,
            incarnation: ProducerIncarnation(w.incarnation),
            format: required(w.format, "Attach", "format")?.try_into()?,
        })
    }
}

/// Attach identity, decoded without validating the format, so a receiver can name both formats
/// in a mismatch error even when the producer's is one this build does not speak.
///
/// # Errors
/// [`WireError::MissingField`] or [`WireError::BadName`].
pub fn attach_pool(w: &v1::Attach) -> Result<PoolId, WireError> {
    required(w.pool.clone(), "Attach", "pool")?.try_into()
}

fn tag(
    lease: Option<v1::LaneLease>,
    message: &'static str,
    incarnation: ProducerIncarnation,
) -> Result<StreamTag, WireError> {
    Ok(StreamTag {
        incarnation,
        lease: required(lease, message, "lease")?.try_into()?,
    })
}

// ---- publication frames -------------------------------------------------------------------
//
// Frames after Attach carry only the lease; the producer incarnation comes from the stream's
// Attach, so wire -> core frame conversions take it as an argument.

/// Decodes a snapshot chunk received on a stream attached by `incarnation`.
///
/// # Errors
/// [`WireError::MissingField`] (lease) or [`WireError::OutOfRange`] (lane).
pub fn snapshot_chunk_from_wire(
    w: v1::SnapshotChunk,
    incarnation: ProducerIncarnation,
) -> Result<SnapshotChunk, WireError> {
    Ok(SnapshotChunk {
        tag: tag(w.lease, "SnapshotChunk", incarnation)?,
        sequence: w.sequence,
        first_bucket: w.first_bucket,
        words: w.words,
    })
}

/// Decodes a delta received on a stream attached by `incarnation`.
///
/// # Errors
/// [`WireError::MissingField`] (lease), [`WireError::OutOfRange`] (lane) or
/// [`WireError::LengthMismatch`]. Empty, duplicate and out-of-range buckets are left to the
/// consumer's acceptance rules.
pub fn delta_from_wire(
    w: v1::Delta,
    incarnation: ProducerIncarnation,
) -> Result<DcCkfDelta, WireError> {
    if w.buckets.len() != w.images.len() {
        return Err(WireError::LengthMismatch {
            buckets: w.buckets.len(),
            images: w.images.len(),
        });
    }
    Ok(DcCkfDelta {
        tag: tag(w.lease, "Delta", incarnation)?,
        base_sequence: w.base_sequence,
        sequence: w.sequence,
        images: w
            .buckets
            .iter()
            .zip(&w.images)
            .map(|(&bucket, &image)| BucketImage { bucket, image })
            .collect(),
        oldest_change_age_ms: w.oldest_change_age_ms,
    })
}

/// Decodes a drain marker received on a stream attached by `incarnation`.
///
/// # Errors
/// [`WireError::MissingField`] (lease) or [`WireError::OutOfRange`] (lane).
pub fn drain_marker_from_wire(
    w: v1::DrainMarker,
    incarnation: ProducerIncarnation,
) -> Result<DrainMarker, WireError> {
    Ok(DrainMarker {
        tag: tag(w.lease, "DrainMarker", incarnation)?,
        sequence: w.sequence,
    })
}

/// Decodes a heartbeat's lease and last sent sequence.
///
/// # Errors
/// [`WireError::MissingField`] (lease) or [`WireError::OutOfRange`] (lane).
pub fn heartbeat_from_wire(
    w: v1::Heartbeat,
    incarnation: ProducerIncarnation,
) -> Result<(StreamTag, u64), WireError> {
    Ok((tag(w.lease, "Heartbeat", incarnation)?, w.sequence))
}

/// A load report as received: its tag, sequence, the pool's load and its age when sent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadFrame {
    /// The stream's lease and incarnation.
    pub tag: StreamTag,
    /// The report's number under the lease.
    pub sequence: u64,
    /// The pool's load.
    pub load: ckf_core::route::PoolLoad,
    /// How old the oldest observation in it was when sent.
    pub age: std::time::Duration,
}

/// Decodes a load report received on a stream attached by `incarnation` (its values are
/// checked where it is kept, `ckf_core::route::LaneLoads::report`).
///
/// # Errors
/// [`WireError::MissingField`] (lease) or [`WireError::OutOfRange`] (lane).
pub fn load_from_wire(
    w: v1::LoadReport,
    incarnation: ProducerIncarnation,
) -> Result<LoadFrame, WireError> {
    Ok(LoadFrame {
        tag: tag(w.lease, "LoadReport", incarnation)?,
        sequence: w.sequence,
        load: ckf_core::route::PoolLoad {
            engines_reporting: w.engines_reporting,
            engines_configured: w.engines_configured,
            running: w.running,
            waiting: w.waiting,
            kv_usage: w.kv_usage,
            prefill_tokens_per_s: w.prefill_tokens_per_s,
        },
        age: std::time::Duration::from_millis(w.age_ms),
    })
}

/// The wire form of report `sequence` of `load` under `lease`, `age` old.
pub fn load_to_wire(
    lease: LaneLease,
    sequence: u64,
    load: &ckf_core::route::PoolLoad,
    age: std::time::Duration,
) -> v1::LoadReport {
    v1::LoadReport {
        lease: Some(lease.into()),
        sequence,
        age_ms: u64::try_from(age.as_millis()).unwrap_or(u64::MAX),
        engines_reporting: load.engines_reporting,
        engines_configured: load.engines_configured,
        running: load.running,
        waiting: load.waiting,
        kv_usage: load.kv_usage,
        prefill_tokens_per_s: load.prefill_tokens_per_s,
    }
}

impl From<&SnapshotChunk> for v1::SnapshotChunk {
    fn from(c: &SnapshotChunk) -> Self {
        Self {
            lease: Some(c.tag.lease.into()),
            sequence: c.sequence,
            first_bucket: c.first_bucket,
            words: c.words.clone(),
        }
    }
}

impl From<SnapshotChunk> for v1::SnapshotChunk {
    fn from(c: SnapshotChunk) -> Self {
        Self {
            lease: Some(c.tag.lease.into()),
            sequence: c.sequence,
            first_bucket: c.first_bucket,
            words: c.words,
        }
    }
}

impl From<&DcCkfDelta> for v1::Delta {
    fn from(d: &DcCkfDelta) -> Self {
        Self {
            lease: Some(d.tag.lease.into()),
            base_sequence: d.base_sequence,
            sequence: d.sequence,
            buckets: d.images.iter().map(|i| i.bucket).collect(),
            images: d.images.iter().map(|i| i.image).collect(),
            oldest_change_age_ms: d.oldest_change_age_ms,
        }
    }
}

impl From<&DrainMarker> for v1::DrainMarker {
    fn from(m: &DrainMarker) -> Self {
        Self {
            lease: Some(m.tag.lease.into()),
            sequence: m.sequence,
        }
    }
}

/// Wire chunks of a barrier snapshot, each carrying at most `max_chunk_bytes` bytes of words
/// (see [`DcCkfSnapshot::chunks`]).
pub fn snapshot_to_wire(
    snapshot: &DcCkfSnapshot,
    max_chunk_bytes: usize,
) -> impl Iterator<Item = v1::SnapshotChunk> + '_ {
    snapshot
        .chunks(max_chunk_bytes)
        .map(v1::SnapshotChunk::from)
}

// ---- lane states and retirement reasons (consumer -> wire only) ---------------------------

impl From<LaneState> for v1::LaneState {
    fn from(state: LaneState) -> Self {
        match state {
            LaneState::Unassigned => Self::Unassigned,
            LaneState::AwaitingSnapshot => Self::AwaitingSnapshot,
            LaneState::Active => Self::Active,
            LaneState::Retired => Self::Retired,
        }
    }
}

/// The wire reason of a consumer retirement. Several core reasons share one wire value: gap and
/// non-contiguous delta are both `GAP`; malformed deltas, malformed snapshots and frames not
/// allowed in the lane's state are `MALFORMED_FRAME`. (`SUPERSEDED` and `SHUTDOWN` are not lane
/// retirements in the core; services send them when they end a stream.)
impl From<&RetireReason> for v1::RetireReason {
    fn from(reason: &RetireReason) -> Self {
        match reason {
            RetireReason::Gap { .. }
            | RetireReason::NonContiguous { .. }
            | RetireReason::HeartbeatGap { .. } => Self::Gap,
            RetireReason::MalformedDelta(_)
            | RetireReason::MalformedSnapshot(_)
            | RetireReason::NotActive { .. } => Self::MalformedFrame,
            RetireReason::LostFinalDelta { .. } => Self::LostFinalDelta,
            RetireReason::HeartbeatTimeout { .. } => Self::HeartbeatTimeout,
            RetireReason::LagExceeded { .. } => Self::LagExceeded,
            RetireReason::Saturated { .. } => Self::Saturated,
            RetireReason::ApplyFailed { .. } => Self::ApplyFailure,
            RetireReason::StreamLost { .. } => Self::StreamLost,
            RetireReason::Removed => Self::Removed,
            RetireReason::DrainGraceExpired { .. } => Self::DrainGraceExpired,
        }
    }
}

/// How a producer fences its publisher when the indexer retires its stream with `reason`:
/// `SUPERSEDED` (a newer lease for the lane went to another attachment) is
/// [`FenceReason::Superseded`](ckf_core::publication::FenceReason::Superseded); every other
/// reason, `UNSPECIFIED` and `SHUTDOWN` included, leaves the stream uncertain
/// ([`FenceReason::UncertainDelivery`](ckf_core::publication::FenceReason::UncertainDelivery)):
/// a new lease and barrier snapshot recover it.
impl From<v1::RetireReason> for ckf_core::publication::FenceReason {
    fn from(reason: v1::RetireReason) -> Self {
        match reason {
            v1::RetireReason::Superseded => Self::Superseded,
            v1::RetireReason::Unspecified
            | v1::RetireReason::Gap
            | v1::RetireReason::MalformedFrame
            | v1::RetireReason::LagExceeded
            | v1::RetireReason::HeartbeatTimeout
            | v1::RetireReason::Saturated
            | v1::RetireReason::LostFinalDelta
            | v1::RetireReason::ApplyFailure
            | v1::RetireReason::StreamLost
            | v1::RetireReason::DrainGraceExpired
            | v1::RetireReason::Removed
            | v1::RetireReason::Shutdown => Self::UncertainDelivery,
        }
    }
}

// ---- queries ------------------------------------------------------------------------------

/// A query by token ids as its core value (moves the token ids and strings, copies nothing).
/// Infallible: `""` becomes `None` (proto3 cannot tell absent from empty), `block_size` 0
/// becomes `None` (the indexer's); the query's rules are checked by
/// [`TokenQuery::sequence_hashes`](ckf_core::tokens::TokenQuery::sequence_hashes).
impl From<v1::FindMatchesByTokensRequest> for ckf_core::tokens::TokenQuery {
    fn from(w: v1::FindMatchesByTokensRequest) -> Self {
        let non_empty = |s: String| (!s.is_empty()).then_some(s);
        Self {
            token_ids: w.token_ids,
            lora_name: non_empty(w.lora_name),
            cache_salt: non_empty(w.cache_salt),
            multimodal: w
                .multimodal
                .into_iter()
                .map(|m| ckf_core::tokens::MultimodalItem {
                    identifier: m.identifier,
                    offset: m.offset,
                    length: m.length,
                })
                .collect(),
            block_size: (w.block_size != 0).then_some(w.block_size),
        }
    }
}

/// Wraps one frame into the `RelayFrame` oneof.
impl From<v1::relay_frame::Frame> for v1::RelayFrame {
    fn from(frame: v1::relay_frame::Frame) -> Self {
        Self { frame: Some(frame) }
    }
}

/// Wraps one reply into the `RelayReply` oneof.
impl From<v1::relay_reply::Reply> for v1::RelayReply {
    fn from(reply: v1::relay_reply::Reply) -> Self {
        Self { reply: Some(reply) }
    }
}

/// Most bytes one bucket image adds to an encoded `Delta`: **13**.
///
/// `Delta.buckets` (`repeated uint32`, field 4) and `Delta.images` (`repeated fixed64`,
/// field 5) are proto3 packed fields, so each field's tag and length prefix is written once
/// per message and every image adds only its two elements:
///
/// * its bucket index as a varint: 7 bits per byte, so a `u32` up to `2^32 - 1` (the largest
///   index of a `2^32`-bucket table) takes at most 5 bytes;
/// * its image as a `fixed64`: always 8 bytes.
///
/// The per-message part (the two tags, 1 byte each, and the two length prefixes, at most 5
/// bytes each, plus the lease and sequence fields) is not included: callers that size a frame
/// to a byte limit reserve an envelope allowance for it. Both services divide their message
/// budget by this number (the indexer to lower the images per delta it grants, the producer to
/// cut its deltas); a test derives it from prost's `encoded_len` of worst-case images.
pub const WIRE_BYTES_PER_IMAGE: usize = 13;

#[cfg(test)]
mod tests;
