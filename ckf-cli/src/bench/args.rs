//! The flags of the benchmark tools: `ckf replay`, `ckf simulate`, `ckf load`, and the fleet,
//! timeout and feed flags `ckf demo` shares with them.

use std::path::PathBuf;

use clap::Args;

use crate::bench::fleet::FleetShape;
use crate::bench::policy::Policy;
use crate::bench::sim::{DcServing, ServingModel};
use crate::bench::trace::Request;
use crate::connect::TlsArgs;

/// Default DCs of `ckf demo` and `ckf simulate`.
pub const DEFAULT_DCS: usize = 3;
/// Default requests of the built-in synthetic workload.
pub const DEFAULT_SYNTHETIC_REQUESTS: usize = 4_000;

/// Fleet, policy and workload flags shared by `demo`, `replay` and `simulate`.
#[derive(Debug, Clone, Args)]
pub struct FleetArgs {
    /// Workers per DC.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Data-parallel ranks per worker.
    #[arg(long, default_value_t = 2)]
    pub ranks: usize,
    /// KV capacity of one rank, in the workload's blocks (a Mooncake trace's 512-token prefix
    /// blocks; the zmq feed hands each to its engine as one KV block): LRU eviction beyond it.
    #[arg(long, default_value_t = 1_024)]
    pub capacity: usize,
    /// Routing policy of the live run of `demo` and `replay` (`simulate` compares every
    /// policy and ignores it; so does every report, on the serving model). expected-ttft runs
    /// live only in `ckf demo` with the zmq feed: routed by the indexer's Route on the load the
    /// producers scrape from the simulated engines, with the requests sent on the workload's
    /// clock (timestamps / --speed).
    #[arg(long, value_enum, default_value_t = Policy::DeepestPrefix)]
    pub policy: Policy,
    /// Replay at most this many requests (default: all of a trace; 4000 of the built-in
    /// workload).
    #[arg(long)]
    pub limit: Option<usize>,
    /// Seed of the random policy and of the synthetic workload.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Print the report as JSON (and no progress bar).
    #[arg(long)]
    pub json: bool,
    /// The serving model of the policy comparison.
    #[command(flatten)]
    pub serving: ServingArgs,
}

/// The serving model's flags (see [`crate::bench::sim`]).
#[derive(Debug, Clone, Args)]
pub struct ServingArgs {
    /// Prefill tokens/s of each DC's pool, one per DC in DC order, comma-separated (a live
    /// expected-ttft run configures the producers' workers with them)
    /// [default: 64000 for the 1st, 3rd, ... DC, 32000 for the 2nd, 4th, ...].
    #[arg(long, value_delimiter = ',', value_name = "TOKENS_PER_S,...")]
    pub dc_prefill_tokens_per_s: Vec<f64>,
    /// Round trip from the router to each DC in milliseconds, one per DC, comma-separated (a
    /// live expected-ttft run sends them with every Route)
    /// [default: 2 for the first DC, 280 for the last, 40 for the others].
    #[arg(long, value_delimiter = ',', value_name = "MS,...")]
    pub dc_rtt_ms: Vec<f64>,
    /// Replay arrivals this many times faster than the workload's timestamps (on the serving
    /// model; a live expected-ttft run also sends its requests at those times).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub speed: f64,
    /// How often each pool's load is observed for expected-ttft, milliseconds (1..=3600000);
    /// in a live expected-ttft run also the producers' scrape interval (100..=60000).
    #[arg(
        long,
        default_value_t = 1_000.0,
        value_name = "MS",
        allow_negative_numbers = true
    )]
    pub load_interval_ms: f64,
    /// The route model's prefill work of one queued request, tokens [default: the workload's
    /// mean prompt length, as an operator would set `route.queued_request_tokens` from their
    /// traffic].
    #[arg(long, allow_negative_numbers = true)]
    pub queued_request_tokens: Option<f64>,
}

