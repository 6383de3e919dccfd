//! Configuration of one producer: what it is (pool, table format), where it listens, where it
//! publishes and how often. Only configuration lives here: the command line, the sections
//! and their defaults, and validation that names the key, the value and the rule it broke (the
//! command line and its layering over them are [`crate::cli`]'s). Nothing here starts a task or opens a socket.

pub mod ingest_auth;

pub use ingest_auth::IngestAuthConfig;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ckf_core::addressing::TableFormat;

use crate::engines::config::{EngineSection, EngineSpec, PublisherSpec};
use ckf_core::identity::PoolId;
use ckf_svc_kit::LogFormat;
use ckf_svc_kit::TableConfig;
use ckf_svc_kit::config::{Invalid, Validate, at_least, at_most, in_range};
use ckf_svc_kit::serve::{DEFAULT_WORKER_THREADS, ProcessSettings, validate_worker_threads};
use ckf_svc_kit::tls::{
    ClientTlsConfig, Exposure, Guard, Listener, ServerTlsConfig, check_exposure,
};
use ckf_svc_kit::transport::TransportConfig;
use serde::{Deserialize, Serialize};

/// Default ingest (gRPC) listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7500";
/// Default Prometheus `/metrics` listen address.
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:9500";
/// Prefix of every environment variable read (`CKF_PRODUCER_POOL__DC` sets `pool.dc`).
pub const ENV_PREFIX: &str = "CKF_PRODUCER_";

/// The pool this producer publishes: `(indexer domain, DC id)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolConfig {
    /// Indexer domain name (1..=64 bytes of `[A-Za-z0-9._-]`).
    pub domain: String,
    /// DC id within the domain; required (no default, two producers must never share one).
    pub dc: String,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            domain: "default".into(),
            dc: String::new(),
        }
    }
}

/// When a publication batch is cut and how often idle attachments send heartbeats.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PublicationConfig {
    /// Cut a batch as soon as this many buckets are dirty.
    pub batch_threshold: u32,
    /// Cut a batch at the latest this many milliseconds after the first dirty bucket: the bound
    /// on coalescing under load.
    pub max_delay_ms: u64,
    /// Cut a batch as soon as the state actor has no command queued (Nagle off: an idle
    /// producer publishes a change at once, a busy one coalesces up to `batch_threshold` /
    /// `max_delay_ms`). `false` waits for the threshold or the delay (the cadence before the
    /// idle cut existed: fewer, larger deltas, ~`max_delay_ms` more event-to-visible lag).
    pub cut_when_idle: bool,
    /// Send a heartbeat after this many idle milliseconds (capped at a third of the
    /// indexer's heartbeat deadline).
    pub heartbeat_interval_ms: u64,
    /// Publication batches (queue entries: a batch's deltas, a snapshot, a drain marker) one
    /// attachment may have queued before it is fenced and re-attached. Past half of it the
    /// state actor cuts at most one batch per `ckf_core::cadence::BACKED_UP_INTERVAL`.
    pub attachment_queue: u32,
    /// How the producer attaches when it starts: `takeover` (default: a new producer fences
    /// the pool's current holder) or `if-vacant` (a hot standby: it takes the lane only while
    /// no other producer holds it live, and keeps retrying until then).
    pub start_mode: StartMode,
}

/// `publication.start_mode`: how a freshly started producer attaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum StartMode {
    /// Attach `TAKEOVER`: the newest producer holds the pool (rolling replacement).
    #[default]
    Takeover,
    /// Attach `IF_VACANT`: stand by while another producer holds the pool live (hot standby;
    /// docs/operations.md, "Hot standby").
    IfVacant,
}

impl Default for PublicationConfig {
    fn default() -> Self {
        Self {
            batch_threshold: 256,
            max_delay_ms: 10,
            cut_when_idle: true,
            heartbeat_interval_ms: 1_000,
            attachment_queue: 1_024,
            start_mode: StartMode::Takeover,
        }
    }
}

/// Reconnect backoff of a publisher after a stream failure or retirement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReconnectConfig {
    /// First delay, in milliseconds; doubles on every failed attempt (plus up to 25% jitter).
    pub initial_backoff_ms: u64,
    /// Largest delay, in milliseconds.
    pub max_backoff_ms: u64,
    /// Connect and lease-grant timeout of one attempt, in milliseconds.
    pub connect_timeout_ms: u64,
}

