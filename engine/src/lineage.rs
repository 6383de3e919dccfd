//! Per member: engine block hash -> canonical block hash.
//!
//! Engines publish their own block hashes (vLLM: sha256 of its own key; SGLang and
//! TensorRT-LLM: their own int64); queries probe canonical hashes (`ckf_core::tokens`). A store's canonical chain is
//! computed from its tokens: block k's canonical hash is
//! `chain_step(parent canonical, block_hash(tokens, mm hashes ++ other extras, seed))`, block
//! k's parent being block k-1 and the first block's parent the event's parent. The seed is the
//! parent's seed (a parent this member's lineage does not know makes the store an orphan:
//! nothing applied), else `BlockSeed::new(cache_salt or block 0's extra-key salt, lora_name)`,
//! `lora_name` being the LoRA identity the decoder gives the event: the name sent, else a
//! `lora_id` sent without a name, in decimal (TensorRT-LLM). A block's mm hashes are those of
//! its vLLM `[identifier, offset]` extra keys and of its TensorRT-LLM `mm_keys`: an item named
//! by the same identifier gives the same block hash from either engine.
//! A removal maps engine hashes back; a canonical hash held through several engine hashes of
//! one member leaves the state only with the last (per-member refcount). `AllBlocksCleared`
//! drops the member's lineage. Full rule: the crate README, "Lineage rule".

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};

use ckf_core::dc::{KvEvent, KvEventKind, MemberId};
use ckf_core::tokens::{self, BlockSeed};

use crate::event::{EngineEvent, RemovedBlocks, StoredBlocks};
use crate::filters::{EngineFilters, Skip};

/// Why (part of) an event was not turned into a [`KvEvent`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SkipReason {
    /// The filter rule refused the event ([`crate::filters`]).
    Filter(Skip),
    /// A store whose parent engine hash this member's lineage does not know: the canonical
    /// chain cannot be computed, so nothing of the event is applied.
    Orphan,
    /// A removed engine hash this member's lineage does not know (a no-op).
    UnknownRemoval,
    /// A stored engine hash already known with a different canonical hash (an engine hash
    /// collision or an engine bug): the first mapping is kept, the block is not re-applied.
    Conflict,
    /// An event of a type this crate does not know.
    UnknownEvent,
}

impl SkipReason {
    /// A short stable label for metrics: the [`Skip::label`], or `"orphan"`,
    /// `"unknown_removal"`, `"conflict"`, `"unknown_event"`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Filter(s) => s.label(),
            Self::Orphan => "orphan",
            Self::UnknownRemoval => "unknown_removal",
            Self::Conflict => "conflict",
            Self::UnknownEvent => "unknown_event",
        }
    }
}

/// The result of translating one engine event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Translation {
    /// The event to apply to `DcCkfState`, if any (block hashes canonical).
    pub kv_event: Option<KvEvent>,
    /// What was skipped, with the number of blocks (1 for an event without blocks); each
    /// reason at most once.
    pub skipped: Vec<(SkipReason, u32)>,
}

impl Translation {
    /// Adds `blocks` to `reason`'s count.
    fn skip(&mut self, reason: SkipReason, blocks: usize) {
        let blocks = u32::try_from(blocks).unwrap_or(u32::MAX);
        match self.skipped.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, n)) => *n = n.saturating_add(blocks),
            None => self.skipped.push((reason, blocks)),
        }
    }
}

/// One engine block of a member's lineage, as a durability checkpoint records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct LineageEntry {
    /// The engine's block hash (reduced to 64 bits, see [`crate::wire`]).
    pub engine_hash: u64,
    /// The canonical block hash it maps to (`ckf_core::tokens`).
    pub canonical: u64,
    /// The [`BlockSeed`] of its chain (`BlockSeed.0`): a child store naming this block as
    /// parent inherits it.
    pub seed: u64,
}

/// One member's whole lineage ([`Lineage::export`], [`Lineage::restore`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct MemberLineageImage {
    /// The member.
    pub member: MemberId,
    /// Its engine blocks, by ascending engine hash (from [`Lineage::export`]).
    pub blocks: Vec<LineageEntry>,
}

