//! `FindMatchesByTokens` against an in-process indexer: lanes hold canonical block hashes
//! computed from token ids; queries by tokens must answer exactly as `FindMatches` on those
//! hashes, and every refused request names its fault.

mod common;

use ckf_core::tokens::{BlockSeed, MultimodalSpan, mm_identifier_hash, sequence_hashes};
use ckf_proto::v1;
use common::*;
use tonic::Code;

const BLOCK: u32 = 4;
const HEX: &str = "0123456789abcdeffedcba9876543210fedcba9876543210fedcba9876543210";

/// 30 tokens = 7 full blocks of 4 and a partial one, some near `u32::MAX`.
fn tokens() -> Vec<u32> {
    (0..30u32)
        .map(|i| {
            if i % 5 == 0 {
                u32::MAX - i
            } else {
                1000 + i * 37
            }
        })
        .collect()
}

fn item(identifier: &str, offset: u64, length: u64) -> v1::MultimodalItem {
    v1::MultimodalItem {
        identifier: identifier.into(),
        offset,
        length,
    }
}

/// A salted LoRA request with two multimodal items (one short identifier, one vLLM digest).
fn request() -> v1::FindMatchesByTokensRequest {
    v1::FindMatchesByTokensRequest {
        token_ids: tokens(),
        lora_name: "sql-lora".into(),
        cache_salt: "tenant-7".into(),
        multimodal: vec![item("img-1", 5, 3), item(HEX, 17, 6)],
        block_size: 0,
    }
}

/// The canonical hashes of `request()`, computed here from the core functions.
fn request_hashes() -> Vec<u64> {
    let seed = BlockSeed::new(Some("tenant-7"), Some("sql-lora"));
    let spans = [
        MultimodalSpan {
            hash: mm_identifier_hash("img-1").unwrap(),
            offset: 5,
            length: 3,
        },
        MultimodalSpan {
            hash: 0x0123_4567_89ab_cdef,
            offset: 17,
            length: 6,
        },
    ];
    sequence_hashes(&tokens(), BLOCK as usize, seed, &spans).unwrap()
}

fn plain_hashes() -> Vec<u64> {
    sequence_hashes(&tokens(), BLOCK as usize, BlockSeed::DEFAULT, &[]).unwrap()
}

/// dc-a holds the whole salted request, dc-b its first 3 blocks and the whole plain (no salt,
/// no LoRA, no image) chain of the same tokens; dc-c is never attached (not ready).
async fn indexer_with_token_lanes() -> (Indexer, Producer, Producer) {
    let mut cfg = config(&["dc-a", "dc-b", "dc-c"]);
    cfg.block_size = BLOCK;
    cfg.limits.max_query_blocks = 8;
    let indexer = Indexer::start(cfg).await;
    let salted = request_hashes();
    assert_eq!(salted.len(), 7);
    let mut a = Producer::attach(&indexer, "dc-a", 1).await;
    a.store(1, &salted);
    a.snapshot(64 << 10).await;
    let mut b = Producer::attach(&indexer, "dc-b", 2).await;
    b.store(1, &salted[..3]);
    b.store(2, &plain_hashes());
    b.snapshot(64 << 10).await;
    (indexer, a, b)
}

