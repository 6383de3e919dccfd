//! E2E: per-pool authorization (`[auth]` on the indexer, `[ingest_auth]` on the producer) and
//! separate Query / Relay listeners, against the real binaries.
//!
//! * A lane hijack: a raw client attaching as `dc-a` while the real producer is
//!   attached, without credentials (`UNAUTHENTICATED`), with an unknown token
//!   (`UNAUTHENTICATED`) or with `dc-b`'s token (`PERMISSION_DENIED`). The real producer's lane
//!   stays `ACTIVE` under the same lease, its blocks still match, it keeps publishing.
//! * A poisoned snapshot is impossible without the credential: an attacker that pipelines
//!   `Attach`, a barrier snapshot full of its own fingerprints and a drain marker in one request
//!   is refused before any frame after `Attach` is read: its hashes stay at depth 0.
//! * Query with `auth.query_token_file`: refused without / with another token, token rotated by
//!   SIGHUP, health unaffected, `ckf lanes --token-file`.
//! * Ingest: a source not allowed and a worker not allowed are refused with `PERMISSION_DENIED`
//!   (nothing of the batch applied) while the allowed source proceeds to the indexer;
//!   `ReportLoad` likewise (a worker outside the grant refused), the allowed push reaching the
//!   indexer's kept load of the pool.
//! * `query_listen`: Query served there and not on `listen`; Relay on `listen` and not there.

use std::path::{Path, PathBuf};
use std::process::Command;

use ckf_e2e::binary;
use ckf_e2e::check::wait_converged;
use ckf_e2e::cluster::{
    self, Indexer, IndexerSpec, Producer, ProducerSpec, TestDir, batch, channel, event, format,
    is_active,
};
use ckf_e2e::hashes::HashPool;
use ckf_e2e::metrics;
use ckf_e2e::relay::{RawStream, RawTable, attach};
use ckf_e2e::wait::{DEADLINE, eventually};
use ckf_proto::v1::{
    self, ingest_client::IngestClient, kv_event::Kind, query_client::QueryClient,
    relay_client::RelayClient, relay_frame::Frame,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Status};
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

/// Writes `token` (with a trailing newline, as `echo` would) to `<dir>/<name>.token`.
fn token_file(dir: &TestDir, name: &str, token: &str) -> PathBuf {
    let path = dir.path().join(format!("{name}.token"));
    std::fs::write(&path, format!("{token}\n")).expect("write token file");
    path
}

/// `request` with `authorization: Bearer <token>` when a token is given.
fn bearer<T>(request: T, token: Option<&str>) -> Request<T> {
    let mut request = Request::new(request);
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().expect("header value");
        request.metadata_mut().insert("authorization", value);
    }
    request
}

/// An `[auth]` section requiring credentials: producers `dc-a` and `dc-b`, each with a token
/// file and its own pool.
fn relay_auth(a: &Path, b: &Path) -> String {
    format!(
        "[auth]\nrequired = true\n\
         [[auth.producers]]\nname = \"dc-a\"\npools = [\"dc-a\"]\ntoken_file = {a:?}\n\
         [[auth.producers]]\nname = \"dc-b\"\npools = [\"dc-b\"]\ntoken_file = {b:?}\n"
    )
}

async fn raw_attach(indexer: &Indexer, dc: &str, token: Option<&str>) -> Result<RawStream, Status> {
    let channel = channel(indexer.addr).await.map_err(Status::unavailable)?;
    RawStream::open_with_token(channel, attach(dc, 0xbad, format()), token).await
}

fn counter(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metrics::value(text, name, labels).unwrap_or(0.0)
}