impl Default for ReconnectConfig {
    fn default() -> Self {
        Self {
            initial_backoff_ms: 100,
            max_backoff_ms: 5_000,
            connect_timeout_ms: 5_000,
        }
    }
}

/// Upper bound of `limits.max_tracked_sources` (16,777,216 sources: ~2 GB of sequence state at
/// 128-byte ids), so a typo cannot promise more memory than a producer host has.
pub const MAX_TRACKED_SOURCES_LIMIT: u32 = 1 << 24;

/// Resource limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Ingest commands queued for the state actor before handlers wait (backpressure).
    pub ingest_channel_capacity: u32,
    /// Largest gRPC message this producer accepts or sends, in bytes (outgoing frames also
    /// stay under half of the indexer's granted limit).
    pub max_message_bytes: u64,
    /// Largest number of events in one ingest batch.
    pub max_events_per_batch: u32,
    /// Most event sources whose batch sequence is remembered (gap and replay detection). When
    /// full, the least recently used source is forgotten: its next batch counts as a first
    /// batch, so a replay older than that is no longer detected
    /// (`ckf_core::sources::SourceSequences`). 1..=[`MAX_TRACKED_SOURCES_LIMIT`]; memory
    /// grows with the sources actually seen (about 100 bytes each plus the id), not with this
    /// bound.
    pub max_tracked_sources: u32,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            ingest_channel_capacity: 1_024,
            max_message_bytes: 4 << 20,
            max_events_per_batch: 65_536,
            max_tracked_sources: 65_536,
        }
    }
}

/// Ingest quotas (`[quotas]`, rules in `ckf_core::dc::quota`); `0` = unlimited for each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QuotasConfig {
    /// Most block hashes in one stored or removed event; a batch with a larger event is refused
    /// whole (`RESOURCE_EXHAUSTED`). Bounds one event's work in the state actor.
    pub max_blocks_per_event: u32,
    /// Most block hashes in one batch, all events together; refused whole above it. Bounds how
    /// long one batch holds the state actor, so other clients wait at most that long.
    pub max_blocks_per_batch: u64,
    /// Most blocks one member (worker, dp rank) may own; a stored event that would exceed it
    /// is refused (event status `REFUSED`, code `RESOURCE_EXHAUSTED`).
    pub max_blocks_per_member: u32,
    /// Most blocks one source may hold: the blocks of the members charged to it (a member is
    /// charged to the first source that stores into it, until it owns nothing again).
    pub max_blocks_per_source: u64,
    /// Most dp ranks of one worker owning blocks at once; a stored event of one more rank is
    /// refused (event status `REFUSED`, code `RESOURCE_EXHAUSTED`). Ingest authorization
    /// grants workers, not ranks: this bounds what one granted worker can claim.
    pub max_ranks_per_worker: u32,
}

impl Default for QuotasConfig {
    fn default() -> Self {
        let q = ckf_core::dc::Quotas::default();
        Self {
            max_blocks_per_event: q.max_blocks_per_event,
            max_blocks_per_batch: q.max_blocks_per_batch,
            max_blocks_per_member: q.max_blocks_per_member,
            max_blocks_per_source: q.max_blocks_per_source,
            max_ranks_per_worker: q.max_ranks_per_worker,
        }
    }
}

impl QuotasConfig {
    /// The core's quotas.
    pub fn to_core(&self) -> ckf_core::dc::Quotas {
        ckf_core::dc::Quotas {
            max_blocks_per_event: self.max_blocks_per_event,
            max_blocks_per_batch: self.max_blocks_per_batch,
            max_blocks_per_member: self.max_blocks_per_member,
            max_blocks_per_source: self.max_blocks_per_source,
            max_ranks_per_worker: self.max_ranks_per_worker,
        }
    }

    fn validate(&self) -> Result<(), Invalid> {
        let (event, batch) = (self.max_blocks_per_event, self.max_blocks_per_batch);
        if event > 0 && batch > 0 && u64::from(event) > batch {
            return Err(Invalid::new(
                "quotas.max_blocks_per_event",
                event,
                format!(
                    "must not exceed quotas.max_blocks_per_batch ({batch}): no batch could carry \
                     such an event"
                ),
            ));
        }
        Ok(())
    }
}

/// Graceful-shutdown settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShutdownConfig {
    /// How long to wait for every indexer's drained acknowledgement, in milliseconds.
    pub drain_timeout_ms: u64,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        Self {
            drain_timeout_ms: 5_000,
        }
    }
}

