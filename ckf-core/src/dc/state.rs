//! [`DcCkfState`]: the state type and its core methods (build, apply events, exact queries,
//! publication batches, stats). Clears in slices are `release.rs`'s, the ownership image
//! `image.rs`'s, member scans `member_scan.rs`'s, the quota rules `quota.rs`'s.

use crate::addressing::{Addressing, TableFormat};
use crate::bucket;
use crate::dirty::{DirtyTracker, PublicationBatch};
use crate::mutator::Mutator;

use super::block_map::{BlockMap, RebuildStats};
use super::blocks::{
    Acquired, Blocks, Counters, LOOKAHEAD_MIN_BUCKETS, PREFETCH_DISTANCE, Prepared,
};
use super::config::{
    DcCkfConfig, DcCkfError, MAX_KICKS_LIMIT, allocator_grants, block_map_granted,
};
use super::events::{BlockError, EventOutcome, KvEvent, KvEventKind, MemberId};
use super::ownership::Members;
use super::quota::{QuotaError, Quotas, StoreRequest};
use super::release::Releases;
use super::stats::DcCkfStats;
use super::tags::Tag;

/// One DC pool's producer state. See the module docs for the rules it keeps.
#[derive(Debug, Clone)]
pub struct DcCkfState {
    pub(super) config: DcCkfConfig,
    pub(super) quotas: Quotas,
    pub(super) members: Members,
    pub(super) blocks: Blocks,
    pub(super) releases: Releases,
}

impl DcCkfState {
    /// An empty state.
    ///
    /// # Errors
    /// [`DcCkfError::Format`] for an invalid format, [`DcCkfError::MaxKicksTooLarge`],
    /// [`DcCkfError::ReserveTooLarge`], [`DcCkfError::Allocation`] when the allocator refuses
    /// the table, [`DcCkfError::ReserveAllocation`] when it refuses the reserved block map.
    pub fn new(config: DcCkfConfig) -> Result<Self, DcCkfError> {
        let addressing = Addressing::new(&config.format)?;
        if config.max_kicks > MAX_KICKS_LIMIT {
            return Err(DcCkfError::MaxKicksTooLarge(config.max_kicks));
        }
        if config.reserve_blocks > config.format.slot_count() {
            return Err(DcCkfError::ReserveTooLarge {
                reserve_blocks: config.reserve_blocks,
                slot_count: config.format.slot_count(),
            });
        }
        // Ask the allocator first so an impossible table is a typed error, not an abort: the
        // table's words and the dirty tracker's, 12 bytes per bucket.
        let buckets = config.format.bucket_count;
        if !allocator_grants(buckets as usize * 12) {
            return Err(DcCkfError::Allocation {
                bucket_count: buckets,
                bytes: buckets * 8,
            });
        }
        let mut blocks = BlockMap::with_seed(config.format.seed);
        if config.reserve_blocks > 0 {
            blocks.reserve(block_map_granted(config.reserve_blocks)?);
        }
        let mutator = Mutator::new(addressing, config.max_kicks);
        let dirty = DirtyTracker::new(mutator.buckets().len());
        Ok(Self {
            config,
            quotas: Quotas::UNLIMITED,
            members: Members::default(),
            blocks: Blocks {
                addressing,
                blocks,
                mutator,
                dirty,
                resident: 0,
                edges: 0,
                counters: Counters::default(),
                lookahead: [0; PREFETCH_DISTANCE],
                lookahead_len: 0,
                carried: [(0, Prepared::EMPTY); PREFETCH_DISTANCE],
                carried_len: 0,
                #[cfg(test)]
                walk_hint_lines: 0,
            },
            releases: Releases::default(),
        })
    }

    /// The table format.
    pub fn format(&self) -> TableFormat {
        self.config.format
    }

    /// The configuration the state was built with.
    pub fn config(&self) -> DcCkfConfig {
        self.config
    }

    /// The addressing derived from the format.
    pub fn addressing(&self) -> &Addressing {
        &self.blocks.addressing
    }

    /// The quotas [`apply_from`](Self::apply_from) enforces ([`Quotas::UNLIMITED`] until
    /// [`set_quotas`](Self::set_quotas)).
    pub fn quotas(&self) -> Quotas {
        self.quotas
    }

