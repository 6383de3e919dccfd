//! Configuration of the engine publishers this producer subscribes to (`[engine]`,
//! `[[engines]]`, `--engine`, `CKF_ENGINES`), and its validation. Only configuration: the
//! sockets are opened in [`super::publisher`].

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;

use ckf_svc_kit::config::{Invalid, at_least, in_range};
use serde::{Deserialize, Serialize};

/// Largest `dp_size` of one engine (ports `port..port + dp_size`).
pub const MAX_DP_SIZE: u32 = 1024;
/// Largest `engine.max_pushed_workers`.
pub const MAX_PUSHED_WORKERS: u32 = 65_536;
/// Largest `engine.max_frame_bytes` (1 GiB).
pub const MAX_FRAME_BYTES_LIMIT: u64 = 1 << 30;

/// Settings shared by every engine publisher (`[engine]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineSection {
    /// Storage media whose blocks enter the filter (`medium` absent counts as `GPU`).
    pub media: Vec<String>,
    /// The KV-cache group whose blocks enter the filter (`group_idx` absent counts as 0).
    pub main_group: u32,
    /// How long a replay may go without a reply before it fails, in milliseconds.
    pub replay_timeout_ms: u64,
    /// How long a publisher may stay silent before its last applied batch is verified again
    /// through its replay socket (a connection can look open while its peer is gone), in
    /// milliseconds; 0 never.
    pub verify_idle_ms: u64,
    /// Frames larger than this (all parts together), in bytes, are dropped and counted.
    pub max_frame_bytes: u64,
    /// Live batches buffered while a replay runs; beyond it the replay fails.
    pub max_buffered_batches: u32,
    /// How often each engine's `metrics_url` is scraped for its load, in milliseconds.
    pub load_interval_ms: u64,
    /// How long one scrape may take before the engine's load is unknown, in milliseconds.
    pub load_timeout_ms: u64,
    /// How long a load pushed through `Ingest/ReportLoad` stays known after its observation,
    /// in milliseconds; then it is unknown until pushed again.
    pub pushed_load_ttl_ms: u64,
    /// Workers not configured in `[[engines]]` that may push their load at once; a new one
    /// past it is refused (`RESOURCE_EXHAUSTED`). 0: only configured engines may push.
    pub max_pushed_workers: u32,
}

impl Default for EngineSection {
    fn default() -> Self {
        Self {
            media: vec!["GPU".into()],
            main_group: 0,
            replay_timeout_ms: 2_000,
            verify_idle_ms: 10_000,
            max_frame_bytes: 64 << 20,
            max_buffered_batches: 10_000,
            load_interval_ms: 1_000,
            load_timeout_ms: 500,
            pushed_load_ttl_ms: 3_000,
            max_pushed_workers: 1_024,
        }
    }
}

/// Who opens the connection of an engine's PUB socket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SocketMode {
    /// The engine binds (vLLM's and SGLang's default); the producer connects its SUB socket.
    #[default]
    Connect,
    /// The engine connects; the producer binds its SUB socket on `endpoint`.
    Bind,
}

/// One engine publisher (`[[engines]]` entry, or one `--engine` spec).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSpec {
    /// The worker id of this engine's members (`(worker_id, dp_rank)`); unique.
    pub worker_id: u64,
    /// The PUB endpoint of rank 0, `tcp://host:port` or `ipc://path`; rank r uses port + r.
    pub endpoint: String,
    /// The ROUTER replay endpoint of rank 0 (rank r: port + r); none = gaps cannot be filled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_endpoint: Option<String>,
    /// Data-parallel ranks, 1..=1024; one publisher socket each.
    #[serde(default = "one")]
    pub dp_size: u32,
    /// Topic prefix subscribed to ("" = every topic).
    #[serde(default)]
    pub topic: String,
    /// Payload encoding; only `auto` (tagged-map and positional events are both recognised).
    #[serde(default = "auto")]
    pub format: String,
    /// `connect` (default) or `bind`.
    #[serde(default)]
    pub mode: SocketMode,
    /// The engine's Prometheus endpoint (`http://host:port/metrics`), scraped for its load
    /// every `engine.load_interval_ms`; none: its load is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_url: Option<String>,
    /// Which engine serves `metrics_url` (their metric names differ): `vllm` or `sglang`.
    #[serde(default)]
    pub family: ckf_engine::load::EngineFamily,
    /// The engine's prefill capacity, tokens per second (0: unknown).
    #[serde(default)]
    pub prefill_tokens_per_s: u64,
}

