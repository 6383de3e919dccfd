//! `DcCkfState` against an exact model (docs/design.md, "Correctness checks").
//!
//! Random store / remove / clear / remove-worker / publish sequences over 6 members (3 workers x
//! 2 ranks, so some blocks have more than the three inline owners) and 64 block hashes, on 2-32 bucket tables (powers of two and not) with 0-500 kicks, so collisions, kicks and
//! capacity omissions all happen. Sixteen of the hashes come in pairs that share fingerprint and
//! bucket pair (found by brute force), so representation multiplicity is exercised.
//!
//! After every operation: ownership, refcounts and outcome counts equal the model (which mirrors
//! omissions: an omitted store adds nothing); every tracked hash's fingerprint is in one of its
//! two buckets, with at least one copy per tracked hash of each (fingerprint, bucket pair); the
//! physical fingerprint count equals the number of tracked hashes; a single-block omission left
//! the table bytes and the dirty set untouched and happened only with both buckets full.
//! Publishing applies each batch to a consumer copy, which must converge to the producer table.

use std::collections::{BTreeMap, BTreeSet};

use ckf_core::addressing::fmix64;
use ckf_core::bucket;
use ckf_core::dc::{BlockError, DcCkfConfig, DcCkfState, EventOutcome, MemberId};
use ckf_core::{Addressing, TableFormat};
use proptest::prelude::*;

const SEED: u64 = 0x5EED;
const HASHES: usize = 64;
const SHARED_PAIRS: usize = 8;
const MEMBERS: usize = 6;

/// Inverse of `fmix64` (each xor-shift by 33 is its own inverse, each odd multiplier has an
/// inverse mod 2^64), so a test can pick the mixed word and get the block hash that gives it.
fn unfmix64(mut k: u64) -> u64 {
    let inv = |c: u64| {
        let mut x = c;
        for _ in 0..6 {
            x = x.wrapping_mul(2u64.wrapping_sub(c.wrapping_mul(x)));
        }
        x
    };
    k ^= k >> 33;
    k = k.wrapping_mul(inv(0xc4ce_b9fe_1a85_ec53));
    k ^= k >> 33;
    k = k.wrapping_mul(inv(0xff51_afd7_ed55_8ccd));
    k ^= k >> 33;
    k
}

/// 64 block hashes; the first `2 * SHARED_PAIRS` are pairs with equal (fingerprint, bucket pair)
/// in a table of *any* bucket count: the two mixed words of a pair share the fingerprint bits
/// (48..63) and the bucket bits (0..31), and differ only in bits 32..47, which format v2 never
/// reads (built through the inverse of `fmix64`).
fn universe() -> Vec<u64> {
    let mut hashes = Vec::new();
    for i in 0..SHARED_PAIRS as u64 {
        let mixed = fmix64(i ^ 0x9A1B);
        let fp = (mixed >> 48).max(1) << 48;
        let low = mixed & 0xFFFF_FFFF;
        for mid in [0x1111u64, 0x2222] {
            hashes.push(unfmix64(fp | mid << 32 | low) ^ SEED);
        }
    }
    for j in 0..(HASHES - 2 * SHARED_PAIRS) as u64 {
        hashes.push(fmix64(j ^ 0xABCD_0000));
    }
    hashes
}

/// Table sizes of the model: powers of two and format v2's other even counts, from the 2-bucket
/// minimum up (`docs/design.md`, "Cuckoo filter cases", cases 2, 3, 5, 7 on tables where the alternate is a modular
/// subtraction that wraps, not an XOR).
const BUCKET_COUNTS: [u64; 10] = [2, 4, 6, 8, 10, 12, 14, 16, 22, 32];

#[derive(Debug, Clone)]
enum Op {
    Store(usize, Vec<usize>),
    Remove(usize, Vec<usize>),
    Clear(usize),
    RemoveWorker(u64),
    Publish,
    /// One slice of the clears in progress.
    ReleaseStep,
}

fn member(i: usize) -> MemberId {
    MemberId::new(i as u64 / 2, (i % 2) as u32)
}

fn op() -> impl Strategy<Value = Op> {
    let blocks = prop::collection::btree_set(0..HASHES, 1..5)
        .prop_map(|s| s.into_iter().collect::<Vec<_>>());
    prop_oneof![
        10 => (0..MEMBERS, blocks.clone()).prop_map(|(m, b)| Op::Store(m, b)),
        6 => (0..MEMBERS, prop::collection::vec(0..HASHES, 1..5)).prop_map(|(m, b)| Op::Remove(m, b)),
        1 => (0..MEMBERS).prop_map(Op::Clear),
        1 => (0..MEMBERS as u64 / 2).prop_map(Op::RemoveWorker),
        2 => Just(Op::Publish),
        3 => Just(Op::ReleaseStep),
    ]
}

