//! Real `ckf-indexer` and `ckf-producer` processes for one test: TOML configs and logs in the
//! test's own temp dir, loopback ports the services bind themselves (port 0, read back from their
//! JSON "serving"/"started" log record, so no port is guessed; a restarted indexer gets the same
//! ports again), and the gRPC calls the tests make against them.
//!
//! Every test uses one small table format ([`format()`]: 1,024 buckets, seed 7) so content checks
//! stay cheap, and one domain ([`DOMAIN`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use ckf_core::addressing::TableFormat;
use ckf_proto::v1::{self, ingest_client::IngestClient, kv_event::Kind, query_client::QueryClient};
use tempfile::TempDir;
use tonic::transport::{Channel, Endpoint};

use crate::model::DcModel;
use crate::wait::{DEADLINE, eventually};
use crate::{Service, binary, metrics};

/// Indexer domain of every test.
pub const DOMAIN: &str = "e2e";
/// Buckets of the test table format (4,096 slots).
pub const BUCKETS: u64 = 1024;
/// Addressing seed of the test table format.
pub const SEED: u64 = 7;

/// The table format every test service uses.
pub fn format() -> TableFormat {
    TableFormat::new(BUCKETS, SEED).expect("valid test format")
}

/// The test's temp dir (configs and logs). When the test panics, every `*.log` in it is printed
/// to stderr and the dir is kept for inspection.
pub struct TestDir {
    dir: Option<TempDir>,
}

impl TestDir {
    /// A fresh temp dir named after the test.
    ///
    /// # Panics
    /// When no temp dir can be created.
    pub fn new(test: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix(&format!("ckf-e2e-{test}-"))
            .tempdir()
            .expect("create temp dir");
        Self { dir: Some(dir) }
    }

    /// The dir's path.
    pub fn path(&self) -> &Path {
        self.dir.as_ref().expect("dir is held until drop").path()
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let Some(dir) = self.dir.take() else { return };
        let path = dir.keep();
        let mut logs: Vec<PathBuf> = std::fs::read_dir(&path)
            .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        logs.retain(|p| p.extension().is_some_and(|e| e == "log"));
        logs.sort();
        for log in logs {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            eprintln!("===== {} =====\n{text}", log.display());
        }
        eprintln!("(test dir kept: {})", path.display());
    }
}

/// A gRPC channel to `addr` (connected now; fails fast when nothing listens), with the HTTP/2
/// windows of every client the services build (`ckf_svc_kit::transport::http2`).
///
/// # Errors
/// The transport error, as text.
pub async fn channel(addr: SocketAddr) -> Result<Channel, String> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}")).map_err(|e| e.to_string())?;
    ckf_svc_kit::transport::http2::endpoint(endpoint)
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .map_err(|e| format!("connect {addr}: {e}"))
}

/// One reused gRPC connection to a service; forgotten after a failed call (or a kill) so the
/// next call connects afresh.
#[derive(Debug)]
struct ChannelCache {
    addr: SocketAddr,
    cached: std::sync::Mutex<Option<Channel>>,
}

impl ChannelCache {
    fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            cached: std::sync::Mutex::new(None),
        }
    }

    async fn get(&self) -> Result<Channel, String> {
        let cached = self.cached.lock().expect("channel cache").clone();
        if let Some(channel) = cached {
            return Ok(channel);
        }
        let fresh = channel(self.addr).await?;
        *self.cached.lock().expect("channel cache") = Some(fresh.clone());
        Ok(fresh)
    }

    fn forget(&self) {
        *self.cached.lock().expect("channel cache") = None;
    }

    /// Forgets the channel when `result` is an error, then passes it on.
    fn check<T>(&self, result: Result<T, tonic::Status>) -> Result<T, tonic::Status> {
        if result.is_err() {
            self.forget();
        }
        result
    }
}

