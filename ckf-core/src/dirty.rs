//! Dirty-bucket tracking and safe image ordering for deltas (docs/design.md, "Publication
//! protocol").
//!
//! Dirty tracking is a notification mechanism, not a log. On the first write to a bucket since
//! the last publication the tracker records the bucket's image *as last published*; when the
//! actor publishes it samples each dirty bucket's current absolute word and keeps only buckets
//! whose word differs from the recorded one, so net reversions (store then remove, a relocation
//! undone by later churn) drop out of the batch.
//!
//! # Image order (`docs/design.md`, "Cuckoo filter cases", case 12)
//! A consumer installs a delta's images one atomic store at a time and queries may run in
//! between. A relocated fingerprint must therefore reach its new bucket before it leaves its old
//! one. The order is computed from the sampled state, not from the history of kicks:
//!
//! * For every changed bucket `x` and every fingerprint `f` that `x` loses (old-minus-new
//!   multiset), let `y = alternate(x, f)`. If `y` is also in the batch and gains `f`, add the
//!   edge "`y` before `x`".
//! * Sort topologically (Kahn's algorithm; ready buckets in first-touch order). A batch
//!   without such edges (the common case) keeps first-touch order and costs no sort.
//!
//! Because a fingerprint in bucket `x` can only belong to the pair `{x, alternate(x, f)}`, this
//! keeps, after every single image, at least `min(old, new)` copies of every (fingerprint, pair)
//! in place, so a block tracked both before and after the batch is never transiently missing.
//!
//! **Cycles.** When moves form a cycle (`x` gives `f` to `y` while `y` gives `g` to `x`, or a
//! longer ring through several buckets, possible when several relocations are coalesced into
//! one batch), no order satisfies every edge. The tracker then emits one bucket that lies on a
//! cycle (walking back along unemitted predecessors from the earliest-touched remaining bucket), counts one broken cycle in [`PublicationBatch::cycles_broken`], and continues.
//! A query racing the application of that one image may miss the fingerprints that bucket gives
//! away, until the next image of the batch lands. This is the documented residue of the
//! weak-read contract; the producer reports the running total in its stats so the rate can be
//! measured.
//!
//! The mutator keeps a single insertion's kick path from re-entering a bucket it changed (see
//! [`crate::mutator`]), so cycles come from coalescing several relocating commands into one
//! batch. Measured in `tests/cases_producer.rs` (case 12: 4,096 buckets at 93% load, batches of
//! 1-16 remove+store commands, nearly every batch relocating): about 1% of batches break one
//! cycle, 0.02% of installed images expose one transient miss, and no single-command batch broke
//! a cycle. Publishing more often (smaller batches) makes cycles rarer.

use std::time::Instant;

use crate::addressing::Addressing;
use crate::bucket;
use crate::frames::BucketImage;

/// One publication batch: the absolute images of every bucket whose word changed since the last
/// batch, in safe installation order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicationBatch {
    /// Absolute bucket images, unique buckets, non-empty, in installation order.
    pub images: Vec<BucketImage>,
    /// When the first write since the previous batch was made (producer monotonic clock): an
    /// upper bound on the age of every image in this batch.
    pub oldest_change: Instant,
    /// Ordering cycles broken while sorting this batch (see the module docs).
    pub cycles_broken: u32,
}

impl PublicationBatch {
    /// This batch as consecutive parts of at most `max_images` images each (`max_images` is
    /// raised to 1), in order: concatenated they are exactly `self.images`, so installing the
    /// parts one after the other keeps the safe image order across frames. Every part keeps
    /// `oldest_change`; the first carries `cycles_broken`, the others 0. A batch that fits is
    /// returned whole as the only part.
    pub fn split(&self, max_images: usize) -> Vec<PublicationBatch> {
        let max_images = max_images.max(1);
        if self.images.len() <= max_images {
            return vec![self.clone()];
        }
        self.images
            .chunks(max_images)
            .enumerate()
            .map(|(i, images)| PublicationBatch {
                images: images.to_vec(),
                oldest_change: self.oldest_change,
                cycles_broken: if i == 0 { self.cycles_broken } else { 0 },
            })
            .collect()
    }
}

/// A changed bucket while ordering a batch.
#[derive(Debug, Clone, Copy)]
struct Changed {
    bucket: u32,
    old: u64,
    new: u64,
}