/// One known engine block of a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Block {
    canonical: u64,
    seed: BlockSeed,
}

#[derive(Debug, Clone, Default)]
struct MemberLineage {
    /// Engine hash -> canonical hash and the seed of its chain.
    blocks: HashMap<u64, Block>,
    /// Canonical hash -> number of engine hashes of this member mapping to it (>= 1).
    refs: HashMap<u64, u32>,
}

/// Every member's engine-to-canonical map (see the module docs and the crate README).
#[derive(Debug, Clone, Default)]
pub struct Lineage {
    members: BTreeMap<MemberId, MemberLineage>,
    /// The image being copied member by member ([`begin_capture`](Self::begin_capture)).
    capture: Option<Capture>,
}

/// An image of the lineage as it was at [`Lineage::begin_capture`], copied member by member:
/// in steps, and a member about to change first.
#[derive(Debug, Clone, Default)]
struct Capture {
    /// Members not copied yet.
    pending: std::collections::BTreeSet<MemberId>,
    /// Members copied (blocks in no order).
    images: Vec<MemberLineageImage>,
}

impl Lineage {
    /// An empty lineage.
    pub fn new() -> Self {
        Self::default()
    }

    /// Translates one engine event of `member` into a canonical [`KvEvent`], updating the
    /// lineage. Pure bookkeeping: the caller applies `kv_event` to the state.
    pub fn translate(
        &mut self,
        member: MemberId,
        event: &EngineEvent,
        filters: &EngineFilters,
    ) -> Translation {
        self.before_change(member);
        let mut out = Translation::default();
        match event {
            EngineEvent::Stored(stored) => self.store(member, stored, filters, &mut out),
            EngineEvent::Removed(removed) => self.remove(member, removed, filters, &mut out),
            EngineEvent::AllCleared => {
                self.members.remove(&member);
                out.kv_event = Some(KvEvent {
                    member,
                    kind: KvEventKind::Cleared,
                });
            }
            EngineEvent::Unknown { .. } => out.skip(SkipReason::UnknownEvent, 1),
        }
        out
    }

    fn store(
        &mut self,
        member: MemberId,
        stored: &StoredBlocks,
        filters: &EngineFilters,
        out: &mut Translation,
    ) {
        let n = stored.block_hashes.len();
        if n == 0 {
            return;
        }
        if let Err(skip) = filters.admit_stored(stored) {
            out.skip(SkipReason::Filter(skip), n);
            return;
        }
        let known = self.members.get(&member);
        let (mut parent, seed) = match stored.parent {
            Some(p) => match known.and_then(|m| m.blocks.get(&p)) {
                Some(e) => (Some(e.canonical), e.seed),
                None => {
                    out.skip(SkipReason::Orphan, n);
                    return;
                }
            },
            None => {
                let salt = stored
                    .cache_salt
                    .as_deref()
                    .or_else(|| stored.block_extras.first().and_then(|x| x.salt.as_deref()));
                (None, BlockSeed::new(salt, stored.lora_name.as_deref()))
            }
        };
        let parent_hash = parent;
        let lineage = self.members.entry(member).or_default();
        let bs = stored.block_size as usize;
        let mut canonicals = Vec::with_capacity(n);
        let mut mm = Vec::new();
        let mut conflicts = 0;
        for (k, &engine) in stored.block_hashes.iter().enumerate() {
            mm.clear();
            if let Some(x) = stored.block_extras.get(k) {
                mm.extend_from_slice(&x.mm_hashes);
                mm.extend_from_slice(&x.other);
            }
            // In range: admit_stored checked token_ids.len() == n * block_size.
            let tokens = &stored.token_ids[k * bs..(k + 1) * bs];
            let canonical = tokens::chain_step(parent, tokens::block_hash(tokens, &mm, seed));
            match lineage.blocks.entry(engine) {
                Entry::Vacant(v) => {
                    v.insert(Block { canonical, seed });
                    *lineage.refs.entry(canonical).or_insert(0) += 1;
                    canonicals.push(canonical);
                    parent = Some(canonical);
                }
                Entry::Occupied(o) if o.get().canonical == canonical => {
                    // A duplicate store (replay overlap, re-announce): re-applied, the state
                    // treats it as redundant; a store the state omitted may now succeed.
                    canonicals.push(canonical);
                    parent = Some(canonical);
                }
                Entry::Occupied(o) => {
                    // Keep the first mapping, and chain on from it: later events naming this
                    // engine hash as parent get the same canonical chain.
                    conflicts += 1;
                    parent = Some(o.get().canonical);
                }
            }
        }
        if conflicts > 0 {
            out.skip(SkipReason::Conflict, conflicts);
        }
        if !canonicals.is_empty() {
            out.kv_event = Some(KvEvent {
                member,
                kind: KvEventKind::Stored {
                    block_hashes: canonicals,
                    parent_hash,
                },
            });
        }
    }