/// What to do with a state directory whose content cannot be used (damaged, another pool's or
/// another table format's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum OnInvalidState {
    /// Refuse to start (exit 2) and name the file and the fault: an operator decides.
    #[default]
    Refuse,
    /// Move the files to `data_dir/invalid-<unix seconds>/`, log it, and start empty.
    SetAside,
}

/// `[durability]`: the exact state on disk (`ckf-journal`), so a restart does not blind the
/// DC. Off (no `data_dir`) the state lives in memory only, as before: a restart starts empty.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DurabilityConfig {
    /// Directory of the journal (created 0700 if absent); `None` = durability off.
    pub data_dir: Option<PathBuf>,
    /// Group-commit (fdatasync) window in milliseconds, `1..=1000`: at most this much of the
    /// newest changes, plus one fdatasync, is lost on power loss (a `kill -9` loses only what
    /// the journal's writer had not taken yet). Default 50.
    pub commit_interval_ms: u64,
    /// A checkpoint is written once the log since the last one exceeds this many MiB and the
    /// last checkpoint's size. Default 64.
    pub min_checkpoint_mib: u64,
    /// What to do with unusable state: `refuse` (default) or `set-aside`.
    pub on_invalid_state: OnInvalidState,
    /// While the journal is failed (disk full, I/O error), a checkpoint is retried this often,
    /// milliseconds, `100..=3_600_000`. Default 10000.
    pub checkpoint_retry_ms: u64,
}

impl Default for DurabilityConfig {
    fn default() -> Self {
        Self {
            data_dir: None,
            commit_interval_ms: ckf_journal::DEFAULT_COMMIT_INTERVAL.as_millis() as u64,
            min_checkpoint_mib: ckf_journal::DEFAULT_MIN_CHECKPOINT_BYTES >> 20,
            on_invalid_state: OnInvalidState::Refuse,
            checkpoint_retry_ms: ckf_journal::DEFAULT_RETRY_INTERVAL.as_millis() as u64,
        }
    }
}

impl DurabilityConfig {
    fn validate(&self) -> Result<(), Invalid> {
        in_range(
            "durability.commit_interval_ms",
            self.commit_interval_ms,
            1..=ckf_journal::MAX_COMMIT_INTERVAL.as_millis() as u64,
            "milliseconds",
        )?;
        in_range(
            "durability.checkpoint_retry_ms",
            self.checkpoint_retry_ms,
            100..=3_600_000,
            "milliseconds",
        )?;
        in_range(
            "durability.min_checkpoint_mib",
            self.min_checkpoint_mib,
            1..=1 << 20,
            "MiB",
        )?;
        if let Some(dir) = &self.data_dir {
            if dir.as_os_str().is_empty() {
                return Err(Invalid::new(
                    "durability.data_dir",
                    "\"\"",
                    "must be a directory path (omit the key to turn durability off)",
                ));
            }
            if dir.exists() && !dir.is_dir() {
                return Err(Invalid::new(
                    "durability.data_dir",
                    dir.display(),
                    "exists and is not a directory",
                ));
            }
        }
        Ok(())
    }

    /// The journal settings these values stand for.
    pub fn journal(&self) -> ckf_journal::JournalConfig {
        ckf_journal::JournalConfig {
            commit_interval: Duration::from_millis(self.commit_interval_ms),
            min_checkpoint_bytes: self.min_checkpoint_mib << 20,
            retry_interval: Duration::from_millis(self.checkpoint_retry_ms),
            ..ckf_journal::JournalConfig::default()
        }
    }
}