/// Tracks buckets changed since the last publication. Allocation-free on the write path once
/// its buffers have grown.
#[derive(Debug, Clone)]
pub struct DirtyTracker {
    /// One bit per bucket: dirty since the last publication.
    marks: Vec<u64>,
    /// Dirty buckets with their image at the last publication, in first-touch order.
    entries: Vec<(u32, u64)>,
    oldest: Option<Instant>,
    /// The changed buckets of the batch being taken -> their position in `changed`: memory in
    /// proportion to the batch, not the table, and its writes stay in cache (a per-bucket
    /// array would take a random, cache-missing write per changed bucket on a large table).
    position: BatchIndex,
    // Scratch buffers for ordering, reused across batches.
    changed: Vec<Changed>,
    /// Edges `(before, after)` as positions in `changed`.
    edges: Vec<(u32, u32)>,
    indegree: Vec<u32>,
    out_starts: Vec<u32>,
    out_to: Vec<u32>,
    in_starts: Vec<u32>,
    in_from: Vec<u32>,
    seen: Vec<u32>,
    done: Vec<bool>,
    /// The Kahn queue, which is also the order (positions in `changed`).
    queue: Vec<u32>,
}

/// Fills a CSR adjacency: `starts[v]..starts[v + 1]` indexes `targets`, grouped by `key(edge)`
/// and holding `value(edge)`. Counting sort: O(nodes + edges), no comparison sort.
fn csr(
    n: usize,
    edges: &[(u32, u32)],
    key: impl Fn(&(u32, u32)) -> u32,
    value: impl Fn(&(u32, u32)) -> u32,
    starts: &mut Vec<u32>,
    targets: &mut Vec<u32>,
    cursor: &mut Vec<u32>,
) {
    starts.clear();
    starts.resize(n + 1, 0);
    for e in edges {
        starts[key(e) as usize + 1] += 1;
    }
    let mut sum = 0;
    for s in starts.iter_mut() {
        sum += *s;
        *s = sum;
    }
    cursor.clear();
    cursor.extend_from_slice(&starts[..n]);
    targets.clear();
    targets.resize(edges.len(), 0);
    for e in edges {
        let c = &mut cursor[key(e) as usize];
        targets[*c as usize] = value(e);
        *c += 1;
    }
}

impl DirtyTracker {
    /// A tracker for `bucket_count` buckets (`bucket_count / 8` bytes of marks; the other
    /// buffers grow with the batches).
    pub fn new(bucket_count: usize) -> Self {
        Self {
            marks: vec![0; bucket_count.div_ceil(64)],
            entries: Vec::new(),
            oldest: None,
            position: BatchIndex::default(),
            changed: Vec::new(),
            edges: Vec::new(),
            indegree: Vec::new(),
            out_starts: Vec::new(),
            out_to: Vec::new(),
            in_starts: Vec::new(),
            in_from: Vec::new(),
            seen: Vec::new(),
            done: Vec::new(),
            queue: Vec::new(),
        }
    }

    /// Notes a write to `bucket` whose word was `before` just before the write. Only the first
    /// touch since the last publication records its image.
    #[inline]
    pub fn touch(&mut self, bucket: u32, before: u64) {
        let (word, bit) = ((bucket >> 6) as usize, 1u64 << (bucket & 63));
        if self.marks[word] & bit == 0 {
            self.marks[word] |= bit;
            self.entries.push((bucket, before));
            if self.oldest.is_none() {
                self.oldest = Some(Instant::now());
            }
        }
    }

    /// Dirty buckets not yet sampled (including buckets that have since reverted).
    pub fn pending(&self) -> usize {
        self.entries.len()
    }

    /// Bytes held by the tracker's buffers (capacity-based).
    pub fn bytes_used(&self) -> usize {
        let u32s = self.indegree.capacity()
            + self.out_starts.capacity()
            + self.out_to.capacity()
            + self.in_starts.capacity()
            + self.in_from.capacity()
            + self.seen.capacity()
            + self.queue.capacity();
        self.marks.capacity() * 8
            + self.entries.capacity() * 16
            + self.changed.capacity() * std::mem::size_of::<Changed>()
            + self.edges.capacity() * 8
            + u32s * 4
            + self.done.capacity()
            + self.position.bytes()
    }

