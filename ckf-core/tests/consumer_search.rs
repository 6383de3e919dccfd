//! Prefix search against an exact model of the table: for every lane ready at
//! capture, depth = number of leading blocks whose fingerprint is in one of their two candidate
//! buckets of that lane. Both row kernels (AVX-512 where the CPU has it, and the portable one)
//! must equal the model for every lane count 1..=64 (one to four lane groups).

use ckf_core::addressing::{TableFormat, fmix64};
use ckf_core::global::GlobalCkfIndexer;
use ckf_core::testing;
use proptest::prelude::*;

fn indexer(buckets: u64, lanes: usize) -> GlobalCkfIndexer {
    testing::indexer("d", TableFormat::new(buckets, 99).unwrap(), lanes, 1)
}

fn activate(ix: &GlobalCkfIndexer, lane: u8, words: Vec<u64>) {
    testing::activate(ix, lane, u64::from(lane), 0, words);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn every_lane_count_and_both_kernels_equal_the_exact_model(
        lanes in 1usize..=64,
        ready_bits in any::<u64>(),
        seed in any::<u64>(),
        log_buckets in 1u32..9,
        query_len in 0usize..80,
    ) {
        let buckets = 1u64 << log_buckets;
        let ix = indexer(buckets, lanes);
        let addressing = *ix.addressing();
        // A shared pool of chained hashes; each lane holds a random prefix of a random subset.
        let pool: Vec<u64> = (0..query_len as u64 + 8).map(|i| fmix64(seed ^ (i + 1))).collect();
        let mut tables = Vec::new();
        for lane in 0..lanes {
            let mut words = vec![0u64; buckets as usize];
            let keep = (fmix64(seed ^ lane as u64) as usize) % (query_len + 1);
            testing::place_blocks(&addressing, &mut words, pool[..keep].iter().copied());
            // Some filler fingerprints.
            testing::place_blocks(&addressing, &mut words, (0..buckets).map(|i| fmix64(seed.rotate_left(7) ^ i ^ (lane as u64) << 40)));
            if ready_bits & (1 << lane) != 0 {
                activate(&ix, lane as u8, words.clone());
            }
            tables.push(words);
        }
        let query = &pool[..query_len];
        let ready = ready_bits & (u64::MAX >> (64 - lanes));
        let lazy = ix.find_prefix_matches_lazy(query.iter().copied());
        for m in [ix.find_prefix_matches(query), ix.find_prefix_matches_portable(query), lazy] {
            prop_assert_eq!(m.ready_mask(), ready);
            for lane in 0..64u8 {
                let want = (usize::from(lane) < lanes && ready & (1 << lane) != 0)
                    .then(|| testing::model_depth(&addressing, &tables[lane as usize], query));
                prop_assert_eq!(m.depth(lane), want, "lane {}", lane);
            }
            prop_assert_eq!(m.iter().count() as u32, ready.count_ones());
        }
    }
}

#[test]
fn empty_query_reports_every_ready_lane_at_depth_zero() {
    let ix = indexer(64, 3);
    activate(&ix, 0, vec![0; 64]);
    activate(&ix, 2, vec![0; 64]);
    let m = ix.find_prefix_matches(&[]);
    assert_eq!(m.ready_mask(), 0b101);
    assert_eq!(m.iter().collect::<Vec<_>>(), vec![(0, 0), (2, 0)]);
    assert_eq!(m.matching().count(), 0);
    assert_eq!(m.best(), Some((0, 0)));
}

#[test]
fn no_ready_lane_reports_nothing() {
    let ix = indexer(64, 2);
    let m = ix.find_prefix_matches(&[1, 2, 3]);
    assert_eq!(m.ready_mask(), 0);
    assert_eq!(m.iter().count(), 0);
    assert_eq!(m.best(), None);
}

#[test]
fn depth_is_first_miss_and_best_picks_the_deepest() {
    // 4 lanes in cache, and 16 lanes x 8 Ki buckets (1 MiB: the prefetching path).
    for (buckets, lanes) in [(1024u64, 4usize), (8192, 16)] {
        depth_case(buckets, lanes);
    }
}

fn depth_case(buckets: u64, lanes: usize) {
    let ix = indexer(buckets, lanes);
    let addressing = *ix.addressing();
    let q: Vec<u64> = (0..40u64).map(|i| fmix64(i + 77)).collect();
    for (lane, depth) in [(0u8, 10usize), (1, 40), (2, 0), (3, 25)] {
        let mut words = vec![0u64; buckets as usize];
        testing::place_blocks(&addressing, &mut words, q[..depth].iter().copied());
        // Blocks after a gap do not count: the depth stops at the first miss.
        testing::place_blocks(&addressing, &mut words, q.iter().skip(depth + 1).copied());
        activate(&ix, lane, words);
    }
    let m = ix.find_prefix_matches(&q);
    let p = ix.find_prefix_matches_portable(&q);
    assert_eq!(m, p);
    assert_eq!(m.depth(0), Some(10));
    assert_eq!(m.depth(1), Some(40));
    assert_eq!(m.depth(2), Some(0));
    assert_eq!(m.depth(3), Some(25));
    assert_eq!(m.best(), Some((1, 40)));
    assert_eq!(
        m.matching().map(|(l, _)| l).collect::<Vec<_>>(),
        vec![0, 1, 3]
    );
    assert_eq!(ix.pool(m.best().unwrap().0).dc.as_str(), "dc-1");
}
