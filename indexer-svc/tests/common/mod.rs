//! Test harness: an in-process indexer on 127.0.0.1:0 and a producer driven by ckf-core's own
//! producer types (`DcCkfState` + `DcCkfPublisher`) over the generated gRPC client.

#![allow(dead_code, missing_docs)]

use std::time::Duration;

use ckf_core::addressing::TableFormat;
use ckf_core::dc::{DcCkfConfig, DcCkfState, MemberId};
use ckf_core::identity::{LaneLease, PoolId, ProducerIdentity, ProducerIncarnation};
use ckf_core::publication::DcCkfPublisher;
use ckf_proto::convert;
use ckf_proto::v1::{
    self, query_client::QueryClient, relay_client::RelayClient, relay_frame::Frame as WireFrame,
};
pub use ckf_testkit::relay::RawStream;
use indexer_svc::{IndexerConfig, RunningIndexer, serve};
use tonic::transport::Channel;
use tonic::{Code, Status};

pub const DOMAIN: &str = "test";
pub const BUCKETS: u64 = 1024;

/// A small-table configuration with `lanes`, generous deadlines (tests end streams
/// themselves) and a 64 KiB message limit.
pub fn config(lanes: &[&str]) -> IndexerConfig {
    let mut config = IndexerConfig::for_lanes(DOMAIN, lanes);
    config.table.bucket_count = BUCKETS;
    config.lag.heartbeat_deadline_ms = 60_000;
    config.lag.dirty_to_applied_deadline_ms = 60_000;
    config.limits.max_message_bytes = 64 << 10;
    config
}

pub fn format() -> TableFormat {
    TableFormat::new(BUCKETS, 0).unwrap()
}

pub struct Indexer {
    pub running: RunningIndexer,
    pub channel: Channel,
}

impl Indexer {
    pub async fn start(config: IndexerConfig) -> Self {
        let running = serve(config, std::future::pending())
            .await
            .expect("indexer starts");
        Self::connect(running).await
    }

    /// An indexer started from a configuration source (its catalog reloads re-read `cli`).
    pub async fn start_from(cli: indexer_svc::Cli) -> Self {
        let running = indexer_svc::serve_from(cli, std::future::pending())
            .await
            .expect("indexer starts");
        Self::connect(running).await
    }

    async fn connect(running: RunningIndexer) -> Self {
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://{}", running.grpc_addr))
                .unwrap()
                .connect()
                .await
                .expect("connect to indexer");
        Self { running, channel }
    }

    pub fn query(&self) -> QueryClient<Channel> {
        QueryClient::new(self.channel.clone())
    }

    /// A generated Relay client (for streams that never attach).
    pub fn relay(&self) -> RelayClient<Channel> {
        RelayClient::new(self.channel.clone())
    }

    /// `(lane, depth)` per ready lane and the ready mask.
    pub async fn find(&self, hashes: &[u64]) -> (Vec<(u32, u32)>, u64) {
        let response = self
            .query()
            .find_matches(v1::FindMatchesRequest {
                block_hashes: hashes.to_vec(),
            })
            .await
            .expect("FindMatches")
            .into_inner();
        (
            response.matches.iter().map(|m| (m.lane, m.depth)).collect(),
            response.ready_lanes(),
        )
    }

    /// `FindMatchesByTokens`: `(lane, depth)` per ready lane and the ready mask, or the status.
    pub async fn find_by_tokens(
        &self,
        request: v1::FindMatchesByTokensRequest,
    ) -> Result<(Vec<(u32, u32)>, u64), Status> {
        let response = self
            .query()
            .find_matches_by_tokens(request)
            .await?
            .into_inner();
        Ok((
            response.matches.iter().map(|m| (m.lane, m.depth)).collect(),
            response.ready_lanes(),
        ))
    }

    pub async fn lanes(&self) -> v1::ListLanesResponse {
        self.query()
            .list_lanes(v1::ListLanesRequest {})
            .await
            .expect("ListLanes")
            .into_inner()
    }

    pub async fn lane(&self, lane: u32) -> v1::LaneInfo {
        self.lanes().await.lanes.remove(lane as usize)
    }