impl ServingArgs {
    /// The serving model for `dcs` DCs serving `requests`: the defaults, with the given values
    /// in their place.
    ///
    /// # Errors
    /// A list whose length is not `dcs`, or a value out of range, named.
    pub fn model(&self, dcs: usize, requests: &[Request]) -> Result<ServingModel, String> {
        let mut model = ServingModel::unequal(dcs);
        for (flag, list) in [
            ("--dc-prefill-tokens-per-s", &self.dc_prefill_tokens_per_s),
            ("--dc-rtt-ms", &self.dc_rtt_ms),
        ] {
            if !list.is_empty() && list.len() != dcs {
                return Err(format!(
                    "{flag} has {} values for {dcs} DCs: give one per DC",
                    list.len()
                ));
            }
        }
        for (i, dc) in model.dcs.iter_mut().enumerate() {
            *dc = DcServing {
                prefill_tokens_per_s: self
                    .dc_prefill_tokens_per_s
                    .get(i)
                    .copied()
                    .unwrap_or(dc.prefill_tokens_per_s),
                rtt_ms: self.dc_rtt_ms.get(i).copied().unwrap_or(dc.rtt_ms),
            };
        }
        model.speed = self.speed;
        model.load_interval_ms = self.load_interval_ms;
        model.queued_request_tokens = self.queued_request_tokens.unwrap_or_else(|| {
            let mean = requests.iter().map(|r| r.input_length as f64).sum::<f64>()
                / requests.len().max(1) as f64;
            mean.clamp(1.0, 1e9)
        });
        model.validate(dcs)?;
        Ok(model)
    }
}

impl FleetArgs {
    /// The fleet shape for `dcs` DCs.
    pub fn shape(&self, dcs: usize) -> FleetShape {
        FleetShape {
            dcs,
            workers_per_dc: self.workers,
            ranks_per_worker: self.ranks,
            capacity_blocks: self.capacity,
        }
    }
}

/// Timeouts of a live replay.
#[derive(Debug, Clone, Args)]
pub struct TimeoutArgs {
    /// Seconds to wait for every DC's lane to be ready before replaying (and, for a live
    /// expected-ttft run, this plus one load interval for every DC's first load report).
    #[arg(long, default_value_t = 30)]
    pub ready_timeout_s: u64,
    /// Milliseconds a visibility probe polls before giving up.
    #[arg(long, default_value_t = 2_000)]
    pub probe_timeout_ms: u64,
    /// Seconds the final drain waits for each DC.
    #[arg(long, default_value_t = 30)]
    pub settle_timeout_s: u64,
}

/// How `ckf demo` feeds its producers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FeedKind {
    /// Built-in vLLM engine publishers over ZMQ (tokens, engine hashes, the producers
    /// translate), queries by tokens (`FindMatchesByTokens`).
    Zmq,
    /// `Ingest/PublishBatch` over gRPC with canonical block hashes, queries by hashes.
    Grpc,
}

/// `ckf replay`.
#[derive(Debug, Clone, Args)]
pub struct ReplayArgs {
    /// The Mooncake JSONL trace.
    #[arg(long)]
    pub trace: PathBuf,
    /// The indexer's gRPC endpoint, e.g. http://127.0.0.1:7400.
    #[arg(long)]
    pub indexer: String,
    /// The indexer domain (model) the queries are for, sent as `ckf-domain` metadata (an
    /// indexer serving another refuses) [default: none, the indexer's own].
    #[arg(long, value_name = "DOMAIN")]
    pub domain: Option<String>,
    /// One producer per DC as DC=URL (e.g. dc-a=http://127.0.0.1:7500); repeat per DC. The DC
    /// id must match the indexer manifest's; the order is the DC order of the report.
    #[arg(long = "producer", value_name = "DC=URL", required = true, value_parser = parse_producer)]
    pub producers: Vec<(String, String)>,
    /// A producer's Prometheus endpoint as DC=HOST:PORT (optional, repeat per DC); with one
    /// for every DC the report adds the relay (producer -> indexer) bytes per event.
    #[arg(long = "producer-metrics", value_name = "DC=HOST:PORT", value_parser = parse_producer)]
    pub producer_metrics: Vec<(String, String)>,
    /// TLS toward the https:// URLs among --indexer and --producer (http:// ones stay
    /// plaintext; at least one must be https:// when these flags are given).
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Send `authorization: Bearer <token>` with the token in FILE on every Query call: the
    /// indexer's `auth.query_token_file`.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Send `authorization: Bearer <token>` with the token in FILE on every Ingest call: the
    /// token of an `[[ingest_auth.sources]]` entry of every producer with `source_ids = ["*"]`
    /// and `workers = ["*"]` (the replay names its sources afresh on every run,
    /// `ckf-replay-<run>/<dc>/...`, and touches every worker of the fleet).
    #[arg(long, value_name = "FILE")]
    pub ingest_token_file: Option<PathBuf>,
    /// Fleet, policy and output.
    #[command(flatten)]
    pub fleet: FleetArgs,
    /// Timeouts.
    #[command(flatten)]
    pub timeouts: TimeoutArgs,
}

