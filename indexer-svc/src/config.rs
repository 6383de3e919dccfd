//! Configuration of one indexer: the manifest (domain, lanes, table format), where it listens,
//! its lag policy and its limits. Only configuration lives here: the command line, the layered
//! sources (defaults < TOML file < `CKF_INDEXER_*` environment < flags, via
//! `ckf_svc_kit::config`) and validation that names the key, the value and the rule it broke.
//! Nothing here starts a task or opens a socket.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ckf_core::lane::LagPolicy;
use ckf_core::route::RouteModel;
use ckf_core::search::{SearchKernel, SearchKernelError};
use ckf_core::tokens::MAX_BLOCK_SIZE;
use ckf_proto::convert::WIRE_BYTES_PER_IMAGE;
use ckf_svc_kit::LogFormat;
use ckf_svc_kit::config::{ConfigError, Invalid, Layers, Overrides, Validate, at_least, in_range};
use ckf_svc_kit::serve::{DEFAULT_WORKER_THREADS, ProcessSettings, validate_worker_threads};
use ckf_svc_kit::table::{EXPECTED_BLOCKS_PER_LANE_ALIAS, TableConfig};
use ckf_svc_kit::tls::{
    Exposure, Guard, Listener, ServerTlsConfig, ServerTlsFlags, check_exposure,
};
use ckf_svc_kit::transport::{TransportConfig, TransportFlags};
use clap::Parser;
use serde::{Deserialize, Serialize};

pub mod domains;

use domains::CatalogKeys;
pub use domains::{DomainConfig, ManifestConfig};

/// Default gRPC (Relay, Query, health, reflection) listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7400";
/// Default Prometheus `/metrics` listen address.
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:9400";
/// Default tokens per KV block (vLLM's default; the producer's default too).
pub const DEFAULT_BLOCK_SIZE: u32 = 16;
/// Prefix of every environment variable read (`CKF_INDEXER_LAG__HEARTBEAT_DEADLINE_MS` sets
/// `lag.heartbeat_deadline_ms`).
pub const ENV_PREFIX: &str = "CKF_INDEXER_";
/// Smallest accepted `limits.max_message_bytes`: a snapshot chunk must carry a few hundred
/// buckets and a delta a few hundred images.
pub const MIN_MESSAGE_BYTES: u64 = 4 << 10;
/// Bytes of `limits.max_message_bytes` required per lane: one answer (`ListLanes`, a
/// `FindMatches` or `Route` answer) carries every lane with its 64-byte names, measured at most
/// ~300 bytes per lane with a retirement detail.
pub const BYTES_PER_LANE_ANSWER: u64 = 512;
/// Default `config_watch_interval_ms`: the configuration file is checked every 5 s.
pub const DEFAULT_CONFIG_WATCH_INTERVAL_MS: u64 = 5_000;
/// Largest accepted `limits.max_message_bytes` (256 MiB).
pub const MAX_MESSAGE_BYTES: u64 = 256 << 20;

/// Deadlines after which a lane is retired (0 disables a deadline).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LagConfig {
    /// A leased lane that receives no frame (delta, chunk or heartbeat) for this many
    /// milliseconds is retired (`HEARTBEAT_TIMEOUT`). Told to producers in `LeaseGranted`.
    pub heartbeat_deadline_ms: u64,
    /// A delta whose oldest change is older than this many milliseconds when it would be applied
    /// (producer-side age at send + time queued here) is not applied and its lane is retired
    /// (`LAG_EXCEEDED`).
    pub dirty_to_applied_deadline_ms: u64,
    /// A lane whose producer drained (exact drain marker) stays ready this many milliseconds
    /// (a rolling producer restart keeps its DC warm), then leaves the ready set
    /// (`DRAIN_GRACE_EXPIRED`) unless a new lease arrived. 0 = it leaves at the first deadline
    /// check after the drain (within 100 ms). At most [`MAX_DRAIN_GRACE_MS`].
    pub drain_grace_ms: u64,
}

/// Largest `lag.drain_grace_ms` (one day).
pub const MAX_DRAIN_GRACE_MS: u64 = 86_400_000;