fn one() -> u32 {
    1
}

fn auto() -> String {
    "auto".into()
}

/// The spec's keys, in the order the help text lists them.
pub const SPEC_KEYS: [&str; 10] = [
    "worker_id",
    "endpoint",
    "replay_endpoint",
    "dp_size",
    "topic",
    "format",
    "mode",
    "metrics_url",
    "family",
    "prefill_tokens_per_s",
];

impl FromStr for EngineSpec {
    type Err = String;

    /// Parses `worker_id=7,endpoint=tcp://h:5557,replay_endpoint=tcp://h:5558,dp_size=2`
    /// (`worker_id` and `endpoint` required; the other keys as in `[[engines]]`).
    fn from_str(spec: &str) -> Result<Self, String> {
        let mut worker_id = None;
        let mut endpoint = None;
        let mut out = EngineSpec {
            worker_id: 0,
            endpoint: String::new(),
            replay_endpoint: None,
            dp_size: 1,
            topic: String::new(),
            format: auto(),
            mode: SocketMode::Connect,
            metrics_url: None,
            family: ckf_engine::load::EngineFamily::default(),
            prefill_tokens_per_s: 0,
        };
        let mut seen = HashSet::new();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| format!("'{item}' is not key=value"))?;
            let (key, value) = (key.trim(), value.trim());
            if !seen.insert(key.to_owned()) {
                return Err(format!("key '{key}' given twice"));
            }
            match key {
                "worker_id" => {
                    worker_id = Some(value.parse::<u64>().map_err(|e| {
                        format!("worker_id '{value}' is not an unsigned 64-bit integer: {e}")
                    })?)
                }
                "endpoint" => endpoint = Some(value.to_owned()),
                "replay_endpoint" => out.replay_endpoint = Some(value.to_owned()),
                "dp_size" => {
                    out.dp_size = value
                        .parse()
                        .map_err(|e| format!("dp_size '{value}' is not an integer: {e}"))?
                }
                "topic" => out.topic = value.to_owned(),
                "format" => out.format = value.to_owned(),
                "mode" => {
                    out.mode = match value {
                        "connect" => SocketMode::Connect,
                        "bind" => SocketMode::Bind,
                        _ => return Err(format!("mode '{value}' must be connect or bind")),
                    }
                }
                "metrics_url" => out.metrics_url = Some(value.to_owned()),
                "family" => out.family = value.parse()?,
                "prefill_tokens_per_s" => {
                    out.prefill_tokens_per_s = value.parse().map_err(|e| {
                        format!("prefill_tokens_per_s '{value}' is not an integer: {e}")
                    })?
                }
                _ => {
                    return Err(format!(
                        "unknown key '{key}' (known: {})",
                        SPEC_KEYS.join(", ")
                    ));
                }
            }
        }
        out.worker_id = worker_id.ok_or("worker_id is required")?;
        out.endpoint = endpoint.ok_or("endpoint is required")?;
        Ok(out)
    }
}

/// A parsed ZMQ endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `tcp://host:port`.
    Tcp {
        /// Host name, address or `*` (bind).
        host: String,
        /// Port of rank 0.
        port: u16,
    },
    /// `ipc://path`.
    Ipc(String),
}

impl Endpoint {
    /// Parses `tcp://host:port` or `ipc://path`.
    ///
    /// # Errors
    /// The rule broken, as text.
    pub fn parse(endpoint: &str) -> Result<Self, String> {
        if let Some(rest) = endpoint.strip_prefix("tcp://") {
            let (host, port) = rest
                .rsplit_once(':')
                .ok_or("tcp endpoints must be tcp://host:port")?;
            if host.is_empty() {
                return Err("tcp endpoints must name a host (or * to bind)".into());
            }
            let port = port
                .parse::<u16>()
                .map_err(|_| format!("port '{port}' is not a number in 0..=65535"))?;
            Ok(Self::Tcp {
                host: host.to_owned(),
                port,
            })
        } else if let Some(path) = endpoint.strip_prefix("ipc://") {
            if path.is_empty() {
                return Err("ipc endpoints must name a path".into());
            }
            Ok(Self::Ipc(path.to_owned()))
        } else {
            Err("must start with tcp:// or ipc://".into())
        }
    }