/// `ckf simulate`.
#[derive(Debug, Clone, Args)]
pub struct SimulateArgs {
    /// A Mooncake JSONL trace (default: the built-in synthetic workload).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Data centers, 1..=16.
    #[arg(long, default_value_t = DEFAULT_DCS)]
    pub dcs: usize,
    /// Fleet, policy and output.
    #[command(flatten)]
    pub fleet: FleetArgs,
}

/// Which Query RPC `ckf load` drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LoadMode {
    /// `FindMatches`: one query per request.
    Unary,
    /// `FindMatchesBatch`: `--batch` queries per request.
    Batch,
    /// `FindMatchesStream`: one stream per in-flight sender, `--batch` queries per message.
    Stream,
    /// `FindMatchesByTokens`: each query's blocks as `--block-size` token ids each.
    Tokens,
    /// `grpc.health.v1.Health/Check` of `ckf.v1.Query` on the same server, one per request:
    /// no search, so its CPU per call is the floor of a unary RPC there (the baseline for
    /// `unary`).
    Health,
}

impl LoadMode {
    /// The flag value (and the report's `mode`).
    pub fn name(self) -> &'static str {
        match self {
            LoadMode::Unary => "unary",
            LoadMode::Batch => "batch",
            LoadMode::Stream => "stream",
            LoadMode::Tokens => "tokens",
            LoadMode::Health => "health",
        }
    }
}

/// `ckf load`.
#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    /// The indexer's Query endpoint, e.g. http://127.0.0.1:7400.
    #[arg(long)]
    pub indexer: String,
    /// The indexer domain (model) the queries are for, sent as `ckf-domain` metadata (an
    /// indexer serving another refuses) [default: none, the indexer's own].
    #[arg(long, value_name = "DOMAIN")]
    pub domain: Option<String>,
    /// TLS toward the indexer.
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Send `authorization: Bearer <token>` with the token in FILE (one line): the indexer's
    /// `auth.query_token_file`.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Which RPC to drive.
    #[arg(long, value_enum, default_value_t = LoadMode::Unary)]
    pub mode: LoadMode,
    /// Queries per message in batch and stream modes (at most the indexer's
    /// limits.max_query_batch).
    #[arg(long, default_value_t = 64, value_name = "QUERIES")]
    pub batch: usize,
    /// Messages in flight at once (closed loop), or senders (open loop).
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub concurrency: usize,
    /// HTTP/2 connections the senders are spread over (round-robin).
    #[arg(long, default_value_t = 1, value_name = "C")]
    pub connections: usize,
    /// Open loop: queries per second, sent on schedule whatever the answers do; latency counts
    /// from each message's due time (no coordinated omission).
    #[arg(long, value_name = "QPS")]
    pub rate: Option<f64>,
    /// How long to send: seconds (10, 2.5s) or 500ms [default: 10 s unless --requests].
    #[arg(long, value_parser = crate::duration::parse_duration)]
    pub duration: Option<std::time::Duration>,
    /// Stop after this many messages (requests; each carries --batch queries in batch and
    /// stream modes), or at --duration if that comes first.
    #[arg(long, value_name = "MESSAGES")]
    pub requests: Option<u64>,
    /// Queries from a Mooncake JSONL trace (default: the built-in synthetic workload).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Distinct queries taken from the workload (cycled) [default: all of a trace; 4000
    /// synthetic ones].
    #[arg(long)]
    pub limit: Option<usize>,
    /// Seed of the synthetic workload.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Tokens per block in tokens mode (the indexer's block size, so the hashes it computes
    /// are those of real blocks).
    #[arg(long, default_value_t = 16, value_name = "TOKENS")]
    pub block_size: u32,
    /// The indexer's process id, for its CPU time per query (default: the process listening on
    /// the URL's port when the URL is on this host).
    #[arg(long, value_name = "PID")]
    pub indexer_pid: Option<u32>,
    /// Print the summary as JSON (and no progress bar).
    #[arg(long)]
    pub json: bool,
}

/// Parses `DC=URL`.
pub(crate) fn parse_producer(s: &str) -> Result<(String, String), String> {
    let (dc, url) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected DC=URL"))?;
    if dc.is_empty() || url.is_empty() {
        return Err(format!("`{s}`: expected DC=URL with both parts non-empty"));
    }
    Ok((dc.to_string(), url.to_string()))
}