impl Default for LagConfig {
    fn default() -> Self {
        Self {
            heartbeat_deadline_ms: 10_000,
            dirty_to_applied_deadline_ms: 10_000,
            drain_grace_ms: 30_000,
        }
    }
}

/// Resource limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Largest gRPC message accepted, in bytes (tonic's decoding limit; told to producers in
    /// `LeaseGranted`).
    pub max_message_bytes: u64,
    /// Most bucket images one delta may carry (told to producers in `LeaseGranted`); lowered to
    /// what fits `max_message_bytes` at [`WIRE_BYTES_PER_IMAGE`] bytes per image.
    pub max_images_per_delta: u32,
    /// Relay streams open at once; further attachments get `RESOURCE_EXHAUSTED`.
    pub max_relay_streams: u32,
    /// Most block hashes one `FindMatches` may carry (and each query of a batch or stream
    /// message).
    pub max_query_blocks: u32,
    /// Most queries one `FindMatchesBatch` request or `FindMatchesStream` message may carry, and
    /// most requests one `RouteBatch` may carry (bounds the work one message buys; the message
    /// size is bounded by `max_message_bytes`).
    pub max_query_batch: u32,
    /// `FindMatchesStream` calls open at once; a further one gets `RESOURCE_EXHAUSTED`. An open
    /// stream holds its slot until the client closes it or its connection ends (HTTP/2
    /// keepalive drops a dead peer), idle or not: this bounds what open streams can hold.
    pub max_query_streams: u32,
    /// Frames each lane's ingestion queue holds; a full queue retires the lane (`SATURATED`).
    pub lane_queue_capacity: u32,
    /// Most bytes the tables of every domain served may take together (buckets x lane slots x
    /// 8 each); 0 = this machine's memory (`MemTotal`), so a catalog whose tables cannot fit is
    /// refused at start and by a reload instead of getting the process OOM-killed.
    pub max_table_bytes: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_message_bytes: 4 << 20,
            max_images_per_delta: 65_536,
            max_relay_streams: 256,
            max_query_blocks: 8_192,
            max_query_batch: 1_024,
            max_query_streams: 256,
            lane_queue_capacity: 1_024,
            max_table_bytes: 0,
        }
    }
}

/// The prefix search (`[search]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SearchConfig {
    /// Search kernel: `auto` (the best this CPU runs: AVX-512 > AVX2 > portable), or one of
    /// `portable`, `avx2`, `avx512`, `neon` forced (`ckf_core::search::SearchKernel`); a kernel the CPU
    /// lacks is refused at start. Every kernel gives the same answers.
    pub kernel: String,
}

impl Default for SearchConfig {
    fn default() -> Self {
        Self {
            kernel: SearchKernel::Auto.name().to_owned(),
        }
    }
}

/// The routing decision of `Query/Route` (`[route]`; the model: `ckf_core::route`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouteConfig {
    /// Round trip from the routers to a DC not named in `rtt_ms`, milliseconds.
    pub default_rtt_ms: f64,
    /// Round trip from the routers to each DC, milliseconds, by DC id (a request's own round
    /// trips win).
    pub rtt_ms: std::collections::BTreeMap<String, f64>,
    /// Prefill tokens/s of a DC whose load is unknown (no report, or a stale one).
    pub default_prefill_tokens_per_s: f64,
    /// The prefill work one queued request stands for, tokens.
    pub queued_request_tokens: f64,
    /// A load report older than this is not used, milliseconds.
    pub stale_after_ms: u64,
    /// Estimates within this fraction of the fastest count as equal: the deepest cached prefix
    /// among them is chosen.
    pub prefer_deeper_within: f64,
}

impl Default for RouteConfig {
    fn default() -> Self {
        let model = RouteModel::default();
        Self {
            default_rtt_ms: model.default_rtt.as_secs_f64() * 1e3,
            rtt_ms: std::collections::BTreeMap::new(),
            default_prefill_tokens_per_s: model.default_prefill_tokens_per_s,
            queued_request_tokens: model.queued_request_tokens,
            stale_after_ms: u64::try_from(model.stale_after.as_millis()).unwrap_or(u64::MAX),
            prefer_deeper_within: model.prefer_deeper_within,
        }
    }
}

