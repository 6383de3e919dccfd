//! `Query/Route` against a real indexer: two lanes fed by ckf-core producers over the Relay
//! (snapshots, load reports), answers checked against the model's formula by hand.

mod common;

use ckf_proto::v1;
use common::*;
use tonic::Code;

fn by_hashes(hashes: &[u64], request_tokens: u64) -> v1::RouteRequest {
    v1::RouteRequest {
        query: Some(v1::route_request::Query::Hashes(v1::FindMatchesRequest {
            block_hashes: hashes.to_vec(),
        })),
        request_tokens,
        ..Default::default()
    }
}

async fn route(indexer: &Indexer, request: v1::RouteRequest) -> v1::RouteResponse {
    indexer
        .query()
        .route(request)
        .await
        .expect("Route")
        .into_inner()
}

/// dc-a (lane 0) and dc-b (lane 1), both ready, dc-b configured 50 ms away.
async fn two_lanes(h: &[u64], a_blocks: usize, b_blocks: usize) -> (Indexer, Producer, Producer) {
    let mut cfg = config(&["dc-a", "dc-b"]);
    cfg.route.rtt_ms.insert("dc-b".into(), 50.0);
    let indexer = Indexer::start(cfg).await;
    let mut a = Producer::attach(&indexer, "dc-a", 1).await;
    let mut b = Producer::attach(&indexer, "dc-b", 2).await;
    a.store(1, &h[..a_blocks]);
    b.store(1, &h[..b_blocks]);
    a.snapshot(8192).await;
    b.snapshot(8192).await;
    (indexer, a, b)
}

#[tokio::test]
async fn each_dc_is_estimated_by_the_formula_and_the_fastest_chosen() {
    let h = hashes(70, 8);
    let (indexer, a, _b) = two_lanes(&h, 4, 8).await;
    // dc-a: 2 waiting at 16,000 tokens/s.
    a.stream.send(load_report(&a, 1, 2, 16_000.0)).await;
    kept(&indexer, "dc-a", 1).await;
    let r = route(&indexer, by_hashes(&h, 0)).await;
    // 8 blocks of 16 tokens. dc-b: all cached, no report (default capacity), its configured
    // 50 ms: ttft 50 ms. dc-a: 64 cached, 1 ms + (2 + 0) * 1024 / 16000 s + 64 / 16000 s =
    // 1 + 128 + 4 ms.
    assert_eq!(r.reason(), v1::RouteReason::Fastest);
    assert_eq!(r.chosen_lane, 1);
    assert_eq!(r.chosen.as_ref().map(|p| p.dc.as_str()), Some("dc-b"));
    let (b, a) = (&r.ranked[0], &r.ranked[1]);
    assert_eq!(
        (b.lane, b.depth, b.cached_tokens, b.uncached_tokens),
        (1, 8, 128, 0)
    );
    assert_eq!(b.load_state(), v1::LoadState::Unknown);
    assert!(!b.rtt_from_request);
    assert!((b.ttft_ms - 50.0).abs() < 1e-6, "{b:?}");
    assert_eq!(
        (a.lane, a.depth, a.cached_tokens, a.uncached_tokens),
        (0, 4, 64, 64)
    );
    assert_eq!(a.load_state(), v1::LoadState::Known);
    assert_eq!((a.running, a.waiting, a.booked), (3, 2, 0));
    assert!((a.queue_ms - 128.0).abs() < 1e-6, "{a:?}");
    assert!((a.prefill_ms - 4.0).abs() < 1e-6, "{a:?}");
    assert!((a.ttft_ms - 133.0).abs() < 1e-6, "{a:?}");
    // The router's own round trip to dc-b (500 ms) overrides the configured one: dc-a wins.
    let mut far = by_hashes(&h, 0);
    far.rtt_ms.insert("dc-b".into(), 500.0);
    let r = route(&indexer, far).await;
    assert_eq!((r.chosen_lane, r.reason()), (0, v1::RouteReason::Fastest));
    assert!(r.ranked[1].rtt_from_request);
    assert!((r.ranked[1].ttft_ms - 500.0).abs() < 1e-6);
    // The choices were booked: dc-b once, dc-a once.
    let text = metrics_text(&indexer).await;
    for dc in ["dc-a", "dc-b"] {
        let line = format!(
            "ckf_indexer_route_decisions_total{{dc=\"{dc}\",domain=\"test\",reason=\"fastest\"}} 1"
        );
        assert!(text.contains(&line), "{line} not in the metrics");
    }
}