/// The exact model: member -> owned hashes.
#[derive(Default)]
struct Model {
    owned: BTreeMap<MemberId, BTreeSet<u64>>,
}

impl Model {
    fn refcount(&self, h: u64) -> u32 {
        self.owned.values().filter(|s| s.contains(&h)).count() as u32
    }
    fn owns(&self, m: MemberId, h: u64) -> bool {
        self.owned.get(&m).is_some_and(|s| s.contains(&h))
    }
    fn tracked(&self) -> BTreeSet<u64> {
        self.owned.values().flatten().copied().collect()
    }
    fn clear(&mut self, m: MemberId) -> u32 {
        self.owned.remove(&m).map_or(0, |s| s.len() as u32)
    }
}

fn copies(word: u64, fp: u16) -> usize {
    bucket::slots(word).iter().filter(|&&s| s == fp).count()
}

/// Every check that must hold between operations.
fn check(state: &DcCkfState, model: &Model, hashes: &[u64]) -> Result<(), TestCaseError> {
    let a = *state.addressing();
    let buckets = state.buckets();
    let tracked = model.tracked();
    for &h in hashes {
        prop_assert_eq!(state.refcount(h), model.refcount(h), "refcount of {:#x}", h);
        for m in 0..MEMBERS {
            prop_assert_eq!(state.owns(member(m), h), model.owns(member(m), h));
        }
    }
    // At least one physical copy per tracked hash of each (fingerprint, bucket pair).
    let mut groups: BTreeMap<(u16, u32, u32), usize> = BTreeMap::new();
    for &h in &tracked {
        let l = a.locate(h);
        prop_assert!(state.may_contain(h), "tracked {:#x} not in its buckets", h);
        let key = (
            l.fingerprint,
            l.bucket_a.min(l.bucket_b),
            l.bucket_a.max(l.bucket_b),
        );
        *groups.entry(key).or_default() += 1;
    }
    for (&(fp, x, y), &n) in &groups {
        let have = copies(buckets[x as usize], fp) + copies(buckets[y as usize], fp);
        prop_assert!(
            have >= n,
            "{} hashes share fp {:#x} in ({}, {}) but {} copies",
            n,
            fp,
            x,
            y,
            have
        );
    }
    for m in 0..MEMBERS {
        let expect: Vec<u64> = model
            .owned
            .get(&member(m))
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        let mut got = state.member_blocks(member(m));
        got.sort_unstable();
        let mut expect = expect;
        expect.sort_unstable();
        prop_assert_eq!(got, expect, "blocks of member {}", m);
    }
    let stats = state.stats();
    prop_assert_eq!(stats.members, model.owned.len());
    let edges: usize = model.owned.values().map(BTreeSet::len).sum();
    // Cleared members' edges not swept yet still count, their blocks keep a fingerprint.
    prop_assert_eq!(
        stats.ownership_edges,
        edges as u64 + state.releasing_edges()
    );
    prop_assert_eq!(state.releasing(), state.releasing_edges() > 0);
    prop_assert_eq!(state.count_resident(), stats.resident_fingerprints);
    if state.releasing() {
        prop_assert!(stats.resident_fingerprints >= tracked.len() as u64);
        prop_assert!(stats.unique_blocks >= tracked.len());
    } else {
        prop_assert_eq!(stats.resident_fingerprints, tracked.len() as u64);
        prop_assert_eq!(stats.unique_blocks, tracked.len());
    }
    prop_assert_eq!(stats.missing_fingerprints_total, 0);
    Ok(())
}

