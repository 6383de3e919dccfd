//! The producer's exact block map: block hash -> owners (and with them the refcount), in
//! 16-byte entries whose two candidate cache lines are computable from the hash alone, so an
//! event's blocks can be located and prefetched before any of them is applied.
//!
//! # Layout
//! A bucketized cuckoo hash table: `lines` 64-byte lines of four [`Entry`]s (block hash + packed
//! owners word). A key lives in one of two lines, `fastrange(mix)` and `fastrange(mix rotated
//! by 32)` of one `fmix64` of the key (seeded with the table seed in the producer, so it is
//! the mix the filter's `locate` computes anyway: see [`Probe`] for the bit budget):
//! multiply-shift indexing, so the line count is any number, not a power of two. Lines are
//! allocated through `memory::zeroed_vec` (2 MiB pages where the kernel offers them). A lookup reads at most two lines (both prefetchable, see
//! [`BlockMap::prefetch`]); an insertion goes to the emptier of the two, and when both are full
//! first moves one of their eight residents to its other line if that has room, else walks
//! (a bounded random walk, [`MAX_WALK`]). Two choices of
//! four entries per line keep insertions short well above 90% load (Fan et al., CoNEXT 2014, measured the
//! same 2 x 4 shape for cuckoo filters at 95%), so the table grows at [`MAX_LOAD`] = 90% by 1.5x
//! (to 60%), never sits below ~60% while it grows, and entries cost 16 / load bytes: 17.8-26.7
//! bytes per block. A growth rehashes every entry inside the insertion that triggers it (a
//! pause for the producer's ingest, 0.54-0.64 s at 12.76 M entries); the rehash prefetches
//! ahead ([`REBUILD_PREFETCH_DISTANCE`]) and places entries in the one-at-a-time order.
//!
//! A walk that fails leaves its last displaced entry in the *stash* (a small hash map): every
//! entry stays reachable, so an insertion never fails and never rolls back. A stash above
//! [`STASH_LIMIT`] entries makes the table grow, unless it is under half full (keys that
//! collide at every size, which only crafted hashes do; they then live in the stash, O(1)
//! each, rather than making the table grow without bound) or at its reserved size
//! ([`BlockMap::reserve`]: no growth below the reservation, whatever the keys).
//!
//! # Owners word
//! Three 21-bit owner tags (0 = unused) and, in bit 63, a *spill* flag: the block has more than
//! three owners and the others are in the spill map (block hash -> tags). Invariant: the flag
//! is set iff the spill map has a non-empty entry for the hash, and then all three inline tags
//! are set (a freed inline tag is refilled from the spill), so `has_owner` looks past the word
//! only for blocks with four or more owners. A word is 0 iff the block has no owner, which is
//! also what marks an entry empty: block hash 0 and `u64::MAX` are ordinary keys.
//!
//! # Tag limit
//! 21 bits give at most [`MAX_TAG`] = 2,097,151 members owning blocks at once. Tags are
//! assigned by `ownership::Members`, which refuses a member past the limit (the store then
//! omits its blocks with [`BlockError::MemberLimit`](super::BlockError::MemberLimit)).

use std::collections::HashMap;

use super::hasher::FoldHashBuilder;
use super::tags::{MAX_TAG, TAG_BITS, Tag, TagSet};
use crate::addressing::fmix64;
use crate::memory::prefetch;

const TAG_MASK: u64 = MAX_TAG as u64;
const SPILL_FLAG: u64 = 1 << 63;
const INLINE: usize = 3;