/// The socket address in field `field` of a JSON log record.
///
/// # Panics
/// When the field is missing or not an address.
fn record_addr(record: &serde_json::Value, field: &str) -> SocketAddr {
    record[field]
        .as_str()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("log record without {field}: {record}"))
}

/// How to configure a test indexer.
#[derive(Debug, Clone)]
pub struct IndexerSpec {
    /// DC ids, lane `i` = `lanes[i]`.
    pub lanes: Vec<String>,
    /// `lag.heartbeat_deadline_ms`.
    pub heartbeat_deadline_ms: u64,
    /// `limits.max_message_bytes`.
    pub max_message_bytes: u64,
    /// `limits.max_images_per_delta`.
    pub max_images_per_delta: u32,
    /// Top-level `block_size` (tokens per KV block of token queries); `None`: the default.
    pub block_size: Option<u32>,
    /// TOML inserted after the top-level keys, before `[manifest]`: top-level keys first, then
    /// whole sections of its own (e.g. `query_listen = ...` and `[auth]`).
    pub extra_toml: String,
    /// `lag.drain_grace_ms`.
    pub drain_grace_ms: u64,
    /// Lines appended to the `[limits]` section (e.g. `max_query_batch = 16`).
    pub extra_limits: String,
}

impl Default for IndexerSpec {
    /// Lanes `dc-a`, `dc-b`; a 5 s heartbeat deadline; 64 KiB messages; 30 s drain grace.
    fn default() -> Self {
        Self {
            lanes: vec!["dc-a".into(), "dc-b".into()],
            heartbeat_deadline_ms: 5_000,
            drain_grace_ms: 30_000,
            max_message_bytes: 64 << 10,
            max_images_per_delta: 65_536,
            block_size: None,
            extra_toml: String::new(),
            extra_limits: String::new(),
        }
    }
}

/// A `ckf-indexer` process.
pub struct Indexer {
    svc: Option<Service>,
    /// gRPC address (Relay, Query, health).
    pub addr: SocketAddr,
    /// Query address: `query_listen`'s when configured, else `addr`.
    pub query_addr: SocketAddr,
    /// Bearer token sent with the Query calls of these helpers (`auth.query_token_file`).
    pub query_token: Option<String>,
    /// `/metrics` address.
    pub metrics_addr: SocketAddr,
    /// Lane order of the manifest.
    pub lanes: Vec<String>,
    /// Process name (config `<name>.toml`, log `<name>.log`).
    pub name: String,
    config: PathBuf,
    log_dir: PathBuf,
    grpc: ChannelCache,
}

impl Indexer {
    /// Writes the config into `dir` and starts the indexer (named `indexer`) on ports it picks
    /// itself; returns once it has logged the addresses it bound.
    ///
    /// # Panics
    /// When it exits or does not start within the deadline.
    pub fn start(dir: &TestDir, spec: &IndexerSpec) -> Self {
        Self::start_named(dir, "indexer", spec)
    }

    /// As [`Indexer::start`], with config `<name>.toml` and log `<name>.log` (several indexers
    /// in one test).
    ///
    /// # Panics
    /// When it exits or does not start within the deadline.
    pub fn start_named(dir: &TestDir, name: &str, spec: &IndexerSpec) -> Self {
        let lanes = toml_strings(&spec.lanes);
        // Port 0: the indexer binds free ports and logs them ("ckf-indexer serving").
        let toml = format!(
            "listen = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:0\"\nlog_format = \"json\"\n{}{}\n\
             [manifest]\ndomain = \"{DOMAIN}\"\nlanes = [{lanes}]\n\
             [table]\nbucket_count = {BUCKETS}\nseed = {SEED}\n\
             [lag]\nheartbeat_deadline_ms = {}\ndirty_to_applied_deadline_ms = 30000\n\
             drain_grace_ms = {}\n\
             [limits]\nmax_message_bytes = {}\nmax_images_per_delta = {}\n{}",
            block_size_line(spec.block_size),
            spec.extra_toml,
            spec.heartbeat_deadline_ms,
            spec.drain_grace_ms,
            spec.max_message_bytes,
            spec.max_images_per_delta,
            spec.extra_limits
        );
        let config = dir.path().join(format!("{name}.toml"));
        std::fs::write(&config, toml).expect("write indexer config");
        let (svc, addr, metrics_addr, query_addr) = spawn_indexer(name, &config, dir.path(), None);
        Self {
            svc: Some(svc),
            addr,
            query_addr,
            query_token: None,
            metrics_addr,
            lanes: spec.lanes.clone(),
            config,
            name: name.into(),
            log_dir: dir.path().to_owned(),
            grpc: ChannelCache::new(query_addr),
        }
    }

