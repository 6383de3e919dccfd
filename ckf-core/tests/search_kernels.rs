//! Every search kernel against the portable one and against an exact model of the table, on the
//! same tables: random lane counts, fill levels, ready masks and query lengths (0, 1, long, the
//! indexer's 8,192-block limit), slot values drawn from a tiny alphabet so fingerprint
//! collisions and full-depth answers are common, tables large enough for the prefetching path;
//! plus kernel choice: forcing, `Auto`, refusals, and proof that a forced kernel really ran.
//! Every check also runs the lazy form (`find_prefix_matches_lazy`) on the same query: the same
//! answer, and no more of its iterator pulled than the early exit allows.
//!
//! A kernel this CPU lacks is skipped, saying so on stderr (`cargo test -- --nocapture`).

use ckf_core::addressing::{TableFormat, fmix64};
use ckf_core::bucket::{self, with_slot};
use ckf_core::global::GlobalCkfIndexer;
use ckf_core::search::{LAZY_STEP, PrefixMatches, SearchKernel, SearchKernelError};
use ckf_core::testing;
use proptest::prelude::*;
use std::cell::Cell;

/// The concrete kernels, portable first.
const KERNELS: [SearchKernel; 4] = [
    SearchKernel::Portable,
    SearchKernel::Avx2,
    SearchKernel::Avx512,
    SearchKernel::Neon,
];

/// The kernels this CPU runs; prints the ones skipped.
fn runnable() -> Vec<SearchKernel> {
    KERNELS
        .into_iter()
        .filter(|k| {
            let ok = k.is_available();
            if !ok {
                eprintln!(
                    "search kernel {k} skipped: this CPU lacks {}",
                    k.requirement()
                );
            }
            ok
        })
        .collect()
}

fn indexer(buckets: u64, lanes: usize, seed: u64) -> GlobalCkfIndexer {
    testing::indexer("d", TableFormat::new(buckets, seed).unwrap(), lanes, 1)
}

/// Asserts every runnable kernel gives the model's answer for every lane (and `None` for lanes
/// not ready or not configured).
fn check_all_kernels(
    ix: &GlobalCkfIndexer,
    tables: &[Vec<u64>],
    ready: u64,
    query: &[u64],
) -> Result<(), TestCaseError> {
    let addressing = *ix.addressing();
    let portable = ix.find_prefix_matches_portable(query);
    for kernel in runnable() {
        let m = ix.find_prefix_matches_with(kernel, query).unwrap();
        prop_assert_eq!(m, portable, "kernel {} differs from portable", kernel);
        prop_assert_eq!(m.ready_mask(), ready);
        for lane in 0..64u8 {
            let want = (usize::from(lane) < tables.len() && ready & (1 << lane) != 0)
                .then(|| testing::model_depth(&addressing, &tables[lane as usize], query));
            prop_assert_eq!(m.depth(lane), want, "kernel {} lane {}", kernel, lane);
        }
        // The lazy form: the same answer, and the iterator pulled only as far as its rule says.
        let pulled = Cell::new(0usize);
        let hashes = query
            .iter()
            .inspect(|_| pulled.set(pulled.get() + 1))
            .copied();
        let lazy = ix.find_prefix_matches_lazy_with(kernel, hashes).unwrap();
        prop_assert_eq!(
            lazy,
            m,
            "kernel {} lazy differs from the slice form",
            kernel
        );
        let (least, most) = lazy_pull_bounds(ix, &m, query.len());
        prop_assert!(
            (least..=most).contains(&pulled.get()),
            "kernel {} lazy pulled {} of {} hashes, expected {}..={}",
            kernel,
            pulled.get(),
            query.len(),
            least,
            most
        );
    }
    Ok(())
}