/// Slots per line: 4 x 16 bytes = one 64-byte cache line.
const LINE_ENTRIES: usize = 4;
/// Load above which an insertion grows the table first (entries / capacity).
pub(crate) const MAX_LOAD: f64 = 0.90;
/// Load (entries / capacity, as a fraction) from which [`BlockMap::walk_hint_active`] holds. On
/// the producer bench at 85% filter load (valgrind's cache model), a map at 84% load took 0.28
/// unprefetched L1 misses per block op in its walks, one at 66% took 0.02.
const WALK_HINT_LOAD: (usize, usize) = (3, 4);
/// Lines (64 bytes each) from which [`BlockMap::walk_hint_active`] holds: 2^18 lines are
/// 16 MiB, beyond a core's L2 and its usual share of the L3, where the lines a walk reads come
/// from DRAM.
const WALK_HINT_MIN_LINES: usize = 1 << 18;
/// Growth factor: 1.5x, so a table just grown is 60% full, not 45% as with doubling.
const GROWTH_NUM: usize = 3;
const GROWTH_DEN: usize = 2;
/// Smallest table allocated (lines).
const MIN_LINES: usize = 4;
/// Residents moved by one insertion before its last displaced entry goes to the stash.
pub(crate) const MAX_WALK: u32 = 128;
/// Stash entries above which the table grows (when at least half full).
pub(crate) const STASH_LIMIT: usize = 8;
/// Entries a rebuild (growth or shrink) prefetches ahead of the one it places. A rebuild
/// re-places every entry at random in a fresh table; one at a time, each placement waited for
/// its two lines. Filling a 2^22-bucket producer state from empty (`producer -- growth`, Zen 3
/// guest), the longest store, the one whose growth rehashes 12.76 M entries into 5,314,959
/// lines, took 1.15-1.27 s one at a time and 0.54-0.64 s pipelined; 0.25-0.31 s of a
/// pipelined growth is allocating the new 324 MiB and faulting it in. 8, 16 and 32 ahead were
/// within noise of each other.
const REBUILD_PREFETCH_DISTANCE: usize = 16;
/// Seed of a map built with [`BlockMap::default`] (the tests'); the producer's map uses the
/// table seed ([`BlockMap::with_seed`]), so its probe is the filter's mixed hash.
const MAP_SEED: u64 = 0x6A09_E667_F3BC_C909;

/// One entry: block hash and packed owners (0 = empty).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
struct Entry {
    key: u64,
    owners: u64,
}

/// One 64-byte line of four entries, aligned so a line is one cache line.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C, align(64))]
struct Line([Entry; LINE_ENTRIES]);

/// The key's mixed hash `fmix64(key ^ seed)`, computed once per block and reused for the
/// prefetch and the apply (it stays valid across a resize: lines are derived from it with the
/// current line count).
///
/// # Bit budget
/// The producer's map is seeded with the table seed, so its probe *is* the mixed hash the
/// filter's `Addressing::locate` computes: one `fmix64` per block serves both. The filter
/// reads bits 48-63 (fingerprint) and 0-31 (`bucket_a`'s fast range); the map's first line is
/// the multiply-shift range of the whole word (its top bits, so it follows the fingerprint),
/// the second that of the word rotated by 32 (its low bits, so it follows `bucket_a`). What
/// the map needs is that its two lines are uniform and independent *of each other*, which
/// the two halves of a bijective mix are whether or not the filter reads them too: a map line
/// and a filter bucket index different arrays, so their correlation costs nothing. Keys that
/// share both lines are as rare as with a separate seed (the pair is 2 x log2(lines) bits of
/// one uniform word) and end in the stash as before.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Probe(u64);

impl Probe {
    /// A placeholder value (the probe of no particular key).
    pub const ZERO: Self = Probe(0);

    /// The probe of `key` in a map built with [`BlockMap::default`].
    #[cfg(test)]
    #[inline(always)]
    pub fn of(key: u64) -> Self {
        Probe(fmix64(key ^ MAP_SEED))
    }

    /// The probe whose mixed hash is `mixed` (`fmix64(key ^ seed)` of the map's seed, e.g.
    /// `Addressing::mix` when the map was built with the table seed).
    #[inline(always)]
    pub fn from_mixed(mixed: u64) -> Self {
        Probe(mixed)
    }

    /// The key's two candidate lines in a table of `lines` lines (`lines > 0`).
    #[inline(always)]
    fn lines(self, lines: usize) -> (usize, usize) {
        (
            fastrange(self.0, lines),
            fastrange(self.0.rotate_left(32), lines),
        )
    }
}

/// `x` scaled into `0..n` by the high half of a 64x64 multiply (Lemire's fast range reduction):
/// uniform for uniform `x`, and any `n`.
#[inline(always)]
fn fastrange(x: u64, n: usize) -> usize {
    ((u128::from(x) * n as u128) >> 64) as usize
}

/// Where an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pos {
    /// Line, and the entry's position in it.
    Entry(u32, u8),
    /// In the stash (keyed by the block hash).
    Stash,
}

