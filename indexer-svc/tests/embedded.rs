//! Embedded mode: a running indexer's in-process query handle (`RunningIndexer::query_handle`)
//! answers exactly what the gRPC Query service answers, by hashes and by token ids, from any
//! thread, and follows the lanes as producers publish.

mod common;

use ckf_core::tokens::{BlockSeed, TokenQuery, TokenQueryError, sequence_hashes};
use ckf_proto::v1;
use common::*;

/// `(lane, depth)` per ready lane and the mask, as `Indexer::find` reports the RPC's answer.
fn in_process(query: &indexer_svc::EmbeddedQuery, hashes: &[u64]) -> (Vec<(u32, u32)>, u64) {
    let found = query.find_prefix_matches(hashes);
    (
        found.iter().map(|(l, d)| (u32::from(l), d)).collect(),
        found.ready_mask(),
    )
}

#[tokio::test]
async fn in_process_answers_equal_find_matches_as_lanes_change() {
    let indexer = Indexer::start(config(&["dc-a", "dc-b", "dc-c"])).await;
    let query = indexer.running.query_handle();
    let seq = hashes(5, 16);
    let other = hashes(6, 16);

    // No lane ready: both answer nothing.
    assert_eq!(in_process(&query, &seq), (vec![], 0));
    assert_eq!(indexer.find(&seq).await, (vec![], 0));

    let mut a = Producer::attach(&indexer, "dc-a", 1).await;
    a.store(1, &seq[..10]);
    a.snapshot(64 << 10).await;
    let mut b = Producer::attach(&indexer, "dc-b", 2).await;
    b.store(4, &seq[..3]);
    b.store(4, &other);
    b.snapshot(64 << 10).await;

    let probes = [
        seq.clone(),
        seq[..1].to_vec(),
        other.clone(),
        vec![],
        hashes(99, 40),
    ];
    for probe in &probes {
        assert_eq!(
            in_process(&query, probe),
            indexer.find(probe).await,
            "{} blocks",
            probe.len()
        );
    }
    assert_eq!(in_process(&query, &seq), (vec![(0, 10), (1, 3)], 0b011));
    assert_eq!(query.ready_mask(), 0b011);
    assert_eq!(query.pool(1).to_string(), format!("{DOMAIN}/dc-b"));

    // A delta moves both views together.
    a.remove(1, &seq[4..]);
    a.publish().await;
    assert_eq!(in_process(&query, &seq), (vec![(0, 4), (1, 3)], 0b011));
    assert_eq!(indexer.find(&seq).await, in_process(&query, &seq));

    // A handle cloned into plain threads (no runtime) answers the same.
    let expected = in_process(&query, &seq);
    let answers: Vec<_> = (0..4)
        .map(|_| {
            let q = query.clone();
            let s = seq.clone();
            std::thread::spawn(move || in_process(&q, &s))
        })
        .collect();
    for answer in answers {
        assert_eq!(answer.join().unwrap(), expected);
    }

    // Lane statuses are the ones ListLanes reports.
    let statuses = query.lane_statuses();
    let listed = indexer.lanes().await;
    assert_eq!(statuses.len(), listed.lanes.len());
    for (status, info) in statuses.iter().zip(&listed.lanes) {
        assert_eq!(u32::from(status.lane), info.lane);
        assert_eq!(status.lease.map_or(0, |l| l.epoch), info.lease_epoch);
    }

    // After the indexer stops, the handle still answers, from the tables as last installed.
    let running = indexer.running;
    let handle = running.query_handle();
    running.stop().await.expect("stops");
    assert_eq!(in_process(&handle, &seq), expected);
}