    /// Sets the quotas [`apply_from`](Self::apply_from) enforces from now on (what is held
    /// already is kept, even above a new limit; it only refuses further stores).
    pub fn set_quotas(&mut self, quotas: Quotas) {
        self.quotas = quotas;
    }

    /// Applies one event on behalf of ingest source `source`, enforcing the [`Quotas`] (see
    /// [`quota`](super::quota)'s docs for what a source holds and how the check counts). A stored event
    /// charges an uncharged member to `source`. Removals and clears are never refused.
    ///
    /// # Errors
    /// [`QuotaError::EventTooLarge`], [`QuotaError::MemberFull`],
    /// [`QuotaError::SourceFull`] or [`QuotaError::WorkerRanks`]; the event was then not
    /// applied at all.
    pub fn apply_from(
        &mut self,
        source: &str,
        event: &KvEvent,
    ) -> Result<EventOutcome, QuotaError> {
        let block_hashes = match &event.kind {
            KvEventKind::Stored { block_hashes, .. } => block_hashes,
            KvEventKind::Removed { block_hashes } => {
                self.quotas.check_event(block_hashes.len())?;
                return Ok(self.remove(event.member, block_hashes));
            }
            KvEventKind::Cleared => return Ok(self.clear_member(event.member)),
        };
        self.check_store(source, event.member, block_hashes)?;
        let outcome = self.store(event.member, block_hashes);
        self.charge_if_uncharged(event.member, source);
        Ok(outcome)
    }

    /// Charges `member` to `source` if it owns blocks and is charged to nobody yet (see
    /// [`quota`](super::quota)'s docs: the first stored event that reaches an uncharged member charges it).
    pub(super) fn charge_if_uncharged(&mut self, member: MemberId, source: &str) {
        if let Some(tag) = self.members.tag(member)
            && self.members.record(tag).charge == 0
        {
            self.members.charge(tag, source);
        }
    }

    /// The quota check of a stored event: gathers what [`Quotas::check_store`] needs to know
    /// about the member (see [`quota`](super::quota)'s docs for the rules).
    fn check_store(
        &self,
        source: &str,
        member: MemberId,
        hashes: &[u64],
    ) -> Result<(), QuotaError> {
        let tag = self.members.tag(member);
        let holding = tag.map(|t| {
            let r = self.members.peek(t);
            (u64::from(r.owned), r.charge)
        });
        // Distinct hashes the member does not own yet: exactly the edges the event would add
        // (before capacity omissions).
        let fresh = || {
            let mut fresh: Vec<u64> = match tag {
                Some(t) => hashes
                    .iter()
                    .copied()
                    .filter(|&h| !self.blocks.blocks.owns(h, t))
                    .collect(),
                None => hashes.to_vec(),
            };
            fresh.sort_unstable();
            fresh.dedup();
            fresh.len() as u64
        };
        self.quotas.check_store(
            &self.members.charges,
            StoreRequest {
                source,
                member,
                blocks: hashes.len(),
                holding,
            },
            || self.members.worker_ranks(member.worker_id),
            fresh,
        )
    }

    /// Blocks held by `source` (see [`quota`](super::quota)'s docs); 0 when it holds none.
    pub fn source_held(&self, source: &str) -> u64 {
        let charges = &self.members.charges;
        charges.index_of(source).map_or(0, |i| charges.peek(i).held)
    }

    /// `(source, blocks held)` of every source holding blocks, in no particular order.
    pub fn source_holdings(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        self.members.charges.iter()
    }

    /// Sources holding at least one block (entries of the charge table).
    pub fn charged_sources(&self) -> usize {
        self.members.charges.len()
    }

    /// Blocks `member` owns (exact, O(1)).
    pub fn member_owned(&self, member: MemberId) -> u32 {
        self.members
            .tag(member)
            .map_or(0, |t| self.members.peek(t).owned)
    }

    /// Applies one event; dispatches to [`store`](Self::store), [`remove`](Self::remove) or
    /// [`clear_member`](Self::clear_member). No quota applies (the trusted engine path; ingest
    /// sources go through [`apply_from`](Self::apply_from)).
    pub fn apply(&mut self, event: &KvEvent) -> EventOutcome {
        match &event.kind {
            KvEventKind::Stored { block_hashes, .. } => self.store(event.member, block_hashes),
            KvEventKind::Removed { block_hashes } => self.remove(event.member, block_hashes),
            KvEventKind::Cleared => self.clear_member(event.member),
        }
    }