impl RouteConfig {
    /// The model's parameters.
    pub fn model(&self) -> RouteModel {
        RouteModel {
            default_rtt: Duration::from_secs_f64(self.default_rtt_ms / 1e3),
            default_prefill_tokens_per_s: self.default_prefill_tokens_per_s,
            queued_request_tokens: self.queued_request_tokens,
            stale_after: Duration::from_millis(self.stale_after_ms),
            prefer_deeper_within: self.prefer_deeper_within,
        }
    }

    /// The configured round trip to `dc`, if `rtt_ms` names it.
    pub fn rtt(&self, dc: &str) -> Option<Duration> {
        self.rtt_ms
            .get(dc)
            .map(|ms| Duration::from_secs_f64(ms / 1e3))
    }

    fn validate(&self, lanes: &[String]) -> Result<(), Invalid> {
        let finite = |key: &str, v: f64, min: f64, rule: &str| {
            if v.is_finite() && v >= min && v <= 3.6e6 {
                Ok(())
            } else {
                Err(Invalid::new(key, v, rule))
            }
        };
        finite(
            "route.default_rtt_ms",
            self.default_rtt_ms,
            0.0,
            "a number of ms, 0..=3600000",
        )?;
        for (dc, ms) in &self.rtt_ms {
            if !lanes.iter().any(|l| l == dc) {
                return Err(Invalid::new(
                    format!("route.rtt_ms.{dc}"),
                    ms,
                    "not a DC of any domain's lanes",
                ));
            }
            finite(
                &format!("route.rtt_ms.{dc}"),
                *ms,
                0.0,
                "a number of ms, 0..=3600000",
            )?;
        }
        if !(self.default_prefill_tokens_per_s.is_finite()
            && self.default_prefill_tokens_per_s >= 1.0)
        {
            return Err(Invalid::new(
                "route.default_prefill_tokens_per_s",
                self.default_prefill_tokens_per_s,
                "a number of tokens per second, at least 1",
            ));
        }
        finite(
            "route.queued_request_tokens",
            self.queued_request_tokens,
            0.0,
            "a number of tokens, 0..=3600000",
        )?;
        if !(self.prefer_deeper_within.is_finite()
            && (0.0..=10.0).contains(&self.prefer_deeper_within))
        {
            return Err(Invalid::new(
                "route.prefer_deeper_within",
                self.prefer_deeper_within,
                "a fraction of the fastest estimate, 0..=10",
            ));
        }
        in_range(
            "route.stale_after_ms",
            self.stale_after_ms,
            1..=3_600_000,
            "ms",
        )
    }
}