/// How many hashes a lazy query of `n` hashes answered `m` may pull: at least every position
/// up to the deepest ready lane's first miss (it must see that miss), at most the step holding
/// that miss plus, on a table of 1 MiB or more, the step hashed ahead of it; nothing when no
/// lane is ready.
fn lazy_pull_bounds(ix: &GlobalCkfIndexer, m: &PrefixMatches, n: usize) -> (usize, usize) {
    let Some(deepest) = m.iter().map(|(_, d)| d as usize).max() else {
        return (0, 0);
    };
    if deepest == n {
        return (n, n);
    }
    let ahead = usize::from(ix.table().bytes() >= 1 << 20);
    let steps = deepest / LAZY_STEP + 1 + ahead;
    (deepest + 1, (steps * LAZY_STEP).min(n))
}

/// A lane's words: each slot empty with probability `1 - fill`, otherwise a value from
/// `alphabet` (query fingerprints and their near neighbours, so collisions are common) or a
/// random fingerprint.
fn random_words(buckets: u64, fill: u8, alphabet: &[u16], seed: u64) -> Vec<u64> {
    (0..buckets)
        .map(|b| {
            let mut w = 0u64;
            for s in 0..bucket::SLOTS {
                let r = fmix64(seed ^ (b << 8) ^ s as u64);
                if (r & 0xFF) as u8 >= fill {
                    continue;
                }
                let v = if (r >> 8) & 1 == 0 && !alphabet.is_empty() {
                    alphabet[((r >> 16) % alphabet.len() as u64) as usize]
                } else {
                    ((r >> 32) as u16).max(1)
                };
                w = with_slot(w, s, v);
            }
            w
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn every_kernel_equals_portable_and_the_model(
        lanes in prop_oneof![1usize..=16, 17usize..=64],
        ready_bits in any::<u64>(),
        seed in any::<u64>(),
        half_buckets in prop_oneof![(0u32..11).prop_map(|l| 1u64 << l), 1u64..2048],
        fill in any::<u8>(),
        query_len in prop_oneof![Just(0usize), Just(1usize), 0usize..40, 40usize..300],
        planted in any::<u64>(),
    ) {
        // Any even bucket count (format v2), powers of two among them.
        let buckets = 2 * half_buckets;
        let ix = indexer(buckets, lanes, seed);
        let addressing = *ix.addressing();
        let query: Vec<u64> = (0..query_len as u64).map(|i| fmix64(seed ^ (i + 1))).collect();
        // The query's fingerprints, their neighbours and the edge values of a 16-bit slot.
        let mut alphabet: Vec<u16> = query.iter().take(16).map(|&h| addressing.locate(h).fingerprint).collect();
        let neighbours: Vec<u16> = alphabet.iter().map(|f| f.wrapping_add(1).max(1)).collect();
        alphabet.extend(neighbours);
        alphabet.extend([1, 0x7FFF, 0x8000, 0xFFFF]);
        let mut tables = Vec::new();
        for lane in 0..lanes {
            let lane_seed = fmix64(seed ^ lane as u64);
            let mut words = random_words(buckets, fill, &alphabet, lane_seed);
            // A random prefix of the query placed exactly, so lanes reach different depths.
            let keep = (fmix64(planted ^ lane as u64) as usize) % (query_len + 1);
            testing::place_blocks(&addressing, &mut words, query[..keep].iter().copied());
            if ready_bits & (1 << lane) != 0 {
                testing::activate(&ix, lane as u8, lane as u64, 0, words.clone());
            }
            tables.push(words);
        }
        let ready = ready_bits & (u64::MAX >> (64 - lanes));
        check_all_kernels(&ix, &tables, ready, &query)?;
    }

    /// Tables of 1-8 MiB: the prefetching query loops (tables >= 1 MiB) of every kernel, both
    /// rows of each position read together or (as on tables beyond the last-level cache) the
    /// alternate row read on demand for the lanes the primary one missed.
    #[test]
    fn every_kernel_agrees_on_prefetched_tables(
        lanes in prop_oneof![Just(16usize), Just(5usize), Just(64usize), 1usize..=64],
        seed in any::<u64>(),
        query_len in prop_oneof![Just(0usize), Just(1usize), 2usize..64, 64usize..200],
        ready_bits in any::<u64>(),
        spare in 0u64..4096,
        on_demand in any::<bool>(),
    ) {
        // 1 MiB and up per full lane group, not a power of two (format v2 sizes tables to any
        // even count).
        let buckets = ((1u64 << 20) / 8 / lanes.min(16) as u64 + 2 * spare + 2).next_multiple_of(2);
        testing::force_alternate_on_demand(Some(on_demand));
        let ix = indexer(buckets, lanes, seed);
        testing::force_alternate_on_demand(None);
        let addressing = *ix.addressing();
        let query: Vec<u64> = (0..query_len as u64).map(|i| fmix64(seed ^ (i + 7))).collect();
        let mut tables = Vec::new();
        for lane in 0..lanes {
            let mut words = random_words(buckets, 200, &[], fmix64(seed ^ (lane as u64) << 20));
            // Lanes hold prefixes of decreasing length (placed in free slots, so some are cut).
            let keep = query_len.saturating_sub(lane * 3);
            words.iter_mut().step_by(2).for_each(|w| *w &= 0x0000_FFFF_FFFF_FFFF);
            testing::place_blocks(&addressing, &mut words, query[..keep].iter().copied());
            if ready_bits & (1 << lane) != 0 {
                testing::activate(&ix, lane as u8, lane as u64, 0, words.clone());
            }
            tables.push(words);
        }
        let ready = ready_bits & (u64::MAX >> (64 - lanes));
        check_all_kernels(&ix, &tables, ready, &query)?;
    }
}

/// The longest query the indexer accepts (`limits.max_query_blocks`, 8,192) at full depth in
/// every lane, on a 4 MiB 16-lane table (prefetch path), and with one lane cut at the last block.
#[test]
fn longest_query_at_full_depth() {
    for on_demand in [None, Some(true)] {
        longest_query_at_full_depth_with(on_demand);
    }
}

fn longest_query_at_full_depth_with(on_demand: Option<bool>) {
    let (buckets, lanes) = (32768u64, 16usize);
    testing::force_alternate_on_demand(on_demand);
    let ix = indexer(buckets, lanes, 5);
    testing::force_alternate_on_demand(None);
    let addressing = *ix.addressing();
    let query: Vec<u64> = (0..8192u64).map(|i| fmix64(i ^ 0xABC)).collect();
    let mut tables = Vec::new();
    for lane in 0..lanes {
        let mut words = vec![0u64; buckets as usize];
        let keep = if lane == 3 { 8191 } else { 8192 };
        testing::place_blocks(&addressing, &mut words, query[..keep].iter().copied());
        testing::activate(&ix, lane as u8, lane as u64, 0, words.clone());
        tables.push(words);
    }
    check_all_kernels(&ix, &tables, 0xFFFF, &query).unwrap();
    let m = ix.find_prefix_matches(&query);
    // Every block fits at 6% load, so every lane but 3 holds all of them (3 stops at 8,191
    // unless a collision makes the last block a false positive, which the model would show).
    let model3 = testing::model_depth(&addressing, &tables[3], &query);
    assert!(model3 >= 8191);
    for lane in 0..16u8 {
        let want = if lane == 3 { model3 } else { 8192 };
        assert_eq!(m.depth(lane), Some(want), "lane {lane}");
    }
}

/// The on-demand loop (a table beyond the last-level cache, forced here on a 1 MiB one) at every
/// query length 0..=40 and every stop around its chunk edges (7, 8, 9, 15, 16, 17, 23, 24, 25:
/// the first 16 positions read both rows, later ones check their primary row a chunk ahead),
/// with lanes whose blocks sit only in their alternate bucket, only in their primary bucket, or
/// alternating: every kernel equals the model.
#[test]
fn on_demand_alternate_rows_at_every_chunk_edge() {
    let (buckets, lanes) = (8192u64, 16usize);
    testing::force_alternate_on_demand(Some(true));
    let ix = indexer(buckets, lanes, 11);
    testing::force_alternate_on_demand(None);
    let addressing = *ix.addressing();
    let query: Vec<u64> = (0..40u64).map(|i| fmix64(i ^ 0xED6E)).collect();
    let stops = [
        0usize, 1, 7, 8, 9, 15, 16, 17, 23, 24, 25, 33, 40, 40, 40, 40,
    ];
    let mut tables = Vec::new();
    for lane in 0..lanes {
        let mut words = vec![0u64; buckets as usize];
        for (i, &h) in query[..stops[lane]].iter().enumerate() {
            let loc = addressing.locate(h);
            // Lane % 3: 0 primary only, 1 alternate only, 2 alternating by position.
            let alternate = match lane % 3 {
                0 => false,
                1 => true,
                _ => i % 2 == 1,
            };
            let b = if alternate {
                loc.bucket_b
            } else {
                loc.bucket_a
            } as usize;
            let slot = bucket::find_empty(words[b]).expect("a free slot at this load");
            words[b] = with_slot(words[b], slot, loc.fingerprint);
        }
        testing::activate(&ix, lane as u8, lane as u64, 0, words.clone());
        tables.push(words);
    }
    for n in 0..=query.len() {
        check_all_kernels(&ix, &tables, 0xFFFF, &query[..n]).unwrap();
        let m = ix.find_prefix_matches(&query[..n]);
        for lane in 0..lanes {
            let model = testing::model_depth(&addressing, &tables[lane], &query[..n]);
            // A lane holds its blocks exactly (no collision reaches past its stop here).
            assert!(model as usize >= stops[lane].min(n), "lane {lane}, n {n}");
            assert_eq!(m.depth(lane as u8), Some(model), "lane {lane}, n {n}");
        }
    }
}

/// Fingerprint collisions: blocks never stored are found because another block with the same
/// fingerprint sits in one of their candidate buckets (a false positive every kernel must report
/// identically), and a fingerprint in a non-candidate bucket never counts.
#[test]
fn fingerprint_collisions_are_reported_alike() {
    let (buckets, lanes) = (1024u64, 7usize);
    let ix = indexer(buckets, lanes, 11);
    let addressing = *ix.addressing();
    let query: Vec<u64> = (0..12u64).map(|i| fmix64(i + 1000)).collect();
    let mut tables = Vec::new();
    for lane in 0..lanes {
        let mut words = vec![0u64; buckets as usize];
        for (i, &h) in query.iter().enumerate() {
            let loc = addressing.locate(h);
            match (i + lane) % 3 {
                // The fingerprint alone in the higher candidate's last slot (no block placed:
                // the same 16 bits from "another block").
                0 => {
                    let b = loc.bucket_a.max(loc.bucket_b) as usize;
                    words[b] = with_slot(words[b], 3, loc.fingerprint);
                }
                // The fingerprint in a bucket that is neither candidate: must not count.
                1 if lane % 2 == 0 => {
                    let other = (0..buckets as u32)
                        .find(|&b| b != loc.bucket_a && b != loc.bucket_b)
                        .unwrap() as usize;
                    words[other] = with_slot(words[other], 0, loc.fingerprint);
                }
                // Near misses around the fingerprint in both candidates, then the real one.
                _ => {
                    for b in [loc.bucket_a, loc.bucket_b] {
                        let b = b as usize;
                        words[b] = with_slot(words[b], 0, loc.fingerprint ^ 1);
                        words[b] = with_slot(words[b], 1, loc.fingerprint.wrapping_add(0x100));
                    }
                    let b = loc.bucket_a as usize;
                    words[b] = with_slot(words[b], 2, loc.fingerprint);
                }
            }
        }
        testing::activate(&ix, lane as u8, lane as u64, 0, words.clone());
        tables.push(words);
    }
    check_all_kernels(&ix, &tables, 0x7F, &query).unwrap();
    let m = ix.find_prefix_matches(&query);
    // Odd lanes hold every block (by value); even lanes stop at their first case-1 position.
    for lane in 0..lanes as u8 {
        let want = if lane % 2 == 1 {
            12
        } else {
            (0..12u32)
                .find(|&i| (i as usize + lane as usize) % 3 == 1)
                .unwrap()
        };
        assert_eq!(m.depth(lane), Some(want), "lane {lane}");
    }
}

/// An iterator that panics when pulled after it ended, or at all when it must not be.
struct Strict {
    items: std::vec::IntoIter<u64>,
    ended: bool,
}

impl Iterator for Strict {
    type Item = u64;
    fn next(&mut self) -> Option<u64> {
        assert!(!self.ended, "pulled again after returning None");
        let item = self.items.next();
        self.ended = item.is_none();
        item
    }
}

/// The lazy form pulls nothing when no lane is ready, never pulls an iterator past its end
/// (exact multiples of the step included), and stops a long query's pulling shortly after the
/// last lane misses, on a small and on a prefetched table.
#[test]
fn lazy_queries_pull_no_further_than_needed() {
    for (buckets, lanes) in [(256u64, 3usize), (16_384, 16)] {
        let ix = indexer(buckets, lanes, 9);
        let addressing = *ix.addressing();
        let strict = |n: usize| Strict {
            items: (0..n as u64)
                .map(|i| fmix64(i ^ 0x1A2))
                .collect::<Vec<_>>()
                .into_iter(),
            ended: false,
        };
        // No lane ready: not pulled at all (the first `next` would see `ended`).
        let untouched = Strict {
            items: Vec::new().into_iter(),
            ended: true,
        };
        assert_eq!(ix.find_prefix_matches_lazy(untouched).ready_mask(), 0);
        let query: Vec<u64> = strict(10 * LAZY_STEP).collect();
        // Lane 0 holds the first 30 blocks, lane 1 all of them, lane 2 none.
        let mut words = vec![vec![0u64; buckets as usize]; lanes];
        testing::place_blocks(&addressing, &mut words[0], query[..30].iter().copied());
        testing::place_blocks(&addressing, &mut words[1], query.iter().copied());
        for (lane, w) in words.iter().enumerate().take(3) {
            testing::activate(&ix, lane as u8, lane as u64, 0, w.clone());
        }
        for n in [
            0,
            1,
            LAZY_STEP - 1,
            LAZY_STEP,
            LAZY_STEP + 1,
            2 * LAZY_STEP,
            10 * LAZY_STEP,
        ] {
            let m = ix.find_prefix_matches_lazy(strict(n));
            assert_eq!(m, ix.find_prefix_matches(&query[..n]), "n={n}");
            assert_eq!(m.depth(1), Some(n as u32), "n={n}");
        }
        // With lane 1 gone, the query stops in the step of lane 0's miss at 30.
        testing::activate(&ix, 1, 1, 1, vec![0; buckets as usize]);
        let pulled = Cell::new(0usize);
        let m = ix.find_prefix_matches_lazy(
            query
                .iter()
                .inspect(|_| pulled.set(pulled.get() + 1))
                .copied(),
        );
        assert_eq!(m.depth(0), Some(30));
        let (least, most) = lazy_pull_bounds(&ix, &m, query.len());
        assert!(
            pulled.get() >= least && pulled.get() <= most && most < query.len(),
            "{buckets}: pulled {}",
            pulled.get()
        );
    }
}

/// A lazy query's lanes are those ready when it started: a lane made ready while its iterator
/// is being pulled (here, from inside the iterator) is neither searched nor reported, on a small
/// and on a prefetched table.
#[test]
fn a_lazy_query_captures_the_ready_lanes_once() {
    for buckets in [256u64, 16_384] {
        let ix = indexer(buckets, 4, 11);
        let addressing = *ix.addressing();
        let query: Vec<u64> = (0..200u64).map(|i| fmix64(i + 5)).collect();
        let mut words = vec![0u64; buckets as usize];
        testing::place_blocks(&addressing, &mut words, query.iter().copied());
        testing::activate(&ix, 0, 0, 0, words.clone());
        let pulled = Cell::new(0usize);
        let m = ix.find_prefix_matches_lazy(query.iter().copied().inspect(|_| {
            pulled.set(pulled.get() + 1);
            if pulled.get() == 30 {
                testing::activate(&ix, 2, 2, 0, words.clone());
            }
        }));
        assert!(pulled.get() >= 30, "the lane was made ready mid-query");
        assert_eq!(m.ready_mask(), 0b0001, "{buckets} buckets");
        assert_eq!(m.depth(2), None);
        assert_eq!(m.depth(0), Some(200));
        assert_eq!(ix.ready_mask(), 0b0101);
    }
}

/// A query by token ids answers as its hashes collected, below, at and above the length where
/// it leaves the stack, with small blocks (hashed whole) and large ones (hashed lazily).
#[test]
fn token_queries_answer_as_their_hashes_collected() {
    use ckf_core::search::LAZY_MIN_BLOCK_TOKENS;
    for block in [4usize, LAZY_MIN_BLOCK_TOKENS] {
        token_queries_at_block_size(block);
    }
}

fn token_queries_at_block_size(block: usize) {
    use ckf_core::search::LAZY_MIN_BLOCKS;
    use ckf_core::tokens::{BlockSeed, SequenceHashes, sequence_hashes};
    let ix = indexer(16_384, 16, 21);
    let addressing = *ix.addressing();
    let seed = BlockSeed::DEFAULT;
    // A trailing partial block, never hashed.
    let tokens: Vec<u32> = (0..(3 * LAZY_MIN_BLOCKS * block + block / 2) as u32).collect();
    let chain = sequence_hashes(&tokens, block, seed, &[]).unwrap();
    // Lane l holds the first 10 * l blocks of the request.
    for lane in 0..16usize {
        let mut words = vec![0u64; 16_384];
        testing::place_blocks(
            &addressing,
            &mut words,
            chain[..(10 * lane).min(chain.len())].iter().copied(),
        );
        testing::activate(&ix, lane as u8, lane as u64, 0, words);
    }
    for blocks in [
        0,
        1,
        LAZY_MIN_BLOCKS - 1,
        LAZY_MIN_BLOCKS,
        LAZY_MIN_BLOCKS + 1,
        chain.len(),
    ] {
        let request = &tokens[..blocks * block + block / 2];
        let hashes = SequenceHashes::new(request, block, seed, Vec::new()).unwrap();
        let m = ix.find_prefix_matches_by_tokens(hashes);
        assert_eq!(
            m,
            ix.find_prefix_matches(&chain[..blocks]),
            "{blocks} blocks"
        );
        assert_eq!(m.depth(15), Some(blocks.min(150) as u32), "{blocks} blocks");
    }
}

/// Lanes not ready are never reported by any kernel, even when their words would match.
#[test]
fn lanes_not_ready_are_never_reported() {
    let ix = indexer(256, 16, 3);
    let addressing = *ix.addressing();
    let query: Vec<u64> = (0..20u64).map(fmix64).collect();
    let mut words = vec![0u64; 256];
    testing::place_blocks(&addressing, &mut words, query.iter().copied());
    // Ready: 0, 5, 15 only.
    for lane in [0u8, 5, 15] {
        testing::activate(&ix, lane, u64::from(lane), 0, words.clone());
    }
    let tables: Vec<Vec<u64>> = (0..16)
        .map(|l| {
            if [0, 5, 15].contains(&l) {
                words.clone()
            } else {
                vec![0; 256]
            }
        })
        .collect();
    check_all_kernels(&ix, &tables, 0b1000_0000_0010_0001, &query).unwrap();
    for kernel in runnable() {
        let m = ix.find_prefix_matches_with(kernel, &query).unwrap();
        assert_eq!(
            m.iter().collect::<Vec<_>>(),
            vec![(0, 20), (5, 20), (15, 20)],
            "{kernel}"
        );
    }
}

#[test]
fn forced_kernels_really_run_and_auto_picks_the_best() {
    let ix = indexer(64, 4, 1);
    testing::activate(&ix, 0, 0, 0, vec![0; 64]);
    // Default: the best kernel of this CPU.
    assert_eq!(ix.search_kernel(), SearchKernel::best());
    assert_ne!(SearchKernel::best(), SearchKernel::Auto);
    for kernel in runnable() {
        assert_eq!(ix.set_search_kernel(kernel), Ok(kernel));
        assert_eq!(ix.search_kernel(), kernel);
        let before: Vec<u64> = KERNELS.iter().map(|&k| testing::kernel_runs(k)).collect();
        for _ in 0..3 {
            ix.find_prefix_matches(&[1, 2, 3]);
        }
        for (i, &k) in KERNELS.iter().enumerate() {
            let ran = testing::kernel_runs(k) - before[i];
            assert_eq!(
                ran,
                if k == kernel { 3 } else { 0 },
                "forced {kernel}, ran {k}"
            );
        }
    }
    assert_eq!(
        ix.set_search_kernel(SearchKernel::Auto),
        Ok(SearchKernel::best())
    );
    // On x86-64 with AVX2 (this project's machines), forcing AVX2 runs the AVX2 code even when
    // AVX-512 is there.
    if SearchKernel::Avx2.is_available() {
        ix.set_search_kernel(SearchKernel::Avx2).unwrap();
        let before = testing::kernel_runs(SearchKernel::Avx2);
        ix.find_prefix_matches(&[9]);
        assert_eq!(testing::kernel_runs(SearchKernel::Avx2), before + 1);
    } else {
        eprintln!("AVX2 not available on this CPU: forced-AVX2 check skipped");
    }
}

#[test]
fn a_kernel_the_cpu_lacks_is_refused_and_auto_falls_back() {
    let ix = indexer(64, 2, 1);
    testing::activate(&ix, 1, 1, 0, vec![0; 64]);
    testing::without_kernels(&[SearchKernel::Avx512], || {
        let err = ix.set_search_kernel(SearchKernel::Avx512).unwrap_err();
        assert!(matches!(
            err,
            SearchKernelError::Unavailable {
                kernel: SearchKernel::Avx512,
                ..
            }
        ));
        let msg = err.to_string();
        assert!(msg.contains("avx512") && msg.contains("AVX-512"), "{msg}");
        assert!(
            ix.find_prefix_matches_with(SearchKernel::Avx512, &[1])
                .is_err()
        );
        // Auto on a CPU without AVX-512: AVX2 where present, else portable.
        let best = SearchKernel::best();
        assert_ne!(best, SearchKernel::Avx512);
        assert_eq!(ix.set_search_kernel(SearchKernel::Auto), Ok(best));
    });
    let vector = [SearchKernel::Avx512, SearchKernel::Avx2, SearchKernel::Neon];
    testing::without_kernels(&vector, || {
        assert_eq!(SearchKernel::best(), SearchKernel::Portable);
        assert_eq!(SearchKernel::available(), vec![SearchKernel::Portable]);
        let before = ix.search_kernel();
        let err = ix.set_search_kernel(SearchKernel::Avx2).unwrap_err();
        assert_eq!(
            err.to_string(),
            "search kernel avx2 is not available on this CPU (it needs x86-64 with AVX2); \
             available: portable"
        );
        // The kernel in use is unchanged by a refusal.
        assert_eq!(ix.search_kernel(), before);
    });
    // Restored after the scope.
    assert!(SearchKernel::Portable.is_available());
}

#[test]
fn kernel_names_parse_and_print() {
    for k in SearchKernel::ALL {
        assert_eq!(k.name().parse::<SearchKernel>(), Ok(k));
        assert_eq!(k.to_string(), k.name());
    }
    assert_eq!(
        "AVX2".parse::<SearchKernel>(),
        Err(SearchKernelError::Unknown("AVX2".into()))
    );
    assert_eq!(
        "sse".parse::<SearchKernel>().unwrap_err().to_string(),
        "unknown search kernel \"sse\": expected one of auto, portable, avx2, avx512, neon"
    );
    assert_eq!(SearchKernel::default(), SearchKernel::Auto);
    // NEON is only ever forced: `Auto` never picks an unmeasured kernel.
    assert_ne!(SearchKernel::best(), SearchKernel::Neon);
    assert_eq!(
        SearchKernel::Neon.is_available(),
        cfg!(target_arch = "aarch64")
    );
}