    /// Polls ListLanes until `lane` satisfies `pred` (bounded wait, not a timing assertion).
    pub async fn wait_lane(&self, lane: u32, pred: impl Fn(&v1::LaneInfo) -> bool) -> v1::LaneInfo {
        for _ in 0..400 {
            let info = self.lane(lane).await;
            if pred(&info) {
                return info;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!(
            "lane {lane} never reached the expected state: {:?}",
            self.lane(lane).await
        );
    }
}

pub fn identity(dc: &str, incarnation: u64, format: TableFormat) -> ProducerIdentity {
    ProducerIdentity {
        pool: PoolId::new(DOMAIN, dc).unwrap(),
        incarnation: ProducerIncarnation(incarnation),
        format,
    }
}

pub fn member(worker: u64) -> MemberId {
    MemberId {
        worker_id: worker,
        dp_rank: 0,
    }
}

/// Deterministic distinct block hashes (a fixed sequence: results never vary between runs).
pub fn hashes(seed: u64, n: usize) -> Vec<u64> {
    (0..n as u64)
        .map(|i| ckf_core::addressing::fmix64(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i + 1)))
        .collect()
}

/// Opens a raw relay stream to `indexer` and sends `attach` ([`RawStream::open`]).
pub async fn open(indexer: &Indexer, attach: v1::Attach) -> Result<RawStream, Status> {
    RawStream::open(indexer.channel.clone(), attach).await
}

/// A delta frame under `a`'s lease (not from its producer state): image 7
/// in each of `buckets`, taking the lane from `base` to `sequence`.
pub fn raw_delta(a: &Producer, base: u64, sequence: u64, buckets: Vec<u32>) -> v1::RelayFrame {
    WireFrame::Delta(v1::Delta {
        lease: a.wire_lease(),
        base_sequence: base,
        sequence,
        images: vec![7; buckets.len()],
        buckets,
        oldest_change_age_ms: 0,
    })
    .into()
}

/// Opens a raw relay stream with `attach` and returns the status it must be refused with.
pub async fn refused(indexer: &Indexer, attach: v1::Attach) -> Status {
    open(indexer, attach).await.expect_err("refused")
}

/// Panics unless `status` has `code` and its message contains every one of `says`.
pub fn assert_status(status: &Status, code: Code, says: &[&str]) {
    assert_eq!(status.code(), code, "{status:?}");
    for needle in says {
        assert!(
            status.message().contains(needle),
            "{needle:?} not in {:?}",
            status.message()
        );
    }
}

/// A producer made of ckf-core's producer types, publishing over one relay stream.
pub struct Producer {
    pub state: DcCkfState,
    pub publisher: DcCkfPublisher,
    pub stream: RawStream,
    pub lease: LaneLease,
    pub granted: v1::LeaseGranted,
}

impl Producer {
    /// Attaches with a fresh state of the test format.
    pub async fn attach(indexer: &Indexer, dc: &str, incarnation: u64) -> Self {
        Self::attach_as(indexer, identity(dc, incarnation, format())).await
    }

    /// Attaches as `identity` (any domain and format) with a fresh state of its format.
    pub async fn attach_as(indexer: &Indexer, identity: ProducerIdentity) -> Self {
        Self::attach_with_token(indexer, identity, None).await
    }

    /// As [`Producer::attach_as`], presenting bearer `token` (an `[[auth.producers]]` one).
    pub async fn attach_with_token(
        indexer: &Indexer,
        identity: ProducerIdentity,
        token: Option<&str>,
    ) -> Self {
        let format = identity.format;
        let stream = RawStream::open_with_token(indexer.channel.clone(), (&identity).into(), token)
            .await
            .expect("attach accepted");
        let granted = stream.granted;
        let lease: LaneLease = stream.lease.try_into().unwrap();
        let mut publisher = DcCkfPublisher::new(identity);
        publisher.install_lease(lease).unwrap();
        Self {
            state: DcCkfState::new(DcCkfConfig::new(format)).unwrap(),
            publisher,
            stream,
            lease,
            granted,
        }
    }