/// The whole indexer configuration (TOML layout: `deploy/indexer.example.toml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IndexerConfig {
    /// The primary domain and its lanes.
    pub manifest: ManifestConfig,
    /// More domains served, each with its own lanes, block size and table
    /// ([`domains::DomainConfig`]).
    pub domains: Vec<DomainConfig>,
    /// Table format (every producer's must be equal; `ckf_svc_kit::table`). The old key
    /// `table.expected_blocks_per_lane` is still accepted for `table.expected_blocks`.
    pub table: TableConfig,
    /// Lag policy.
    pub lag: LagConfig,
    /// Resource limits.
    pub limits: LimitsConfig,
    /// Prefix search (kernel choice).
    pub search: SearchConfig,
    /// The routing decision (`Query/Route`).
    pub route: RouteConfig,
    /// Connection and request limits of the gRPC listener (`ckf_svc_kit::transport`).
    pub transport: TransportConfig,
    /// Tokens per KV block, `1..=65536`: how `FindMatchesByTokens` cuts a request's token ids
    /// into blocks. Must equal the producers' `block_size` (and the engines'), or the hashes
    /// of a query name other blocks than those the producers stored.
    pub block_size: u32,
    /// gRPC listen address (port 0 = ephemeral): Relay, and Query unless `query_listen` is set.
    pub listen: SocketAddr,
    /// Optional second gRPC listener serving Query only (then `listen` serves Relay only);
    /// health and reflection on both.
    pub query_listen: Option<SocketAddr>,
    /// Authorization of Relay attachments and Query calls (`crate::access`).
    pub auth: crate::access::AuthConfig,
    /// Prometheus `/metrics` listen address (port 0 = ephemeral).
    pub metrics_listen: SocketAddr,
    /// Log line format (`human` or `json`).
    pub log_format: LogFormat,
    /// Tokio worker threads of the `ckf-indexer` process, `0..=1024`; 0 = one per CPU
    /// (tokio's default, or `TOKIO_WORKER_THREADS`). A program that calls [`crate::serve`]
    /// itself (`ckf demo`, an embedded replica) runs it on its own runtime, and this key is not
    /// read. On a host shared with the routers, 1 cost 0.7-0.8x the CPU per query at a few
    /// calls in flight (docs/performance.md, "The query RPC end to end").
    pub worker_threads: u32,
    /// TLS of the gRPC listener (`ckf_svc_kit::tls`): certificate, key, client CA, reload.
    pub tls: ServerTlsConfig,
    /// How often the configuration file (`--config`) is checked for a change, milliseconds; a
    /// change reloads the catalog of domains as SIGHUP and `Admin/ReloadCatalog` do
    /// (`crate::catalog`), once two checks in a row see the same changed file. 0 = no watch
    /// (SIGHUP and the RPC only); else 100..=3600000.
    pub config_watch_interval_ms: u64,
    /// Let a non-loopback listener serve Relay without `auth.required` or Query without a
    /// token or required client certificates, on purpose: logged at WARN at start and every
    /// hour, exported as `ckf_indexer_insecure` = 1 (`ckf_svc_kit::tls::exposure`).
    pub insecure: bool,
}

impl Default for IndexerConfig {
    fn default() -> Self {
        Self {
            manifest: ManifestConfig::default(),
            domains: Vec::new(),
            table: TableConfig::default(),
            lag: LagConfig::default(),
            limits: LimitsConfig::default(),
            search: SearchConfig::default(),
            route: RouteConfig::default(),
            transport: TransportConfig::default(),
            block_size: DEFAULT_BLOCK_SIZE,
            listen: DEFAULT_LISTEN.parse().expect("valid default"),
            query_listen: None,
            auth: crate::access::AuthConfig::default(),
            metrics_listen: DEFAULT_METRICS_LISTEN.parse().expect("valid default"),
            log_format: LogFormat::Human,
            worker_threads: DEFAULT_WORKER_THREADS,
            tls: ServerTlsConfig::default(),
            config_watch_interval_ms: DEFAULT_CONFIG_WATCH_INTERVAL_MS,
            insecure: false,
        }
    }
}

impl IndexerConfig {
    /// What the process needs before it starts: log format and worker threads.
    pub fn process(&self) -> ProcessSettings {
        ProcessSettings {
            log_format: self.log_format,
            worker_threads: self.worker_threads,
        }
    }

    /// A configuration for tests and the in-process demo: defaults with `domain` and `lanes`,
    /// listening on ephemeral loopback ports.
    pub fn for_lanes(domain: &str, lanes: &[&str]) -> Self {
        Self {
            manifest: ManifestConfig {
                domain: domain.into(),
                lanes: lanes.iter().map(|&l| l.to_owned()).collect(),
                ..ManifestConfig::default()
            },
            listen: "127.0.0.1:0".parse().expect("valid"),
            metrics_listen: "127.0.0.1:0".parse().expect("valid"),
            ..Self::default()
        }
    }

