//! The command line of `ckf-producer` ([`Cli`]) and the layers it loads the configuration from:
//! defaults < TOML file (`--config`) < `CKF_PRODUCER_...` environment < flags. The sections
//! themselves and their validation are [`crate::config`]'s.

use std::net::SocketAddr;
use std::path::PathBuf;

use ckf_svc_kit::LogFormat;
use ckf_svc_kit::config::{ConfigError, Layers, Overrides};
use ckf_svc_kit::tls::ServerTlsFlags;
use ckf_svc_kit::transport::TransportFlags;
use clap::Parser;

use crate::config::{ENV_PREFIX, OnInvalidState, ProducerConfig, StartMode};
use crate::engines::config::EngineSpec;

/// Command line of `ckf-producer`. Every flag overrides the same key of the TOML file and the
/// environment; unset flags leave lower layers alone.
#[derive(Debug, Clone, Default, Parser)]
#[command(
    name = "ckf-producer",
    version,
    about = "One DC pool's cuckoo-filter producer: ingests KV events over gRPC (ckf.v1.Ingest) \
             and publishes lease-tagged snapshots, deltas and drain markers to indexers \
             (ckf.v1.Relay).",
    after_help = "Layers: defaults < TOML file (--config) < environment CKF_PRODUCER_<SECTION>__<KEY> \
                  (e.g. CKF_PRODUCER_POOL__DC=dc-a, CKF_PRODUCER_INDEXERS='[\"http://h:7400\"]') \
                  < flags. \
                  Log filter: RUST_LOG (default info,zeromq=error: the ZMQ library's \
                  reconnection warnings are hidden)."
)]
pub struct Cli {
    /// TOML configuration file (see deploy/producer.example.toml).
    #[arg(long, value_name = "FILE", env = "CKF_PRODUCER_CONFIG")]
    pub config: Option<PathBuf>,
    /// pool.domain: indexer domain name [default: default].
    #[arg(long, value_name = "NAME")]
    pub domain: Option<String>,
    /// pool.dc: this DC's id within the domain [required; no default].
    #[arg(long, value_name = "NAME")]
    pub dc: Option<String>,
    /// table.expected_blocks: expected unique blocks, sizes the table at 92% load [default: 1000000].
    #[arg(long, value_name = "BLOCKS")]
    pub expected_blocks: Option<u64>,
    /// table.bucket_count: explicit bucket count, even, 2..=4294967294; 0 = from expected blocks [default: 0].
    #[arg(long, value_name = "BUCKETS")]
    pub bucket_count: Option<u64>,
    /// table.seed: addressing seed, must equal the indexer's [default: 0].
    #[arg(long, value_name = "U64")]
    pub seed: Option<u64>,
    /// table.max_kicks: relocation bound per insertion, in kicks [default: ckf-core's, 500].
    #[arg(long, value_name = "KICKS")]
    pub max_kicks: Option<u32>,
    /// table.reserve_blocks: size the exact block map for this many blocks at start (0 = none), no growth pause below it; at most the table's slots [default: 0].
    #[arg(long, value_name = "BLOCKS")]
    pub reserve_blocks: Option<u64>,
    /// publication.batch_threshold: cut a batch at this many dirty buckets [default: 256].
    #[arg(long, value_name = "BUCKETS")]
    pub batch_threshold: Option<u32>,
    /// publication.max_delay_ms: cut a batch at most this long after the first change, ms [default: 10].
    #[arg(long, value_name = "MS")]
    pub max_delay_ms: Option<u64>,
    /// publication.cut_when_idle: cut a batch as soon as no command is queued (true), or only at the threshold or the max delay (false) [default: true].
    #[arg(long, value_name = "BOOL")]
    pub cut_when_idle: Option<bool>,
    /// publication.heartbeat_interval_ms: heartbeat after this long idle, ms [default: 1000].
    #[arg(long, value_name = "MS")]
    pub heartbeat_interval_ms: Option<u64>,
    /// publication.attachment_queue: batches queued per indexer before it is re-attached [default: 1024].
    #[arg(long, value_name = "BATCHES")]
    pub attachment_queue: Option<u32>,
    /// indexers: an indexer Relay endpoint, http://host:port; repeat for several [required; no default].
    #[arg(long = "indexer", value_name = "URL")]
    pub indexers: Vec<String>,
    /// indexer_token_file: file holding the bearer token sent to the indexers (one line) [default: none].
    #[arg(long, value_name = "FILE")]
    pub indexer_token_file: Option<PathBuf>,
    /// reconnect.initial_backoff_ms: first reconnect delay, ms [default: 100].
    #[arg(long, value_name = "MS")]
    pub initial_backoff_ms: Option<u64>,
    /// reconnect.max_backoff_ms: largest reconnect delay, ms [default: 5000].
    #[arg(long, value_name = "MS")]
    pub max_backoff_ms: Option<u64>,
    /// reconnect.connect_timeout_ms: connect + lease grant timeout, ms [default: 5000].
    #[arg(long, value_name = "MS")]
    pub connect_timeout_ms: Option<u64>,
    /// limits.ingest_channel_capacity: ingest commands queued for the state actor [default: 1024].
    #[arg(long, value_name = "COMMANDS")]
    pub ingest_channel_capacity: Option<u32>,
    /// limits.max_message_bytes: largest gRPC message, bytes [default: 4194304].
    #[arg(long, value_name = "BYTES")]
    pub max_message_bytes: Option<u64>,
    /// limits.max_events_per_batch: largest ingest batch, events [default: 65536].
    #[arg(long, value_name = "EVENTS")]
    pub max_events_per_batch: Option<u32>,
    /// limits.max_tracked_sources: sources whose batch sequence is remembered; least recently used forgotten first; 1..=16777216 [default: 65536].
    #[arg(long, value_name = "SOURCES")]
    pub max_tracked_sources: Option<u32>,
    /// quotas.max_blocks_per_event: most block hashes in one event, larger refused; 0 = unlimited [default: 16384].
    #[arg(long, value_name = "BLOCKS")]
    pub max_blocks_per_event: Option<u32>,
    /// quotas.max_blocks_per_batch: most block hashes in one batch, larger refused; 0 = unlimited [default: 65536].
    #[arg(long, value_name = "BLOCKS")]
    pub max_blocks_per_batch: Option<u64>,
    /// quotas.max_blocks_per_member: most blocks one member may own; 0 = unlimited [default: 0].
    #[arg(long, value_name = "BLOCKS")]
    pub max_blocks_per_member: Option<u32>,
    /// quotas.max_blocks_per_source: most blocks one ingest source may hold; 0 = unlimited [default: 0].
    #[arg(long, value_name = "BLOCKS")]
    pub max_blocks_per_source: Option<u64>,
    /// quotas.max_ranks_per_worker: most dp ranks of one worker owning blocks; 0 = unlimited [default: 1024].
    #[arg(long, value_name = "RANKS")]
    pub max_ranks_per_worker: Option<u32>,
    /// shutdown.drain_timeout_ms: wait for drained acks on shutdown, ms [default: 5000].
    #[arg(long, value_name = "MS")]
    pub drain_timeout_ms: Option<u64>,
    /// `[transport]` flags.
    #[command(flatten)]
    pub transport: TransportFlags,
    /// listen: ingest gRPC address [default: 127.0.0.1:7500].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// metrics_listen: Prometheus /metrics address [default: 127.0.0.1:9500].
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// log_format: human or json [default: human].
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<LogFormat>,
    /// worker_threads: tokio worker threads, 0..=1024; 0 = one per CPU [default: 0].
    #[arg(long, value_name = "THREADS")]
    pub worker_threads: Option<u32>,
    /// block_size: tokens per KV block, as the engines and the indexer use [default: 16].
    #[arg(long, value_name = "TOKENS", env = "CKF_BLOCK_SIZE")]
    pub block_size: Option<u32>,
    /// engine.media: storage media whose blocks enter the filter, comma-separated [default: ["GPU"]].
    #[arg(long = "engine-media", value_name = "MEDIUM", value_delimiter = ',')]
    pub engine_media: Vec<String>,
    /// engine.main_group: the KV-cache group whose blocks enter the filter [default: 0].
    #[arg(long = "engine-main-group", value_name = "GROUP")]
    pub engine_main_group: Option<u32>,
    /// engine.replay_timeout_ms: how long a replay may go without a reply before it fails (the publisher's members are then cleared), ms [default: 2000].
    #[arg(long, value_name = "MS")]
    pub replay_timeout_ms: Option<u64>,
    /// engine.verify_idle_ms: a publisher silent this long has its last applied batch verified again through its replay socket (0: never), ms [default: 10000].
    #[arg(long, value_name = "MS")]
    pub verify_idle_ms: Option<u64>,
    /// engine.max_frame_bytes: engine frames above this are dropped and counted, bytes [default: 67108864].
    #[arg(long, value_name = "BYTES")]
    pub max_frame_bytes: Option<u64>,
    /// engine.max_buffered_batches: live batches buffered while a replay runs [default: 10000].
    #[arg(long, value_name = "BATCHES")]
    pub max_buffered_batches: Option<u32>,
    /// engine.load_interval_ms: how often each engine's metrics_url is scraped for its load, ms [default: 1000].
    #[arg(long, value_name = "MS")]
    pub load_interval_ms: Option<u64>,
    /// engine.load_timeout_ms: how long one load scrape may take before that engine's load is unknown, ms [default: 500].
    #[arg(long, value_name = "MS")]
    pub load_timeout_ms: Option<u64>,
    /// engine.pushed_load_ttl_ms: how long a load pushed through Ingest/ReportLoad stays known after its observation (at least engine.load_interval_ms), ms [default: 3000].
    #[arg(long, value_name = "MS")]
    pub pushed_load_ttl_ms: Option<u64>,
    /// engine.max_pushed_workers: workers not configured as engines that may push their load at once; a new one past it is refused with RESOURCE_EXHAUSTED (0: only configured engines may push) [default: 1024].
    #[arg(long, value_name = "WORKERS")]
    pub max_pushed_workers: Option<u32>,
    /// engines: one engine publisher, worker_id=N,endpoint=tcp://host:port, optionally followed by ,replay_endpoint=tcp://host:port ,dp_size=N ,topic=T ,format=auto ,mode=connect|bind ,metrics_url=http://host:port/metrics ,family=vllm|sglang ,prefill_tokens_per_s=N; repeat for several; CKF_ENGINES takes the same specs separated by ';' [default: []].
    #[arg(
        long = "engine",
        value_name = "SPEC",
        env = "CKF_ENGINES",
        value_delimiter = ';'
    )]
    pub engines: Vec<EngineSpec>,
    /// TLS of the Ingest listener.
    #[command(flatten)]
    pub tls: ServerTlsFlags,
    /// indexer_tls.ca_file: CA bundle (PEM) the indexers' certificates are verified against; required for https:// endpoints [default: none].
    #[arg(long, value_name = "FILE")]
    pub indexer_ca: Option<PathBuf>,
    /// indexer_tls.cert_file: client certificate (PEM) presented to the indexers (mutual TLS) [default: none].
    #[arg(long, value_name = "FILE")]
    pub indexer_cert: Option<PathBuf>,
    /// indexer_tls.key_file: private key (PEM) of --indexer-cert [default: none].
    #[arg(long, value_name = "FILE")]
    pub indexer_key: Option<PathBuf>,
    /// indexer_tls.server_name: name checked in the indexers' certificates instead of the URL host [default: none].
    #[arg(long, value_name = "NAME")]
    pub indexer_server_name: Option<String>,
    /// publication.start_mode: takeover (a new producer fences the pool's holder) or if-vacant (hot standby: take the lane only while no other producer holds it) [default: takeover].
    #[arg(long, value_name = "MODE")]
    pub start_mode: Option<StartMode>,
    /// durability.data_dir: keep the exact state in this directory so a restart recovers it; without it the state lives in memory only [default: none].
    #[arg(long, value_name = "DIR", env = "CKF_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// durability.commit_interval_ms: group-commit (fdatasync) window, what a power loss can lose, ms [default: 50].
    #[arg(long, value_name = "MS")]
    pub commit_interval_ms: Option<u64>,
    /// durability.on_invalid_state: refuse to start on damaged or foreign state, or set it aside and start empty [default: refuse].
    #[arg(long, value_name = "WHAT")]
    pub on_invalid_state: Option<OnInvalidState>,
    /// durability.min_checkpoint_mib: checkpoint once the log since the last one exceeds this and the last checkpoint, MiB [default: 64].
    #[arg(long, value_name = "MIB")]
    pub min_checkpoint_mib: Option<u64>,
    /// durability.checkpoint_retry_ms: while the journal is failed (disk full), retry a checkpoint this often, ms [default: 10000].
    #[arg(long, value_name = "MS")]
    pub checkpoint_retry_ms: Option<u64>,
}

