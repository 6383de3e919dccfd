//! The block-keyed half of the producer state ([`Blocks`]: the exact block map, the filter
//! table, its dirty tracking and the counters) and the prefetch pipeline that applies an
//! event's blocks with the cache lines of the blocks ahead already on their way.

use crate::addressing::{Addressing, Location};
use crate::dirty::DirtyTracker;
use crate::mutator::Mutator;

use super::block_map::{BlockMap, Probe};
use super::events::BlockError;
use super::maps::SHRINK_MIN_CAPACITY;
use super::tags::{Tag, TagSet};

/// Blocks of an event located and prefetched ahead of the one being applied. Far enough for
/// the lines of the filter and the block map (four cache lines per block) to arrive from DRAM
/// while the blocks before them are applied; near enough that the misses in flight fit the
/// core's fill buffers. Chosen with `benches/producer.rs` (4, 16 and 32 measured within noise
/// of 8 on 2^20 buckets; see `ckf-core/README.md`).
pub(super) const PREFETCH_DISTANCE: usize = 8;

/// Tables of at least this many buckets (8 MiB of filter, plus a block map of ~3 M blocks and
/// more) take [`DcCkfState::prefetch_next`](crate::dc::DcCkfState::prefetch_next)'s hint; smaller ones ignore it. Measured with
/// `benches/producer.rs` at 85% load: 1.04-1.17x on 2^20 and 2^22 buckets, but 0.84x on 2^16
/// (everything in cache: the hint's extra work buys nothing there).
pub(super) const LOOKAHEAD_MIN_BUCKETS: u64 = 1 << 20;

/// A block located ahead of its turn: its filter location and its block-map probe.
#[derive(Debug, Clone, Copy)]
pub(super) struct Prepared {
    loc: Location,
    probe: Probe,
}

impl Prepared {
    /// A placeholder for the prefetch ring before it is filled (never applied).
    pub(super) const EMPTY: Self = Prepared {
        loc: Location {
            fingerprint: 1,
            bucket_a: 0,
            bucket_b: 0,
        },
        probe: Probe::ZERO,
    };
}

/// Running counters behind [`DcCkfStats`].
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Counters {
    pub(super) omissions: u64,
    pub(super) unknown_removals: u64,
    pub(super) kicks: u64,
    pub(super) batches: u64,
    pub(super) cycles_broken: u64,
    pub(super) missing_fingerprints: u64,
}

/// Everything keyed by block hash: owners and refcounts, the table and its dirty tracking.
/// Split from the member table so a member's record can stay borrowed while blocks are applied.
#[derive(Debug, Clone)]
pub(super) struct Blocks {
    pub(super) addressing: Addressing,
    pub(super) blocks: BlockMap,
    pub(super) mutator: Mutator,
    pub(super) dirty: DirtyTracker,
    pub(super) resident: u64,
    pub(super) edges: u64,
    pub(super) counters: Counters,
    /// The first blocks of the event expected next ([`DcCkfState::prefetch_next`](crate::dc::DcCkfState::prefetch_next)): the tail of
    /// the next pipelined event prefetches them, so the prefetch ring runs on across events.
    pub(super) lookahead: [u64; PREFETCH_DISTANCE],
    pub(super) lookahead_len: usize,
    /// The look-ahead blocks the last pipelined event located (hash, location), reused by the
    /// next event's ring when its first blocks are those: no block is located twice. A
    /// `Prepared` depends only on the hash and the table format, never on the block map's size.
    pub(super) carried: [(u64, Prepared); PREFETCH_DISTANCE],
    pub(super) carried_len: usize,
    /// Block-map lines the walk hint prefetched (tests only: shows the hint ran).
    #[cfg(test)]
    pub(super) walk_hint_lines: usize,
}

/// What acquiring one edge did.
pub(super) enum Acquired {
    /// New `(member, hash)` edge.
    Edge,
    /// The member already owned the hash.
    Redundant,
}

impl Blocks {
    /// Locates `block_hash` in the filter and the block map and prefetches the cache lines an
    /// [`acquire`](Self::acquire) or [`release`](Self::release) of it will read.
    #[inline(always)]
    pub(super) fn prepare(&self, block_hash: u64) -> Prepared {
        // One mix serves both: the block map is seeded with the table seed (`Probe`'s bit
        // budget).
        let h = self.addressing.mix(block_hash);
        let p = Prepared {
            loc: self.addressing.locate_mixed(h),
            probe: Probe::from_mixed(h),
        };
        self.mutator.prefetch(p.loc);
        self.blocks.prefetch(p.probe);
        p
    }