/// The whole producer configuration (TOML layout; see `deploy/producer.example.toml`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProducerConfig {
    /// The pool published.
    pub pool: PoolConfig,
    /// Table format (must match the indexer manifest's; `ckf_svc_kit::table`), the mutator's
    /// kick bound (`table.max_kicks`, default [`ckf_core::dc::DEFAULT_MAX_KICKS`]) and the
    /// block map's reservation (`table.reserve_blocks`, default 0: none).
    pub table: TableConfig,
    /// Publication cadence.
    pub publication: PublicationConfig,
    /// Indexer Relay endpoints (`http://host:port`); each is an independent attachment.
    pub indexers: Vec<String>,
    /// Reconnect backoff.
    pub reconnect: ReconnectConfig,
    /// Resource limits.
    pub limits: LimitsConfig,
    /// Ingest quotas.
    pub quotas: QuotasConfig,
    /// Connection and request limits of the ingest listener (`ckf_svc_kit::transport`).
    pub transport: TransportConfig,
    /// Graceful shutdown.
    pub shutdown: ShutdownConfig,
    /// Ingest gRPC listen address (port 0 = ephemeral).
    pub listen: SocketAddr,
    /// Prometheus `/metrics` listen address (port 0 = ephemeral).
    pub metrics_listen: SocketAddr,
    /// Log line format.
    pub log_format: LogFormat,
    /// Tokio worker threads of the `ckf-producer` process, `0..=1024`; 0 = one per CPU
    /// (tokio's default, or `TOKIO_WORKER_THREADS`). A program that calls [`crate::serve`]
    /// itself runs it on its own runtime, and this key is not read.
    pub worker_threads: u32,
    /// Tokens per KV block, the engines' and the indexer's (`--block-size`,
    /// `CKF_BLOCK_SIZE`); a stored event with another block size is refused and counted.
    pub block_size: u32,
    /// Settings shared by every engine publisher.
    pub engine: EngineSection,
    /// Engine publishers subscribed to over ZMQ (`--engine`, `CKF_ENGINES`).
    pub engines: Vec<EngineSpec>,
    /// TLS of the Ingest listener (`ckf_svc_kit::tls`).
    pub tls: ServerTlsConfig,
    /// TLS toward the indexers: trust roots (required for `https://` endpoints), client
    /// certificate, server name.
    pub indexer_tls: ClientTlsConfig,
    /// File holding the bearer token sent to every indexer (`authorization: Bearer`).
    pub indexer_token_file: Option<PathBuf>,
    /// Who may publish to Ingest, as which source, touching which workers (`ingest_auth`; checked at run time by `crate::access`).
    pub ingest_auth: IngestAuthConfig,
    /// The exact state on disk (`[durability]`; off by default).
    pub durability: DurabilityConfig,
    /// Let a non-loopback Ingest listener serve without `ingest_auth.required`, on purpose:
    /// logged at WARN at start and every hour, exported as `ckf_producer_insecure` = 1
    /// (`ckf_svc_kit::tls::exposure`).
    pub insecure: bool,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        Self {
            pool: PoolConfig::default(),
            table: TableConfig {
                max_kicks: Some(ckf_core::dc::DEFAULT_MAX_KICKS),
                reserve_blocks: Some(0),
                ..TableConfig::default()
            },
            publication: PublicationConfig::default(),
            indexers: Vec::new(),
            reconnect: ReconnectConfig::default(),
            limits: LimitsConfig::default(),
            quotas: QuotasConfig::default(),
            transport: TransportConfig::default(),
            shutdown: ShutdownConfig::default(),
            listen: DEFAULT_LISTEN.parse().expect("valid default"),
            metrics_listen: DEFAULT_METRICS_LISTEN.parse().expect("valid default"),
            log_format: LogFormat::Human,
            worker_threads: DEFAULT_WORKER_THREADS,
            block_size: DEFAULT_BLOCK_SIZE,
            engine: EngineSection::default(),
            engines: Vec::new(),
            tls: ServerTlsConfig::default(),
            indexer_tls: ClientTlsConfig::default(),
            indexer_token_file: None,
            ingest_auth: IngestAuthConfig::default(),
            durability: DurabilityConfig::default(),
            insecure: false,
        }
    }
}

/// Default `block_size`: tokens per KV block (vLLM's default).
pub const DEFAULT_BLOCK_SIZE: u32 = 16;
/// Largest accepted `block_size`.
pub const MAX_BLOCK_SIZE: u32 = 1 << 16;

/// Largest accepted `limits.max_message_bytes` (tonic's decode limit is a `usize`; 256 MiB is
/// far beyond any useful frame).
pub const MAX_MESSAGE_BYTES_LIMIT: u64 = 256 << 20;
/// Smallest accepted `limits.max_message_bytes`: a snapshot chunk must carry at least a few
/// hundred buckets.
pub const MIN_MESSAGE_BYTES_LIMIT: u64 = 4 << 10;