/// Packed owners word helpers.
#[inline(always)]
fn tag_at(word: u64, i: usize) -> Tag {
    ((word >> (TAG_BITS as usize * i)) & TAG_MASK) as Tag
}

#[inline(always)]
fn with_tag(word: u64, i: usize, tag: Tag) -> u64 {
    let shift = TAG_BITS as usize * i;
    (word & !(TAG_MASK << shift)) | (u64::from(tag) << shift)
}

#[inline(always)]
fn inline_find(word: u64, tag: Tag) -> Option<usize> {
    (0..INLINE).find(|&i| tag_at(word, i) == tag)
}

#[inline(always)]
fn inline_len(word: u64) -> u32 {
    (0..INLINE).filter(|&i| tag_at(word, i) != 0).count() as u32
}

/// Block hash -> owners. See the module docs.
pub(crate) struct BlockMap {
    /// Xored into every key before mixing ([`Probe`]).
    seed: u64,
    lines: Vec<Line>,
    /// Entries in lines and stash.
    len: usize,
    /// Largest `len` allowed before an insertion grows the table: `MAX_LOAD` of the capacity,
    /// kept as an integer so the per-insertion check is one compare (see [`Self::grow_at`]).
    grow_at: usize,
    stash: HashMap<u64, u64, FoldHashBuilder>,
    /// Owners beyond the inline three, per block hash (never an empty `Vec`).
    spill: HashMap<u64, Vec<Tag>, FoldHashBuilder>,
    /// Sum of the spill vectors' capacities, in tags.
    spill_tags: usize,
    /// Advances on every walk; picks the victims.
    counter: u64,
    /// Lines the map keeps at least, once it has any ([`reserve`](Self::reserve)); 0 when
    /// nothing is reserved.
    reserved_lines: usize,
    /// Rebuilds since the map was built, and their wall time.
    rebuilds: RebuildStats,
    /// While an image is taken in slices ([`record_moves`](Self::record_moves)): every key a
    /// walk moved to another line or to the stash, which a scan by line ranges may miss.
    moved: Option<Vec<u64>>,
    /// Keys walks moved since the map was built ([`moves`](Self::moves)).
    moves: u64,
}

/// Rebuilds of a producer's exact block map since it was built
/// (`DcCkfState::block_map_rebuilds`): every growth (by 1.5x at 90% load), shrink and reservation rehashes
/// all tracked blocks inside the store, removal or start that triggers it, a pause of the
/// producer's ingest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RebuildStats {
    /// Rebuilds (growths, shrinks, the reservation) since start.
    pub count: u64,
    /// Wall time of all of them together, allocation and fault-in of the new lines included.
    pub total: std::time::Duration,
    /// The longest single one.
    pub longest: std::time::Duration,
}

impl Clone for BlockMap {
    /// A field-by-field copy, except `spill_tags`: a cloned `Vec` has its own capacity (its
    /// length), so the clone sums its own spill vectors' capacities, keeping `bytes_used` and
    /// [`check`](Self::check) true of the clone.
    fn clone(&self) -> Self {
        let spill = self.spill.clone();
        let spill_tags = spill.values().map(Vec::capacity).sum();
        Self {
            seed: self.seed,
            lines: self.lines.clone(),
            len: self.len,
            grow_at: self.grow_at,
            stash: self.stash.clone(),
            spill,
            spill_tags,
            counter: self.counter,
            reserved_lines: self.reserved_lines,
            rebuilds: self.rebuilds,
            moved: self.moved.clone(),
            moves: self.moves,
        }
    }
}

impl std::fmt::Debug for BlockMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockMap")
            .field("len", &self.len)
            .field("lines", &self.lines.len())
            .field("stash", &self.stash.len())
            .field("spilled_blocks", &self.spill.len())
            .finish()
    }
}

impl Default for BlockMap {
    fn default() -> Self {
        Self::with_seed(MAP_SEED)
    }
}

impl BlockMap {
    /// An empty map whose probes are `fmix64(key ^ seed)`.
    pub fn with_seed(seed: u64) -> Self {
        Self {
            seed,
            lines: Vec::new(),
            len: 0,
            grow_at: 0,
            stash: HashMap::default(),
            spill: HashMap::default(),
            spill_tags: 0,
            counter: 0,
            reserved_lines: 0,
            rebuilds: RebuildStats::default(),
            moved: None,
            moves: 0,
        }
    }