    /// Samples every dirty bucket of `buckets`, clears the dirty set and returns the net changes
    /// as an ordered batch, or `None` when every dirty bucket is back to its published image.
    pub fn take(&mut self, buckets: &[u64], addressing: &Addressing) -> Option<PublicationBatch> {
        let oldest = self.oldest.take();
        self.changed.clear();
        self.position.reset(self.entries.len(), buckets.len());
        for &(b, old) in &self.entries {
            let new = buckets[b as usize];
            if new != old {
                self.position.insert(b, self.changed.len() as u32);
                self.changed.push(Changed {
                    bucket: b,
                    old,
                    new,
                });
            }
        }
        // Edges: bucket `x` lost fingerprint `f` and its alternate `y` is in the batch and
        // gained `f`, so `y` goes first. Plain inserts and removals (alternate not in the batch)
        // add none.
        self.edges.clear();
        for (x, c) in self.changed.iter().enumerate() {
            // Slots whose fingerprint changed (a removal or a kick; most changed words only
            // gained a fingerprint in an empty slot and skip the loop at once).
            let mut replaced = bucket::replaced_slots(c.old, c.new);
            while replaced != 0 {
                let f = bucket::slot(c.old, bucket::mask_slot(replaced));
                replaced &= replaced - 1;
                if bucket::copies(c.old, f) <= bucket::copies(c.new, f) {
                    continue;
                }
                let alt = addressing.alternate(c.bucket, f);
                // Only a dirty bucket can be in the batch. Its mark (one bit per bucket, still
                // set) rules out most alternates without probing `position`.
                if self.marks[(alt >> 6) as usize] & (1u64 << (alt & 63)) == 0 {
                    continue;
                }
                // A fingerprint lost twice yields the edge twice; Kahn counts both.
                if let Some(y) = self.position.get(alt)
                    && let cy = &self.changed[y as usize]
                    && bucket::copies(cy.new, f) > bucket::copies(cy.old, f)
                {
                    self.edges.push((y, x as u32));
                }
            }
        }
        for &(b, _) in &self.entries {
            self.marks[(b >> 6) as usize] &= !(1u64 << (b & 63));
        }
        // A burst (say, a warm-up before the first publication) must not pin its peak buffer
        // size forever: trim buffers far above this batch's size.
        trim(&mut self.entries);
        self.entries.clear();
        trim(&mut self.changed);
        if self.changed.is_empty() {
            return None;
        }
        let (images, cycles_broken) = self.order();
        Some(PublicationBatch {
            images,
            oldest_change: oldest.unwrap_or_else(Instant::now),
            cycles_broken,
        })
    }

    /// Topological order of `self.changed` under `self.edges` (see the module docs). Returns the
    /// images and the number of cycles broken.
    fn order(&mut self) -> (Vec<BucketImage>, u32) {
        let image = |c: &Changed| BucketImage {
            bucket: c.bucket,
            image: c.new,
        };
        if self.edges.is_empty() {
            return (self.changed.iter().map(image).collect(), 0);
        }
        let n = self.changed.len();
        // `seen` doubles as the cursor buffer of the counting sort. The predecessor lists and
        // `seen`'s stamps serve only `on_cycle`, so they are built at the first cycle (about 1%
        // of batches had one in the case-12 measurement of the module docs; larger batches
        // have more).
        csr(
            n,
            &self.edges,
            |e| e.0,
            |e| e.1,
            &mut self.out_starts,
            &mut self.out_to,
            &mut self.seen,
        );
        self.indegree.clear();
        self.indegree.resize(n, 0);
        for &(_, to) in &self.edges {
            self.indegree[to as usize] += 1;
        }
        self.done.clear();
        self.done.resize(n, false);
        let mut predecessors = false;

        // `order` doubles as the Kahn queue: `order[head..]` are ready but not yet expanded.
        let mut order = std::mem::take(&mut self.queue);
        order.clear();
        order.extend((0..n as u32).filter(|&v| self.indegree[v as usize] == 0));
        for &v in &order {
            self.done[v as usize] = true;
        }
        let mut head = 0;
        let mut earliest_pending = 0;
        let mut cycles = 0u32;
        while order.len() < n || head < order.len() {
            if head == order.len() {
                // Every remaining bucket waits on another. Break a cycle at a bucket that lies on
                // it (emitting a bucket merely downstream of a cycle would cost a miss and
                // resolve nothing).
                while self.done[earliest_pending] {
                    earliest_pending += 1;
                }
                if !predecessors {
                    csr(
                        n,
                        &self.edges,
                        |e| e.1,
                        |e| e.0,
                        &mut self.in_starts,
                        &mut self.in_from,
                        &mut self.seen,
                    );
                    self.seen.clear();
                    self.seen.resize(n, 0);
                    predecessors = true;
                }
                cycles += 1;
                let v = self.on_cycle(earliest_pending, cycles);
                self.done[v] = true;
                order.push(v as u32);
            }
            let v = order[head] as usize;
            head += 1;
            for e in self.out_starts[v]..self.out_starts[v + 1] {
                let to = self.out_to[e as usize] as usize;
                self.indegree[to] -= 1;
                if self.indegree[to] == 0 && !self.done[to] {
                    self.done[to] = true;
                    order.push(to as u32);
                }
            }
        }
        let images = order
            .iter()
            .map(|&v| image(&self.changed[v as usize]))
            .collect();
        trim(&mut order);
        self.queue = order;
        (images, cycles)
    }