    /// A hint: the next [`store`](Self::store) or [`remove`](Self::remove) will be followed by
    /// an event of `block_hashes`. Its first blocks' cache lines are then prefetched during that
    /// event's last blocks, so a stream of events keeps its misses overlapped across event
    /// boundaries instead of restarting the prefetch ring at each event. Only the first
    /// 8 hashes (the prefetch distance) are kept, and a new hint replaces the last one. The
    /// hint is used, then dropped, by the next store or removal that walks its blocks (a
    /// removal by a member that owns blocks, even of an empty list, and any store of at least
    /// one block by a member with a tag, whatever the blocks' outcomes). An event that returns
    /// before (an empty store, a member over the tag limit, a removal by an unknown member, a
    /// clear, or a store refused by a quota) leaves it for a later event; an empty list
    /// withdraws it. It changes nothing but timing: a wrong, stale or unused hint
    /// costs a few wasted prefetches, and a located block is reused only for the same hash.
    /// Ignored on tables under 2^20 buckets, which live in the caches.
    pub fn prefetch_next(&mut self, block_hashes: &[u64]) {
        if self.config.format.bucket_count < LOOKAHEAD_MIN_BUCKETS {
            return;
        }
        let n = block_hashes.len().min(PREFETCH_DISTANCE);
        self.blocks.lookahead[..n].copy_from_slice(&block_hashes[..n]);
        self.blocks.lookahead_len = n;
    }

    /// `member` now holds `block_hashes`, in order. Each new `(member, hash)` edge increments
    /// the hash's refcount; a `0 -> 1` transition inserts one fingerprint, and if that fails for
    /// capacity the block is omitted without a trace (see the module docs).
    pub fn store(&mut self, member: MemberId, block_hashes: &[u64]) -> EventOutcome {
        let mut out = EventOutcome::default();
        if block_hashes.is_empty() {
            return out;
        }
        let Some(tag) = self.members.tag_or_insert(member) else {
            // Every block is refused alike: the member cannot get an owner tag.
            let limit = self.members.tag_limit;
            for &block_hash in block_hashes {
                out.fail(BlockError::MemberLimit { block_hash, limit });
            }
            self.blocks.counters.omissions += u64::from(out.omitted);
            return out;
        };
        self.blocks.pipelined::<true>(block_hashes, |blocks, h, p| {
            match blocks.acquire(h, tag, p) {
                Ok(Acquired::Edge) => out.applied += 1,
                Ok(Acquired::Redundant) => out.redundant += 1,
                Err(e) => out.fail(e),
            }
        });
        self.members.adjust(tag, out.applied, 0);
        self.members.release_if_empty(tag);
        out
    }

    /// `member` evicted `block_hashes`, in order. A hash the member does not own is an
    /// idempotent no-op (`unknown`); a `1 -> 0` transition removes one fingerprint copy.
    pub fn remove(&mut self, member: MemberId, block_hashes: &[u64]) -> EventOutcome {
        let mut out = EventOutcome::default();
        let Some(tag) = self.members.tag(member) else {
            out.unknown = block_hashes.len() as u32;
            self.blocks.counters.unknown_removals += block_hashes.len() as u64;
            return out;
        };
        self.blocks
            .pipelined::<false>(block_hashes, |blocks, h, p| {
                if blocks.release(h, tag, p) {
                    out.applied += 1;
                } else {
                    out.unknown += 1;
                }
            });
        self.blocks.counters.unknown_removals += u64::from(out.unknown);
        self.members.adjust(tag, 0, out.applied);
        self.members.release_if_empty(tag);
        self.shrink();
        out
    }

    /// `member` dropped every block: releases each of its edges; `applied` = blocks it held.
    /// Exact at once, swept in slices (see `release`'s docs).
    pub fn clear_member(&mut self, member: MemberId) -> EventOutcome {
        let tags: Vec<Tag> = self.members.tag(member).into_iter().collect();
        self.clear_tags(&tags)
    }

    /// Clears every dp rank of `worker_id` together; merged outcome. Exact at once, swept in
    /// slices whose cost does not depend on the number of ranks (see `release`'s docs).
    pub fn remove_worker(&mut self, worker_id: u64) -> EventOutcome {
        let tags = self.members.worker_tags(worker_id);
        self.clear_tags(&tags)
    }

