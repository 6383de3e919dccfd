//! More than 16 lanes in one indexer (up to 64, in lane groups of 16): producers of lanes in
//! every group attach, snapshot and are answered by every query RPC; lanes of other groups are
//! untouched; 65 lanes are refused at start.

mod common;

use ckf_proto::v1;
use common::*;

fn dcs(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("dc-{i}")).collect()
}

#[tokio::test]
async fn lanes_past_sixteen_are_attached_and_answered_by_every_query() {
    let names = dcs(64);
    let lanes: Vec<&str> = names.iter().map(String::as_str).collect();
    let indexer = Indexer::start(config(&lanes)).await;
    assert_eq!(indexer.lanes().await.lanes.len(), 64);
    let bytes = format!(
        "ckf_indexer_table_bytes{{domain=\"{DOMAIN}\"}} {}",
        BUCKETS * 64 * 8
    );
    let metrics = metrics_text(&indexer).await;
    assert!(metrics.contains(&bytes), "no {bytes:?} in\n{metrics}");
    // One lane in each group, at different depths of the same sequence.
    let sequence = hashes(7, 12);
    let mut producers = Vec::new();
    for (lane, depth) in [(3u32, 12usize), (17, 5), (40, 9), (63, 1)] {
        let mut p = Producer::attach(&indexer, &format!("dc-{lane}"), 1).await;
        p.store(1, &sequence[..depth]);
        p.snapshot(8192).await;
        indexer
            .wait_lane(lane, |l| l.state() == v1::LaneState::Active)
            .await;
        producers.push(p);
    }
    let want = vec![(3, 12), (17, 5), (40, 9), (63, 1)];
    let mask = 1u64 << 3 | 1 << 17 | 1 << 40 | 1 << 63;
    assert_eq!(indexer.find(&sequence).await, (want.clone(), mask));

    let batch = indexer
        .query()
        .find_matches_batch(v1::FindMatchesBatchRequest {
            queries: vec![v1::BlockHashQuery {
                block_hashes: sequence.clone(),
            }],
        })
        .await
        .expect("FindMatchesBatch")
        .into_inner();
    assert_eq!(batch.results[0].ready_lanes(), mask);
    assert_eq!(
        batch.results[0].ready_mask, mask as u32,
        "lanes 0..31 in the old field"
    );
    assert_eq!(batch.results[0].depths, [12, 5, 9, 1]);

    let routed = indexer
        .query()
        .route(v1::RouteRequest {
            query: Some(v1::route_request::Query::Hashes(v1::FindMatchesRequest {
                block_hashes: sequence.clone(),
            })),
            dry_run: true,
            ..Default::default()
        })
        .await
        .expect("Route")
        .into_inner();
    assert_eq!(routed.ready_lanes(), mask);
    let mut ranked: Vec<(u32, u32)> = routed.ranked.iter().map(|r| (r.lane, r.depth)).collect();
    ranked.sort_unstable();
    assert_eq!(ranked, want);

    // Lane 17's producer drains and retires: the other groups keep their answers.
    producers[1].drain().await;
    drop(producers.remove(1));
    let (_, after) = indexer.find(&sequence).await;
    assert_eq!(
        after & !(1 << 17),
        mask & !(1 << 17),
        "other lanes untouched"
    );
}

#[tokio::test]
async fn sixty_five_lanes_are_refused_naming_the_limit() {
    let names = dcs(65);
    let lanes: Vec<&str> = names.iter().map(String::as_str).collect();
    let Err(error) = indexer_svc::serve(config(&lanes), std::future::pending()).await else {
        panic!("an indexer of 65 lanes started");
    };
    let error = error.to_string();
    assert!(error.contains("65 lanes"), "{error}");
}