    /// The catalog part of the configuration: every domain's keys ([`domains::CatalogKeys`]).
    pub fn catalog(&self) -> CatalogKeys<'_> {
        CatalogKeys {
            manifest: &self.manifest,
            domains: &self.domains,
            block_size: self.block_size,
            table: &self.table,
            max_query_blocks: self.limits.max_query_blocks,
        }
    }

    /// Every domain served, resolved ([`CatalogKeys::domain_specs`]).
    ///
    /// # Errors
    /// [`Invalid`] naming the first offending key.
    pub fn domain_specs(&self) -> Result<Vec<domains::DomainSpec>, Invalid> {
        self.catalog().domain_specs()
    }

    /// The primary domain's table format ([`CatalogKeys::format`]).
    ///
    /// # Errors
    /// [`Invalid`] naming the `table.*` key at fault.
    pub fn format(&self) -> Result<ckf_core::addressing::TableFormat, Invalid> {
        self.catalog().format()
    }

    /// The primary domain's validated manifest ([`CatalogKeys::manifest`]).
    ///
    /// # Errors
    /// [`Invalid`] naming the first offending key.
    pub fn manifest(&self) -> Result<ckf_core::global::Manifest, Invalid> {
        self.catalog().manifest()
    }

    /// Tokens per block of every lane of the primary domain ([`CatalogKeys::lane_block_sizes`]).
    ///
    /// # Errors
    /// [`Invalid`] naming the key.
    pub fn lane_block_sizes(&self) -> Result<ckf_core::tokens::lanes::LaneBlockSizes, Invalid> {
        self.catalog().lane_block_sizes()
    }

    /// The primary domain's rules of a query by token ids ([`CatalogKeys::token_rules`]).
    pub fn token_rules(&self) -> ckf_core::tokens::TokenQueryRules {
        self.catalog().token_rules()
    }

    /// Every domain's name and lanes, the primary first ([`CatalogKeys::domain_lanes`]).
    pub fn domain_lanes(&self) -> Vec<crate::access::DomainLanes> {
        self.catalog().domain_lanes()
    }

    /// Most images per delta actually enforced and granted: `limits.max_images_per_delta`,
    /// lowered to what fits `limits.max_message_bytes` at [`WIRE_BYTES_PER_IMAGE`] each.
    pub fn effective_max_images_per_delta(&self) -> u32 {
        let fits = self.limits.max_message_bytes / WIRE_BYTES_PER_IMAGE as u64;
        self.limits
            .max_images_per_delta
            .min(u32::try_from(fits).unwrap_or(u32::MAX))
    }

    /// The search kernel `search.kernel` names, resolved for this CPU (`auto` becomes the best
    /// available; never `Auto`).
    ///
    /// # Errors
    /// [`Invalid`] naming `search.kernel`: an unknown name, or a kernel this CPU lacks (the
    /// message says what it needs and which kernels are available).
    pub fn search_kernel(&self) -> Result<SearchKernel, Invalid> {
        let value = &self.search.kernel;
        value
            .parse::<SearchKernel>()
            .and_then(SearchKernel::resolve)
            .map_err(|e| kernel_invalid(value, e))
    }

    /// Who may call each listener: Relay is guarded by `auth.required`, Query by
    /// `auth.query_token_file` or required client certificates; a non-loopback listener with
    /// an unguarded service is refused unless `insecure = true`
    /// (`ckf_svc_kit::tls::exposure`).
    ///
    /// # Errors
    /// [`Invalid`] naming the listener and the settings to change.
    pub fn exposure(&self) -> Result<Exposure, Invalid> {
        let relay = Guard {
            service: "Relay",
            authorized: self.auth.required,
            settings: "auth.required = true (with an [[auth.producers]] entry per pool)",
            risk: "any client could attach as any pool and take its lane over",
        };
        let query = Guard {
            service: "Query",
            authorized: self.auth.query_token_file.is_some()
                || self.tls.requires_client_certificates(),
            settings: "auth.query_token_file, or tls.client_ca_file with tls.client_auth = \
                       \"required\"",
            risk: "any client could read every DC's cached prefixes",
        };
        let listeners = match self.query_listen {
            None => vec![Listener {
                key: "listen",
                addr: self.listen,
                guards: vec![relay, query],
            }],
            Some(addr) => vec![
                Listener {
                    key: "listen",
                    addr: self.listen,
                    guards: vec![relay],
                },
                Listener {
                    key: "query_listen",
                    addr,
                    guards: vec![query],
                },
            ],
        };
        check_exposure(&listeners, self.insecure, &format!("{ENV_PREFIX}INSECURE"))
    }

    /// The consumer's lag policy (0 ms = that deadline disabled).
    pub fn lag_policy(&self) -> LagPolicy {
        let ms = |v: u64| (v != 0).then(|| Duration::from_millis(v));
        LagPolicy {
            heartbeat_deadline: ms(self.lag.heartbeat_deadline_ms),
            apply_deadline: ms(self.lag.dirty_to_applied_deadline_ms),
            // 0 is a real grace of nothing, not "disabled": a drained lane must end.
            drain_grace: Some(Duration::from_millis(self.lag.drain_grace_ms)),
        }
    }
}

