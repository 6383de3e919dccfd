//! A domain whose lanes use different block sizes: a query by token ids answers each lane in
//! its own blocks, exactly as a query of that lane's block hashes (a single-size domain)
//! answers it, and matches an exact model of the lane's table; the query's own block size and
//! the token limit are checked against every size before anything is searched.

use ckf_core::addressing::{TableFormat, fmix64};
use ckf_core::global::GlobalCkfIndexer;
use ckf_core::testing;
use ckf_core::tokens::lanes::LaneBlockSizes;
use ckf_core::tokens::{BlockSeed, TokenQuery, TokenQueryError, sequence_hashes};
use proptest::prelude::*;

const BUCKETS: u64 = 512;

fn query(tokens: &[u32]) -> TokenQuery {
    TokenQuery {
        token_ids: tokens.to_vec(),
        ..TokenQuery::default()
    }
}

/// An indexer whose lane `l` holds the first `keep[l]` blocks of `tokens` in its own block size
/// (every lane ready); returns it with each lane's words.
fn domain(sizes: &[u32], keep: &[usize], tokens: &[u32]) -> (GlobalCkfIndexer, Vec<Vec<u64>>) {
    let ix = testing::indexer("d", TableFormat::new(BUCKETS, 5).unwrap(), sizes.len(), 1);
    let addressing = *ix.addressing();
    let mut tables = Vec::new();
    for (lane, (&size, &keep)) in sizes.iter().zip(keep).enumerate() {
        let hashes = sequence_hashes(tokens, size as usize, BlockSeed::DEFAULT, &[]).unwrap();
        let mut words = vec![0u64; BUCKETS as usize];
        testing::place_blocks(
            &addressing,
            &mut words,
            hashes[..keep.min(hashes.len())].iter().copied(),
        );
        testing::activate(&ix, lane as u8, lane as u64, 0, words.clone());
        tables.push(words);
    }
    (ix, tables)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn each_lane_is_answered_in_its_own_blocks(
        sizes in prop::collection::vec(prop_oneof![Just(4u32), Just(16), Just(64), Just(512)], 1..=40),
        len in prop_oneof![0usize..200, 200usize..30_000],
        seed in any::<u64>(),
    ) {
        let tokens: Vec<u32> = (0..len as u64).map(|i| fmix64(seed ^ i) as u32).collect();
        let keep: Vec<usize> = (0..sizes.len()).map(|l| fmix64(seed ^ (l as u64) << 32) as usize % 80).collect();
        let (ix, tables) = domain(&sizes, &keep, &tokens);
        let lane_sizes = LaneBlockSizes::new(sizes.clone()).unwrap();
        let m = ix.find_prefix_matches_by_token_query(&query(&tokens), &lane_sizes, 8192).unwrap();
        prop_assert_eq!(m.ready_mask(), u64::MAX >> (64 - sizes.len()));
        for (lane, &size) in sizes.iter().enumerate() {
            let hashes = sequence_hashes(&tokens, size as usize, BlockSeed::DEFAULT, &[]).unwrap();
            let single = ix.find_prefix_matches(&hashes).depth(lane as u8);
            prop_assert_eq!(m.depth(lane as u8), single, "lane {} of {} tokens per block", lane, size);
            let model = testing::model_depth(ix.addressing(), &tables[lane], &hashes);
            prop_assert_eq!(m.depth(lane as u8), Some(model), "lane {}", lane);
        }
    }
}

#[test]
fn the_query_block_size_must_be_one_of_the_lanes_and_limits_hold_for_every_size() {
    let tokens: Vec<u32> = (0..256).collect();
    let sizes = [16u32, 64, 16];
    let (ix, _) = domain(&sizes, &[16, 4, 2], &tokens);
    let lane_sizes = LaneBlockSizes::new(sizes.to_vec()).unwrap();
    // The blocks counted are the smallest size's: 256 tokens are 16 blocks of 16.
    assert_eq!(lane_sizes.check(&query(&tokens), 4096), Ok(16));
    let mut q = query(&tokens);
    q.block_size = Some(32);
    assert_eq!(
        ix.find_prefix_matches_by_token_query(&q, &lane_sizes, 4096)
            .unwrap_err(),
        TokenQueryError::BlockSizeNotServed {
            requested: 32,
            served: vec![16, 64]
        }
    );
    // A size some lanes use is accepted, and every lane is still answered in its own blocks.
    q.block_size = Some(64);
    let m = ix
        .find_prefix_matches_by_token_query(&q, &lane_sizes, 4096)
        .unwrap();
    assert_eq!(m.iter().collect::<Vec<_>>(), [(0, 16), (1, 4), (2, 2)]);
    // 256 tokens are 16 blocks of 16 but 4 of 64: a limit of 8 blocks refuses the whole query.
    let e = ix
        .find_prefix_matches_by_token_query(&query(&tokens), &lane_sizes, 8)
        .unwrap_err();
    assert!(
        matches!(e, TokenQueryError::TooManyTokens { block_size: 16, .. }),
        "{e}"
    );
}

#[test]
fn one_block_size_is_the_single_size_query() {
    let tokens: Vec<u32> = (0..100).collect();
    let (ix, _) = domain(&[16, 16], &[3, 6], &tokens);
    let sizes = LaneBlockSizes::uniform(16, 2).unwrap();
    let mut q = query(&tokens);
    let m = ix
        .find_prefix_matches_by_token_query(&q, &sizes, 4096)
        .unwrap();
    assert_eq!(m.iter().collect::<Vec<_>>(), [(0, 3), (1, 6)]);
    q.block_size = Some(32);
    assert!(matches!(
        ix.find_prefix_matches_by_token_query(&q, &sizes, 4096),
        Err(TokenQueryError::BlockSizeMismatch {
            requested: 32,
            configured: 16
        })
    ));
}