    /// The endpoint of data-parallel rank `rank`: port + rank (vLLM's and SGLang's rule).
    ///
    /// # Errors
    /// When the port overflows, or an ipc endpoint is asked for a rank above 0.
    pub fn for_rank(&self, rank: u32) -> Result<Self, String> {
        match self {
            Self::Tcp { host, port } => {
                let port = u32::from(*port) + rank;
                let port = u16::try_from(port)
                    .map_err(|_| format!("port + dp rank {rank} = {port} exceeds 65535"))?;
                Ok(Self::Tcp {
                    host: host.clone(),
                    port,
                })
            }
            Self::Ipc(path) if rank == 0 => Ok(Self::Ipc(path.clone())),
            Self::Ipc(_) => Err("ipc endpoints have no per-rank port: dp_size must be 1".into()),
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcp { host, port } => write!(f, "tcp://{host}:{port}"),
            Self::Ipc(path) => write!(f, "ipc://{path}"),
        }
    }
}

/// One publisher socket: one rank of one engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublisherSpec {
    /// The engine's worker id.
    pub worker_id: u64,
    /// The rank this socket publishes (the member's rank when a batch names none).
    pub rank: u32,
    /// The rank's PUB endpoint.
    pub endpoint: Endpoint,
    /// The rank's replay endpoint, if any.
    pub replay_endpoint: Option<Endpoint>,
    /// Topic prefix subscribed to.
    pub topic: String,
    /// Connect or bind.
    pub mode: SocketMode,
}

impl PublisherSpec {
    /// The `publisher` metric label: `"worker/rank"`.
    pub fn label(&self) -> String {
        format!("{}/{}", self.worker_id, self.rank)
    }
}

impl EngineSection {
    /// Checks `[engine]`.
    ///
    /// # Errors
    /// [`Invalid`] naming the key.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.media.is_empty() {
            return Err(Invalid::new(
                "engine.media",
                "[]",
                "at least one medium is required (GPU)",
            ));
        }
        at_least(
            "engine.replay_timeout_ms",
            self.replay_timeout_ms,
            1,
            "millisecond",
        )?;
        in_range(
            "engine.max_frame_bytes",
            self.max_frame_bytes,
            1..=MAX_FRAME_BYTES_LIMIT,
            "bytes",
        )?;
        in_range(
            "engine.max_buffered_batches",
            self.max_buffered_batches,
            1..=1_000_000,
            "batches",
        )?;
        in_range(
            "engine.load_interval_ms",
            self.load_interval_ms,
            100..=60_000,
            "ms",
        )?;
        in_range(
            "engine.load_timeout_ms",
            self.load_timeout_ms,
            10..=self.load_interval_ms,
            "ms (at most engine.load_interval_ms)",
        )?;
        in_range(
            "engine.pushed_load_ttl_ms",
            self.pushed_load_ttl_ms,
            self.load_interval_ms..=3_600_000,
            "ms (at least engine.load_interval_ms)",
        )?;
        in_range(
            "engine.max_pushed_workers",
            self.max_pushed_workers,
            0..=MAX_PUSHED_WORKERS,
            "workers",
        )
    }
}