    /// The probe of `key` under this map's seed.
    #[inline(always)]
    fn probe(&self, key: u64) -> Probe {
        Probe(fmix64(key ^ self.seed))
    }

    /// Tracked blocks.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Slots allocated (`lines * 4`).
    #[inline]
    pub fn slot_capacity(&self) -> usize {
        self.lines.len() * LINE_ENTRIES
    }

    /// Entries in the stash (for tests and the bench).
    #[cfg(test)]
    pub fn stash_len(&self) -> usize {
        self.stash.len()
    }

    /// Hints the CPU to fetch both candidate lines of `probe`.
    #[inline(always)]
    pub fn prefetch(&self, probe: Probe) {
        let n = self.lines.len();
        if n > 0 {
            let (a, b) = probe.lines(n);
            prefetch(self.lines.as_ptr().wrapping_add(a));
            prefetch(self.lines.as_ptr().wrapping_add(b));
        }
    }

    /// Whether [`prefetch_walk`](Self::prefetch_walk) is worth calling on this map as it is
    /// now: at least [`WALK_HINT_MIN_LINES`] lines (below, the map lives in the caches) and at
    /// least [`WALK_HINT_LOAD`] full (below, both candidate lines are rarely full, and reading
    /// them early costs more than the rare walk it would speed up). A caller tests it once per
    /// event, not per block: within an event the load moves by at most a few entries, and a
    /// stale answer only costs or misses a hint, never correctness.
    #[inline]
    pub fn walk_hint_active(&self) -> bool {
        let n = self.lines.len();
        n >= WALK_HINT_MIN_LINES
            && self.len * WALK_HINT_LOAD.1 >= n * LINE_ENTRIES * WALK_HINT_LOAD.0
    }

    /// When both candidate lines of `probe` are full (inserting its key would
    /// [`walk`](Self::walk)), hints the CPU to fetch the lines the walk's first pass reads
    /// ([`walk_lines`](Self::walk_lines)) and returns them; `None` (nothing hinted) otherwise
    /// and on an empty map. Reads the two candidate lines, so call it once they are likely
    /// cached (after [`prefetch`](Self::prefetch)), and only where
    /// [`walk_hint_active`](Self::walk_hint_active) says it pays. Never faults, never changes
    /// the map.
    #[inline]
    pub fn prefetch_walk(&self, probe: Probe) -> Option<[usize; 2 * LINE_ENTRIES]> {
        let n = self.lines.len();
        if n == 0 {
            return None;
        }
        let (a, b) = probe.lines(n);
        let full = |l: usize| self.lines[l].0.iter().all(|s| s.owners != 0);
        if !full(a) || !full(b) {
            return None;
        }
        let lines = self.walk_lines(a, b);
        for &l in &lines {
            prefetch(self.lines.as_ptr().wrapping_add(l));
        }
        Some(lines)
    }

    /// The lines a walk from full lines `a` and `b` tries first: the other candidate line of
    /// each resident, in `walk`'s order (`a`'s four entries, then `b`'s).
    #[inline(always)]
    fn walk_lines(&self, a: usize, b: usize) -> [usize; 2 * LINE_ENTRIES] {
        let mut out = [0; 2 * LINE_ENTRIES];
        for (i, l) in [a, b].into_iter().enumerate() {
            for (s, entry) in self.lines[l].0.iter().enumerate() {
                out[i * LINE_ENTRIES + s] = self.other_line(entry.key, l);
            }
        }
        out
    }

    /// The candidate line of `key` that is not `line` (`line` itself when both candidates are
    /// the same line).
    #[inline(always)]
    fn other_line(&self, key: u64, line: usize) -> usize {
        let (a, b) = self.probe(key).lines(self.lines.len());
        if a == line { b } else { a }
    }

    /// Where `key` is, if tracked.
    #[inline]
    pub fn find(&self, key: u64, probe: Probe) -> Option<Pos> {
        let n = self.lines.len();
        if n == 0 {
            return None;
        }
        let (a, b) = probe.lines(n);
        for l in [a, b] {
            let line = &self.lines[l].0;
            for (s, entry) in line.iter().enumerate() {
                if entry.key == key && entry.owners != 0 {
                    return Some(Pos::Entry(l as u32, s as u8));
                }
            }
        }
        if !self.stash.is_empty() && self.stash.contains_key(&key) {
            return Some(Pos::Stash);
        }
        None
    }