    /// Calls `apply(self, hash, prepared)` for each block of `hashes` in order, with the
    /// block [`PREFETCH_DISTANCE`] places ahead already located and prefetched: the cache misses
    /// of an event's blocks overlap instead of being paid one after the other. With `STORE`,
    /// the block half that distance ahead (its buckets cached by then) also gets the buckets a
    /// relocation would read prefetched ([`Mutator::prefetch_relocation`]), and on a large,
    /// loaded block map the lines its walk would read ([`BlockMap::prefetch_walk`], gated once
    /// per event by [`BlockMap::walk_hint_active`]). The order of application (and so every
    /// rule about duplicates and order inside an event) is unchanged.
    #[inline(always)]
    pub(super) fn pipelined<const STORE: bool>(
        &mut self,
        hashes: &[u64],
        mut apply: impl FnMut(&mut Self, u64, Prepared),
    ) {
        const HALF: usize = PREFETCH_DISTANCE / 2;
        let mut ring = [Prepared::EMPTY; PREFETCH_DISTANCE];
        for (k, (slot, &h)) in ring.iter_mut().zip(hashes).enumerate() {
            *slot = match self.carried[..self.carried_len].get(k) {
                Some(&(carried, p)) if carried == h => p,
                _ => self.prepare(h),
            };
        }
        self.carried_len = 0;
        // Tested once per event: the map's size and load move by a few entries within one.
        let walk_hint = STORE && self.blocks.walk_hint_active();
        // An event shorter than the ring: the look-ahead's first blocks already fit in it.
        for j in 0..PREFETCH_DISTANCE
            .saturating_sub(hashes.len())
            .min(self.lookahead_len)
        {
            let next = self.lookahead[j];
            self.carried[j] = (next, self.prepare(next));
            self.carried_len = j + 1;
        }
        for (i, &h) in hashes.iter().enumerate() {
            if STORE && i + HALF < hashes.len() {
                let ahead = ring[(i + HALF) % PREFETCH_DISTANCE];
                self.mutator.prefetch_relocation(ahead.loc);
                if walk_hint {
                    let hinted = self.blocks.prefetch_walk(ahead.probe);
                    #[cfg(test)]
                    {
                        self.walk_hint_lines += hinted.map_or(0, |lines| lines.len());
                    }
                    #[cfg(not(test))]
                    let _ = hinted;
                }
            }
            let p = ring[i % PREFETCH_DISTANCE];
            if let Some(&ahead) = hashes.get(i + PREFETCH_DISTANCE) {
                ring[i % PREFETCH_DISTANCE] = self.prepare(ahead);
            } else if let Some(j) = (i + PREFETCH_DISTANCE)
                .checked_sub(hashes.len())
                .filter(|&j| j < self.lookahead_len)
            {
                // The next event's block: located and prefetched now, kept for its ring.
                let next = self.lookahead[j];
                self.carried[j] = (next, self.prepare(next));
                self.carried_len = j + 1;
            }
            apply(self, h, p);
        }
        self.lookahead_len = 0;
    }

    /// Adds `tag` as an owner of `block_hash`; inserts its fingerprint on `0 -> 1`.
    #[inline]
    pub(super) fn acquire(
        &mut self,
        block_hash: u64,
        tag: Tag,
        p: Prepared,
    ) -> Result<Acquired, BlockError> {
        match self.blocks.find(block_hash, p.probe) {
            Some(pos) => {
                if self.blocks.has_owner(pos, block_hash, tag) {
                    return Ok(Acquired::Redundant);
                }
                self.blocks.add_owner(pos, block_hash, tag);
            }
            None => match self.mutator.insert(p.loc) {
                Ok(kicks) => {
                    self.blocks.insert_new(block_hash, p.probe, tag);
                    self.resident += 1;
                    self.counters.kicks += u64::from(kicks);
                    for w in self.mutator.last_writes() {
                        self.dirty.touch(w.bucket, w.before);
                    }
                }
                Err(failed) => {
                    self.counters.omissions += 1;
                    return Err(BlockError::CapacityExhausted {
                        block_hash,
                        kicks: failed.kicks,
                    });
                }
            },
        }
        self.edges += 1;
        Ok(Acquired::Edge)
    }

    /// Drops `tag` as an owner of `block_hash`; removes one copy on `1 -> 0`. `false` (and no
    /// change) when `tag` does not own it.
    #[inline]
    pub(super) fn release(&mut self, block_hash: u64, tag: Tag, p: Prepared) -> bool {
        let Some(pos) = self.blocks.find(block_hash, p.probe) else {
            return false;
        };
        let Some(emptied) = self.blocks.drop_owner(pos, block_hash, tag) else {
            return false;
        };
        self.edges -= 1;
        if !emptied {
            return true;
        }
        if self.mutator.remove(p.loc) {
            self.resident -= 1;
            for w in self.mutator.last_writes() {
                self.dirty.touch(w.bucket, w.before);
            }
        } else {
            debug_assert!(false, "tracked block {block_hash:#x} has no fingerprint");
            self.counters.missing_fingerprints += 1;
        }
        true
    }

    /// Drops the tags in `dying` from the blocks of lines `range` (and the stash when `stash`),
    /// see [`BlockMap::sweep`]; `1 -> 0` transitions remove one copy each. Calls
    /// `dropped(tag)` per edge dropped.
    pub(super) fn sweep(
        &mut self,
        range: std::ops::Range<usize>,
        stash: bool,
        dying: &TagSet,
        mut dropped: impl FnMut(Tag),
    ) {
        let Blocks {
            addressing,
            blocks,
            mutator,
            dirty,
            resident,
            edges,
            counters,
            ..
        } = self;
        let on_drop = |tag| {
            *edges -= 1;
            dropped(tag);
        };
        blocks.sweep(range, stash, dying, on_drop, |h| {
            if mutator.remove(addressing.locate(h)) {
                *resident -= 1;
                for w in mutator.last_writes() {
                    dirty.touch(w.bucket, w.before);
                }
            } else {
                debug_assert!(false, "tracked block {h:#x} has no fingerprint");
                counters.missing_fingerprints += 1;
            }
        });
    }

    /// Shrinks the block map (and its spill map) when it emptied far below its capacity
    /// ([`BlockMap::shrink`]).
    pub(super) fn shrink(&mut self) {
        self.blocks.shrink(SHRINK_MIN_CAPACITY);
    }
}