impl PoolConfig {
    /// The pool this producer publishes: `pool.dc` is required, both names follow the core's
    /// identity rules.
    fn id(&self) -> Result<PoolId, Invalid> {
        if self.dc.is_empty() {
            return Err(Invalid::new(
                "pool.dc",
                "\"\"",
                "required: set --dc, CKF_PRODUCER_POOL__DC or pool.dc in the TOML file",
            ));
        }
        let domain = ckf_core::identity::IndexerDomainId::new(self.domain.clone())
            .map_err(|e| Invalid::new("pool.domain", &self.domain, e.to_string()))?;
        let dc = ckf_core::identity::DcId::new(self.dc.clone())
            .map_err(|e| Invalid::new("pool.dc", &self.dc, e.to_string()))?;
        Ok(PoolId { domain, dc })
    }
}

impl PublicationConfig {
    fn validate(&self) -> Result<(), Invalid> {
        let p = self;
        at_least(
            "publication.batch_threshold",
            p.batch_threshold,
            1,
            "bucket",
        )?;
        in_range(
            "publication.max_delay_ms",
            p.max_delay_ms,
            1..=60_000,
            "milliseconds",
        )?;
        in_range(
            "publication.heartbeat_interval_ms",
            p.heartbeat_interval_ms,
            10..=600_000,
            "milliseconds",
        )?;
        at_least(
            "publication.attachment_queue",
            p.attachment_queue,
            2,
            "queue entries",
        )?;
        Ok(())
    }
}

impl ReconnectConfig {
    fn validate(&self) -> Result<(), Invalid> {
        let r = self;
        at_least(
            "reconnect.initial_backoff_ms",
            r.initial_backoff_ms,
            1,
            "millisecond",
        )?;
        if r.max_backoff_ms < r.initial_backoff_ms {
            return Err(Invalid::new(
                "reconnect.max_backoff_ms",
                r.max_backoff_ms,
                format!(
                    "must be at least reconnect.initial_backoff_ms ({})",
                    r.initial_backoff_ms
                ),
            ));
        }
        at_least(
            "reconnect.connect_timeout_ms",
            r.connect_timeout_ms,
            1,
            "millisecond",
        )?;
        Ok(())
    }
}

impl LimitsConfig {
    fn validate(&self) -> Result<(), Invalid> {
        let l = self;
        at_least(
            "limits.ingest_channel_capacity",
            l.ingest_channel_capacity,
            1,
            "",
        )?;
        in_range(
            "limits.max_message_bytes",
            l.max_message_bytes,
            MIN_MESSAGE_BYTES_LIMIT..=MAX_MESSAGE_BYTES_LIMIT,
            "bytes",
        )?;
        at_least("limits.max_events_per_batch", l.max_events_per_batch, 1, "")?;
        at_least("limits.max_tracked_sources", l.max_tracked_sources, 1, "")?;
        at_most(
            "limits.max_tracked_sources",
            l.max_tracked_sources,
            MAX_TRACKED_SOURCES_LIMIT,
            "",
        )?;
        Ok(())
    }
}

impl ProducerConfig {
    /// A configuration for tests and in-process use: defaults with the given pool and indexers,
    /// listening on ephemeral loopback ports.
    pub fn for_pool(domain: &str, dc: &str, indexers: Vec<String>) -> Self {
        Self {
            pool: PoolConfig {
                domain: domain.into(),
                dc: dc.into(),
            },
            indexers,
            listen: "127.0.0.1:0".parse().expect("valid"),
            metrics_listen: "127.0.0.1:0".parse().expect("valid"),
            ..Self::default()
        }
    }

    /// Checks every rule and returns the derived pool id and table format.
    ///
    /// # Errors
    /// [`Invalid`] naming the first key that breaks its rule, its value and the rule.
    pub fn pool_and_format(&self) -> Result<(PoolId, TableFormat), Invalid> {
        let pool = self.pool.id()?;
        let format = self.table.format()?;
        at_most(
            "table.max_kicks",
            self.max_kicks(),
            ckf_core::dc::MAX_KICKS_LIMIT,
            "",
        )?;
        at_most(
            "table.reserve_blocks",
            self.reserve_blocks(),
            format.slot_count(),
            "blocks (the table's slot count: a table tracks at most one block per slot)",
        )?;
        self.publication.validate()?;
        self.check_indexers()?;
        self.reconnect.validate()?;
        self.limits.validate()?;
        self.quotas.validate()?;
        at_least(
            "shutdown.drain_timeout_ms",
            self.shutdown.drain_timeout_ms,
            1,
            "millisecond",
        )?;
        self.transport.validate()?;
        validate_worker_threads(self.worker_threads)?;
        self.durability.validate()?;
        self.publishers()?;
        ingest_auth::validate(&self.ingest_auth, self.indexer_token_file.as_deref())?;
        self.exposure()?;
        Ok((pool, format))
    }