    #[inline(always)]
    fn word(&self, pos: Pos, key: u64) -> u64 {
        match pos {
            Pos::Entry(l, s) => self.lines[l as usize].0[s as usize].owners,
            Pos::Stash => self.stash.get(&key).copied().unwrap_or(0),
        }
    }

    #[inline(always)]
    fn set_word(&mut self, pos: Pos, key: u64, word: u64) {
        match pos {
            Pos::Entry(l, s) => self.lines[l as usize].0[s as usize].owners = word,
            Pos::Stash => {
                if let Some(w) = self.stash.get_mut(&key) {
                    *w = word;
                }
            }
        }
    }

    /// Whether `tag` owns the block at `pos`.
    #[inline]
    pub fn has_owner(&self, pos: Pos, key: u64, tag: Tag) -> bool {
        let word = self.word(pos, key);
        inline_find(word, tag).is_some()
            || (word & SPILL_FLAG != 0 && self.spill.get(&key).is_some_and(|v| v.contains(&tag)))
    }

    /// Whether `tag` owns `key`.
    pub fn owns(&self, key: u64, tag: Tag) -> bool {
        self.find(key, self.probe(key))
            .is_some_and(|pos| self.has_owner(pos, key, tag))
    }

    /// Owners of `key` (0 when untracked).
    pub fn refcount(&self, key: u64) -> u32 {
        let Some(pos) = self.find(key, self.probe(key)) else {
            return 0;
        };
        let word = self.word(pos, key);
        let spilled = if word & SPILL_FLAG != 0 {
            self.spill.get(&key).map_or(0, Vec::len) as u32
        } else {
            0
        };
        inline_len(word) + spilled
    }

    /// Adds `tag` as an owner of the tracked block at `pos` (the caller checked it is not one).
    #[inline]
    pub fn add_owner(&mut self, pos: Pos, key: u64, tag: Tag) {
        debug_assert!(tag != 0 && tag <= MAX_TAG);
        let word = self.word(pos, key);
        let word = match inline_find(word, 0) {
            Some(i) => with_tag(word, i, tag),
            None => {
                self.spill_push(key, tag);
                word | SPILL_FLAG
            }
        };
        self.set_word(pos, key, word);
    }

    #[cold]
    fn spill_push(&mut self, key: u64, tag: Tag) {
        let v = self.spill.entry(key).or_default();
        let before = v.capacity();
        v.push(tag);
        self.spill_tags += v.capacity() - before;
    }

    /// Drops `tag` as an owner of the block at `pos`. `None` when it was not one; otherwise
    /// whether the block is now ownerless (then it is already removed from the map).
    #[inline]
    pub fn drop_owner(&mut self, pos: Pos, key: u64, tag: Tag) -> Option<bool> {
        let word = self.word(pos, key);
        let word = Self::dropped(&mut self.spill, &mut self.spill_tags, key, word, tag)?;
        if word != 0 {
            self.set_word(pos, key, word);
            return Some(false);
        }
        match pos {
            Pos::Entry(l, s) => self.lines[l as usize].0[s as usize] = Entry::default(),
            Pos::Stash => {
                self.stash.remove(&key);
            }
        }
        self.len -= 1;
        Some(true)
    }

    /// `word` without `tag` (refilled from the spill); `None` when `tag` is not an owner.
    #[inline(always)]
    fn dropped(
        spill: &mut HashMap<u64, Vec<Tag>, FoldHashBuilder>,
        spill_tags: &mut usize,
        key: u64,
        word: u64,
        tag: Tag,
    ) -> Option<u64> {
        if let Some(i) = inline_find(word, tag) {
            if word & SPILL_FLAG == 0 {
                return Some(with_tag(word, i, 0));
            }
            // Keep the inline tags full while the block spills: refill the hole.
            let (refill, emptied) = Self::spill_take(spill, spill_tags, key, None);
            let word = with_tag(word, i, refill.unwrap_or(0));
            return Some(if emptied { word & !SPILL_FLAG } else { word });
        }
        if word & SPILL_FLAG == 0 {
            return None;
        }
        let (taken, emptied) = Self::spill_take(spill, spill_tags, key, Some(tag));
        taken?;
        Some(if emptied { word & !SPILL_FLAG } else { word })
    }