    fn remove(
        &mut self,
        member: MemberId,
        removed: &RemovedBlocks,
        filters: &EngineFilters,
        out: &mut Translation,
    ) {
        let n = removed.block_hashes.len();
        if n == 0 {
            return;
        }
        if let Err(skip) = filters.admit_removed(removed) {
            out.skip(SkipReason::Filter(skip), n);
            return;
        }
        let Some(lineage) = self.members.get_mut(&member) else {
            out.skip(SkipReason::UnknownRemoval, n);
            return;
        };
        let mut gone = Vec::new();
        let mut unknown = 0;
        for engine in &removed.block_hashes {
            let Some(block) = lineage.blocks.remove(engine) else {
                unknown += 1;
                continue;
            };
            if let Entry::Occupied(mut r) = lineage.refs.entry(block.canonical) {
                *r.get_mut() -= 1;
                if *r.get() == 0 {
                    r.remove();
                    gone.push(block.canonical);
                }
            }
        }
        if lineage.blocks.is_empty() {
            self.members.remove(&member);
        }
        if unknown > 0 {
            out.skip(SkipReason::UnknownRemoval, unknown);
        }
        if !gone.is_empty() {
            out.kv_event = Some(KvEvent {
                member,
                kind: KvEventKind::Removed { block_hashes: gone },
            });
        }
    }

    /// Forgets `member`'s lineage (after its state was cleared: restart, failed replay).
    /// Returns whether it had one.
    pub fn clear_member(&mut self, member: MemberId) -> bool {
        self.before_change(member);
        self.members.remove(&member).is_some()
    }

    /// Starts an image of the lineage as it is now, copied by
    /// [`capture_step`](Self::capture_step)s; a member about to change (a translated event, a
    /// clear) is copied first, so the image stays the one of this moment while events go on.
    /// A step, or a change, costs one member's engine blocks at most (plus the step's budget):
    /// the pause is bounded by the largest member, not by the whole lineage. O(members) now.
    /// Starting another capture abandons this one.
    pub fn begin_capture(&mut self) {
        self.capture = Some(Capture {
            pending: self.members.keys().copied().collect(),
            images: Vec::new(),
        });
    }

    /// Copies pending members into the capture until `max_blocks` engine blocks were copied
    /// (at least one member, whatever its size); returns whether members remain (`false`
    /// too when no capture is in progress).
    pub fn capture_step(&mut self, max_blocks: usize) -> bool {
        let Some(capture) = &mut self.capture else {
            return false;
        };
        let mut copied = 0;
        while copied < max_blocks.max(1) {
            let Some(member) = capture.pending.pop_first() else {
                break;
            };
            let image = Self::export_member(&self.members, member);
            copied += image.blocks.len();
            capture.images.push(image);
        }
        !capture.pending.is_empty()
    }