#[tokio::test]
async fn token_queries_answer_as_find_matches_on_the_canonical_hashes() {
    let (indexer, _a, _b) = indexer_with_token_lanes().await;
    let salted = request_hashes();
    let by_hashes = indexer.find(&salted).await;
    assert_eq!(by_hashes, (vec![(0, 7), (1, 3)], 0b011));
    assert_eq!(indexer.find_by_tokens(request()).await.unwrap(), by_hashes);

    // The block size named explicitly, equal to the indexer's: the same answer.
    let explicit = v1::FindMatchesByTokensRequest {
        block_size: BLOCK,
        ..request()
    };
    assert_eq!(indexer.find_by_tokens(explicit).await.unwrap(), by_hashes);

    // Salt, LoRA and images are part of the hash: without them the plain chain matches.
    let plain = v1::FindMatchesByTokensRequest {
        token_ids: tokens(),
        ..Default::default()
    };
    let answer = indexer.find_by_tokens(plain).await.unwrap();
    assert_eq!(answer, indexer.find(&plain_hashes()).await);
    assert_eq!(answer, (vec![(0, 0), (1, 7)], 0b011));
    // Only the salt differs: no lane holds that chain.
    let other_salt = v1::FindMatchesByTokensRequest {
        cache_salt: "tenant-8".into(),
        ..request()
    };
    assert_eq!(
        indexer.find_by_tokens(other_salt).await.unwrap(),
        (vec![(0, 0), (1, 0)], 0b011)
    );
    // The image moved from block 1 to block 3: only block 0 still matches.
    let moved = v1::FindMatchesByTokensRequest {
        multimodal: vec![item("img-1", 12, 3), item(HEX, 17, 6)],
        ..request()
    };
    assert_eq!(
        indexer.find_by_tokens(moved).await.unwrap(),
        (vec![(0, 1), (1, 1)], 0b011)
    );
    // A prefix of the tokens matches its own full blocks (the partial tail is not probed).
    let prefix = v1::FindMatchesByTokensRequest {
        token_ids: tokens()[..11].to_vec(),
        ..request()
    };
    assert_eq!(
        indexer.find_by_tokens(prefix).await.unwrap(),
        (vec![(0, 2), (1, 2)], 0b011)
    );
}

#[tokio::test]
async fn fewer_tokens_than_one_block_is_the_empty_hash_query() {
    let (indexer, _a, _b) = indexer_with_token_lanes().await;
    let empty = indexer.find(&[]).await;
    assert_eq!(empty, (vec![(0, 0), (1, 0)], 0b011));
    for n in [0, 1, BLOCK as usize - 1] {
        let short = v1::FindMatchesByTokensRequest {
            token_ids: tokens()[..n].to_vec(),
            ..request()
        };
        assert_eq!(indexer.find_by_tokens(short).await.unwrap(), empty, "{n}");
    }
}

#[tokio::test]
async fn bad_token_queries_are_invalid_argument_naming_the_fault() {
    let (indexer, _a, _b) = indexer_with_token_lanes().await;
    let refused = |request: v1::FindMatchesByTokensRequest| {
        let indexer = &indexer;
        async move { indexer.find_by_tokens(request).await.expect_err("refused") }
    };

    let status = refused(v1::FindMatchesByTokensRequest {
        block_size: 16,
        ..request()
    })
    .await;
    assert_status(
        &status,
        Code::InvalidArgument,
        &["block_size 16 differs from the indexer's block_size 4"],
    );

    // The limit is max_query_blocks (8) x block_size (4) = 32 tokens; 32 are accepted.
    let at_limit = v1::FindMatchesByTokensRequest {
        token_ids: (0..32).collect(),
        ..Default::default()
    };
    assert!(indexer.find_by_tokens(at_limit).await.is_ok());
    let status = refused(v1::FindMatchesByTokensRequest {
        token_ids: (0..33).collect(),
        ..Default::default()
    })
    .await;
    assert_status(
        &status,
        Code::InvalidArgument,
        &["33 token ids is more than max_query_blocks 8 x block_size 4 = 32"],
    );

    let status = refused(v1::FindMatchesByTokensRequest {
        multimodal: vec![item("img-1", 5, 3), item("", 0, 4)],
        ..request()
    })
    .await;
    assert_status(
        &status,
        Code::InvalidArgument,
        &["multimodal[1].identifier is empty"],
    );

    let status = refused(v1::FindMatchesByTokensRequest {
        multimodal: vec![item("img-1", u64::MAX, 1)],
        ..request()
    })
    .await;
    assert_status(
        &status,
        Code::InvalidArgument,
        &["multimodal[0]: offset 18446744073709551615 + length 1 overflows 64 bits"],
    );

    // Nothing was touched: the lanes answer as before.
    assert_eq!(
        indexer.find_by_tokens(request()).await.unwrap(),
        (vec![(0, 7), (1, 3)], 0b011)
    );
}