#[tokio::test]
async fn a_burst_spreads_by_capacity_until_a_new_report_covers_it() {
    // Nothing cached anywhere: only the queue and the capacity tell the DCs apart.
    let h = hashes(71, 2);
    let (indexer, a, b) = two_lanes(&[], 0, 0).await;
    a.stream.send(load_report(&a, 1, 0, 16_384.0)).await;
    b.stream.send(load_report(&b, 1, 0, 8_192.0)).await;
    kept(&indexer, "dc-a", 1).await;
    kept(&indexer, "dc-b", 1).await;
    // The request's own 1 ms to both (the configured 50 ms to dc-b overridden).
    let request = || {
        let mut r = by_hashes(&h, 1_024);
        r.rtt_ms.insert("dc-a".into(), 1.0);
        r.rtt_ms.insert("dc-b".into(), 1.0);
        r
    };
    let mut chosen = [0u32; 2];
    let mut by_hand = [0u32; 2];
    for _ in 0..30 {
        let r = route(&indexer, request()).await;
        chosen[r.chosen_lane as usize] += 1;
        // (b0 + 1) * 1024 / 16384 <= (b1 + 1) * 1024 / 8192, ties to lane 0.
        let lane = usize::from(by_hand[0] + 1 > 2 * (by_hand[1] + 1));
        by_hand[lane] += 1;
    }
    assert_eq!(chosen, by_hand);
    assert_eq!(chosen, [20, 10]);
    // A new report of dc-a covers its bookings; dc-b's stay.
    a.stream.send(load_report(&a, 2, 0, 16_384.0)).await;
    kept(&indexer, "dc-a", 2).await;
    let r = route(&indexer, request()).await;
    let booked = |lane: u32| r.ranked.iter().find(|d| d.lane == lane).map(|d| d.booked);
    assert_eq!(
        (booked(0), booked(1)),
        (Some(0), Some(10)),
        "dc-a's bookings covered, dc-b's kept"
    );
}

#[tokio::test]
async fn bad_requests_are_invalid_arguments_and_no_ready_lane_chooses_nothing() {
    let indexer = Indexer::start(config(&["dc-a"])).await;
    let r = route(&indexer, by_hashes(&hashes(72, 3), 0)).await;
    assert_eq!(r.reason(), v1::RouteReason::NoReadyDc);
    assert!(r.ranked.is_empty() && r.chosen.is_none());
    let mut client = indexer.query();
    let empty = v1::RouteRequest::default();
    let status = client.route(empty).await.expect_err("no query");
    assert_status(
        &status,
        Code::InvalidArgument,
        &["RouteRequest.query is required"],
    );
    let mut negative = by_hashes(&hashes(72, 3), 0);
    negative.rtt_ms.insert("dc-a".into(), -1.0);
    let status = client.route(negative).await.expect_err("negative rtt");
    assert_status(&status, Code::InvalidArgument, &["rtt_ms of dc-a is -1"]);
}

/// Two lanes with unequal capacities and nothing cached: a burst spreads between them.
async fn spreading() -> (Indexer, Producer, Producer) {
    let (indexer, a, b) = two_lanes(&[], 0, 0).await;
    a.stream.send(load_report(&a, 1, 1, 16_384.0)).await;
    b.stream.send(load_report(&b, 1, 0, 8_192.0)).await;
    kept(&indexer, "dc-a", 1).await;
    kept(&indexer, "dc-b", 1).await;
    (indexer, a, b)
}

fn burst_request(h: &[u64]) -> v1::RouteRequest {
    let mut r = by_hashes(h, 1_024);
    r.rtt_ms.insert("dc-a".into(), 1.0);
    r.rtt_ms.insert("dc-b".into(), 1.0);
    r
}

async fn route_batch(
    indexer: &Indexer,
    requests: Vec<v1::RouteRequest>,
) -> Result<Vec<v1::RouteResponse>, tonic::Status> {
    Ok(indexer
        .query()
        .route_batch(v1::RouteBatchRequest { requests })
        .await?
        .into_inner()
        .responses)
}

fn sample(text: &str, line: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(line))
        .map(|v| v.trim().to_owned())
}