    /// Sends the barrier snapshot in chunks of `chunk_bytes`; returns the activation Ack.
    pub async fn snapshot(&mut self, chunk_bytes: usize) -> v1::Ack {
        // The snapshot copies the whole table, so pending changes are included; the publisher
        // refuses to snapshot while a batch is pending, so drop it here.
        let _ = self.state.take_batch();
        let snapshot = self.publisher.snapshot(&self.state).unwrap();
        for chunk in convert::snapshot_to_wire(&snapshot, chunk_bytes) {
            self.stream.send(WireFrame::SnapshotChunk(chunk)).await;
        }
        self.stream.expect_ack().await
    }

    pub fn store(&mut self, worker: u64, hashes: &[u64]) {
        let outcome = self.state.store(member(worker), hashes);
        assert_eq!(
            outcome.applied as usize,
            hashes.len(),
            "no omission in a roomy table"
        );
    }

    pub fn remove(&mut self, worker: u64, hashes: &[u64]) {
        self.state.remove(member(worker), hashes);
    }

    /// The next delta as a wire frame (not sent).
    pub fn next_delta(&mut self) -> v1::Delta {
        let batch = self.state.take_batch().expect("something changed");
        let delta = self.publisher.delta(&batch).unwrap();
        (&delta).into()
    }

    /// Publishes the pending changes as one delta; returns its Ack.
    pub async fn publish(&mut self) -> v1::Ack {
        let delta = self.next_delta();
        self.stream.send(WireFrame::Delta(delta)).await;
        self.stream.expect_ack().await
    }

    pub async fn drain(&mut self) -> v1::Ack {
        let marker = self.publisher.drain_marker().unwrap();
        self.stream
            .send(WireFrame::DrainMarker((&marker).into()))
            .await;
        self.stream.expect_ack().await
    }

    pub fn wire_lease(&self) -> Option<v1::LaneLease> {
        Some(self.lease.into())
    }
}

/// The body and headers of `GET path` on `addr` (HTTP/1.1, connection closed after).
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}

/// The indexer's `/metrics` page (with the HTTP headers).
pub async fn metrics_text(indexer: &Indexer) -> String {
    http_get(indexer.running.metrics_addr, "/metrics").await
}

/// Polls `/metrics` until it holds every one of `lines` (the counters follow lane events, which
/// their watchers read asynchronously: a bounded wait, not a timing assertion); returns the page.
pub async fn wait_metrics(indexer: &Indexer, lines: &[&str]) -> String {
    let mut metrics = String::new();
    for _ in 0..250 {
        metrics = metrics_text(indexer).await;
        if lines.iter().all(|l| metrics.contains(l)) {
            return metrics;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let missing: Vec<_> = lines.iter().filter(|l| !metrics.contains(*l)).collect();
    panic!("no {missing:?} in\n{metrics}");
}

/// A load report of `a`'s pool: one engine, 3 running, `waiting` waiting, `capacity` tokens/s.
pub fn load_report(a: &Producer, sequence: u64, waiting: u32, capacity: f64) -> WireFrame {
    WireFrame::Load(v1::LoadReport {
        lease: a.wire_lease(),
        sequence,
        age_ms: 0,
        engines_reporting: 1,
        engines_configured: 1,
        running: 3,
        waiting,
        kv_usage: 0.25,
        prefill_tokens_per_s: capacity,
    })
}

/// Waits until `dc` has had `n` load reports kept (bounded wait, not a timing assertion).
pub async fn kept(indexer: &Indexer, dc: &str, n: u32) {
    let line = format!(
        "ckf_indexer_load_reports_total{{dc=\"{dc}\",domain=\"test\",outcome=\"kept\"}} {n}"
    );
    for _ in 0..250 {
        if metrics_text(indexer).await.contains(&line) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{line} never in the metrics");
}

/// A Route answer without its load ages (the only field that moves with the clock alone).
pub fn without_ages(mut r: v1::RouteResponse) -> v1::RouteResponse {
    for dc in &mut r.ranked {
        dc.load_age_ms = 0.0;
    }
    r
}