    /// Retires `tags`; sweeps their blocks now only when slices are off
    /// (`slice_lines = 0`), else leaves that to [`release_step`](Self::release_step), so
    /// a clear costs its tags, not the map (a batch of many clears stays cheap).
    fn clear_tags(&mut self, tags: &[Tag]) -> EventOutcome {
        let mut out = EventOutcome::default();
        if tags.is_empty() {
            return out;
        }
        out.applied = self.retire_tags(tags) as u32;
        if self.config.slice_lines == 0 {
            self.finish_releases();
        }
        out
    }

    /// Retires `tags` (see `release.rs`); returns the edges they held, which the sweep will
    /// drop.
    fn retire_tags(&mut self, tags: &[Tag]) -> u64 {
        self.releases.retire(&mut self.members, tags)
    }

    /// Whether a clear is still being swept ([`release_step`](Self::release_step) has work).
    pub fn releasing(&self) -> bool {
        !self.releases.is_empty()
    }

    /// Edges of cleared members the sweep has not dropped yet (0 when no clear is in
    /// progress). Until then their blocks still count in [`DcCkfStats`]'s
    /// `unique_blocks` and `ownership_edges`, and their fingerprints stay in the table.
    pub fn releasing_edges(&self) -> u64 {
        self.releases.remaining
    }

    /// Sweeps one slice of the clears in progress: `slice_lines` block-map lines (the
    /// whole map when that is 0), see `release.rs`. Returns whether work remains.
    pub fn release_step(&mut self) -> bool {
        if self.releases.is_empty() {
            return false;
        }
        let slice_lines = self.config.slice_lines;
        if self
            .releases
            .sweep_slice(&mut self.members, &mut self.blocks, slice_lines)
        {
            return true;
        }
        self.shrink();
        false
    }

    /// Runs [`release_step`](Self::release_step) until no clear is in progress.
    pub fn finish_releases(&mut self) {
        while self.release_step() {}
    }

    /// Returns memory after removals: shrinks the exact maps that fell far below their
    /// capacity (see [`shrink_map`](super::maps::shrink_map): under a quarter full -> twice their length).
    fn shrink(&mut self) {
        self.blocks.shrink();
        // Retired tags keep their records until swept.
        if self.releases.is_empty() {
            self.members.shrink();
        }
    }

    /// Number of members owning `block_hash` (exact).
    pub fn refcount(&self, block_hash: u64) -> u32 {
        if self.releases.is_empty() {
            self.blocks.blocks.refcount(block_hash)
        } else {
            self.blocks
                .blocks
                .live_refcount(block_hash, &self.releases.dying)
        }
    }

    /// Whether `member` owns `block_hash` (exact).
    pub fn owns(&self, member: MemberId, block_hash: u64) -> bool {
        self.members
            .tag(member)
            .is_some_and(|tag| self.blocks.blocks.owns(block_hash, tag))
    }

    /// The block hashes `member` owns (exact), ascending; empty for an unknown member.
    /// O(unique blocks): for tests, diagnostics and rebuilds, not the hot path.
    pub fn member_blocks(&self, member: MemberId) -> Vec<u64> {
        let Some(tag) = self.members.tag(member) else {
            return Vec::new();
        };
        let mut blocks: Vec<u64> = Vec::new();
        self.blocks.blocks.for_each_edge(|h, t| {
            if t == tag {
                blocks.push(h);
            }
        });
        blocks.sort_unstable();
        blocks
    }