    /// The finished capture's images, sorted by member, **each one's blocks in no order**
    /// (sort by engine hash where it costs the caller nothing); members whose lineage was
    /// empty at the capture are left out. `None` when no capture is in progress or members
    /// remain ([`capture_step`](Self::capture_step) until it returns `false`).
    pub fn take_capture(&mut self) -> Option<Vec<MemberLineageImage>> {
        if self.capture.as_ref()?.pending.is_empty() {
            let mut images = self.capture.take()?.images;
            images.retain(|image| !image.blocks.is_empty());
            images.sort_unstable_by_key(|image| image.member);
            Some(images)
        } else {
            None
        }
    }

    /// Copies `member` into the capture in progress before it changes, if not copied yet.
    fn before_change(&mut self, member: MemberId) {
        if let Some(capture) = &mut self.capture
            && capture.pending.remove(&member)
        {
            capture
                .images
                .push(Self::export_member(&self.members, member));
        }
    }

    /// `member`'s lineage (blocks in no order; none when it has no lineage).
    fn export_member(
        members: &BTreeMap<MemberId, MemberLineage>,
        member: MemberId,
    ) -> MemberLineageImage {
        let blocks = members.get(&member).map_or_else(Vec::new, |lineage| {
            lineage
                .blocks
                .iter()
                .map(|(&engine_hash, b)| LineageEntry {
                    engine_hash,
                    canonical: b.canonical,
                    seed: b.seed.0,
                })
                .collect()
        });
        MemberLineageImage { member, blocks }
    }

    /// Every member's lineage as plain values, sorted by member, each one's blocks by engine
    /// hash: what a durability checkpoint of the producer records, so that a restarted
    /// producer translates later events (children of known parents, removals) exactly as
    /// before ([`restore`](Self::restore)). O(engine blocks); the per-member canonical
    /// refcounts are not exported, they follow from the blocks.
    pub fn export(&self) -> Vec<MemberLineageImage> {
        self.members
            .keys()
            .map(|&member| {
                let mut image = Self::export_member(&self.members, member);
                image.blocks.sort_unstable_by_key(|e| e.engine_hash);
                image
            })
            .collect()
    }

    /// Adds `images` to the lineage (into an empty one: rebuilds what
    /// [`export`](Self::export) recorded). Each entry maps its member's engine hash as a store
    /// would, and the member's canonical refcount (engine hashes per canonical hash) is
    /// rebuilt from the entries, so a later removal leaves the state only with the last engine
    /// hash of a canonical block. An engine hash the member already maps keeps its first
    /// mapping (the store rule for a conflict); an image without blocks adds nothing.
    pub fn restore(&mut self, images: impl IntoIterator<Item = MemberLineageImage>) {
        for image in images {
            if image.blocks.is_empty() {
                continue;
            }
            let lineage = self.members.entry(image.member).or_default();
            lineage.blocks.reserve(image.blocks.len());
            for e in image.blocks {
                if let Entry::Vacant(v) = lineage.blocks.entry(e.engine_hash) {
                    v.insert(Block {
                        canonical: e.canonical,
                        seed: BlockSeed(e.seed),
                    });
                    *lineage.refs.entry(e.canonical).or_insert(0) += 1;
                }
            }
        }
    }

    /// Members with a (non-empty) lineage, sorted.
    pub fn members(&self) -> Vec<MemberId> {
        self.members.keys().copied().collect()
    }

    /// The canonical hash and seed `member` maps `engine_hash` to, if known.
    pub fn lookup(&self, member: MemberId, engine_hash: u64) -> Option<(u64, BlockSeed)> {
        let e = self.members.get(&member)?.blocks.get(&engine_hash)?;
        Some((e.canonical, e.seed))
    }

    /// Number of engine hashes `member`'s lineage holds.
    pub fn len(&self, member: MemberId) -> usize {
        self.members.get(&member).map_or(0, |m| m.blocks.len())
    }