    /// A bucket on a cycle: walk back from `start` along predecessors that are not yet emitted
    /// until a bucket repeats. Every remaining bucket has such a predecessor (its in-degree
    /// counts only unemitted ones), so the walk ends on a cycle. `stamp` is unique per call.
    fn on_cycle(&mut self, start: usize, stamp: u32) -> usize {
        let mut v = start;
        while self.seen[v] != stamp {
            self.seen[v] = stamp;
            let preds = &self.in_from[self.in_starts[v] as usize..self.in_starts[v + 1] as usize];
            match preds.iter().find(|&&u| !self.done[u as usize]) {
                Some(&u) => v = u as usize,
                None => break,
            }
        }
        v
    }
}

/// Bucket -> position map of one batch, rebuilt for every batch, in memory proportional to
/// the batch: open addressing with linear probing over a power-of-two slot array at most half
/// full (8 bytes a slot, so 16-32 bytes a key). A batch large enough that this would take more
/// than a per-bucket array (4 bytes a bucket; a burst published at once, or a small table)
/// uses that array instead, kept until the next batch. Keys are unique (a bucket is changed
/// once per batch).
#[derive(Debug, Clone, Default)]
struct BatchIndex {
    /// `(bucket + 1) << 32 | position`; 0 marks a free slot (one word, so a reset is a
    /// plain zero fill).
    slots: Vec<u64>,
    /// `log2(slots.len())`.
    bits: u32,
    /// Per bucket: its position, or `u32::MAX`; empty unless this batch is a large one.
    direct: Vec<u32>,
}

impl BatchIndex {
    /// Empties the index and sizes it for up to `n` keys (the batch's dirty buckets, an upper
    /// bound of its changed ones) among `bucket_count` buckets.
    fn reset(&mut self, n: usize, bucket_count: usize) {
        let len = (2 * n).next_power_of_two().max(16);
        // The hash form takes 8 bytes a slot, the per-bucket form 4 bytes a bucket: whichever
        // is smaller, so the index never holds more than 4 bytes a bucket.
        if 2 * len > bucket_count {
            self.slots = Vec::new();
            self.direct.clear();
            self.direct.resize(bucket_count, u32::MAX);
            return;
        }
        self.direct = Vec::new();
        self.bits = len.trailing_zeros();
        self.slots.clear();
        self.slots.resize(len, 0);
        trim(&mut self.slots);
    }

