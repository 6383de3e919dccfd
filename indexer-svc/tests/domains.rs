//! One indexer serving two domains (`[manifest]` and one `[[domains]]` entry) with the same DC
//! names: each query answered by the domain its `ckf-domain` metadata names (none: the
//! primary), each attachment by its pool's domain, and a fault in one domain never changing the
//! other's lanes or answers.

mod common;

use ckf_core::addressing::TableFormat;
use ckf_core::identity::{PoolId, ProducerIdentity, ProducerIncarnation};
use ckf_core::tokens::{BlockSeed, sequence_hashes};
use ckf_proto::v1;
use common::*;
use indexer_svc::IndexerConfig;
use indexer_svc::config::domains::DomainConfig;
use tonic::Code;

/// The second domain: its own table size and block size.
const QWEN: &str = "qwen";
const QWEN_BUCKETS: u64 = 2048;
const QWEN_BLOCK: u32 = 32;

/// `test` (primary: dc-a, dc-b; 1,024 buckets, block size 16) and `qwen` (dc-a, dc-b; 2,048
/// buckets, block size 32).
fn two_domains() -> IndexerConfig {
    let mut config = config(&["dc-a", "dc-b"]);
    config.domains.push(DomainConfig {
        domain: QWEN.into(),
        lanes: vec!["dc-a".into(), "dc-b".into()],
        block_size: Some(QWEN_BLOCK),
        table: Some(ckf_svc_kit::table::TableConfig {
            bucket_count: QWEN_BUCKETS,
            ..Default::default()
        }),
        ..DomainConfig::default()
    });
    config
}

fn qwen_identity(dc: &str, incarnation: u64) -> ProducerIdentity {
    ProducerIdentity {
        pool: PoolId::new(QWEN, dc).unwrap(),
        incarnation: ProducerIncarnation(incarnation),
        format: TableFormat::new(QWEN_BUCKETS, 0).unwrap(),
    }
}

/// `request` naming `domain` in its metadata (none: no metadata).
fn named<T>(request: T, domain: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(request);
    if let Some(domain) = domain {
        request
            .metadata_mut()
            .insert(ckf_proto::metadata::DOMAIN_KEY, domain.parse().unwrap());
    }
    request
}

/// `(lane, depth)` per ready lane of `domain` for `hashes`, and its ready mask.
async fn find(indexer: &Indexer, domain: Option<&str>, hashes: &[u64]) -> (Vec<(u32, u32)>, u64) {
    let request = v1::FindMatchesRequest {
        block_hashes: hashes.to_vec(),
    };
    let answer = indexer
        .query()
        .find_matches(named(request, domain))
        .await
        .expect("FindMatches")
        .into_inner();
    for m in &answer.matches {
        let pool = m.pool.as_ref().unwrap();
        assert_eq!(pool.domain, domain.unwrap_or(DOMAIN), "{m:?}");
    }
    (
        answer.matches.iter().map(|m| (m.lane, m.depth)).collect(),
        answer.ready_lanes(),
    )
}

async fn lanes(indexer: &Indexer, domain: Option<&str>) -> v1::ListLanesResponse {
    indexer
        .query()
        .list_lanes(named(v1::ListLanesRequest {}, domain))
        .await
        .expect("ListLanes")
        .into_inner()
}