#[tokio::test]
async fn a_batch_answers_and_books_exactly_as_the_same_unary_calls() {
    let h = hashes(73, 2);
    let (unary, _ua, _ub) = spreading().await;
    let (batched, _ba, _bb) = spreading().await;
    let mut one_by_one = Vec::new();
    for _ in 0..100 {
        one_by_one.push(without_ages(route(&unary, burst_request(&h)).await));
    }
    let requests = vec![burst_request(&h); 100];
    let answers = route_batch(&batched, requests).await.expect("RouteBatch");
    let answers: Vec<_> = answers.into_iter().map(without_ages).collect();
    assert_eq!(answers.len(), 100);
    assert_eq!(
        answers, one_by_one,
        "same choices, same order, same estimates"
    );
    // The bookings spread the burst (not all on one DC), and request k saw k earlier choices.
    let chosen = |lane| answers.iter().filter(|r| r.chosen_lane == lane).count();
    assert!(
        chosen(0) > 0 && chosen(1) > 0,
        "{} / {}",
        chosen(0),
        chosen(1)
    );
    for (k, r) in answers.iter().enumerate() {
        let booked: u32 = r.ranked.iter().map(|d| d.booked).sum();
        assert_eq!(booked as usize, k);
    }
    // Counted as the unary calls are: per request, and the decisions per DC.
    let (u, b) = (metrics_text(&unary).await, metrics_text(&batched).await);
    assert_eq!(
        sample(
            &b,
            "ckf_indexer_queries_total{domain=\"test\",method=\"route_batch\"}"
        )
        .as_deref(),
        Some("100")
    );
    assert_eq!(
        sample(
            &u,
            "ckf_indexer_queries_total{domain=\"test\",method=\"route\"}"
        )
        .as_deref(),
        Some("100")
    );
    for dc in ["dc-a", "dc-b"] {
        let line = format!(
            "ckf_indexer_route_decisions_total{{dc=\"{dc}\",domain=\"test\",reason=\"fastest\"}}"
        );
        assert_eq!(sample(&u, &line), sample(&b, &line), "{line}");
        assert!(sample(&b, &line).is_some(), "{line}");
    }
}