    /// The first slot `bucket` probes: the top bits of a multiplicative hash.
    #[inline(always)]
    fn home(&self, bucket: u32) -> usize {
        (u64::from(bucket).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - self.bits)) as usize
    }

    /// Records `bucket` (not yet in the index) at `position`.
    #[inline]
    fn insert(&mut self, bucket: u32, position: u32) {
        if !self.direct.is_empty() {
            self.direct[bucket as usize] = position;
            return;
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(bucket);
        while self.slots[i] != 0 {
            i = (i + 1) & mask;
        }
        self.slots[i] = (u64::from(bucket) + 1) << 32 | u64::from(position);
    }

    /// The position of `bucket`, if it was inserted since the last reset.
    #[inline]
    fn get(&self, bucket: u32) -> Option<u32> {
        if !self.direct.is_empty() {
            return Some(self.direct[bucket as usize]).filter(|&p| p != u32::MAX);
        }
        let mask = self.slots.len() - 1;
        let key = u64::from(bucket) + 1;
        let mut i = self.home(bucket);
        loop {
            match self.slots[i] {
                0 => return None,
                slot if slot >> 32 == key => return Some(slot as u32),
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// Bytes held (capacity-based).
    fn bytes(&self) -> usize {
        self.slots.capacity() * 8 + self.direct.capacity() * 4
    }
}

/// Shrinks `v` when its capacity exceeds four times its length (and 1,024 elements).
fn trim<T>(v: &mut Vec<T>) {
    let keep = v.len().max(1024);
    if v.capacity() > 4 * keep {
        v.shrink_to(2 * keep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addressing::TableFormat;

    fn addressing(buckets: u64) -> Addressing {
        Addressing::new(&TableFormat::new(buckets, 3).unwrap()).unwrap()
    }

    #[test]
    fn reversions_drop_out() {
        let a = addressing(16);
        let mut t = DirtyTracker::new(16);
        let mut table = vec![0u64; 16];
        t.touch(3, table[3]);
        table[3] = 7;
        t.touch(3, table[3]);
        table[3] = 0;
        assert_eq!(t.pending(), 1);
        assert_eq!(t.take(&table, &a), None);
        assert_eq!(t.pending(), 0);
        t.touch(5, table[5]);
        table[5] = 9;
        let batch = t.take(&table, &a).unwrap();
        assert_eq!(
            batch.images,
            vec![BucketImage {
                bucket: 5,
                image: 9
            }]
        );
    }

    #[test]
    fn relocation_target_comes_first() {
        // 64 buckets: the batch's index is the hash table; 4 buckets: its smallest hash table
        // (16 slots) would take more than 4 bytes a bucket, so it is the per-bucket array.
        for buckets in [64u64, 4] {
            let a = addressing(buckets);
            // Find a fingerprint whose alternate of bucket 2 is above 2, so ascending order
            // alone would install the source first.
            let f = (1..u16::MAX).find(|&f| a.alternate(2, f) > 2).unwrap();
            let y = a.alternate(2, f);
            let mut t = DirtyTracker::new(buckets as usize);
            let mut table = vec![0u64; buckets as usize];
            table[2] = u64::from(f);
            t.touch(2, table[2]);
            table[2] = 0;
            t.touch(y, table[y as usize]);
            table[y as usize] = u64::from(f);
            let batch = t.take(&table, &a).unwrap();
            assert_eq!(batch.images[0].bucket, y, "{buckets} buckets");
            assert_eq!(batch.images[1].bucket, 2);
            assert_eq!(batch.cycles_broken, 0);
        }
    }

    proptest::proptest! {
        /// The batch index against a map, in both of its forms and across resets: every key
        /// inserted since the last reset is found at its position, nothing else is.
        #[test]
        fn batch_index_finds_exactly_what_was_inserted(
            batches in proptest::collection::vec(
                proptest::collection::btree_set(0u32..4096, 0..1200), 1..4),
            probes in proptest::collection::vec(0u32..4096, 64),
        ) {
            let mut index = BatchIndex::default();
            for keys in &batches {
                index.reset(keys.len(), 4096);
                let mut model = std::collections::HashMap::new();
                // Positions in a shuffled-looking order, as `changed` skips reverted buckets.
                for (i, &bucket) in keys.iter().rev().enumerate() {
                    let position = (i as u32).wrapping_mul(7);
                    index.insert(bucket, position);
                    model.insert(bucket, position);
                }
                for &bucket in keys.iter().chain(&probes) {
                    proptest::prop_assert_eq!(index.get(bucket), model.get(&bucket).copied());
                }
            }
        }
    }

    #[test]
    fn cycle_is_broken_on_the_cycle_not_downstream() {
        // Positions: 0 = C (touched first), 1 = A, 2 = B. A and B must each precede the other;
        // C waits on A. Breaking at C (the earliest touched) would resolve nothing and cost a
        // second break; the walk-back picks a bucket on the cycle.
        let mut t = DirtyTracker::new(64);
        for bucket in [10, 11, 12] {
            t.changed.push(Changed {
                bucket,
                old: 0,
                new: u64::from(bucket),
            });
        }
        t.edges.extend([(1, 2), (2, 1), (1, 0)]);
        let (images, cycles) = t.order();
        assert_eq!(cycles, 1);
        let pos = |b: u32| images.iter().position(|i| i.bucket == b).unwrap();
        assert!(pos(11) < pos(10), "C must follow A");
        assert_eq!(images.len(), 3);
    }

    #[test]
    fn swap_cycle_is_broken_and_counted() {
        let a = addressing(64);
        // Two fingerprints with the same offset swap between the same two buckets.
        let f = 11u16;
        let y = a.alternate(0, f);
        let g = (1..u16::MAX)
            .find(|&g| g != f && a.alternate(0, g) == y)
            .unwrap();
        let mut t = DirtyTracker::new(64);
        let mut table = vec![0u64; 64];
        table[0] = u64::from(f);
        table[y as usize] = u64::from(g);
        t.touch(0, table[0]);
        t.touch(y, table[y as usize]);
        table[0] = u64::from(g);
        table[y as usize] = u64::from(f);
        let batch = t.take(&table, &a).unwrap();
        assert_eq!(batch.images.len(), 2);
        assert_eq!(batch.cycles_broken, 1);
        assert_eq!(batch.images[0].bucket, 0);
    }
}