#[tokio::test]
async fn two_domains_with_the_same_dcs_are_answered_apart_and_a_fault_in_one_spares_the_other() {
    let indexer = Indexer::start(two_domains()).await;
    let shared = hashes(1, 6);
    // test/dc-a holds the whole sequence; qwen/dc-a its first 3 blocks, qwen/dc-b another one.
    let mut test_a = Producer::attach(&indexer, "dc-a", 1).await;
    test_a.store(1, &shared);
    test_a.snapshot(8192).await;
    let mut qwen_a = Producer::attach_as(&indexer, qwen_identity("dc-a", 2)).await;
    qwen_a.store(1, &shared[..3]);
    qwen_a.snapshot(8192).await;
    let mut qwen_b = Producer::attach_as(&indexer, qwen_identity("dc-b", 3)).await;
    qwen_b.store(1, &hashes(2, 4));
    qwen_b.snapshot(8192).await;

    // No metadata: the primary; its own name: the same; the other's name: the other's lanes.
    let primary = (vec![(0, 6)], 0b01);
    assert_eq!(find(&indexer, None, &shared).await, primary);
    assert_eq!(find(&indexer, Some(DOMAIN), &shared).await, primary);
    let qwen = (vec![(0, 3), (1, 0)], 0b11);
    assert_eq!(find(&indexer, Some(QWEN), &shared).await, qwen);
    assert_eq!(
        find(&indexer, Some(QWEN), &hashes(2, 4)).await,
        (vec![(0, 0), (1, 4)], 0b11)
    );

    // ListLanes per domain: its name, its format, its lanes' pools and block size.
    let listed = lanes(&indexer, Some(QWEN)).await;
    assert_eq!(listed.domain, QWEN);
    assert_eq!(listed.format.unwrap().bucket_count, QWEN_BUCKETS);
    assert_eq!(listed.lanes.len(), 2);
    assert_eq!(listed.lanes[1].pool.as_ref().unwrap().domain, QWEN);
    assert_eq!(listed.lanes[1].block_size, QWEN_BLOCK);
    let listed = lanes(&indexer, None).await;
    assert_eq!(listed.domain, DOMAIN);
    assert_eq!(listed.format.unwrap().bucket_count, BUCKETS);
    assert_eq!(listed.lanes[0].block_size, 16);

    // A broken frame on qwen/dc-a retires that lane alone.
    qwen_a.stream.send_raw(v1::RelayFrame { frame: None }).await;
    let (retired, status) = qwen_a.stream.expect_retired().await;
    assert_eq!(
        retired.reason(),
        v1::RetireReason::StreamLost,
        "{retired:?}"
    );
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let wait_qwen_retired = async {
        for _ in 0..400 {
            if lanes(&indexer, Some(QWEN)).await.lanes[0].state() == v1::LaneState::Retired {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        panic!("qwen/dc-a never retired");
    };
    wait_qwen_retired.await;
    assert_eq!(
        find(&indexer, Some(QWEN), &shared).await,
        (vec![(1, 0)], 0b10)
    );
    // The primary's dc-a (same DC name, other domain) is untouched: still ready, never
    // retired, same answer, and its stream goes on.
    assert_eq!(find(&indexer, None, &shared).await, primary);
    let lane = &lanes(&indexer, None).await.lanes[0];
    assert_eq!(lane.state(), v1::LaneState::Active);
    assert_eq!(lane.retirements, 0);
    test_a.store(2, &hashes(3, 2));
    assert_eq!(test_a.publish().await.installed_sequence, 1);

    // Metrics carry the domain: one lane gauge per (domain, lane), one table per domain.
    let tables = [
        format!(
            r#"ckf_indexer_table_bytes{{domain="test"}} {}"#,
            BUCKETS * 2 * 8
        ),
        format!(
            r#"ckf_indexer_table_bytes{{domain="qwen"}} {}"#,
            QWEN_BUCKETS * 2 * 8
        ),
    ];
    wait_metrics(
        &indexer,
        &[
            r#"ckf_indexer_lane_ready{dc="dc-a",domain="test",lane="0"} 1"#,
            r#"ckf_indexer_lane_ready{dc="dc-a",domain="qwen",lane="0"} 0"#,
            r#"ckf_indexer_lane_ready{dc="dc-b",domain="qwen",lane="1"} 1"#,
            r#"ckf_indexer_lane_retirements_total{dc="dc-a",domain="qwen",lane="0",reason="stream_lost"} 1"#,
            &tables[0],
            &tables[1],
            r#"ckf_indexer_queries_total{domain="qwen",method="find_matches"} 3"#,
            r#"ckf_indexer_queries_total{domain="test",method="find_matches"} 3"#,
        ],
    )
    .await;
}

#[tokio::test]
async fn an_attachment_for_a_domain_not_served_is_not_found_naming_the_domains() {
    let indexer = Indexer::start(two_domains()).await;
    let mut mistral = qwen_identity("dc-a", 1);
    mistral.pool = PoolId::new("mistral", "dc-a").unwrap();
    let status = refused(&indexer, (&mistral).into()).await;
    assert_status(
        &status,
        Code::NotFound,
        &[
            "pool mistral/dc-a",
            "domain mistral is not served here: this indexer serves qwen, test",
        ],
    );
    // A domain's own format rules: qwen's producer with the primary's format is refused.
    let mut wrong = qwen_identity("dc-a", 1);
    wrong.format = format();
    let status = refused(&indexer, (&wrong).into()).await;
    assert_status(
        &status,
        Code::FailedPrecondition,
        &["table format mismatch for pool qwen/dc-a"],
    );
    // A call naming two domains is refused, not answered from the first.
    let mut twice = tonic::Request::new(v1::FindMatchesRequest::default());
    for d in [DOMAIN, QWEN] {
        twice
            .metadata_mut()
            .append(ckf_proto::metadata::DOMAIN_KEY, d.parse().unwrap());
    }
    let status = indexer.query().find_matches(twice).await.unwrap_err();
    assert_status(&status, Code::InvalidArgument, &["names 2 domains"]);
    // A query naming it is refused too, before anything is searched.
    let request = named(v1::FindMatchesRequest::default(), Some("mistral"));
    let status = indexer.query().find_matches(request).await.unwrap_err();
    assert_status(&status, Code::NotFound, &["this indexer serves qwen, test"]);
}

#[tokio::test]
async fn each_domain_has_its_own_relay_stream_limit() {
    let mut config = two_domains();
    config.limits.max_relay_streams = 1;
    let indexer = Indexer::start(config).await;
    let _test_a = Producer::attach(&indexer, "dc-a", 1).await;
    let status = refused(&indexer, (&identity("dc-b", 2, format())).into()).await;
    assert_status(
        &status,
        Code::ResourceExhausted,
        &["limits.max_relay_streams = 1"],
    );
    // The other domain's producers are not locked out by the first's streams.
    let _qwen_a = Producer::attach_as(&indexer, qwen_identity("dc-a", 3)).await;
}

#[tokio::test]
async fn token_queries_use_the_named_domains_block_size() {
    let indexer = Indexer::start(two_domains()).await;
    let tokens: Vec<u32> = (0..128).collect();
    let at =
        |block: u32| sequence_hashes(&tokens, block as usize, BlockSeed::DEFAULT, &[]).unwrap();
    let mut qwen_a = Producer::attach_as(&indexer, qwen_identity("dc-a", 1)).await;
    qwen_a.store(1, &at(QWEN_BLOCK)[..3]);
    qwen_a.snapshot(8192).await;
    let mut test_a = Producer::attach(&indexer, "dc-a", 2).await;
    test_a.store(1, &at(16)[..5]);
    test_a.snapshot(8192).await;
    let request = |domain| {
        named(
            v1::FindMatchesByTokensRequest {
                token_ids: tokens.clone(),
                ..Default::default()
            },
            domain,
        )
    };
    let answer = |r: v1::FindMatchesResponse| -> Vec<(u32, u32, u64)> {
        r.matches
            .iter()
            .map(|m| (m.lane, m.depth, m.cached_tokens))
            .collect()
    };
    let qwen = indexer
        .query()
        .find_matches_by_tokens(request(Some(QWEN)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer(qwen), [(0, 3, 96)]);
    let primary = indexer
        .query()
        .find_matches_by_tokens(request(None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer(primary), [(0, 5, 80)]);
    // A block size the named domain does not use is refused naming its own.
    let mut wrong = request(Some(QWEN));
    wrong.get_mut().block_size = 16;
    let status = indexer
        .query()
        .find_matches_by_tokens(wrong)
        .await
        .unwrap_err();
    assert_status(&status, Code::InvalidArgument, &["block_size 16", "32"]);
}