fn run(
    bucket_count: u64,
    max_kicks: u32,
    slice_lines: u32,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let hashes = universe();
    let format = TableFormat::new(bucket_count, SEED).unwrap();
    let mut state = DcCkfState::new(DcCkfConfig {
        format,
        max_kicks,
        reserve_blocks: 0,
        slice_lines,
    })
    .unwrap();
    let mut model = Model::default();
    let mut consumer = state.buckets().to_vec();
    let mut omissions = 0u64;
    let a = *state.addressing();
    for op in ops {
        match op {
            Op::Store(m, idx) => {
                let m = member(m);
                let blocks: Vec<u64> = idx.iter().map(|&i| hashes[i]).collect();
                let before = state.buckets().to_vec();
                let pending_before = state.pending_dirty();
                let out = state.store(m, &blocks);
                let mut expect = EventOutcome::default();
                for &h in &blocks {
                    if model.owns(m, h) {
                        expect.redundant += 1;
                    } else if state.owns(m, h) {
                        expect.applied += 1;
                        model.owned.entry(m).or_default().insert(h);
                    } else {
                        // Omitted: only a first owner's insertion can fail.
                        prop_assert_eq!(model.refcount(h), 0, "store of a tracked hash omitted");
                        expect.omitted += 1;
                        expect
                            .first_error
                            .get_or_insert(BlockError::CapacityExhausted {
                                block_hash: h,
                                kicks: max_kicks,
                            });
                    }
                }
                prop_assert_eq!(out, expect);
                omissions += u64::from(out.omitted);
                if blocks.len() == 1 && out.omitted == 1 {
                    let l = a.locate(blocks[0]);
                    prop_assert_eq!(state.buckets(), &before[..], "omission changed the table");
                    prop_assert_eq!(state.pending_dirty(), pending_before);
                    prop_assert_eq!(bucket::occupied(before[l.bucket_a as usize]), 4);
                    prop_assert_eq!(bucket::occupied(before[l.bucket_b as usize]), 4);
                }
            }
            Op::Remove(m, idx) => {
                let m = member(m);
                let blocks: Vec<u64> = idx.iter().map(|&i| hashes[i]).collect();
                let out = state.remove(m, &blocks);
                let mut expect = EventOutcome::default();
                for h in &blocks {
                    let removed = model.owned.get_mut(&m).is_some_and(|s| s.remove(h));
                    if removed {
                        expect.applied += 1;
                    } else {
                        expect.unknown += 1;
                    }
                }
                model.owned.retain(|_, s| !s.is_empty());
                prop_assert_eq!(out, expect);
            }
            Op::Clear(m) => {
                let out = state.clear_member(member(m));
                prop_assert_eq!(out.applied, model.clear(member(m)));
            }
            Op::RemoveWorker(w) => {
                let out = state.remove_worker(w);
                let cleared = model.clear(MemberId::new(w, 0)) + model.clear(MemberId::new(w, 1));
                prop_assert_eq!(out.applied, cleared);
            }
            Op::Publish => {
                if let Some(batch) = state.take_batch() {
                    let mut seen = BTreeSet::new();
                    for image in &batch.images {
                        prop_assert!(seen.insert(image.bucket), "duplicate bucket in batch");
                        prop_assert_ne!(consumer[image.bucket as usize], image.image);
                        consumer[image.bucket as usize] = image.image;
                    }
                }
                prop_assert_eq!(state.pending_dirty(), 0);
                prop_assert_eq!(&consumer[..], state.buckets(), "consumer copy diverged");
            }
            Op::ReleaseStep => {
                let more = state.release_step();
                prop_assert_eq!(more, state.releasing());
            }
        }
        check(&state, &model, &hashes)?;
    }
    // Settled: the sweep ends, and with it every trace of the cleared members.
    state.finish_releases();
    check(&state, &model, &hashes)?;
    prop_assert_eq!(state.stats().omissions_total, omissions);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn state_matches_exact_model(
        bucket_count in prop::sample::select(BUCKET_COUNTS.to_vec()),
        max_kicks in prop::sample::select(vec![0u32, 1, 5, 50, 500]),
        slice_lines in prop::sample::select(vec![0u32, 1, 2]),
        ops in prop::collection::vec(op(), 1..160),
    ) {
        run(bucket_count, max_kicks, slice_lines, ops)?;
    }
}

#[test]
fn universe_has_shared_representations() {
    let hashes = universe();
    assert_eq!(hashes.len(), HASHES);
    assert_eq!(hashes.iter().collect::<BTreeSet<_>>().len(), HASHES);
    let large = [1_000_002, (1 << 31) - 2, ckf_core::addressing::MAX_BUCKETS];
    for bucket_count in BUCKET_COUNTS.into_iter().chain(large) {
        let a = Addressing::new(&TableFormat::new(bucket_count, SEED).unwrap()).unwrap();
        for pair in hashes[..2 * SHARED_PAIRS].chunks(2) {
            assert_eq!(a.locate(pair[0]), a.locate(pair[1]));
        }
    }
}

/// The model test must see omissions and kicks, or it proves little: a fixed heavy sequence on
/// the smallest table.
#[test]
fn tiny_table_sees_kicks_and_omissions() {
    let hashes = universe();
    let format = TableFormat::new(8, SEED).unwrap();
    let mut state = DcCkfState::new(DcCkfConfig::new(format)).unwrap();
    for (i, &h) in hashes.iter().enumerate() {
        state.store(member(i % 4), &[h]);
    }
    let stats = state.stats();
    assert!(stats.kicks_total > 0);
    assert!(stats.omissions_total > 0);
    assert!(stats.resident_fingerprints <= 32);
}
