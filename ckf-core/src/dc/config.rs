//! A producer state's configuration ([`DcCkfConfig`], the kick bounds, [`SLICE_LINES`]) and why
//! one cannot be built ([`DcCkfError`]).

use thiserror::Error;

use crate::addressing::{FormatError, TableFormat};

use super::block_map::BlockMap;

/// Default kick bound.
///
/// 500 is the bound of the original cuckoo-filter evaluation (Fan et al., CoNEXT 2014). With
/// 4-slot buckets, insertions below ~95% load almost always finish within a few dozen kicks, so
/// 500 only matters at the cliff, where it caps a failed attempt (and its rollback) at about a
/// thousand bucket reads and writes — tens of microseconds — before the block is omitted.
pub const DEFAULT_MAX_KICKS: u32 = 500;
/// Largest accepted `max_kicks`: bounds the worst-case latency of one block and the undo log
/// (16 bytes per kick, allocated up front).
pub const MAX_KICKS_LIMIT: u32 = 100_000;

/// Configuration of one producer state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DcCkfConfig {
    /// Table format (bucket count, seed, ...); must equal the consumer's.
    pub format: TableFormat,
    /// Kick bound for cuckoo insertion, `0..=MAX_KICKS_LIMIT`. `0` disables relocation: a block
    /// is stored only if one of its two buckets has an empty slot.
    pub max_kicks: u32,
    /// Blocks the exact block map is sized for from the start, `0..=format.slot_count()`
    /// (0: none, the map grows as blocks arrive). The map grows by 1.5x at 90% load, and each
    /// growth rehashes every tracked block inside the store that triggers it: a pause of the
    /// DC's ingest and publication, 0.54-0.64 s at 12.76 M blocks (Zen 3 guest, `producer --
    /// growth`). A state that reserves N blocks never grows below N, and never shrinks below
    /// it either, for about 17.8 bytes per reserved block held from the start (at least 256
    /// bytes: four 64-byte lines). A reserved map still grows past N, as an unreserved one
    /// does. A table cannot track more blocks than it has slots, hence the bound.
    pub reserve_blocks: u64,
    /// Block-map lines (four blocks each) one slice of whole-map work covers: a
    /// [`DcCkfState::release_step`](crate::dc::DcCkfState::release_step) of the clears in progress (a member's clear, a worker's
    /// removal) and a [`DcCkfState::capture_step`](crate::dc::DcCkfState::capture_step) of a checkpoint's ownership image. With a
    /// non-zero value clears leave their sweep to the caller's `release_step`s; `0` (the
    /// default) sweeps the whole map inside the clear itself and captures an image in one step.
    /// The producer's actor uses [`SLICE_LINES`].
    pub slice_lines: u32,
}

/// The producer's [`DcCkfConfig::slice_lines`]: 8,192 lines, 32,768 slots (512 KiB of
/// the block map) per slice: at most ~3 ms of CPU however much a clear releases, ~0.3 ms when
/// it releases little; a checkpoint's capture ~0.3 ms per slice on average, 7.8 ms at the
/// longest at 10^7 blocks (`cargo bench -p ckf-core --bench removal`).
pub const SLICE_LINES: u32 = 8_192;

impl DcCkfConfig {
    /// `format` with [`DEFAULT_MAX_KICKS`], no reservation, clears swept in their call.
    pub fn new(format: TableFormat) -> Self {
        Self {
            format,
            max_kicks: DEFAULT_MAX_KICKS,
            reserve_blocks: 0,
            slice_lines: 0,
        }
    }
}

/// Errors building a [`DcCkfState`](crate::dc::DcCkfState).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DcCkfError {
    /// The table format is invalid.
    #[error("invalid table format: {0}")]
    Format(#[from] FormatError),
    /// `max_kicks` exceeds [`MAX_KICKS_LIMIT`].
    #[error("max_kicks {0} exceeds the limit {MAX_KICKS_LIMIT}")]
    MaxKicksTooLarge(u32),
    /// `reserve_blocks` exceeds the table's slots: it could never track that many blocks.
    #[error(
        "reserve_blocks {reserve_blocks} exceeds the table's {slot_count} slots (a table tracks at most one block per slot)"
    )]
    ReserveTooLarge {
        /// Requested reservation, in blocks.
        reserve_blocks: u64,
        /// Slots of the table (`bucket_count * 4`).
        slot_count: u64,
    },
    /// The allocator refused the block map's size for a reservation
    /// ([`DcCkfConfig::reserve_blocks`]) or a presizing ([`DcCkfState::presize_blocks`](crate::dc::DcCkfState::presize_blocks)).
    #[error("cannot allocate a block map for {reserve_blocks} blocks ({bytes} bytes)")]
    ReserveAllocation {
        /// Blocks the map was to be sized for.
        reserve_blocks: u64,
        /// Bytes of the block map's lines it needs.
        bytes: u64,
    },
    /// The allocator refused the table (`bucket_count * 8` bytes) or its dirty tracking.
    #[error("cannot allocate a producer table of {bucket_count} buckets ({bytes} bytes)")]
    Allocation {
        /// Requested buckets.
        bucket_count: u64,
        /// Bytes of the bucket words alone.
        bytes: u64,
    },
}

/// Whether the allocator grants `bytes` now (asked for, then given back at once), so that a
/// size it refuses becomes a typed error rather than an abort at the real allocation.
pub(super) fn allocator_grants(bytes: usize) -> bool {
    Vec::<u8>::new().try_reserve_exact(bytes).is_ok()
}

/// Asks the allocator for a block map sized for `blocks` entries (a reservation or a
/// presizing) and returns the entry count to size it with.
///
/// # Errors
/// [`DcCkfError::ReserveAllocation`] when the allocator refuses those lines.
pub(super) fn block_map_granted(blocks: u64) -> Result<usize, DcCkfError> {
    let entries = usize::try_from(blocks).unwrap_or(usize::MAX);
    let bytes = BlockMap::reserve_bytes(entries);
    if allocator_grants(bytes) {
        Ok(entries)
    } else {
        Err(DcCkfError::ReserveAllocation {
            reserve_blocks: blocks,
            bytes: bytes as u64,
        })
    }
}