/// Checks every `[[engines]]` entry and expands them into one [`PublisherSpec`] per rank.
///
/// # Errors
/// [`Invalid`] naming `engines[i].<key>`, the value and the rule: a bad endpoint scheme,
/// `dp_size` 0 or above [`MAX_DP_SIZE`], port + rank overflow, a duplicate `worker_id` or
/// endpoint (after expansion to ranks), an unknown `format`.
pub fn expand(engines: &[EngineSpec]) -> Result<Vec<PublisherSpec>, Invalid> {
    let mut out = Vec::new();
    let mut workers = HashSet::new();
    let mut endpoints: HashSet<String> = HashSet::new();
    for (i, e) in engines.iter().enumerate() {
        let key = |k: &str| format!("engines[{i}].{k}");
        if !workers.insert(e.worker_id) {
            return Err(Invalid::new(
                key("worker_id"),
                e.worker_id,
                "listed twice: each engine needs its own worker_id",
            ));
        }
        in_range(&key("dp_size"), e.dp_size, 1..=MAX_DP_SIZE, "ranks")?;
        if e.format != "auto" {
            return Err(Invalid::new(
                key("format"),
                &e.format,
                "unknown format: only \"auto\" is supported (tagged-map and positional events)",
            ));
        }
        if let Some(url) = &e.metrics_url
            && !url.starts_with("http://")
        {
            return Err(Invalid::new(
                key("metrics_url"),
                url,
                "must be a plain http:// URL (an engine's /metrics endpoint)",
            ));
        }
        let endpoint = Endpoint::parse(&e.endpoint)
            .map_err(|r| Invalid::new(key("endpoint"), &e.endpoint, r))?;
        let replay = e
            .replay_endpoint
            .as_deref()
            .map(|r| {
                Endpoint::parse(r).map_err(|rule| Invalid::new(key("replay_endpoint"), r, rule))
            })
            .transpose()?;
        if e.mode == SocketMode::Connect
            && matches!(&endpoint, Endpoint::Tcp { host, .. } if host == "*")
        {
            return Err(Invalid::new(
                key("endpoint"),
                &e.endpoint,
                "cannot connect to *: name the engine's host, or set mode = \"bind\"",
            ));
        }
        for rank in 0..e.dp_size {
            let ep = endpoint
                .for_rank(rank)
                .map_err(|r| Invalid::new(key("endpoint"), &e.endpoint, r))?;
            let rp = replay
                .as_ref()
                .map(|r| {
                    r.for_rank(rank)
                        .map_err(|rule| Invalid::new(key("replay_endpoint"), r.to_string(), rule))
                })
                .transpose()?;
            for (k, addr) in [("endpoint", Some(&ep)), ("replay_endpoint", rp.as_ref())] {
                let Some(addr) = addr else { continue };
                if !endpoints.insert(addr.to_string()) {
                    return Err(Invalid::new(
                        key(k),
                        addr,
                        format!(
                            "endpoint of rank {rank} is already used by another publisher socket"
                        ),
                    ));
                }
            }
            out.push(PublisherSpec {
                worker_id: e.worker_id,
                rank,
                endpoint: ep,
                replay_endpoint: rp,
                topic: e.topic.clone(),
                mode: e.mode,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(s: &str) -> EngineSpec {
        s.parse().expect("valid spec")
    }

    #[test]
    fn spec_parses_every_key() {
        let e = spec(
            "worker_id=7,endpoint=tcp://h:5557,replay_endpoint=tcp://h:6557,dp_size=2,topic=kv,format=auto,mode=bind",
        );
        assert_eq!(e.worker_id, 7);
        assert_eq!(e.replay_endpoint.as_deref(), Some("tcp://h:6557"));
        assert_eq!(
            (e.dp_size, e.topic.as_str(), e.mode),
            (2, "kv", SocketMode::Bind)
        );
        let d = spec("endpoint=ipc:///tmp/x, worker_id=1");
        assert_eq!(
            (d.dp_size, d.format.as_str(), d.mode),
            (1, "auto", SocketMode::Connect)
        );
        assert_eq!(
            (d.metrics_url, d.family, d.prefill_tokens_per_s),
            (None, ckf_engine::load::EngineFamily::Vllm, 0)
        );
        let l = spec(
            "worker_id=7,endpoint=tcp://h:5557,metrics_url=http://h:30000/metrics,family=sglang,prefill_tokens_per_s=9000",
        );
        assert_eq!(l.metrics_url.as_deref(), Some("http://h:30000/metrics"));
        assert_eq!(
            (l.family, l.prefill_tokens_per_s),
            (ckf_engine::load::EngineFamily::Sglang, 9_000)
        );
    }

    #[test]
    fn load_settings_are_checked() {
        let e = expand(&[spec(
            "worker_id=1,endpoint=tcp://h:1,metrics_url=https://h/metrics",
        )])
        .expect_err("https refused");
        assert_eq!(e.key, "engines[0].metrics_url");
        assert!(
            "worker_id=1,endpoint=tcp://h:1,family=trtllm"
                .parse::<EngineSpec>()
                .expect_err("unknown family")
                .contains("not an engine family")
        );
        let section = EngineSection {
            load_interval_ms: 1_000,
            load_timeout_ms: 2_000,
            ..EngineSection::default()
        };
        assert_eq!(
            section.validate().expect_err("timeout above interval").key,
            "engine.load_timeout_ms"
        );
        let section = EngineSection {
            load_interval_ms: 10,
            ..EngineSection::default()
        };
        assert_eq!(
            section.validate().expect_err("interval too short").key,
            "engine.load_interval_ms"
        );
        let section = EngineSection {
            load_interval_ms: 1_000,
            pushed_load_ttl_ms: 999,
            ..EngineSection::default()
        };
        assert_eq!(
            section.validate().expect_err("TTL below the interval").key,
            "engine.pushed_load_ttl_ms"
        );
        let section = EngineSection {
            max_pushed_workers: MAX_PUSHED_WORKERS + 1,
            ..EngineSection::default()
        };
        assert_eq!(
            section.validate().expect_err("too many pushed workers").key,
            "engine.max_pushed_workers"
        );
        assert!(EngineSection::default().validate().is_ok());
    }

    #[test]
    fn spec_errors_are_precise() {
        let err = |s: &str| s.parse::<EngineSpec>().expect_err(s);
        assert!(err("worker_id=1,endpoint=tcp://h:1,colour=red").contains("unknown key 'colour'"));
        assert!(err("endpoint=tcp://h:1").contains("worker_id is required"));
        assert!(err("worker_id=1").contains("endpoint is required"));
        assert!(err("worker_id=x,endpoint=tcp://h:1").contains("worker_id 'x'"));
        assert!(err("worker_id=1,worker_id=2,endpoint=tcp://h:1").contains("given twice"));
        assert!(err("worker_id=1,endpoint=tcp://h:1,mode=listen").contains("connect or bind"));
        assert!(err("worker_id=1,endpoint").contains("not key=value"));
    }

    #[test]
    fn ranks_take_port_plus_rank() {
        let p = expand(&[spec(
            "worker_id=7,endpoint=tcp://h:5557,replay_endpoint=tcp://h:6557,dp_size=3",
        )])
        .expect("valid");
        let eps: Vec<_> = p
            .iter()
            .map(|p| {
                (
                    p.label(),
                    p.endpoint.to_string(),
                    p.replay_endpoint.clone().map(|e| e.to_string()),
                )
            })
            .collect();
        assert_eq!(
            eps,
            [
                (
                    "7/0".into(),
                    "tcp://h:5557".into(),
                    Some("tcp://h:6557".into())
                ),
                (
                    "7/1".into(),
                    "tcp://h:5558".into(),
                    Some("tcp://h:6558".into())
                ),
                (
                    "7/2".into(),
                    "tcp://h:5559".into(),
                    Some("tcp://h:6559".into())
                ),
            ]
        );
    }

    #[test]
    fn expansion_refuses_with_the_key() {
        let err = |specs: &[&str]| {
            let specs: Vec<_> = specs.iter().map(|s| spec(s)).collect();
            expand(&specs).expect_err("invalid")
        };
        let e = err(&["worker_id=1,endpoint=http://h:1"]);
        assert_eq!(e.key, "engines[0].endpoint");
        assert!(e.rule.contains("tcp:// or ipc://"));
        assert_eq!(
            err(&["worker_id=1,endpoint=tcp://h:1,dp_size=0"]).key,
            "engines[0].dp_size"
        );
        assert_eq!(
            err(&["worker_id=1,endpoint=tcp://h:1,dp_size=1025"]).key,
            "engines[0].dp_size"
        );
        let e = err(&["worker_id=1,endpoint=tcp://h:65535,dp_size=2"]);
        assert!(e.rule.contains("exceeds 65535"), "{e:?}");
        let e = err(&[
            "worker_id=1,endpoint=tcp://h:1",
            "worker_id=1,endpoint=tcp://h:9",
        ]);
        assert_eq!(e.key, "engines[1].worker_id");
        let e = err(&[
            "worker_id=1,endpoint=tcp://h:1,dp_size=2",
            "worker_id=2,endpoint=tcp://h:2",
        ]);
        assert_eq!(e.key, "engines[1].endpoint");
        assert!(e.rule.contains("already used"));
        let e = err(&["worker_id=1,endpoint=tcp://h:1,replay_endpoint=tcp://h:1"]);
        assert_eq!(e.key, "engines[0].replay_endpoint");
        assert_eq!(
            err(&["worker_id=1,endpoint=tcp://h:1,format=json"]).key,
            "engines[0].format"
        );
        assert!(
            err(&["worker_id=1,endpoint=ipc:///tmp/a,dp_size=2"])
                .rule
                .contains("dp_size must be 1")
        );
        assert!(
            err(&["worker_id=1,endpoint=tcp://*:5557"])
                .rule
                .contains("bind")
        );
        assert!(
            err(&["worker_id=1,endpoint=tcp://h:port"])
                .rule
                .contains("port")
        );
    }
}