    /// Members owning at least one block, in no particular order.
    pub fn members(&self) -> impl Iterator<Item = MemberId> + '_ {
        self.members.index.keys().copied()
    }

    /// Lossy CKF membership: whether either candidate bucket of `block_hash` holds its
    /// fingerprint. True for every tracked hash; may be true for others (false positive).
    pub fn may_contain(&self, block_hash: u64) -> bool {
        self.blocks
            .mutator
            .contains(self.blocks.addressing.locate(block_hash))
    }

    /// The packed table, `bucket_count` words, index = bucket.
    pub fn buckets(&self) -> &[u64] {
        self.blocks.mutator.buckets()
    }

    /// Dirty buckets not yet sampled into a batch.
    pub fn pending_dirty(&self) -> usize {
        self.blocks.dirty.pending()
    }

    /// Samples the absolute image of every dirty bucket and clears the dirty set. Returns
    /// `None` when nothing net-changed since the last batch (every dirty bucket reverted, or
    /// nothing was dirty). Images are ordered for safe installation (see [`crate::dirty`]).
    ///
    /// Several publishers share one state: call this once per publication tick and hand the
    /// same batch to every publisher (see [`crate::publication`]).
    pub fn take_batch(&mut self) -> Option<PublicationBatch> {
        let p = &mut self.blocks;
        let batch = p.dirty.take(p.mutator.buckets(), &p.addressing)?;
        p.counters.batches += 1;
        p.counters.cycles_broken += u64::from(batch.cycles_broken);
        Some(batch)
    }

    /// Current statistics. `bytes_used` walks the member records (O(members)).
    pub fn stats(&self) -> DcCkfStats {
        let p = &self.blocks;
        let c = p.counters;
        let format = self.config.format;
        let exact_bytes =
            p.blocks.bytes_used() + self.members.bytes_used() + self.releases.bytes_used();
        let bytes_used = std::mem::size_of::<Self>()
            + p.mutator.bytes_used()
            + p.dirty.bytes_used()
            + exact_bytes;
        DcCkfStats {
            members: self.members.index.len(),
            unique_blocks: p.blocks.len(),
            ownership_edges: p.edges,
            resident_fingerprints: p.resident,
            bucket_count: format.bucket_count,
            slot_count: format.slot_count(),
            load_factor: p.resident as f64 / format.slot_count() as f64,
            omissions_total: c.omissions,
            unknown_removals_total: c.unknown_removals,
            kicks_total: c.kicks,
            batches_total: c.batches,
            cycles_broken_total: c.cycles_broken,
            missing_fingerprints_total: c.missing_fingerprints,
            pending_dirty: p.dirty.pending(),
            table_bytes: format.table_bytes(),
            bytes_used: bytes_used as u64,
            exact_bytes: exact_bytes as u64,
            block_map_rebuilds: p.blocks.rebuild_stats().count,
        }
    }

    /// Sizes the exact block map for `blocks` tracked blocks plus a fifth more (so they fill
    /// it to 75%, the middle of its 60-90% band between growths), unless it is already that
    /// large: storing them then rehashes nothing on the way, where a map growing from empty
    /// would rebuild about every 1.5x (rebuilds whose total is about twice the last one). For
    /// a restore that knows its size before it stores (the producer's checkpoints record it).
    /// Unlike [`DcCkfConfig::reserve_blocks`] it sets no floor: removals may shrink the map
    /// again. Bounded by the table's capacity (no more blocks can be tracked), so a wrong count
    /// costs at most the memory of a full table's block map. Costs about 21 bytes per
    /// presized block from now on; one rebuild (of what the map holds) when it grows it,
    /// counted in [`block_map_rebuilds`](Self::block_map_rebuilds). Returns the blocks the map
    /// was sized for: `blocks` plus a fifth, at most the capacity (a map already larger, say by a
    /// reservation, stays as it is).
    ///
    /// # Errors
    /// [`DcCkfError::ReserveAllocation`] when the allocator refuses the map's size; the state
    /// is then unchanged. Where the allocator never refuses (overcommit, a cgroup memory
    /// limit), that check cannot protect: a caller should bound a count it did not measure
    /// itself (the producer bounds a checkpoint's count by the checkpoint's bytes).
    pub fn presize_blocks(&mut self, blocks: u64) -> Result<u64, DcCkfError> {
        let target = blocks
            .saturating_add(blocks / 5)
            .min(self.config.format.slot_count());
        self.blocks.blocks.presize(block_map_granted(target)?);
        Ok(target)
    }

    /// The block map's rebuilds since the state was built, with their wall time (total and
    /// longest, allocation and fault-in included): each one held the caller (the producer's
    /// actor, so the DC's ingest) for that long. The count is also
    /// [`DcCkfStats::block_map_rebuilds`].
    pub fn block_map_rebuilds(&self) -> RebuildStats {
        self.blocks.blocks.rebuild_stats()
    }

    /// Fingerprints physically present, counted by scanning the table (O(buckets); for tests and
    /// consistency checks; `stats().resident_fingerprints` is the O(1) counter).
    pub fn count_resident(&self) -> u64 {
        self.buckets()
            .iter()
            .map(|&w| u64::from(bucket::occupied(w)))
            .sum()
    }
}