impl Cli {
    /// The flags that were given, keyed by dotted config paths.
    pub fn overrides(&self) -> Overrides {
        let overrides = Overrides::new()
            .set("pool.domain", self.domain.as_ref())
            .set("pool.dc", self.dc.as_ref())
            .set("table.expected_blocks", self.expected_blocks)
            .set("table.bucket_count", self.bucket_count)
            .set("table.seed", self.seed)
            .set("table.max_kicks", self.max_kicks)
            .set("table.reserve_blocks", self.reserve_blocks)
            .set("publication.batch_threshold", self.batch_threshold)
            .set("publication.max_delay_ms", self.max_delay_ms)
            .set("publication.cut_when_idle", self.cut_when_idle)
            .set(
                "publication.heartbeat_interval_ms",
                self.heartbeat_interval_ms,
            )
            .set("publication.attachment_queue", self.attachment_queue)
            .set("indexer_token_file", self.indexer_token_file.clone())
            .set("reconnect.initial_backoff_ms", self.initial_backoff_ms)
            .set("reconnect.max_backoff_ms", self.max_backoff_ms)
            .set("reconnect.connect_timeout_ms", self.connect_timeout_ms)
            .set(
                "limits.ingest_channel_capacity",
                self.ingest_channel_capacity,
            )
            .set("limits.max_message_bytes", self.max_message_bytes)
            .set("limits.max_events_per_batch", self.max_events_per_batch)
            .set("limits.max_tracked_sources", self.max_tracked_sources)
            .set("quotas.max_blocks_per_event", self.max_blocks_per_event)
            .set("quotas.max_blocks_per_batch", self.max_blocks_per_batch)
            .set("quotas.max_blocks_per_member", self.max_blocks_per_member)
            .set("quotas.max_blocks_per_source", self.max_blocks_per_source)
            .set("quotas.max_ranks_per_worker", self.max_ranks_per_worker)
            .set("shutdown.drain_timeout_ms", self.drain_timeout_ms)
            .set("listen", self.listen.map(|a| a.to_string()))
            .set("metrics_listen", self.metrics_listen.map(|a| a.to_string()))
            .set("log_format", self.log_format)
            .set("worker_threads", self.worker_threads)
            .set(
                "indexers",
                (!self.indexers.is_empty()).then_some(&self.indexers),
            )
            .set("block_size", self.block_size)
            .set(
                "engine.media",
                (!self.engine_media.is_empty()).then_some(&self.engine_media),
            )
            .set("engine.main_group", self.engine_main_group)
            .set("engine.replay_timeout_ms", self.replay_timeout_ms)
            .set("engine.verify_idle_ms", self.verify_idle_ms)
            .set("engine.max_frame_bytes", self.max_frame_bytes)
            .set("engine.max_buffered_batches", self.max_buffered_batches)
            .set("engine.load_interval_ms", self.load_interval_ms)
            .set("engine.load_timeout_ms", self.load_timeout_ms)
            .set("engine.pushed_load_ttl_ms", self.pushed_load_ttl_ms)
            .set("engine.max_pushed_workers", self.max_pushed_workers)
            .set(
                "engines",
                (!self.engines.is_empty()).then_some(&self.engines),
            );
        let overrides = self.transport.overrides(overrides);
        self.tls
            .overrides(overrides)
            .set("indexer_tls.ca_file", self.indexer_ca.as_ref())
            .set("indexer_tls.cert_file", self.indexer_cert.as_ref())
            .set("indexer_tls.key_file", self.indexer_key.as_ref())
            .set("indexer_tls.server_name", self.indexer_server_name.as_ref())
            .set("publication.start_mode", self.start_mode)
            .set("durability.data_dir", self.data_dir.as_ref())
            .set("durability.commit_interval_ms", self.commit_interval_ms)
            .set("durability.on_invalid_state", self.on_invalid_state)
            .set("durability.min_checkpoint_mib", self.min_checkpoint_mib)
            .set("durability.checkpoint_retry_ms", self.checkpoint_retry_ms)
    }

    /// The configuration layers of this command line (environment prefix [`ENV_PREFIX`]).
    pub fn layers(&self) -> Layers {
        Layers {
            env_prefix: ENV_PREFIX,
            file: self.config.clone(),
            overrides: self.overrides(),
            aliases: &[],
        }
    }

    /// Loads the layered configuration: defaults < `--config` TOML < `CKF_PRODUCER_...`
    /// environment (nested keys joined by `__`) < flags, then validates it.
    ///
    /// # Errors
    /// [`ConfigError::Load`] when a layer cannot be read or does not fit the schema;
    /// [`ConfigError::Invalid`] naming the key, value, rule and source of a refused value.
    pub fn load(&self) -> Result<ProducerConfig, ConfigError> {
        self.layers().load()
    }
}