/// The `search.kernel` refusal for `value`, in the style of the other keys' refusals.
fn kernel_invalid(value: &str, error: SearchKernelError) -> Invalid {
    match error {
        SearchKernelError::Unknown(_) => Invalid::new(
            "search.kernel",
            value,
            "must be one of auto, portable, avx2, avx512, neon",
        ),
        SearchKernelError::Unavailable {
            needs, available, ..
        } => Invalid::new(
            "search.kernel",
            value,
            format!(
                "is not available on this CPU (it needs {needs}); available: {available}, or auto"
            ),
        ),
    }
}

impl Validate for IndexerConfig {
    fn validate(&self) -> Result<(), Invalid> {
        let specs = self.domain_specs()?;
        let mut listens = vec![("listen", self.listen)];
        listens.extend(self.query_listen.map(|addr| ("query_listen", addr)));
        self.tls.check("tls", &listens)?;
        in_range("block_size", self.block_size, 1..=MAX_BLOCK_SIZE, "tokens")?;
        self.route.validate(&self.catalog().all_dcs())?;
        validate_worker_threads(self.worker_threads)?;
        self.search_kernel()?;
        if self.config_watch_interval_ms != 0 {
            in_range(
                "config_watch_interval_ms",
                self.config_watch_interval_ms,
                100..=3_600_000,
                "ms (or 0: no watch)",
            )?;
        }
        in_range(
            "lag.drain_grace_ms",
            self.lag.drain_grace_ms,
            0..=MAX_DRAIN_GRACE_MS,
            "ms",
        )?;
        let l = &self.limits;
        in_range(
            "limits.max_message_bytes",
            l.max_message_bytes,
            MIN_MESSAGE_BYTES..=MAX_MESSAGE_BYTES,
            "bytes",
        )?;
        // One answer of every lane (a `ListLanes` lane with its names and last reason, a
        // `FindMatches` match, a `Route` estimate) must fit one message.
        let lanes = self.catalog().most_lanes() as u64;
        if l.max_message_bytes < lanes * BYTES_PER_LANE_ANSWER {
            return Err(Invalid::new(
                "limits.max_message_bytes",
                l.max_message_bytes,
                format!(
                    "at least {} bytes for {lanes} lanes in one domain ({BYTES_PER_LANE_ANSWER} \
                     per lane: one answer names every lane)",
                    lanes * BYTES_PER_LANE_ANSWER
                ),
            ));
        }
        for (key, value) in [
            ("limits.max_images_per_delta", l.max_images_per_delta),
            ("limits.max_relay_streams", l.max_relay_streams),
            ("limits.max_query_blocks", l.max_query_blocks),
            ("limits.max_query_batch", l.max_query_batch),
            ("limits.max_query_streams", l.max_query_streams),
            ("limits.lane_queue_capacity", l.lane_queue_capacity),
        ] {
            at_least(key, value, 1, "")?;
        }
        domains::check_table_bytes(&specs, l.max_table_bytes)?;
        if let Some(query) = self.query_listen
            && query.port() != 0
            && (query == self.listen || query == self.metrics_listen)
        {
            return Err(Invalid::new(
                "query_listen",
                query,
                "must differ from listen and metrics_listen",
            ));
        }
        crate::access::validate(&self.auth, &self.domain_lanes())?;
        self.exposure()?;
        self.transport.validate()?;
        Ok(())
    }
}

