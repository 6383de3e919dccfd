//! Command-line definitions (configuration only; [`crate::operator`] and [`crate::bench`] run
//! them).

use std::path::PathBuf;

use clap::{ArgGroup, Args, Parser, Subcommand};

use crate::bench::fleet::FleetShape;
use crate::bench::policy::Policy;

/// Default DCs of `ckf demo` and `ckf simulate`.
pub const DEFAULT_DCS: usize = 3;
/// Default requests of the built-in synthetic workload.
pub const DEFAULT_SYNTHETIC_REQUESTS: usize = 4_000;

/// `ckf`: replay prefix-cache workloads through ckf-relay and inspect a running indexer.
#[derive(Debug, Parser)]
#[command(name = "ckf", version, about, long_about = None)]
pub struct Cli {
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start 1 indexer + one producer per DC in-process on loopback, replay a workload (built-in
    /// synthetic, or --trace), print the report, exit 0.
    Demo(DemoArgs),
    /// Replay a Mooncake JSONL trace against running producers and an indexer.
    Replay(ReplayArgs),
    /// Offline: compare routing policies on a workload with the exact oracle as the index (no
    /// services).
    Simulate(SimulateArgs),
    /// Prefix depth per DC for a block-hash sequence, or for a request's token ids (--tokens,
    /// --tokens-file: the indexer computes the canonical hashes, proto/TOKEN_HASH.md).
    Query(QueryArgs),
    /// Load generator for the indexer's Query service: closed loop (N in flight over C
    /// connections) or open loop (--rate), unary / batch / stream / tokens / health; QPS, latency
    /// percentiles, errors by status, the indexer's CPU per query.
    Load(LoadArgs),
    /// The indexer's lane table.
    Lanes(LanesArgs),
    /// gRPC health check (grpc.health.v1): exit 0 when SERVING, 1 otherwise, 2 when unreachable.
    Health(HealthArgs),
    /// Where an ingest source stands at a producer (Ingest.GetSourceSequence): the last batch
    /// sequence applied and the next one expected, in one line.
    SourceSequence(SourceSequenceArgs),
    /// Create a development CA, the indexer's and every pool's certificates, and bearer token
    /// files (for compose, Kubernetes and local TLS; not a production PKI).
    Certs(crate::operator::certs::CertsArgs),
}

/// Client TLS flags of every command that connects (`https://` URLs need `--ca`).
#[derive(Debug, Clone, Default, Args)]
pub struct TlsArgs {
    /// CA bundle (PEM) the server certificate is verified against; required for https://.
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// Client certificate (PEM) for servers that require one (mutual TLS); needs --key.
    #[arg(long, value_name = "FILE", requires = "key", requires = "ca")]
    pub cert: Option<PathBuf>,
    /// Private key (PEM) of --cert.
    #[arg(long, value_name = "FILE", requires = "cert")]
    pub key: Option<PathBuf>,
    /// Name checked in the server certificate instead of the URL's host.
    #[arg(long, value_name = "NAME", requires = "ca")]
    pub server_name: Option<String>,
}

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
    /// Routing policy of the live run (the report also compares the others offline).
    #[arg(long, value_enum, default_value_t = Policy::Ckf)]
    pub policy: Policy,
    /// Replay at most this many requests (default: all of a trace; 4000 synthetic ones).
    #[arg(long)]
    pub limit: Option<usize>,
    /// Seed of the random policy and of the synthetic workload.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Print the report as JSON (and no progress bar).
    #[arg(long)]
    pub json: bool,
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
    /// Seconds to wait for every DC's lane to be ready before replaying.
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

/// `ckf demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// How the producers get KV events.
    #[arg(long, value_enum, default_value_t = FeedKind::Zmq)]
    pub feed: FeedKind,
    /// A Mooncake JSONL trace to replay instead of the built-in synthetic workload.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Data centers (one producer and one indexer lane each), 1..=16.
    #[arg(long, default_value_t = DEFAULT_DCS)]
    pub dcs: usize,
    /// Fleet, policy and output.
    #[command(flatten)]
    pub fleet: FleetArgs,
    /// Timeouts.
    #[command(flatten)]
    pub timeouts: TimeoutArgs,
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

/// `ckf query`.
#[derive(Debug, Clone, Args)]
#[command(group(ArgGroup::new("by_tokens").args(["tokens", "tokens_file"])))]
pub struct QueryArgs {
    /// The indexer's gRPC endpoint.
    #[arg(long)]
    pub indexer: String,
    /// TLS toward the indexer.
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Send `authorization: Bearer <token>` with the token in FILE (one line): the indexer's
    /// `auth.query_token_file`.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Treat the arguments as trace `hash_ids` and chain them into block hashes first.
    #[arg(long, conflicts_with = "by_tokens")]
    pub ids: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Query by token ids (FindMatchesByTokens): comma-separated u32 ids in request order.
    #[arg(long, value_name = "ID,ID,...", value_parser = parse_token_list)]
    pub tokens: Option<TokenList>,
    /// Query by the token ids in FILE (u32 ids separated by whitespace and/or commas).
    #[arg(long, value_name = "FILE")]
    pub tokens_file: Option<PathBuf>,
    /// LoRA adapter name of the token query (request-wide).
    #[arg(long, value_name = "NAME", requires = "by_tokens")]
    pub lora: Option<String>,
    /// Cache salt (cache namespace) of the token query (request-wide).
    #[arg(long, value_name = "SALT", requires = "by_tokens")]
    pub salt: Option<String>,
    /// A multimodal item of the token query, IDENTIFIER:OFFSET:LENGTH (token positions
    /// [OFFSET, OFFSET+LENGTH) of the request); repeatable.
    #[arg(long = "mm", value_name = "ID:OFFSET:LENGTH", value_parser = parse_mm_item, requires = "by_tokens")]
    pub multimodal: Vec<MmItem>,
    /// Tokens per block the token query assumes; must equal the indexer's (default: the
    /// indexer's).
    #[arg(long, value_name = "TOKENS", requires = "by_tokens")]
    pub block_size: Option<u32>,
    /// Block hashes in prefix order (decimal or 0x-hex), or ids with --ids.
    #[arg(
        required_unless_present = "by_tokens",
        conflicts_with = "by_tokens",
        value_parser = parse_u64
    )]
    pub hashes: Vec<u64>,
}