    /// `request` with the helpers' bearer token, if any.
    fn query_request<T>(&self, request: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(request);
        if let Some(token) = &self.query_token {
            let value = format!("Bearer {token}").parse().expect("a header value");
            request.metadata_mut().insert("authorization", value);
        }
        request
    }

    /// SIGKILL (no shutdown path runs).
    pub fn kill9(&mut self) {
        if let Some(mut svc) = self.svc.take() {
            svc.kill9();
        }
        self.grpc.forget();
    }

    /// Sends a signal to the process (e.g. `libc::SIGHUP`).
    pub fn signal(&self, signal: i32) {
        if let Some(svc) = &self.svc {
            svc.signal(signal);
        }
    }

    /// SIGTERM and wait for the exit (bounded).
    ///
    /// # Panics
    /// When the process does not exit within the deadline.
    pub fn terminate(&mut self) -> ExitStatus {
        let mut svc = self.svc.take().expect("indexer is running");
        self.grpc.forget();
        svc.terminate(DEADLINE)
            .unwrap_or_else(|e| panic!("SIGTERM {}: {e}", self.name))
    }

    /// Starts the indexer again with the same config and ports (killing it first if it runs).
    pub fn restart(&mut self) {
        self.kill9();
        let query = (self.query_addr != self.addr).then_some(self.query_addr);
        let ports = Some((self.addr, self.metrics_addr, query));
        let (svc, addr, metrics_addr, query_addr) =
            spawn_indexer(&self.name, &self.config, &self.log_dir, ports);
        assert_eq!(
            (addr, metrics_addr, query_addr),
            (self.addr, self.metrics_addr, self.query_addr)
        );
        self.svc = Some(svc);
    }

    /// The Relay endpoint producers are configured with.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The lane index of `dc`.
    ///
    /// # Panics
    /// When `dc` is not a lane.
    pub fn lane_index(&self, dc: &str) -> u32 {
        self.lanes
            .iter()
            .position(|l| l == dc)
            .unwrap_or_else(|| panic!("{dc} is not a lane")) as u32
    }

    /// `ListLanes`.
    ///
    /// # Errors
    /// The transport error or status, as text.
    pub async fn list_lanes(&self) -> Result<v1::ListLanesResponse, String> {
        let mut client = QueryClient::new(self.grpc.get().await?);
        let result = client
            .list_lanes(self.query_request(v1::ListLanesRequest {}))
            .await;
        self.grpc
            .check(result)
            .map(tonic::Response::into_inner)
            .map_err(|s| format!("ListLanes: {s:?}"))
    }

    /// The `ListLanes` entry of `dc`.
    ///
    /// # Errors
    /// As [`Indexer::list_lanes`].
    pub async fn lane(&self, dc: &str) -> Result<v1::LaneInfo, String> {
        let index = self.lane_index(dc);
        let lanes = self.list_lanes().await?;
        lanes
            .lanes
            .into_iter()
            .find(|l| l.lane == index)
            .ok_or_else(|| format!("ListLanes has no lane {index}"))
    }