/// `ckf-indexer` command line. Every flag overrides the TOML file and the environment.
#[derive(Debug, Clone, Default, Parser)]
#[command(
    name = "ckf-indexer",
    version,
    about = "Global CKF indexer: receives DC producers' cuckoo filters over gRPC (ckf.v1.Relay) \
             and answers prefix-match queries for every ready lane (ckf.v1.Query).",
    after_help = "Layers: defaults < --config TOML file < CKF_INDEXER_* environment \
                  (nested keys joined with __, e.g. CKF_INDEXER_LAG__HEARTBEAT_DEADLINE_MS=5000) \
                  < flags. Logs are filtered by RUST_LOG (default: info,zeromq=error). \
                  Example file: deploy/indexer.example.toml."
)]
pub struct Cli {
    /// TOML configuration file (layout: deploy/indexer.example.toml).
    #[arg(long, value_name = "FILE", env = "CKF_INDEXER_CONFIG")]
    pub config: Option<PathBuf>,
    /// gRPC listen address [default: 127.0.0.1:7400; key: listen].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Serve Query on this separate address (then --listen serves Relay only)
    /// [default: none; key: query_listen].
    #[arg(long, value_name = "ADDR")]
    pub query_listen: Option<SocketAddr>,
    /// Query RPCs need `authorization: Bearer <token>` with the token in FILE (one line)
    /// [default: none; key: auth.query_token_file].
    #[arg(long, value_name = "FILE")]
    pub query_token_file: Option<PathBuf>,
    /// Every Attach must identify an [[auth.producers]] principal (true/false)
    /// [default: false; key: auth.required].
    #[arg(long, value_name = "BOOL")]
    pub auth_required: Option<bool>,
    /// Prometheus /metrics listen address [default: 127.0.0.1:9400; key: metrics_listen].
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// Log line format [default: human; key: log_format].
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub log_format: Option<LogFormat>,
    /// Tokio worker threads, 0..=1024; 0 = one per CPU [default: 0; key: worker_threads].
    #[arg(long, value_name = "THREADS")]
    pub worker_threads: Option<u32>,
    /// Tokens per KV block, 1..=65536; must equal the producers' [default: 16; key: block_size].
    #[arg(long, value_name = "TOKENS")]
    pub block_size: Option<u32>,
    /// Indexer domain [default: default; key: manifest.domain].
    #[arg(long, value_name = "NAME")]
    pub domain: Option<String>,
    /// DC ids of the lanes in lane order, comma-separated, 1..=64
    /// [default: dc-a,dc-b,dc-c; key: manifest.lanes].
    #[arg(long, value_name = "DC,...", value_delimiter = ',')]
    pub lanes: Option<Vec<String>>,
    /// Expected unique blocks per lane; sizes the table at 92% target load
    /// [default: 1000000; key: table.expected_blocks].
    #[arg(long, value_name = "BLOCKS")]
    pub expected_blocks: Option<u64>,
    /// Old name of --expected-blocks, still accepted (both flags together are refused)
    /// [key: table.expected_blocks_per_lane, an alias of table.expected_blocks].
    #[arg(long, value_name = "BLOCKS")]
    pub expected_blocks_per_lane: Option<u64>,
    /// Explicit bucket count, even, in 2..=4294967294; 0 = derive from the expected blocks
    /// [default: 0; key: table.bucket_count].
    #[arg(long, value_name = "BUCKETS")]
    pub bucket_count: Option<u64>,
    /// Addressing seed, part of the table format [default: 0; key: table.seed].
    #[arg(long, value_name = "SEED")]
    pub seed: Option<u64>,
    /// Retire a leased lane after this many milliseconds without a frame; 0 = never
    /// [default: 10000; key: lag.heartbeat_deadline_ms].
    #[arg(long, value_name = "MS")]
    pub heartbeat_deadline_ms: Option<u64>,
    /// Retire a lane whose delta is older than this many milliseconds when applied; 0 = never
    /// [default: 10000; key: lag.dirty_to_applied_deadline_ms].
    #[arg(long, value_name = "MS")]
    pub dirty_to_applied_deadline_ms: Option<u64>,
    /// Keep a drained lane ready this many milliseconds, then retire it unless a new lease
    /// arrived; 0 = retire at once [default: 30000; key: lag.drain_grace_ms].
    #[arg(long, value_name = "MS")]
    pub drain_grace_ms: Option<u64>,
    /// Largest gRPC message accepted, in bytes, 4096..=268435456
    /// [default: 4194304; key: limits.max_message_bytes].
    #[arg(long, value_name = "BYTES")]
    pub max_message_bytes: Option<u64>,
    /// Most bucket images per delta [default: 65536; key: limits.max_images_per_delta].
    #[arg(long, value_name = "IMAGES")]
    pub max_images_per_delta: Option<u32>,
    /// Relay streams open at once [default: 256; key: limits.max_relay_streams].
    #[arg(long, value_name = "STREAMS")]
    pub max_relay_streams: Option<u32>,
    /// Most block hashes per FindMatches query [default: 8192; key: limits.max_query_blocks].
    #[arg(long, value_name = "BLOCKS")]
    pub max_query_blocks: Option<u32>,
    /// Most queries per FindMatchesBatch request or FindMatchesStream message, requests per
    /// RouteBatch [default: 1024; key: limits.max_query_batch].
    #[arg(long, value_name = "QUERIES")]
    pub max_query_batch: Option<u32>,
    /// FindMatchesStream calls open at once [default: 256; key: limits.max_query_streams].
    #[arg(long, value_name = "STREAMS")]
    pub max_query_streams: Option<u32>,
    /// Frames queued per lane before the lane is retired as saturated
    /// [default: 1024; key: limits.lane_queue_capacity].
    #[arg(long, value_name = "FRAMES")]
    pub lane_queue_capacity: Option<u32>,
    /// Prefix-search kernel: auto, portable, avx2, avx512 or neon; a kernel this CPU lacks is
    /// refused [default: auto; key: search.kernel].
    #[arg(long, value_name = "KERNEL")]
    pub search_kernel: Option<String>,
    /// TLS of the gRPC listener.
    #[command(flatten)]
    pub tls: ServerTlsFlags,
    /// `[transport]` flags.
    #[command(flatten)]
    pub transport: TransportFlags,
}