/// Every block-size-16 vector of the Python reference (`proto/token_hash/vectors.json`): a lane
/// holding the vector's published sequence hashes answers the vector's tokens with full depth
/// through an indexer at the default block size.
#[tokio::test]
async fn published_vectors_match_through_the_indexer() {
    let text = include_str!("../../proto/token_hash/vectors.json");
    let doc: serde_json::Value = serde_json::from_str(text).unwrap();
    let indexer = Indexer::start(config(&["dc-a"])).await;
    let mut a = Producer::attach(&indexer, "dc-a", 1).await;
    let mut cases = Vec::new();
    for (worker, vector) in doc["vectors"].as_array().unwrap().iter().enumerate() {
        if vector["block_size"] != 16 {
            continue;
        }
        let hashes: Vec<u64> = vector["sequence_hashes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h.as_u64().unwrap())
            .collect();
        let text_of = |key: &str| vector[key].as_str().unwrap_or_default().to_owned();
        let request = v1::FindMatchesByTokensRequest {
            token_ids: vector["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| u32::try_from(t.as_u64().unwrap()).unwrap())
                .collect(),
            lora_name: text_of("lora_name"),
            cache_salt: text_of("cache_salt"),
            multimodal: vector["multimodal"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["identifier"] != "")
                .map(|m| {
                    item(
                        m["identifier"].as_str().unwrap(),
                        m["offset"].as_u64().unwrap(),
                        m["length"].as_u64().unwrap(),
                    )
                })
                .collect(),
            block_size: 16,
        };
        a.store(worker as u64 + 1, &hashes);
        cases.push((
            vector["name"].as_str().unwrap().to_owned(),
            request,
            hashes.len(),
        ));
    }
    assert!(cases.len() >= 5, "{} block-size-16 vectors", cases.len());
    a.snapshot(64 << 10).await;
    for (name, request, depth) in cases {
        let answer = indexer.find_by_tokens(request).await.unwrap();
        assert_eq!(answer, (vec![(0, depth as u32)], 0b1), "{name}");
    }
}

/// Requests long enough for every way `find_prefix_matches_by_tokens` hashes (onto the stack up
/// to 48 blocks, lazily above at 512 tokens per block), with lanes that stop matching at 25 and
/// 60 blocks: the same answers as `FindMatches` on the collected hashes, and the blocks counter
/// counts every full block of a request even where the lazy search stopped hashing early.
#[tokio::test]
async fn long_token_queries_at_512_token_blocks_answer_as_find_matches() {
    const BLOCK: u32 = 512;
    let mut cfg = config(&["dc-a", "dc-b", "dc-c"]);
    cfg.block_size = BLOCK;
    cfg.limits.max_query_blocks = 200;
    // 150 blocks of 512 token ids are ~300 KiB on the wire.
    cfg.limits.max_message_bytes = 4 << 20;
    let indexer = Indexer::start(cfg).await;
    let tokens: Vec<u32> = (0..150 * BLOCK + 100)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let chain = sequence_hashes(&tokens, BLOCK as usize, BlockSeed::DEFAULT, &[]).unwrap();
    assert_eq!(chain.len(), 150);
    let mut a = Producer::attach(&indexer, "dc-a", 1).await;
    a.store(1, &chain[..60]);
    a.snapshot(64 << 10).await;
    let mut b = Producer::attach(&indexer, "dc-b", 2).await;
    b.store(1, &chain[..25]);
    b.snapshot(64 << 10).await;
    let mut blocks = 0u64;
    for n in [0usize, 1, 24, 25, 47, 48, 49, 60, 72, 73, 150] {
        let request = v1::FindMatchesByTokensRequest {
            token_ids: tokens[..n * BLOCK as usize + 7].to_vec(),
            ..Default::default()
        };
        let answer = indexer.find_by_tokens(request).await.unwrap();
        assert_eq!(answer, indexer.find(&chain[..n]).await, "{n} blocks");
        assert_eq!(answer.0[0], (0, n.min(60) as u32), "{n} blocks");
        blocks += n as u64;
    }
    let want = format!(
        r#"ckf_indexer_query_blocks_total{{domain="test",method="find_matches_by_tokens"}} {blocks}"#
    );
    let text = metrics_text(&indexer).await;
    assert!(text.contains(&want), "missing {want:?} in\n{text}");
}

/// dc-a uses blocks of 4 tokens, dc-b (`manifest.block_sizes`) blocks of 8: each holds the
/// plain chain of `tokens()` in its own blocks, cut at 5 and 2 blocks.
async fn mixed_block_sizes() -> (Indexer, Producer, Producer) {
    let mut cfg = config(&["dc-a", "dc-b"]);
    cfg.block_size = BLOCK;
    cfg.manifest.block_sizes.insert("dc-b".into(), 2 * BLOCK);
    let indexer = Indexer::start(cfg).await;
    let mut a = Producer::attach(&indexer, "dc-a", 1).await;
    a.store(1, &plain_hashes()[..5]);
    a.snapshot(64 << 10).await;
    let eights = sequence_hashes(&tokens(), 2 * BLOCK as usize, BlockSeed::DEFAULT, &[]).unwrap();
    let mut b = Producer::attach(&indexer, "dc-b", 1).await;
    b.store(1, &eights[..2]);
    b.snapshot(64 << 10).await;
    for lane in 0..2 {
        indexer
            .wait_lane(lane, |l| l.state() == v1::LaneState::Active)
            .await;
    }
    (indexer, a, b)
}

#[tokio::test]
async fn lanes_of_different_block_sizes_are_each_answered_in_their_own_blocks() {
    let (indexer, _a, _b) = mixed_block_sizes().await;
    let plain = v1::FindMatchesByTokensRequest {
        token_ids: tokens(),
        ..Default::default()
    };
    let answer = indexer
        .query()
        .find_matches_by_tokens(plain.clone())
        .await
        .expect("FindMatchesByTokens")
        .into_inner();
    let got: Vec<(u32, u32, u64)> = answer
        .matches
        .iter()
        .map(|m| (m.lane, m.depth, m.cached_tokens))
        .collect();
    assert_eq!(got, [(0, 5, 20), (1, 2, 16)]);
    // Route counts each DC's cached tokens in its own blocks too.
    let routed = indexer
        .query()
        .route(v1::RouteRequest {
            query: Some(v1::route_request::Query::Tokens(plain.clone())),
            dry_run: true,
            ..Default::default()
        })
        .await
        .expect("Route")
        .into_inner();
    let mut cached: Vec<(u32, u64)> = routed
        .ranked
        .iter()
        .map(|r| (r.lane, r.cached_tokens))
        .collect();
    cached.sort_unstable();
    assert_eq!(cached, [(0, 20), (1, 16)]);
    let sizes: Vec<u32> = indexer
        .lanes()
        .await
        .lanes
        .iter()
        .map(|l| l.block_size)
        .collect();
    assert_eq!(sizes, [4, 8]);
    // A block size no lane uses is refused, naming the sizes served.
    let status = indexer
        .query()
        .find_matches_by_tokens(v1::FindMatchesByTokensRequest {
            block_size: 16,
            ..plain
        })
        .await
        .unwrap_err();
    assert_status(&status, Code::InvalidArgument, &["block_size 16", "[4, 8]"]);
}

#[tokio::test]
async fn a_block_size_for_a_dc_that_is_no_lane_is_refused_at_start() {
    let mut cfg = config(&["dc-a", "dc-b"]);
    cfg.manifest.block_sizes.insert("dc-z".into(), 32);
    let Err(error) = indexer_svc::serve(cfg, std::future::pending()).await else {
        panic!("an indexer started with a block size for an unknown DC");
    };
    let text = error.to_string();
    assert!(text.contains("manifest.block_sizes.dc-z"), "{text}");
}