    /// `FindMatches`.
    ///
    /// # Errors
    /// The transport error or status, as text.
    pub async fn find(&self, hashes: &[u64]) -> Result<v1::FindMatchesResponse, String> {
        let mut client = QueryClient::new(self.grpc.get().await?);
        let request = v1::FindMatchesRequest {
            block_hashes: hashes.to_vec(),
        };
        let result = client.find_matches(self.query_request(request)).await;
        self.grpc
            .check(result)
            .map(tonic::Response::into_inner)
            .map_err(|s| format!("FindMatches: {s:?}"))
    }

    /// `FindMatches` as `dc -> depth` for every lane that answered (was ready at capture).
    ///
    /// # Errors
    /// As [`Indexer::find`], or a match whose lane does not name its pool.
    pub async fn depths(&self, hashes: &[u64]) -> Result<BTreeMap<String, u32>, String> {
        let response = self.find(hashes).await?;
        response
            .matches
            .iter()
            .map(|m| {
                let pool = m.pool.as_ref().ok_or("LaneMatch without a pool")?;
                if pool.domain != DOMAIN {
                    return Err(format!("LaneMatch of domain {:?}", pool.domain));
                }
                Ok((pool.dc.clone(), m.depth))
            })
            .collect()
    }

    /// Polls `ListLanes` until the lane of `dc` satisfies `pred`; returns that lane.
    ///
    /// # Panics
    /// After [`DEADLINE`], naming `what` and the last lane state seen.
    pub async fn wait_lane(
        &self,
        dc: &str,
        what: &str,
        pred: impl Fn(&v1::LaneInfo) -> bool,
    ) -> v1::LaneInfo {
        eventually(&format!("lane {dc}: {what}"), DEADLINE, || async {
            let lane = self.lane(dc).await?;
            if pred(&lane) {
                Ok(lane)
            } else {
                Err(format!("{lane:?}"))
            }
        })
        .await
    }

    /// Its configuration file (a test may rewrite it and reload with SIGHUP).
    pub fn config_path(&self) -> &Path {
        &self.config
    }

    /// The indexer's process id.
    ///
    /// # Panics
    /// When it was killed.
    pub fn pid(&self) -> u32 {
        self.svc.as_ref().expect("indexer running").pid()
    }

    /// The indexer's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_dir.join(format!("{}.log", self.name))).unwrap_or_default()
    }

    /// The indexer's `/metrics` text.
    ///
    /// # Errors
    /// As [`metrics::scrape`].
    pub fn metrics(&self) -> Result<String, String> {
        metrics::scrape(self.metrics_addr)
    }
}

/// Starts `ckf-indexer --config config` (plus `--listen`/`--metrics-listen` when `ports` pins
/// them) and waits for its "serving" record; returns the bound gRPC, metrics and Query
/// addresses.
///
/// # Panics
/// When it exits or does not serve within the deadline (its log is printed by [`TestDir`]).
fn spawn_indexer(
    name: &str,
    config: &Path,
    log_dir: &Path,
    ports: Option<(SocketAddr, SocketAddr, Option<SocketAddr>)>,
) -> (Service, SocketAddr, SocketAddr, SocketAddr) {
    let mut args = vec!["--config".to_owned(), config.display().to_string()];
    if let Some((listen, metrics, query)) = ports {
        args.extend(["--listen".into(), listen.to_string()]);
        args.extend(["--metrics-listen".into(), metrics.to_string()]);
        if let Some(query) = query {
            args.extend(["--query-listen".into(), query.to_string()]);
        }
    }
    let mut svc = Service::spawn(name, &binary("ckf-indexer"), &args, log_dir);
    let record = svc
        .wait_for_record("ckf-indexer serving", DEADLINE)
        .unwrap_or_else(|e| panic!("ckf-indexer: {e}"));
    let addr = record_addr(&record, "grpc_addr");
    let metrics_addr = record_addr(&record, "metrics_addr");
    let query_addr = record
        .get("query_addr")
        .map_or(addr, |_| record_addr(&record, "query_addr"));
    (svc, addr, metrics_addr, query_addr)
}