/// Token ids parsed from `--tokens` or `--tokens-file` (clap needs one named type per value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenList(pub Vec<u32>);

/// One `--mm` item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MmItem {
    /// The identifier (vLLM 64-hex digest or any other non-empty text).
    pub identifier: String,
    /// First token position.
    pub offset: u64,
    /// Token positions occupied.
    pub length: u64,
}

/// Token ids separated by commas and/or whitespace (`--tokens`, `--tokens-file`).
///
/// # Errors
/// Names the first id that is not a `u32` (with its 1-based position), or says the list is
/// empty.
pub fn parse_token_list(text: &str) -> Result<TokenList, String> {
    let ids = text
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .enumerate()
        .map(|(i, s)| {
            s.parse::<u32>().map_err(|e| {
                format!(
                    "token id #{} `{s}` is not a u32 (0..=4294967295): {e}",
                    i + 1
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if ids.is_empty() {
        return Err("no token ids (expected u32 ids separated by commas or whitespace)".into());
    }
    Ok(TokenList(ids))
}

fn parse_mm_item(text: &str) -> Result<MmItem, String> {
    // The identifier may itself contain ':', so split from the right.
    let mut parts = text.rsplitn(3, ':');
    let (Some(length), Some(offset), Some(identifier)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("`{text}`: expected IDENTIFIER:OFFSET:LENGTH"));
    };
    if identifier.is_empty() {
        return Err(format!("`{text}`: the identifier is empty"));
    }
    let number = |what: &str, s: &str| {
        s.parse::<u64>()
            .map_err(|e| format!("`{text}`: {what} `{s}` is not a u64 ({e})"))
    };
    Ok(MmItem {
        identifier: identifier.to_owned(),
        offset: number("offset", offset)?,
        length: number("length", length)?,
    })
}

/// Which Query RPC `ckf load` drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LoadMode {
    /// `FindMatches`: one query per request.
    Unary,
    /// `FindMatchesBatch`: `--batch` queries per request.
    Batch,
    /// `FindMatchesStream`: one stream per in-flight slot, `--batch` queries per message.
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
    /// Messages in flight at once (closed loop), or sending slots (open loop).
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub concurrency: usize,
    /// HTTP/2 connections the slots are spread over (round-robin).
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

/// `ckf lanes`.
#[derive(Debug, Clone, Args)]
pub struct LanesArgs {
    /// The indexer's gRPC endpoint.
    #[arg(long)]
    pub indexer: String,
    /// TLS toward the indexer.
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Send `authorization: Bearer <token>` with the token in FILE (one line): the indexer's
    /// `auth.query_token_file`.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `ckf source-sequence`.
#[derive(Debug, Clone, Args)]
pub struct SourceSequenceArgs {
    /// The producer's Ingest gRPC endpoint, e.g. http://127.0.0.1:7501.
    #[arg(long)]
    pub producer: String,
    /// The source id (`KvEventBatch.source_id`) to look up.
    #[arg(long, value_name = "ID")]
    pub source: String,
    /// TLS toward the producer.
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Send `authorization: Bearer <token>` with the token in FILE (one line): the token of an
    /// `[[ingest_auth.sources]]` entry whose `source_ids` hold the source.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Print JSON (one line).
    #[arg(long)]
    pub json: bool,
}

/// `ckf health`.
#[derive(Debug, Clone, Args)]
pub struct HealthArgs {
    /// The server's gRPC endpoint, e.g. http://127.0.0.1:7400.
    #[arg(long)]
    pub endpoint: String,
    /// TLS toward the server.
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Service name to check; empty = the whole server.
    #[arg(long, default_value = "")]
    pub service: String,
    /// Give up after this many milliseconds (connect + check).
    #[arg(long, default_value_t = 3_000)]
    pub timeout_ms: u64,
}

/// Parses `DC=URL`.
fn parse_producer(s: &str) -> Result<(String, String), String> {
    let (dc, url) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected DC=URL"))?;
    if dc.is_empty() || url.is_empty() {
        return Err(format!("`{s}`: expected DC=URL with both parts non-empty"));
    }
    Ok((dc.to_string(), url.to_string()))
}

/// Parses a decimal or `0x`-hex `u64`.
fn parse_u64(s: &str) -> Result<u64, String> {
    let parsed = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    parsed.map_err(|e| format!("`{s}`: not a 64-bit unsigned integer ({e})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn producers_and_hashes_parse() {
        let cli = Cli::try_parse_from([
            "ckf",
            "replay",
            "--trace",
            "t.jsonl",
            "--indexer",
            "http://i:1",
            "--producer",
            "dc-a=http://a:1",
            "--producer",
            "dc-b=http://b:1",
            "--capacity",
            "64",
        ])
        .unwrap();
        let Command::Replay(r) = cli.command else {
            panic!("replay")
        };
        assert_eq!(r.producers[1], ("dc-b".into(), "http://b:1".into()));
        assert_eq!(r.fleet.capacity, 64);
        assert_eq!(r.fleet.workers, 2);
        assert!(parse_producer("nourl").is_err());
        assert_eq!(parse_u64("0x10"), Ok(16));
        assert!(parse_u64("-1").is_err());
    }

    #[test]
    fn source_sequence_needs_a_producer_and_a_source() {
        let cli = Cli::try_parse_from([
            "ckf",
            "source-sequence",
            "--producer",
            "http://p:1",
            "--source",
            "router-1",
            "--token-file",
            "t",
        ])
        .unwrap();
        let Command::SourceSequence(s) = cli.command else {
            panic!("source-sequence")
        };
        assert_eq!(
            (s.producer.as_str(), s.source.as_str()),
            ("http://p:1", "router-1")
        );
        assert!(!s.json);
        for bad in [
            &["--producer", "http://p:1"][..],
            &["--source", "s"],
            &["--producer", "http://p:1", "--source", "s", "--cert", "c"],
        ] {
            let args = ["ckf", "source-sequence"].iter().chain(bad);
            assert!(Cli::try_parse_from(args).is_err(), "{bad:?} accepted");
        }
    }

    fn query(args: &[&str]) -> Result<QueryArgs, clap::Error> {
        let cli = Cli::try_parse_from(
            ["ckf", "query", "--indexer", "http://i:1"]
                .iter()
                .chain(args),
        )?;
        let Command::Query(q) = cli.command else {
            panic!("query")
        };
        Ok(q)
    }

    #[test]
    fn token_lists_parse_with_commas_and_whitespace_and_name_bad_ids() {
        assert_eq!(
            parse_token_list("1,2, 3\n4\t4294967295,,"),
            Ok(TokenList(vec![1, 2, 3, 4, u32::MAX]))
        );
        let err = parse_token_list("1,2,x").unwrap_err();
        assert!(err.contains("token id #3 `x` is not a u32"), "{err}");
        let err = parse_token_list("4294967296").unwrap_err();
        assert!(err.contains("#1 `4294967296`"), "{err}");
        assert!(parse_token_list("-1").is_err());
        assert!(
            parse_token_list(" , \n")
                .unwrap_err()
                .contains("no token ids")
        );
    }

    #[test]
    fn token_queries_take_their_options_and_refuse_mixed_input() {
        let q = query(&[
            "--tokens",
            "1,2,3",
            "--lora",
            "l",
            "--salt",
            "s",
            "--block-size",
            "16",
            "--mm",
            "a:b:c:5:7",
        ])
        .unwrap();
        assert_eq!(q.tokens, Some(TokenList(vec![1, 2, 3])));
        assert_eq!(q.lora.as_deref(), Some("l"));
        assert_eq!(q.salt.as_deref(), Some("s"));
        assert_eq!(q.block_size, Some(16));
        assert_eq!(
            q.multimodal,
            vec![MmItem {
                identifier: "a:b:c".into(),
                offset: 5,
                length: 7
            }]
        );
        assert!(query(&["--tokens-file", "f.txt"]).is_ok());
        assert!(query(&["7", "8"]).is_ok());
        // Hashes and tokens together, tokens with --ids, token options without tokens, two
        // token sources, and no input at all are refused by the parser.
        for bad in [
            &["--tokens", "1", "7"][..],
            &["--tokens", "1", "--ids"],
            &["--lora", "l", "7"],
            &["--block-size", "16", "7"],
            &["--tokens", "1", "--tokens-file", "f"],
            &[],
            &["--tokens", "1,x"],
            &["--tokens", "1", "--mm", "img:1"],
            &["--tokens", "1", "--mm", ":1:2"],
        ] {
            assert!(query(bad).is_err(), "{bad:?} accepted");
        }
    }
}