    /// Estimated heap bytes held (entries times their size, hash-table overhead included
    /// roughly), for a memory gauge.
    pub fn bytes_used(&self) -> usize {
        // hashbrown: one control byte per bucket plus the entry; the BTreeMap node share is
        // roughly a key, a value and a pointer per member.
        let per_member = std::mem::size_of::<(MemberId, MemberLineage)>() + 8;
        self.members
            .values()
            .map(|m| {
                per_member
                    + m.blocks.capacity() * (std::mem::size_of::<(u64, Block)>() + 1)
                    + m.refs.capacity() * (std::mem::size_of::<(u64, u32)>() + 1)
            })
            .sum()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::event::BlockExtras;

    const A: MemberId = MemberId::new(1, 0);
    const B: MemberId = MemberId::new(1, 1);

    fn f() -> EngineFilters {
        EngineFilters {
            block_size: 2,
            ..EngineFilters::default()
        }
    }

    /// A GPU store of `hashes` (block size 2) after `parent`.
    pub(crate) fn store(hashes: &[u64], parent: Option<u64>, tokens: &[u32]) -> EngineEvent {
        EngineEvent::Stored(StoredBlocks {
            block_hashes: hashes.to_vec(),
            parent,
            token_ids: tokens.to_vec(),
            block_size: 2,
            ..StoredBlocks::default()
        })
    }

    fn remove(hashes: &[u64]) -> EngineEvent {
        EngineEvent::Removed(RemovedBlocks {
            block_hashes: hashes.to_vec(),
            ..RemovedBlocks::default()
        })
    }

    /// An image captured in steps while events go on between them is the lineage of the
    /// capture's start: every event kind, several members, members appearing and cleared.
    #[test]
    fn a_capture_between_events_is_the_lineage_of_its_start() {
        use proptest::prelude::*;
        let event = || {
            prop_oneof![
                4 => (0u64..40, 0u64..40)
                    .prop_map(|(h, p)| store(&[h + 100, h + 200], (p % 3 == 0).then_some(p + 100), &[1, 2, 3, 4])),
                2 => proptest::collection::vec(100u64..240, 1..4).prop_map(|h| remove(&h)),
                1 => Just(EngineEvent::AllCleared),
            ]
        };
        // (member, 0 = clear_member instead of the event, the event)
        let step = || (0u64..4, 0u8..8, event());
        let mut runner = proptest::test_runner::TestRunner::default();
        runner
            .run(
                &(
                    proptest::collection::vec(step(), 0..60),
                    proptest::collection::vec(
                        (0usize..3, proptest::collection::vec(step(), 0..4)),
                        0..12,
                    ),
                ),
                |(before, during)| {
                    let mut l = Lineage::new();
                    let apply = |l: &mut Lineage, (m, c, e): &(u64, u8, EngineEvent)| {
                        let member = MemberId::new(*m, 0);
                        if *c == 0 {
                            l.clear_member(member);
                        } else {
                            l.translate(member, e, &f());
                        }
                    };
                    for s in &before {
                        apply(&mut l, s);
                    }
                    let expected = l.export();
                    l.begin_capture();
                    let mut more = true;
                    for (budget, events) in &during {
                        for s in events {
                            apply(&mut l, s);
                        }
                        more = l.capture_step(*budget);
                        if !more {
                            break;
                        }
                    }
                    while more {
                        more = l.capture_step(1);
                    }
                    let mut images = l.take_capture().expect("finished");
                    for image in &mut images {
                        image.blocks.sort_unstable_by_key(|e| e.engine_hash);
                    }
                    prop_assert_eq!(images, expected);
                    prop_assert!(l.take_capture().is_none(), "taken once");
                    Ok(())
                },
            )
            .unwrap();
    }

    fn stored_kind(t: &Translation) -> Vec<u64> {
        match &t.kv_event.as_ref().expect("an event").kind {
            KvEventKind::Stored { block_hashes, .. } => block_hashes.clone(),
            other => panic!("{other:?}"),
        }
    }

    fn removed_kind(t: &Translation) -> Vec<u64> {
        match &t.kv_event.as_ref().expect("an event").kind {
            KvEventKind::Removed { block_hashes } => block_hashes.clone(),
            other => panic!("{other:?}"),
        }
    }

    fn chain(tokens: &[u32], seed: BlockSeed) -> Vec<u64> {
        tokens::sequence_hashes(tokens, 2, seed, &[]).unwrap()
    }

    /// A TensorRT-LLM store (tagged map, `lora_id` without `lora_name`, `mm_keys` per block),
    /// decoded then translated: the seed is the id's decimal name, block 1 carries the image.
    #[test]
    fn trt_lora_id_and_mm_keys_enter_the_canonical_chain() {
        use rmpv::Value as V;
        let s = |x: &str| V::from(x);
        let key = V::Map(vec![
            (s("type"), s("mm_key")),
            (s("hash"), s(&"ab".repeat(32))),
            (s("start_offset"), V::from(2)),
        ]);
        let ev = V::Map(vec![
            (s("type"), s("BlockStored")),
            (s("block_hashes"), V::Array(vec![V::from(-1), V::from(-2)])),
            (s("parent_block_hash"), V::Nil),
            (s("token_ids"), V::Array((1..=4).map(V::from).collect())),
            (s("block_size"), V::from(2)),
            (s("lora_id"), V::from(3)),
            (s("medium"), s("GPU")),
            (s("lora_name"), V::Nil),
            (
                s("mm_keys"),
                V::Array(vec![V::Array(vec![]), V::Array(vec![key])]),
            ),
        ]);
        let mut payload = Vec::new();
        let batch = V::Array(vec![V::F64(1.0), V::Array(vec![ev])]);
        rmpv::encode::write_value(&mut payload, &batch).unwrap();
        let limits = crate::wire::DecodeLimits::default();
        let batch = crate::wire::decode_batch(&payload, &limits).unwrap();
        let mut l = Lineage::new();
        let got = stored_kind(&l.translate(A, &batch.events[0], &f()));
        let seed = BlockSeed::new(None, Some("3"));
        let image = tokens::MultimodalSpan {
            hash: 0xabab_abab_abab_abab,
            offset: 2,
            length: 2,
        };
        let want = tokens::sequence_hashes(&[1, 2, 3, 4], 2, seed, &[image]).unwrap();
        assert_eq!(got, want);
        // Block 0 is the adapter's text block; block 1 differs from the text-only chain, and
        // nothing matches the base model's chain.
        let text = chain(&[1, 2, 3, 4], seed);
        assert_eq!(got[0], text[0]);
        assert_ne!(got[1], text[1]);
        assert_ne!(got[0], chain(&[1, 2], BlockSeed::DEFAULT)[0]);
        assert_eq!(l.lookup(A, (-2i64) as u64), Some((want[1], seed)));
        // A child store without LoRA fields inherits the adapter's seed from its parent.
        let t = l.translate(A, &store(&[7], Some((-2i64) as u64), &[5, 6]), &f());
        let child = tokens::next_sequence_hash(want[1], tokens::block_hash(&[5, 6], &[], seed));
        assert_eq!(stored_kind(&t), vec![child]);
    }

    #[test]
    fn chained_stores_follow_the_parent_and_its_seed() {
        let mut l = Lineage::new();
        let first = EngineEvent::Stored(StoredBlocks {
            block_hashes: vec![10],
            token_ids: vec![1, 2],
            block_size: 2,
            block_extras: vec![BlockExtras {
                salt: Some("s".into()),
                ..BlockExtras::default()
            }],
            ..StoredBlocks::default()
        });
        let seed = BlockSeed::new(Some("s"), None);
        let want = chain(&[1, 2, 3, 4, 5, 6], seed);
        assert_eq!(stored_kind(&l.translate(A, &first, &f())), want[..1]);
        // the child names no salt: it inherits the parent's seed.
        let t = l.translate(A, &store(&[11, 12], Some(10), &[3, 4, 5, 6]), &f());
        assert_eq!(stored_kind(&t), want[1..]);
        assert_eq!(
            t.kv_event.unwrap().kind,
            KvEventKind::Stored {
                block_hashes: want[1..].to_vec(),
                parent_hash: Some(want[0])
            }
        );
        assert_eq!(l.lookup(A, 12), Some((want[2], seed)));
        assert_eq!(l.len(A), 3);
    }

    #[test]
    fn orphans_and_members_are_separate() {
        let mut l = Lineage::new();
        l.translate(A, &store(&[10], None, &[1, 2]), &f());
        let t = l.translate(B, &store(&[11], Some(10), &[3, 4]), &f());
        assert_eq!(t.kv_event, None);
        assert_eq!(t.skipped, vec![(SkipReason::Orphan, 1)]);
        assert_eq!(l.len(B), 0);
        assert_eq!(l.members(), vec![A]);
        let t = l.translate(B, &remove(&[10]), &f());
        assert_eq!(
            (t.kv_event, t.skipped),
            (None, vec![(SkipReason::UnknownRemoval, 1)])
        );
        assert_eq!(l.len(A), 1);
    }

    #[test]
    fn canonical_refcount_per_member() {
        let mut l = Lineage::new();
        // two engine hashes, same tokens and seed: one canonical block.
        let c = chain(&[1, 2], BlockSeed::DEFAULT)[0];
        assert_eq!(
            stored_kind(&l.translate(A, &store(&[10], None, &[1, 2]), &f())),
            [c]
        );
        assert_eq!(
            stored_kind(&l.translate(A, &store(&[20], None, &[1, 2]), &f())),
            [c]
        );
        let t = l.translate(A, &remove(&[10]), &f());
        assert_eq!((t.kv_event, t.skipped.len()), (None, 0));
        // a duplicate store of an engine hash does not count twice
        l.translate(A, &store(&[20], None, &[1, 2]), &f());
        let t = l.translate(A, &remove(&[20, 99]), &f());
        assert_eq!(removed_kind(&t), [c]);
        assert_eq!(t.skipped, vec![(SkipReason::UnknownRemoval, 1)]);
        assert!(l.members().is_empty());
        assert_eq!(l.bytes_used(), 0);
    }

    #[test]
    fn conflicting_engine_hash_keeps_the_first_mapping() {
        let mut l = Lineage::new();
        let first = chain(&[1, 2], BlockSeed::DEFAULT);
        l.translate(A, &store(&[10], None, &[1, 2]), &f());
        let t = l.translate(A, &store(&[10, 11], None, &[7, 7, 3, 4]), &f());
        assert_eq!(t.skipped, vec![(SkipReason::Conflict, 1)]);
        // block 11 chains on from the kept mapping of 10
        assert_eq!(
            stored_kind(&t),
            chain(&[1, 2, 3, 4], BlockSeed::DEFAULT)[1..]
        );
        assert_eq!(l.lookup(A, 10).unwrap().0, first[0]);
    }

    #[test]
    fn filters_unknown_and_clear() {
        let mut l = Lineage::new();
        let t = l.translate(A, &store(&[10, 11], None, &[1, 2, 3]), &f());
        assert_eq!(t.skipped, vec![(SkipReason::Filter(Skip::Tokens), 2)]);
        assert_eq!(t.skipped[0].0.label(), "tokens");
        let t = l.translate(A, &EngineEvent::Unknown { kind: "X".into() }, &f());
        assert_eq!(t.skipped, vec![(SkipReason::UnknownEvent, 1)]);
        let t = l.translate(A, &store(&[], None, &[]), &f());
        assert_eq!(t, Translation::default());
        l.translate(A, &store(&[10], None, &[1, 2]), &f());
        l.translate(B, &store(&[10], None, &[1, 2]), &f());
        assert!(l.bytes_used() > 0);
        let t = l.translate(A, &EngineEvent::AllCleared, &f());
        assert_eq!(t.kv_event.unwrap().kind, KvEventKind::Cleared);
        assert_eq!(l.members(), vec![B]);
        assert!(l.clear_member(B));
        assert!(!l.clear_member(B));
        assert!(l.members().is_empty());
    }
}