/// The top-level `block_size = N` line of a config (empty for the default).
fn block_size_line(block_size: Option<u32>) -> String {
    block_size.map_or_else(String::new, |n| format!("block_size = {n}\n"))
}

/// `items` as the inside of a TOML array of strings (`"a", "b"`).
fn toml_strings(items: &[String]) -> String {
    items
        .iter()
        .map(|l| format!("{l:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether a lane is `ACTIVE` (answering queries).
pub fn is_active(lane: &v1::LaneInfo) -> bool {
    lane.state() == v1::LaneState::Active
}

/// How to configure a test producer.
#[derive(Debug, Clone)]
pub struct ProducerSpec {
    /// `pool.dc`.
    pub dc: String,
    /// `publication.heartbeat_interval_ms` (the producer also caps it at a third of the
    /// indexer's deadline).
    pub heartbeat_interval_ms: u64,
    /// `table.bucket_count` (the indexer's is [`BUCKETS`]; another value is a format mismatch).
    pub bucket_count: u64,
    /// `publication.batch_threshold` (dirty buckets).
    pub batch_threshold: u32,
    /// `reconnect.initial_backoff_ms`.
    pub initial_backoff_ms: u64,
    /// `reconnect.max_backoff_ms`.
    pub max_backoff_ms: u64,
    /// Top-level `block_size` (tokens per KV block of engine events); `None`: the default.
    pub block_size: Option<u32>,
    /// Engine publishers, one `--engine` flag each (`worker_id=7,endpoint=tcp://...`).
    pub engines: Vec<String>,
    /// TOML inserted after the top-level keys, before `[pool]`: top-level keys first, then
    /// whole sections of its own (e.g. `indexer_token_file = ...` and `[ingest_auth]`).
    pub extra_toml: String,
    /// Further command-line flags (e.g. `--start-mode if-vacant`), after `--config`.
    pub args: Vec<String>,
}

impl ProducerSpec {
    /// [`ProducerSpec::new`] with `[durability]` on: the journal in `data_dir`, a group-commit
    /// window of `commit_interval_ms`, then `extra` (more `[durability]` keys, e.g.
    /// `min_checkpoint_mib = 1\n`).
    pub fn durable(dc: &str, data_dir: &Path, commit_interval_ms: u64, extra: &str) -> Self {
        Self {
            extra_toml: format!(
                "[durability]\ndata_dir = \"{}\"\ncommit_interval_ms = {commit_interval_ms}\n{extra}",
                data_dir.display()
            ),
            ..Self::new(dc)
        }
    }

    /// A producer of `dc` with quick reconnects (50..=500 ms), 200 ms heartbeats and batches
    /// cut at 64 dirty buckets or 5 ms.
    pub fn new(dc: &str) -> Self {
        Self {
            dc: dc.into(),
            heartbeat_interval_ms: 200,
            bucket_count: BUCKETS,
            batch_threshold: 64,
            initial_backoff_ms: 50,
            max_backoff_ms: 500,
            block_size: None,
            engines: Vec::new(),
            extra_toml: String::new(),
            args: Vec::new(),
        }
    }
}

/// A `ckf-producer` process plus the exact model of what it was told (the test's oracle).
pub struct Producer {
    svc: Option<Service>,
    /// Process name (log file `<name>.log`).
    pub name: String,
    /// The DC it serves.
    pub dc: String,
    /// Ingest gRPC address.
    pub addr: SocketAddr,
    /// `/metrics` address.
    pub metrics_addr: SocketAddr,
    /// The indexer endpoints it publishes to.
    pub indexers: Vec<String>,
    /// Which member owns which blocks, per the events sent and applied.
    pub model: DcModel,
    log: PathBuf,
    log_dir: PathBuf,
    args: Vec<String>,
    next_sequence: u64,
    grpc: ChannelCache,
}

impl Producer {
    /// A producer of `dc` with the default [`ProducerSpec`], named `producer-<x>` for `dc-<x>`
    /// ([`Producer::start`]).
    ///
    /// # Panics
    /// As [`Producer::start`].
    pub fn start_dc(dir: &TestDir, dc: &str, indexers: &[String]) -> Self {
        let name = format!("producer-{}", dc.strip_prefix("dc-").unwrap_or(dc));
        Self::start(dir, &name, &ProducerSpec::new(dc), indexers)
    }

    /// Producers of dc-a and dc-b publishing to `indexers` ([`Producer::start_dc`]).
    ///
    /// # Panics
    /// As [`Producer::start`].
    pub fn start_ab(dir: &TestDir, indexers: &[String]) -> (Self, Self) {
        (
            Self::start_dc(dir, "dc-a", indexers),
            Self::start_dc(dir, "dc-b", indexers),
        )
    }

    /// Writes `<name>.toml` into `dir` and starts the producer on ports it picks itself; returns
    /// once it has logged the addresses it bound.
    ///
    /// # Panics
    /// When it exits or does not start within the deadline.
    pub fn start(dir: &TestDir, name: &str, spec: &ProducerSpec, indexers: &[String]) -> Self {
        let endpoints = toml_strings(indexers);
        let toml = format!(
            "listen = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:0\"\nlog_format = \"json\"\n{}\
             indexers = [{endpoints}]\n{}\n\
             [pool]\ndomain = \"{DOMAIN}\"\ndc = \"{}\"\n\
             [table]\nbucket_count = {}\nseed = {SEED}\n\
             [publication]\nbatch_threshold = {}\nmax_delay_ms = 5\nheartbeat_interval_ms = {}\n\
             [reconnect]\ninitial_backoff_ms = {}\nmax_backoff_ms = {}\nconnect_timeout_ms = 3000\n\
             [shutdown]\ndrain_timeout_ms = 15000\n",
            block_size_line(spec.block_size),
            spec.extra_toml,
            spec.dc,
            spec.bucket_count,
            spec.batch_threshold,
            spec.heartbeat_interval_ms,
            spec.initial_backoff_ms,
            spec.max_backoff_ms,
        );
        let config = dir.path().join(format!("{name}.toml"));
        std::fs::write(&config, toml).expect("write producer config");
        let mut args = vec!["--config".to_owned(), config.display().to_string()];
        for engine in &spec.engines {
            args.extend(["--engine".to_owned(), engine.clone()]);
        }
        args.extend(spec.args.iter().cloned());
        let (svc, addr, metrics_addr) = spawn_producer(name, &args, dir.path());
        Self {
            svc: Some(svc),
            name: name.into(),
            dc: spec.dc.clone(),
            addr,
            metrics_addr,
            indexers: indexers.to_vec(),
            model: DcModel::default(),
            log: dir.path().join(format!("{name}.log")),
            log_dir: dir.path().to_owned(),
            args,
            next_sequence: 1,
            grpc: ChannelCache::new(addr),
        }
    }

    /// Starts the producer again with the same configuration (on new ports), keeping the
    /// model and the source sequence: what a restarted producer that kept its state must
    /// continue from. Kills it first if it runs.
    ///
    /// # Panics
    /// When it exits or does not start within the deadline.
    pub fn restart(&mut self) {
        self.restart_with(&[]);
    }

    /// As [`Producer::restart`], with `extra` flags after the configuration's.
    ///
    /// # Panics
    /// As [`Producer::restart`].
    pub fn restart_with(&mut self, extra: &[&str]) {
        self.kill9();
        let mut args = self.args.clone();
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let (svc, addr, metrics_addr) = spawn_producer(&self.name, &args, &self.log_dir);
        self.svc = Some(svc);
        self.addr = addr;
        self.metrics_addr = metrics_addr;
        self.grpc = ChannelCache::new(addr);
    }

    /// The next batch sequence of the helpers' source `e2e`.
    pub fn next_sequence(&self) -> u64 {
        self.next_sequence
    }

    /// `GetMemberBlocks` of `worker` (dp rank 0): its exact blocks, ascending.
    ///
    /// # Errors
    /// The transport error or status, as text.
    pub async fn member_blocks(&self, worker: u64) -> Result<Vec<u64>, String> {
        let mut client = IngestClient::new(self.grpc.get().await?);
        let result = client
            .get_member_blocks(v1::GetMemberBlocksRequest {
                member: Some(v1::MemberId {
                    worker_id: worker,
                    dp_rank: 0,
                }),
            })
            .await;
        self.grpc
            .check(result)
            .map(|r| r.into_inner().block_hashes)
            .map_err(|s| format!("GetMemberBlocks: {s:?}"))
    }

    /// Sends `batch` through `PublishBatch` as is (any source and sequence), checking nothing.
    ///
    /// # Errors
    /// The transport error or status, as text.
    pub async fn publish_batch(
        &self,
        batch: v1::KvEventBatch,
    ) -> Result<v1::KvEventBatchResult, String> {
        let mut client = IngestClient::new(self.grpc.get().await?);
        let result = client.publish_batch(batch).await;
        self.grpc
            .check(result)
            .map(tonic::Response::into_inner)
            .map_err(|s| format!("PublishBatch: {s:?}"))
    }

    /// `GetStats`.
    ///
    /// # Errors
    /// The transport error or status, as text.
    pub async fn stats(&self) -> Result<v1::ProducerStats, String> {
        let mut client = IngestClient::new(self.grpc.get().await?);
        let result = client.get_stats(v1::GetStatsRequest {}).await;
        self.grpc
            .check(result)
            .map(tonic::Response::into_inner)
            .map_err(|s| format!("GetStats: {s:?}"))
    }

    /// `GetSourceSequence` of `source` (no credentials).
    ///
    /// # Errors
    /// The transport error or status, as text.
    pub async fn source_sequence(&self, source: &str) -> Result<v1::SourceSequence, String> {
        let mut client = IngestClient::new(self.grpc.get().await?);
        let result = client
            .get_source_sequence(v1::GetSourceSequenceRequest {
                source_id: source.to_owned(),
            })
            .await;
        self.grpc
            .check(result)
            .map(tonic::Response::into_inner)
            .map_err(|s| format!("GetSourceSequence: {s:?}"))
    }

    /// Sends one batch through `PublishBatch` (source `e2e`, next sequence) and checks that
    /// every event was applied with no gap, no replay and no omission.
    ///
    /// # Panics
    /// When the call fails or any event is not fully applied.
    pub async fn publish(&mut self, events: Vec<v1::KvEvent>) -> v1::KvEventBatchResult {
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        let count = events.len();
        let mut client = IngestClient::new(self.grpc.get().await.expect("ingest channel"));
        let batch = v1::KvEventBatch {
            source_id: "e2e".into(),
            sequence,
            events,
        };
        let result = client.publish_batch(batch).await;
        let result = self
            .grpc
            .check(result)
            .unwrap_or_else(|s| panic!("PublishBatch to {}: {s:?}", self.name))
            .into_inner();
        assert_eq!(result.sequence, sequence, "{result:?}");
        assert!(result.gap.is_none() && !result.duplicate, "{result:?}");
        assert_eq!(result.events.len(), count, "{result:?}");
        for event in &result.events {
            assert_eq!(event.status(), v1::EventStatus::Applied, "{result:?}");
            assert_eq!(event.omitted_blocks, 0, "{result:?}");
        }
        result
    }

    /// `worker` (dp rank 0) now caches `hashes`.
    pub async fn store(&mut self, worker: u64, hashes: &[u64]) {
        let kind = Kind::Stored(v1::Stored {
            block_hashes: hashes.to_vec(),
            parent_hash: None,
        });
        self.publish(vec![event(worker, kind)]).await;
        self.model.store(worker, hashes);
    }

    /// `worker` evicted `hashes`.
    pub async fn remove(&mut self, worker: u64, hashes: &[u64]) {
        let kind = Kind::Removed(v1::Removed {
            block_hashes: hashes.to_vec(),
        });
        self.publish(vec![event(worker, kind)]).await;
        self.model.remove(worker, hashes);
    }

    /// `worker` dropped every block.
    pub async fn clear(&mut self, worker: u64) {
        self.publish(vec![event(worker, Kind::Cleared(v1::Cleared {}))])
            .await;
        self.model.clear(worker);
    }

    /// The producer's `/metrics` text.
    ///
    /// # Errors
    /// As [`metrics::scrape`].
    pub fn metrics(&self) -> Result<String, String> {
        metrics::scrape(self.metrics_addr)
    }

    /// The producer's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The JSON log records whose `message` contains `needle` (the producer logs with
    /// `log_format = "json"`, one object per line).
    pub fn log_records(&self, needle: &str) -> Vec<serde_json::Value> {
        self.log()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|r| {
                r.get("message")
                    .and_then(serde_json::Value::as_str)
                    .is_some_and(|m| m.contains(needle))
            })
            .collect()
    }

    /// The process id (0 once it was stopped).
    pub fn pid(&self) -> u32 {
        self.svc.as_ref().map_or(0, Service::pid)
    }

    /// Sends a signal to the process (e.g. `libc::SIGSTOP`).
    pub fn signal(&self, signal: i32) {
        if let Some(svc) = &self.svc {
            svc.signal(signal);
        }
    }

    /// SIGKILL.
    pub fn kill9(&mut self) {
        if let Some(mut svc) = self.svc.take() {
            svc.kill9();
        }
    }

    /// SIGTERM and wait for the exit (bounded).
    ///
    /// # Panics
    /// When the process does not exit within the deadline.
    pub fn terminate(&mut self) -> ExitStatus {
        let mut svc = self.svc.take().expect("producer is running");
        svc.terminate(DEADLINE)
            .unwrap_or_else(|e| panic!("SIGTERM {}: {e}", self.name))
    }
}

/// Spawns `ckf-producer` with `args` and waits for its "producer started" record: the
/// process and the ingest and metrics addresses it bound.
fn spawn_producer(
    name: &str,
    args: &[String],
    log_dir: &Path,
) -> (Service, SocketAddr, SocketAddr) {
    let mut svc = Service::spawn(name, &binary("ckf-producer"), args, log_dir);
    // Port 0: the producer binds free ports and logs them ("producer started").
    let record = svc
        .wait_for_record("producer started", DEADLINE)
        .unwrap_or_else(|e| panic!("ckf-producer: {e}"));
    let addr = record_addr(&record, "ingest_addr");
    let metrics_addr = record_addr(&record, "metrics_addr");
    (svc, addr, metrics_addr)
}

/// One event of `worker` (dp rank 0).
pub fn event(worker: u64, kind: Kind) -> v1::KvEvent {
    rank_event(worker, 0, kind)
}

/// One event of `worker`'s dp rank `dp_rank`.
pub fn rank_event(worker: u64, dp_rank: u32, kind: Kind) -> v1::KvEvent {
    v1::KvEvent {
        member: Some(v1::MemberId {
            worker_id: worker,
            dp_rank,
        }),
        kind: Some(kind),
    }
}

/// A store of `hashes` starting a chain (no parent).
pub fn stored(hashes: &[u64]) -> Kind {
    Kind::Stored(v1::Stored {
        block_hashes: hashes.to_vec(),
        parent_hash: None,
    })
}

/// A removal of `hashes`.
pub fn removed(hashes: &[u64]) -> Kind {
    Kind::Removed(v1::Removed {
        block_hashes: hashes.to_vec(),
    })
}

/// Batch `sequence` of `source`.
pub fn batch(source: &str, sequence: u64, events: Vec<v1::KvEvent>) -> v1::KvEventBatch {
    v1::KvEventBatch {
        source_id: source.into(),
        sequence,
        events,
    }
}