#[tokio::test]
async fn in_process_token_queries_follow_the_indexers_rules() {
    const BLOCK: u32 = 4;
    let mut cfg = config(&["dc-a"]);
    cfg.block_size = BLOCK;
    cfg.limits.max_query_blocks = 8;
    let indexer = Indexer::start(cfg).await;
    let query = indexer.running.query_handle();
    let tokens: Vec<u32> = (0..26).map(|i| 500 + i * 3).collect();
    let chain = sequence_hashes(&tokens, BLOCK as usize, BlockSeed::DEFAULT, &[]).unwrap();
    assert_eq!(chain.len(), 6);
    let mut a = Producer::attach(&indexer, "dc-a", 1).await;
    a.store(1, &chain[..5]);
    a.snapshot(64 << 10).await;

    let by_tokens = TokenQuery {
        token_ids: tokens.clone(),
        ..TokenQuery::default()
    };
    let found = query.find_prefix_matches_by_tokens(&by_tokens).unwrap();
    assert_eq!(found.depth(0), Some(5));
    let rpc = indexer
        .find_by_tokens(v1::FindMatchesByTokensRequest {
            token_ids: tokens.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(rpc, (vec![(0, 5)], 0b1));

    // The RPC's refusals are the handle's errors: another block size, too many tokens.
    let wrong_size = TokenQuery {
        block_size: Some(16),
        ..by_tokens.clone()
    };
    assert!(matches!(
        query.find_prefix_matches_by_tokens(&wrong_size),
        Err(TokenQueryError::BlockSizeMismatch { .. })
    ));
    let too_long = TokenQuery {
        token_ids: vec![1; 8 * BLOCK as usize + 1],
        ..TokenQuery::default()
    };
    assert!(matches!(
        query.find_prefix_matches_by_tokens(&too_long),
        Err(TokenQueryError::TooManyTokens { .. })
    ));
}

/// dc-a and dc-b, both holding part of `chain`, with load reports of unequal capacities.
async fn routed_pair(chain: &[u64]) -> (Indexer, Producer, Producer) {
    let mut cfg = config(&["dc-a", "dc-b"]);
    cfg.block_size = 4;
    cfg.route.rtt_ms.insert("dc-b".into(), 3.0);
    let indexer = Indexer::start(cfg).await;
    let mut a = Producer::attach(&indexer, "dc-a", 1).await;
    let mut b = Producer::attach(&indexer, "dc-b", 2).await;
    a.store(1, &chain[..2]);
    b.store(1, &chain[..5]);
    a.snapshot(64 << 10).await;
    b.snapshot(64 << 10).await;
    a.stream.send(load_report(&a, 1, 0, 16_000.0)).await;
    b.stream.send(load_report(&b, 1, 2, 4_000.0)).await;
    kept(&indexer, "dc-a", 1).await;
    kept(&indexer, "dc-b", 1).await;
    (indexer, a, b)
}

#[tokio::test]
async fn in_process_route_is_the_rpc_route_with_the_same_bookings() {
    use indexer_svc::route::wire_answer;
    use indexer_svc::router::RouteQuery;
    let tokens: Vec<u32> = (0..26).map(|i| 900 + i * 7).collect();
    let chain = sequence_hashes(&tokens, 4, BlockSeed::DEFAULT, &[]).unwrap();
    // The same requests to two identically prepared indexers: to one all over gRPC, to the
    // other alternately in-process and over gRPC. Every answer must be the same, so the
    // in-process choices are booked where the RPC's next request sees them (and back).
    let (all_rpc, _a1, _b1) = routed_pair(&chain).await;
    let (mixed, _a2, _b2) = routed_pair(&chain).await;
    let query = mixed.running.query_handle();
    let by_tokens = TokenQuery {
        token_ids: tokens.clone(),
        ..TokenQuery::default()
    };
    let wire = |k: usize| v1::RouteRequest {
        query: Some(if k % 4 < 2 {
            v1::route_request::Query::Hashes(v1::FindMatchesRequest {
                block_hashes: chain.clone(),
            })
        } else {
            v1::route_request::Query::Tokens(v1::FindMatchesByTokensRequest {
                token_ids: tokens.clone(),
                ..Default::default()
            })
        }),
        ..Default::default()
    };
    let mut lanes = Vec::new();
    for k in 0..24 {
        let expected = all_rpc.query().route(wire(k)).await.unwrap().into_inner();
        let answer = if k % 2 == 0 {
            let local = if k % 4 < 2 {
                RouteQuery::by_hashes(chain.clone())
            } else {
                RouteQuery::by_tokens(by_tokens.clone())
            };
            let routed = query.route(&local).expect("routed");
            wire_answer(query.indexer(), &routed)
        } else {
            mixed.query().route(wire(k)).await.unwrap().into_inner()
        };
        assert_eq!(
            without_ages(answer),
            without_ages(expected.clone()),
            "request {k}"
        );
        lanes.push(expected.chosen_lane);
    }
    // Not a trivial answer: both DCs chosen, both with cached blocks and known loads.
    assert!(lanes.contains(&0) && lanes.contains(&1), "{lanes:?}");
    let first = all_rpc.query().route(wire(0)).await.unwrap().into_inner();
    let depths: Vec<_> = first.ranked.iter().map(|d| (d.lane, d.depth)).collect();
    assert!(
        depths.contains(&(0, 2)) && depths.contains(&(1, 5)),
        "{depths:?}"
    );
    assert!(
        first
            .ranked
            .iter()
            .all(|d| d.load_state() == v1::LoadState::Known)
    );

    // The handle refuses what the RPC refuses for token ids, and books nothing then.
    let wrong = RouteQuery::by_tokens(TokenQuery {
        block_size: Some(16),
        ..by_tokens.clone()
    });
    assert!(matches!(
        query.route(&wrong),
        Err(TokenQueryError::BlockSizeMismatch { .. })
    ));
    let after = query.route(&RouteQuery::by_hashes(chain.clone())).unwrap();
    let booked: u32 = after.ranked.iter().map(|d| d.input.booked).sum();
    assert_eq!(
        booked, 24,
        "the 24 choices above, none for the refused request"
    );
}