/// Sends `Attach(dc-a)`, a whole barrier snapshot holding `poison` under the lease the attacker
/// would get next, and a drain marker, all before reading any reply; returns the status.
async fn pipelined_poison(indexer: &Indexer, token: Option<&str>, poison: &[u64]) -> Status {
    let lanes = indexer.list_lanes().await.expect("ListLanes");
    let lane = indexer.lane("dc-a").await.expect("ListLanes");
    let lease = v1::LaneLease {
        consumer_instance: lanes.consumer_instance,
        lane: indexer.lane_index("dc-a"),
        epoch: lane.lease_epoch + 1,
    };
    let mut table = RawTable::new(&format());
    for &h in poison {
        table.place(h);
    }
    let (tx, rx) = mpsc::channel(16);
    tx.send(Frame::Attach(attach("dc-a", 0xbad, format())).into())
        .await
        .expect("room");
    tx.send(
        Frame::SnapshotChunk(v1::SnapshotChunk {
            lease: Some(lease),
            sequence: 1,
            first_bucket: 0,
            words: table.words.iter().flat_map(|w| w.to_le_bytes()).collect(),
        })
        .into(),
    )
    .await
    .expect("room");
    tx.send(
        Frame::DrainMarker(v1::DrainMarker {
            lease: Some(lease),
            sequence: 1,
        })
        .into(),
    )
    .await
    .expect("room");
    let mut client = RelayClient::new(channel(indexer.addr).await.expect("channel"));
    let answer = client.publish(bearer(ReceiverStream::new(rx), token)).await;
    match answer {
        Err(status) => status,
        Ok(response) => {
            let mut replies = response.into_inner();
            match replies.message().await {
                Err(status) => status,
                Ok(reply) => panic!("the poisoned attachment was answered: {reply:?}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hijack_and_poisoned_snapshot_are_refused_without_the_pools_credential() {
    let dir = TestDir::new("authz-relay");
    let a_token = token_file(&dir, "dc-a", "tok-a.0123456789");
    let b_token = token_file(&dir, "dc-b", "tok-b.0123456789");
    let spec = IndexerSpec {
        extra_toml: relay_auth(&a_token, &b_token),
        ..IndexerSpec::default()
    };
    let indexer = Indexer::start(&dir, &spec);
    let a_spec = ProducerSpec {
        extra_toml: format!("indexer_token_file = {a_token:?}\n"),
        ..ProducerSpec::new("dc-a")
    };
    let mut a = Producer::start(&dir, "producer-a", &a_spec, &[indexer.url()]);
    // A real producer without credentials: never gets its lane.
    let b = Producer::start_dc(&dir, "dc-b", &[indexer.url()]);
    let mut pool = HashPool::new(&format(), 11);
    a.store(1, &pool.take(60)).await;
    let before = wait_converged(&indexer, &a).await;

    // The hijack: no credentials, an unknown token, dc-b's token.
    let status = raw_attach(&indexer, "dc-a", None)
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("no credentials"), "{status:?}");
    let status = raw_attach(&indexer, "dc-a", Some("guess"))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(
        status.message().contains("matches no configured principal"),
        "{status:?}"
    );
    let status = raw_attach(&indexer, "dc-a", Some("tok-b.0123456789"))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    for needle in ["\"dc-b\"", "may not publish pool e2e/dc-a", "e2e/dc-b"] {
        assert!(
            status.message().contains(needle),
            "{needle:?} not in {status:?}"
        );
    }

    // The poisoned snapshot, pipelined behind the Attach, without and with the wrong token.
    let poison = pool.take(400);
    for token in [None, Some("tok-b.0123456789")] {
        let status = pipelined_poison(&indexer, token, &poison).await;
        assert!(
            matches!(
                status.code(),
                Code::Unauthenticated | Code::PermissionDenied
            ),
            "{status:?}"
        );
    }
    for &h in &poison {
        let depths = indexer.depths(&[h]).await.expect("FindMatches");
        assert_eq!(
            depths.get("dc-a"),
            Some(&0),
            "poison {h:#x} reached dc-a: {depths:?}"
        );
    }

    // The real producer is untouched and keeps publishing under the same lease.
    a.store(2, &pool.take(40)).await;
    let after = wait_converged(&indexer, &a).await;
    assert!(is_active(&after), "{after:?}");
    assert_eq!(
        (after.lease_epoch, after.incarnation, after.retirements),
        (before.lease_epoch, before.incarnation, 0),
        "the real producer's lane moved: {before:?} -> {after:?}"
    );
    assert!(a.log_records("another producer attached").is_empty());

    // The producer without credentials is refused (retrying) and dc-b stays unassigned.
    eventually(
        "producer-b refused as unauthenticated",
        DEADLINE,
        || async {
            let refused = b
                .log_records("attachment ended")
                .into_iter()
                .any(|r| r.to_string().contains("Unauthenticated"));
            if refused { Ok(()) } else { Err(b.log()) }
        },
    )
    .await;
    let lane_b = indexer.lane("dc-b").await.expect("ListLanes");
    assert_eq!(lane_b.state(), v1::LaneState::Unassigned, "{lane_b:?}");

    let text = indexer.metrics().expect("metrics");
    let refused = |code| {
        counter(
            &text,
            "ckf_indexer_auth_refused_total",
            &[("service", "relay"), ("code", code)],
        )
    };
    assert_eq!(refused("permission_denied"), 2.0, "{text}");
    // 3 raw attempts + producer-b's retries.
    assert!(refused("unauthenticated") >= 4.0, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_needs_the_configured_token_rotated_by_sighup() {
    let dir = TestDir::new("authz-query");
    let query_token = token_file(&dir, "query", "q-old.0123456789");
    let spec = IndexerSpec {
        extra_toml: format!("[auth]\nquery_token_file = {query_token:?}\n"),
        ..IndexerSpec::default()
    };
    let mut indexer = Indexer::start(&dir, &spec);
    let mut client = QueryClient::new(channel(indexer.addr).await.expect("channel"));
    let find = |token: Option<&'static str>| {
        bearer(
            v1::FindMatchesRequest {
                block_hashes: vec![1, 2, 3],
            },
            token,
        )
    };

    for token in [None, Some("q-wrong")] {
        let status = client.find_matches(find(token)).await.expect_err("refused");
        assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
        let status = client
            .list_lanes(bearer(v1::ListLanesRequest {}, token))
            .await
            .expect_err("refused");
        assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
        let tokens = v1::FindMatchesByTokensRequest {
            token_ids: (0..32).collect(),
            ..Default::default()
        };
        let status = client
            .find_matches_by_tokens(bearer(tokens, token))
            .await
            .expect_err("refused");
        assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    }
    client
        .find_matches(find(Some("q-old.0123456789")))
        .await
        .expect("token accepted");

    // Health and the Relay are not behind the query token.
    let mut health = HealthClient::new(channel(indexer.addr).await.expect("channel"));
    let answer = health
        .check(HealthCheckRequest::default())
        .await
        .expect("health")
        .into_inner();
    assert_eq!(answer.status, 1, "SERVING: {answer:?}");
    raw_attach(&indexer, "dc-b", None)
        .await
        .expect("relay needs no query token");

    // The CLI sends the token of --token-file.
    let ckf = |args: &[&str]| {
        Command::new(binary("ckf"))
            .args(["lanes", "--indexer", &indexer.url()])
            .args(args)
            .output()
            .expect("run ckf")
    };
    let out = ckf(&["--token-file", query_token.to_str().expect("utf-8")]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("dc-b"),
        "{out:?}"
    );
    let out = ckf(&[]);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("nauthenticated"),
        "{out:?}"
    );
    let text = indexer.metrics().expect("metrics");
    let refused = counter(
        &text,
        "ckf_indexer_auth_refused_total",
        &[("service", "query"), ("code", "unauthenticated")],
    );
    assert_eq!(
        refused, 7.0,
        "6 refused calls and the CLI without token: {text}"
    );

    // Rotation: a new token in the file, SIGHUP; the old one is refused from then on.
    std::fs::write(&query_token, "q-new.0123456789\n").expect("rotate");
    indexer.signal(libc::SIGHUP);
    eventually("the new query token accepted", DEADLINE, || {
        let mut client = client.clone();
        async move {
            client
                .find_matches(find(Some("q-new.0123456789")))
                .await
                .map_err(|s| format!("{s:?}"))
        }
    })
    .await;
    let status = client
        .find_matches(find(Some("q-old.0123456789")))
        .await
        .expect_err("old token");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    // A broken file on reload keeps the tokens in force.
    std::fs::write(&query_token, "\n").expect("empty");
    indexer.signal(libc::SIGHUP);
    eventually("the failed reload logged", DEADLINE, || async {
        if indexer.log().contains("reload failed") {
            Ok(())
        } else {
            Err(indexer.log())
        }
    })
    .await;
    client
        .find_matches(find(Some("q-new.0123456789")))
        .await
        .expect("still the new token");

    indexer.query_token = Some("q-new.0123456789".into());
    indexer
        .list_lanes()
        .await
        .expect("the helpers send the token");
}

/// One stored event of `worker`.
fn stored(worker: u64, hashes: &[u64]) -> v1::KvEvent {
    event(worker, cluster::stored(hashes))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_sources_and_workers_outside_their_grant_are_refused() {
    let dir = TestDir::new("authz-ingest");
    let router = token_file(&dir, "router-1", "r1-secret.0123456789");
    let ops = token_file(&dir, "ops", "ops-secret.0123456789");
    let indexer = Indexer::start(&dir, &IndexerSpec::default());
    let spec = ProducerSpec {
        extra_toml: format!(
            "[ingest_auth]\nrequired = true\n\
             [[ingest_auth.sources]]\nname = \"router-1\"\ntoken_file = {router:?}\n\
             source_ids = [\"router-1\"]\nworkers = [1, 2]\n\
             [[ingest_auth.sources]]\nname = \"ops\"\ntoken_file = {ops:?}\n\
             [engine]\npushed_load_ttl_ms = 60000\n"
        ),
        ..ProducerSpec::new("dc-a")
    };
    let producer = Producer::start(&dir, "producer-a", &spec, &[indexer.url()]);
    let mut client = IngestClient::new(channel(producer.addr).await.expect("channel"));
    let mut pool = HashPool::new(&format(), 12);
    let (h1, h2, h3) = (pool.take(3), pool.take(3), pool.take(3));
    let member_blocks = |worker: u64| {
        bearer(
            v1::GetMemberBlocksRequest {
                member: Some(v1::MemberId {
                    worker_id: worker,
                    dp_rank: 0,
                }),
            },
            Some("ops-secret.0123456789"),
        )
    };

    // No credentials: nothing is read.
    let status = client
        .publish_batch(bearer(batch("router-1", 1, vec![stored(1, &h1)]), None))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let status = client
        .get_stats(bearer(v1::GetStatsRequest {}, None))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    client
        .get_stats(bearer(
            v1::GetStatsRequest {},
            Some("ops-secret.0123456789"),
        ))
        .await
        .expect("any identified principal may read the stats");

    // The allowed source proceeds.
    let result = client
        .publish_batch(bearer(
            batch("router-1", 1, vec![stored(1, &h1)]),
            Some("r1-secret.0123456789"),
        ))
        .await
        .expect("allowed")
        .into_inner();
    assert_eq!(
        result.events[0].status(),
        v1::EventStatus::Applied,
        "{result:?}"
    );

    // Another source id; a worker outside the grant (the allowed event before it is not applied
    // either); a principal without sources.
    let refused = [
        (
            batch("router-9", 1, vec![stored(1, &h3)]),
            "r1-secret.0123456789",
            vec!["\"router-1\"", "source \"router-9\""],
        ),
        (
            batch(
                "router-1",
                2,
                vec![
                    stored(2, &h3),
                    event(9, Kind::WorkerRemoved(v1::WorkerRemoved {})),
                ],
            ),
            "r1-secret.0123456789",
            vec!["may not touch worker 9", "event 1"],
        ),
        (
            batch("router-1", 2, vec![stored(1, &h3)]),
            "ops-secret.0123456789",
            vec!["\"ops\""],
        ),
    ];
    for (b, token, needles) in refused {
        let status = client
            .publish_batch(bearer(b, Some(token)))
            .await
            .expect_err("refused");
        assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
        for needle in needles {
            assert!(
                status.message().contains(needle),
                "{needle:?} not in {status:?}"
            );
        }
    }
    let held = client
        .get_member_blocks(member_blocks(2))
        .await
        .expect("blocks")
        .into_inner();
    assert!(
        held.block_hashes.is_empty(),
        "a refused batch was applied: {held:?}"
    );

    // The Publish stream: refused without credentials, allowed batches go through.
    let (tx, rx) = mpsc::channel(4);
    tx.send(batch("router-1", 2, vec![stored(2, &h2)]))
        .await
        .expect("room");
    let refused = async {
        let mut replies = client
            .publish(bearer(ReceiverStream::new(rx), None))
            .await?
            .into_inner();
        replies.message().await
    }
    .await;
    assert_eq!(refused.expect_err("refused").code(), Code::Unauthenticated);
    let (tx, rx) = mpsc::channel(4);
    tx.send(batch("router-1", 2, vec![stored(2, &h2)]))
        .await
        .expect("room");
    let mut replies = client
        .publish(bearer(
            ReceiverStream::new(rx),
            Some("r1-secret.0123456789"),
        ))
        .await
        .expect("stream")
        .into_inner();
    let result = replies
        .message()
        .await
        .expect("result")
        .expect("one result");
    assert_eq!(
        result.events[0].status(),
        v1::EventStatus::Applied,
        "{result:?}"
    );
    drop(tx);

    // The allowed source's blocks reach the indexer; the refused ones never did.
    eventually("router-1's blocks at the indexer", DEADLINE, || async {
        let d1 = indexer.depths(&h1).await?;
        let d2 = indexer.depths(&h2).await?;
        if d1.get("dc-a") == Some(&3) && d2.get("dc-a") == Some(&3) {
            Ok(())
        } else {
            Err(format!("{d1:?} {d2:?}"))
        }
    })
    .await;
    for &h in &h3 {
        let depths = indexer.depths(&[h]).await.expect("FindMatches");
        assert_eq!(depths.get("dc-a"), Some(&0), "{depths:?}");
    }

    // ReportLoad is checked like a batch of its source id touching its worker: router-1 may
    // push worker 1's load, not worker 9's; ops pushes nothing. Only the allowed push reaches
    // the indexer's kept load of dc-a (through the producer's Relay load report).
    let load = |worker_id: u64, running: u32| v1::ReportLoadRequest {
        source_id: "router-1".into(),
        worker_id,
        running,
        waiting: 1,
        kv_usage: 0.5,
        prefill_tokens_per_s: Some(4_000.0),
        age_ms: 0,
    };
    for (request, token, needle) in [
        (
            load(9, 50),
            "r1-secret.0123456789",
            "may not report the load of worker 9",
        ),
        (load(1, 50), "ops-secret.0123456789", "\"ops\""),
    ] {
        let status = client
            .report_load(bearer(request, Some(token)))
            .await
            .expect_err("refused");
        assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
        assert!(
            status.message().contains(needle),
            "{needle:?} not in {status:?}"
        );
    }
    client
        .report_load(bearer(load(1, 3), Some("r1-secret.0123456789")))
        .await
        .expect("allowed");
    eventually("the pushed load at the indexer", DEADLINE, || async {
        let text = indexer.metrics()?;
        let running = counter(
            &text,
            "ckf_indexer_lane_load_requests",
            &[("dc", "dc-a"), ("state", "running")],
        );
        if running == 3.0 {
            Ok(())
        } else {
            Err(format!("running {running}"))
        }
    })
    .await;
    let text = indexer.metrics().expect("metrics");
    assert_eq!(
        counter(
            &text,
            "ckf_indexer_lane_load_prefill_tokens_per_second",
            &[("dc", "dc-a")]
        ),
        4_000.0,
        "{text}"
    );

    let text = producer.metrics().expect("metrics");
    assert_eq!(
        counter(
            &text,
            "ckf_producer_load_pushes_total",
            &[("outcome", "denied")]
        ),
        2.0,
        "{text}"
    );
    assert_eq!(
        counter(
            &text,
            "ckf_producer_load_pushes_total",
            &[("outcome", "accepted")]
        ),
        1.0,
        "{text}"
    );
    let refused = |rpc, code| {
        counter(
            &text,
            "ckf_producer_auth_refused_total",
            &[("rpc", rpc), ("code", code)],
        )
    };
    assert_eq!(refused("report_load", "permission_denied"), 2.0, "{text}");
    assert_eq!(refused("publish_batch", "permission_denied"), 3.0, "{text}");
    assert_eq!(refused("publish_batch", "unauthenticated"), 1.0, "{text}");
    assert_eq!(refused("get_stats", "unauthenticated"), 1.0, "{text}");
    assert_eq!(refused("publish", "unauthenticated"), 1.0, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_listen_serves_query_only_and_listen_relay_only() {
    let dir = TestDir::new("authz-listeners");
    let spec = IndexerSpec {
        extra_toml: "query_listen = \"127.0.0.1:0\"\n".into(),
        ..IndexerSpec::default()
    };
    let indexer = Indexer::start(&dir, &spec);
    assert_ne!(indexer.query_addr, indexer.addr);
    let mut a = Producer::start_dc(&dir, "dc-a", &[indexer.url()]);
    let mut pool = HashPool::new(&format(), 13);
    a.store(1, &pool.take(30)).await;
    // Relay on `listen` (the producer's endpoint), Query on `query_listen` (the helpers').
    wait_converged(&indexer, &a).await;

    let mut on_listen = QueryClient::new(channel(indexer.addr).await.expect("channel"));
    let status = on_listen
        .list_lanes(v1::ListLanesRequest {})
        .await
        .expect_err("no Query on listen");
    assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
    let channel_q = channel(indexer.query_addr).await.expect("channel");
    let status = RawStream::open(channel_q.clone(), attach("dc-b", 7, format()))
        .await
        .expect_err("no Relay on query_listen");
    assert_eq!(status.code(), Code::Unimplemented, "{status:?}");

    // Health (and reflection) on both, each naming its own service.
    let check = |channel: tonic::transport::Channel, service: &'static str| async move {
        HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .map(|r| r.into_inner().status)
    };
    let channel_r = cluster::channel(indexer.addr).await.expect("channel");
    assert_eq!(check(channel_r.clone(), "").await.expect("health"), 1);
    assert_eq!(
        check(channel_r.clone(), "ckf.v1.Relay")
            .await
            .expect("health"),
        1
    );
    let status = check(channel_r, "ckf.v1.Query")
        .await
        .expect_err("not here");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert_eq!(check(channel_q.clone(), "").await.expect("health"), 1);
    assert_eq!(
        check(channel_q.clone(), "ckf.v1.Query")
            .await
            .expect("health"),
        1
    );
    let status = check(channel_q, "ckf.v1.Relay")
        .await
        .expect_err("not here");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
}

/// Client TLS trusting `certs/ca.crt` and presenting `certs/<stem>.crt` (from `ckf certs`).
fn mtls(certs: &Path, stem: &str) -> ckf_svc_kit::tls::ClientTls {
    ckf_svc_kit::tls::ClientTlsConfig {
        ca_file: Some(certs.join("ca.crt")),
        cert_file: Some(certs.join(format!("{stem}.crt"))),
        key_file: Some(certs.join(format!("{stem}.key"))),
        server_name: Some("localhost".into()),
    }
    .load("test")
    .expect("client TLS files")
    .expect("client TLS configured")
}

async fn mtls_channel(
    addr: std::net::SocketAddr,
    tls: &ckf_svc_kit::tls::ClientTls,
) -> tonic::transport::Channel {
    ckf_svc_kit::tls::endpoint(&format!("https://{addr}"), Some(tls), true)
        .expect("endpoint")
        .connect_timeout(std::time::Duration::from_secs(3))
        .connect()
        .await
        .expect("TLS connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificate_names_map_to_pools() {
    let dir = TestDir::new("authz-mtls");
    let certs = dir.path().join("certs");
    let out = Command::new(binary("ckf"))
        .args([
            "certs",
            "--out",
            certs.to_str().expect("utf-8"),
            "--pools",
            "dc-a,dc-b",
        ])
        .output()
        .expect("run ckf certs");
    assert!(out.status.success(), "{out:?}");
    let file = |name: &str| certs.join(name);
    let spec = IndexerSpec {
        extra_toml: format!(
            "[tls]\ncert_file = {:?}\nkey_file = {:?}\nclient_ca_file = {:?}\nreload_interval_ms = 0\n\
             [auth]\nrequired = true\n\
             [[auth.producers]]\nname = \"dc-a\"\npools = [\"dc-a\"]\ncert_names = [\"producer.dc-a.ckf\"]\n\
             [[auth.producers]]\nname = \"dc-b\"\npools = [\"dc-b\"]\ncert_names = [\"producer.dc-b.ckf\"]\n",
            file("indexer.crt"),
            file("indexer.key"),
            file("ca.crt"),
        ),
        ..IndexerSpec::default()
    };
    let indexer = Indexer::start(&dir, &spec);
    let a_spec = ProducerSpec {
        extra_toml: format!(
            "[indexer_tls]\nca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\nserver_name = \"localhost\"\n",
            file("ca.crt"),
            file("producer-dc-a.crt"),
            file("producer-dc-a.key"),
        ),
        ..ProducerSpec::new("dc-a")
    };
    let https = format!("https://{}", indexer.addr);
    let mut a = Producer::start(&dir, "producer-a", &a_spec, &[https]);
    let mut pool = HashPool::new(&format(), 14);
    let held = pool.take(20);
    a.store(1, &held).await;

    // The producer's certificate names its pool: it attaches and its blocks arrive.
    let query_tls = mtls(&certs, "query");
    let mut query = QueryClient::new(mtls_channel(indexer.addr, &query_tls).await);
    let lane = eventually("dc-a active with its blocks", DEADLINE, || {
        let mut query = query.clone();
        let held = held.clone();
        async move {
            let lanes = query
                .list_lanes(v1::ListLanesRequest {})
                .await
                .map_err(|s| format!("{s:?}"))?
                .into_inner();
            let lane = lanes.lanes[0].clone();
            let found = query
                .find_matches(v1::FindMatchesRequest { block_hashes: held })
                .await
                .map_err(|s| format!("{s:?}"))?
                .into_inner();
            let depth = found.matches.iter().find(|m| m.lane == 0).map(|m| m.depth);
            if is_active(&lane) && depth == Some(20) {
                Ok(lane)
            } else {
                Err(format!("{lane:?} depth {depth:?}"))
            }
        }
    })
    .await;

    // dc-b's certificate attaching as dc-a, an authentic certificate of no producer.
    let b_tls = mtls(&certs, "producer-dc-b");
    let status = RawStream::open(
        mtls_channel(indexer.addr, &b_tls).await,
        attach("dc-a", 9, format()),
    )
    .await
    .expect_err("another pool's certificate");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    for needle in ["\"dc-b\"", "may not publish pool e2e/dc-a"] {
        assert!(
            status.message().contains(needle),
            "{needle:?} not in {status:?}"
        );
    }
    let status = RawStream::open(
        mtls_channel(indexer.addr, &query_tls).await,
        attach("dc-a", 9, format()),
    )
    .await
    .expect_err("a certificate of no producer");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains("map to no configured principal"),
        "{status:?}"
    );
    // The same certificate for its own pool is granted.
    RawStream::open(
        mtls_channel(indexer.addr, &b_tls).await,
        attach("dc-b", 9, format()),
    )
    .await
    .expect("dc-b's certificate may publish dc-b");

    let after = query
        .list_lanes(v1::ListLanesRequest {})
        .await
        .expect("ListLanes")
        .into_inner()
        .lanes[0]
        .clone();
    assert!(is_active(&after), "{after:?}");
    assert_eq!(
        (after.lease_epoch, after.incarnation, after.retirements),
        (lane.lease_epoch, lane.incarnation, 0),
        "{lane:?} -> {after:?}"
    );
}