impl Cli {
    /// The configuration layers these flags describe.
    pub fn layers(&self) -> Layers {
        let overrides = Overrides::new()
            .set("listen", self.listen)
            .set("metrics_listen", self.metrics_listen)
            .set("query_listen", self.query_listen)
            .set("auth.query_token_file", self.query_token_file.clone())
            .set("auth.required", self.auth_required)
            .set("log_format", self.log_format)
            .set("worker_threads", self.worker_threads)
            .set("block_size", self.block_size)
            .set("manifest.domain", self.domain.clone())
            .set("manifest.lanes", self.lanes.clone())
            .set("table.expected_blocks", self.expected_blocks)
            .set(
                EXPECTED_BLOCKS_PER_LANE_ALIAS.old,
                self.expected_blocks_per_lane,
            )
            .set("table.bucket_count", self.bucket_count)
            .set("table.seed", self.seed)
            .set("lag.heartbeat_deadline_ms", self.heartbeat_deadline_ms)
            .set(
                "lag.dirty_to_applied_deadline_ms",
                self.dirty_to_applied_deadline_ms,
            )
            .set("lag.drain_grace_ms", self.drain_grace_ms)
            .set("limits.max_message_bytes", self.max_message_bytes)
            .set("limits.max_images_per_delta", self.max_images_per_delta)
            .set("limits.max_relay_streams", self.max_relay_streams)
            .set("limits.max_query_blocks", self.max_query_blocks)
            .set("limits.max_query_batch", self.max_query_batch)
            .set("limits.max_query_streams", self.max_query_streams)
            .set("limits.lane_queue_capacity", self.lane_queue_capacity)
            .set("search.kernel", self.search_kernel.clone());
        let overrides = self.tls.overrides(overrides);
        let overrides = self.transport.overrides(overrides);
        Layers {
            env_prefix: ENV_PREFIX,
            file: self.config.clone(),
            overrides,
            aliases: &[EXPECTED_BLOCKS_PER_LANE_ALIAS],
        }
    }

    /// Loads and validates the configuration.
    ///
    /// # Errors
    /// [`ConfigError`] naming the key, the value, the rule and where the value came from.
    pub fn load(&self) -> Result<IndexerConfig, ConfigError> {
        self.layers().load()
    }
}

#[cfg(test)]
mod tests;