#[tokio::test]
async fn a_batch_is_refused_whole_naming_the_limit_or_the_first_refused_request() {
    let h = hashes(74, 2);
    let mut cfg = config(&["dc-a", "dc-b"]);
    cfg.limits.max_query_blocks = 4;
    cfg.limits.max_query_batch = 400;
    let indexer = Indexer::start(cfg).await;
    let mut a = Producer::attach(&indexer, "dc-a", 1).await;
    let mut b = Producer::attach(&indexer, "dc-b", 2).await;
    a.snapshot(8192).await;
    b.snapshot(8192).await;
    let ok = || by_hashes(&h, 0);
    let too_long = by_hashes(&hashes(74, 5), 0);
    let mut negative = ok();
    negative.rtt_ms.insert("dc-b".into(), -2.0);
    let bad_tokens = v1::RouteRequest {
        query: Some(v1::route_request::Query::Tokens(
            v1::FindMatchesByTokensRequest {
                token_ids: vec![1; 64],
                block_size: 3,
                ..Default::default()
            },
        )),
        ..Default::default()
    };
    let cases: Vec<(Vec<v1::RouteRequest>, Vec<&str>)> = vec![
        (
            vec![ok(); 401],
            vec![
                "RouteBatch carries 401 queries",
                "limits.max_query_batch = 400",
            ],
        ),
        // 300 answers on two lanes could outgrow the tests' 64 KiB message limit.
        (
            vec![ok(); 300],
            vec![
                "RouteBatch: the answer of its 300 requests",
                "limits.max_message_bytes = 65536",
            ],
        ),
        (
            vec![ok(), ok(), too_long.clone(), too_long.clone()],
            vec![
                "RouteBatch: query #2 carries 5 block hashes",
                "limits.max_query_blocks = 4",
            ],
        ),
        (
            vec![ok(), v1::RouteRequest::default()],
            vec!["RouteBatch: query #1: Route: RouteRequest.query is required"],
        ),
        (
            vec![ok(), ok(), ok(), negative],
            vec!["RouteBatch: query #3: Route: rtt_ms of dc-b is -2"],
        ),
        (
            vec![bad_tokens.clone()],
            vec!["RouteBatch: query #0: Route: ", "block_size"],
        ),
    ];
    // A unary Route names itself, not the FindMatches RPCs whose rules it shares.
    let mut client = indexer.query();
    let status = client.route(too_long).await.expect_err("too long");
    assert_status(
        &status,
        Code::InvalidArgument,
        &["Route carries 5 block hashes (limits.max_query_blocks = 4)"],
    );
    let status = client.route(bad_tokens).await.expect_err("bad tokens");
    assert_status(&status, Code::InvalidArgument, &["Route: ", "block_size"]);
    let mut refused = 0;
    for (requests, says) in cases {
        refused += requests.len();
        let status = route_batch(&indexer, requests).await.expect_err("refused");
        assert_status(&status, Code::InvalidArgument, &says);
    }
    // Nothing was booked or counted as answered; every request of a refused batch was refused.
    let text = metrics_text(&indexer).await;
    assert_eq!(
        sample(
            &text,
            "ckf_indexer_queries_refused_total{domain=\"test\",method=\"route_batch\"}"
        ),
        Some(refused.to_string())
    );
    assert!(
        !text.contains("ckf_indexer_route_decisions_total{"),
        "nothing chosen"
    );
    let r = route(&indexer, ok()).await;
    assert!(r.ranked.iter().all(|d| d.booked == 0), "{r:?}");
    // A batch within every limit is answered; an empty one with nothing.
    assert_eq!(
        route_batch(&indexer, vec![ok(); 200]).await.unwrap().len(),
        200
    );
    assert!(route_batch(&indexer, vec![]).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_restarted_producer_does_not_inherit_its_predecessors_load() {
    let h = hashes(73, 4);
    let (indexer, a, _b) = two_lanes(&h, 4, 0).await;
    a.stream.send(load_report(&a, 1, 500, 16_000.0)).await;
    kept(&indexer, "dc-a", 1).await;
    let dc_a = |r: &v1::RouteResponse| {
        let d = r.ranked.iter().find(|d| d.lane == 0).expect("dc-a ranked");
        (d.load_state(), d.waiting)
    };
    let r = route(&indexer, by_hashes(&h, 0)).await;
    assert_eq!(dc_a(&r), (v1::LoadState::Known, 500));
    // dc-a's producer restarts (a new incarnation, a new lease) and has reported nothing yet:
    // the dead incarnation's 500 waiting requests are not the pool's.
    let mut a2 = Producer::attach(&indexer, "dc-a", 11).await;
    a2.store(1, &h);
    a2.snapshot(8192).await;
    let r = route(&indexer, by_hashes(&h, 0)).await;
    assert_eq!(dc_a(&r), (v1::LoadState::Unknown, 0));
    a2.stream.send(load_report(&a2, 1, 2, 16_000.0)).await;
    kept(&indexer, "dc-a", 2).await;
    let r = route(&indexer, by_hashes(&h, 0)).await;
    assert_eq!(dc_a(&r), (v1::LoadState::Known, 2));
    drop(a);
}

#[tokio::test]
async fn a_dry_run_answers_alike_and_books_nothing() {
    let h = hashes(75, 4);
    let (indexer, a, _b) = two_lanes(&h, 4, 0).await;
    a.stream.send(load_report(&a, 1, 0, 16_000.0)).await;
    kept(&indexer, "dc-a", 1).await;
    let dry = || v1::RouteRequest {
        dry_run: true,
        ..by_hashes(&h, 0)
    };
    let booked = |r: &v1::RouteResponse| r.ranked.iter().map(|d| d.booked).sum::<u32>();
    // The same answer but for the report's age.
    let ageless = |mut r: v1::RouteResponse| {
        r.ranked.iter_mut().for_each(|d| d.load_age_ms = 0.0);
        r
    };
    let first = ageless(route(&indexer, dry()).await);
    let second = ageless(route(&indexer, dry()).await);
    assert_eq!(first, second, "nothing booked between two dry runs");
    assert_eq!(booked(&second), 0);
    assert!(
        !metrics_text(&indexer)
            .await
            .contains("ckf_indexer_route_decisions_total{"),
        "a dry run is no decision"
    );
    // A real one books its choice: the next answer shows it.
    route(&indexer, by_hashes(&h, 0)).await;
    assert_eq!(booked(&route(&indexer, dry()).await), 1);
}