    /// The indexer endpoints: at least one, each a valid URL listed once, and the TLS settings
    /// they need.
    fn check_indexers(&self) -> Result<(), Invalid> {
        if self.indexers.is_empty() {
            return Err(Invalid::new(
                "indexers",
                "[]",
                "at least one indexer endpoint is required (--indexer http://host:port)",
            ));
        }
        for (i, endpoint) in self.indexers.iter().enumerate() {
            check_endpoint(endpoint)
                .map_err(|rule| Invalid::new("indexers", format!("[{i}] {endpoint}"), rule))?;
            if self.indexers[..i].contains(endpoint) {
                return Err(Invalid::new("indexers", endpoint, "listed twice"));
            }
        }
        let endpoints: Vec<(String, &str)> = self
            .indexers
            .iter()
            .map(|url| ("indexers".to_owned(), url.as_str()))
            .collect();
        self.indexer_tls.check("indexer_tls", &endpoints)?;
        self.tls.check("tls", &[("listen", self.listen)])
    }

    /// Who may call the Ingest listener: guarded by `ingest_auth.required`; off loopback it is
    /// refused without it unless `insecure = true` (`ckf_svc_kit::tls::exposure`).
    ///
    /// # Errors
    /// [`Invalid`] naming `listen` and the settings to change.
    pub fn exposure(&self) -> Result<Exposure, Invalid> {
        let ingest = Guard {
            service: "Ingest",
            authorized: self.ingest_auth.required,
            settings: "ingest_auth.required = true (with [[ingest_auth.sources]] entries)",
            risk: "any client could publish as any source and remove or clear any worker's \
                   blocks",
        };
        let listeners = [Listener {
            key: "listen",
            addr: self.listen,
            guards: vec![ingest],
        }];
        check_exposure(&listeners, self.insecure, &format!("{ENV_PREFIX}INSECURE"))
    }

    /// Checks `block_size`, `[engine]` and `[[engines]]`, and returns one publisher socket
    /// per rank of every engine.
    ///
    /// # Errors
    /// [`Invalid`] naming the key, the value and the rule.
    pub fn publishers(&self) -> Result<Vec<PublisherSpec>, Invalid> {
        in_range("block_size", self.block_size, 1..=MAX_BLOCK_SIZE, "tokens")?;
        self.engine.validate()?;
        crate::engines::config::expand(&self.engines)
    }

    /// What the process needs before it starts: log format and worker threads.
    pub fn process(&self) -> ProcessSettings {
        ProcessSettings {
            log_format: self.log_format,
            worker_threads: self.worker_threads,
        }
    }

    /// `table.max_kicks`: the relocation bound of one cuckoo insertion, in kicks.
    pub fn max_kicks(&self) -> u32 {
        self.table
            .max_kicks
            .unwrap_or(ckf_core::dc::DEFAULT_MAX_KICKS)
    }

    /// `table.reserve_blocks`: tracked blocks the exact block map is sized for from the start
    /// (0: none).
    pub fn reserve_blocks(&self) -> u64 {
        self.table.reserve_blocks.unwrap_or(0)
    }

    /// `publication.max_delay_ms` as a duration.
    pub fn max_delay(&self) -> Duration {
        Duration::from_millis(self.publication.max_delay_ms)
    }

    /// `publication.heartbeat_interval_ms` as a duration.
    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(self.publication.heartbeat_interval_ms)
    }

    /// `shutdown.drain_timeout_ms` as a duration.
    pub fn drain_timeout(&self) -> Duration {
        Duration::from_millis(self.shutdown.drain_timeout_ms)
    }
}

fn check_endpoint(endpoint: &str) -> Result<(), String> {
    let rest = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"))
        .ok_or("must start with http:// or https://")?;
    let authority = rest.trim_end_matches('/');
    if authority.is_empty() || authority.contains('/') {
        return Err("must be scheme://host:port with no path".into());
    }
    endpoint
        .parse::<tonic::transport::Uri>()
        .map_err(|e| format!("not a valid URI: {e}"))?;
    Ok(())
}

impl Validate for ProducerConfig {
    fn validate(&self) -> Result<(), Invalid> {
        self.pool_and_format().map(|_| ())
    }
}