    /// Takes `tag` (or any tag when `None`) from `key`'s spill entry: the tag taken, and whether
    /// the entry is now gone.
    #[cold]
    fn spill_take(
        spill: &mut HashMap<u64, Vec<Tag>, FoldHashBuilder>,
        spill_tags: &mut usize,
        key: u64,
        tag: Option<Tag>,
    ) -> (Option<Tag>, bool) {
        let Some(v) = spill.get_mut(&key) else {
            debug_assert!(false, "spill flag without a spill entry");
            return (None, true);
        };
        let taken = match tag {
            Some(t) => v.iter().position(|&x| x == t).map(|i| v.swap_remove(i)),
            None => v.pop(),
        };
        if v.is_empty() {
            *spill_tags -= v.capacity();
            spill.remove(&key);
            return (taken, true);
        }
        (taken, false)
    }

    /// Inserts untracked `key` with the single owner `tag`.
    pub fn insert_new(&mut self, key: u64, probe: Probe, tag: Tag) {
        debug_assert!(tag != 0 && tag <= MAX_TAG);
        if self.len + 1 > self.grow_at {
            self.grow();
        }
        self.len += 1;
        self.place(key, probe, u64::from(tag));
        // Not while the map is at its reserved size: a reservation promises no growth below
        // it, and keys that fill the stash below 90% load are crafted ones, O(1) each there.
        if self.stash.len() > STASH_LIMIT
            && self.len * 2 >= self.slot_capacity()
            && self.lines.len() > self.reserved_lines
        {
            self.grow();
        }
    }

    /// Puts an entry into a line (the emptier candidate) or, after a failed walk, the stash.
    /// Does not count it in `len`.
    fn place(&mut self, key: u64, probe: Probe, owners: u64) {
        let n = self.lines.len();
        let (a, b) = probe.lines(n);
        let free_a = self.lines[a].0.iter().filter(|s| s.owners == 0).count();
        let free_b = self.lines[b].0.iter().filter(|s| s.owners == 0).count();
        let l = if free_b > free_a { b } else { a };
        if let Some(s) = self.lines[l].0.iter_mut().find(|s| s.owners == 0) {
            *s = Entry { key, owners };
            return;
        }
        self.walk(Entry { key, owners }, a, b);
    }

    /// Makes room in full lines `a` and `b` for `entry`: first by moving one of their eight
    /// residents to its other line if that has an empty entry (the eight lines are independent
    /// loads, where each step of a blind walk is a dependent cache miss on a large table), else
    /// by a bounded random walk: put `entry` in place of a resident, move the resident to its
    /// other line, and so on.
    #[cold]
    fn walk(&mut self, mut entry: Entry, a: usize, b: usize) {
        // The lines `walk_lines` names, computed one at a time, so a walk that finds room early
        // computes fewer of them.
        for l in [a, b] {
            for s in 0..LINE_ENTRIES {
                let victim = self.lines[l].0[s];
                let other = self.other_line(victim.key, l);
                if let Some(empty) = self.lines[other].0.iter_mut().find(|s| s.owners == 0) {
                    *empty = victim;
                    self.lines[l].0[s] = entry;
                    self.moves += 1;
                    if let Some(moved) = &mut self.moved {
                        moved.push(victim.key);
                    }
                    return;
                }
            }
        }
        self.counter = self.counter.wrapping_add(1);
        let salt = fmix64(self.counter);
        let mut line = if salt & 1 == 0 { a } else { b };
        for step in 0..MAX_WALK {
            let r = fmix64(salt ^ u64::from(step));
            let s = (r >> 62) as usize;
            let victim = std::mem::replace(&mut self.lines[line].0[s], entry);
            self.moves += 1;
            if let Some(moved) = &mut self.moved {
                moved.push(victim.key);
            }
            line = self.other_line(victim.key, line);
            if let Some(empty) = self.lines[line].0.iter_mut().find(|s| s.owners == 0) {
                *empty = victim;
                return;
            }
            entry = victim;
        }
        self.stash.insert(entry.key, entry.owners);
    }
}

mod sizing;
mod sweep;
mod visit;

#[cfg(test)]
mod tests;
