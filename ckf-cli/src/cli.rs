//! Command-line definitions (configuration only; [`crate::commands`] runs them).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::fleet::FleetShape;
use crate::policy::Policy;

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
    /// Prefix depth per DC for a block-hash sequence.
    Query(QueryArgs),
    /// The indexer's lane table.
    Lanes(LanesArgs),
    /// gRPC health check (grpc.health.v1): exit 0 when SERVING, 1 otherwise, 2 when unreachable.
    Health(HealthArgs),
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
    /// KV capacity of one rank, in 512-token blocks (LRU eviction beyond it).
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
pub struct QueryArgs {
    /// The indexer's gRPC endpoint.
    #[arg(long)]
    pub indexer: String,
    /// Treat the arguments as trace `hash_ids` and chain them into block hashes first.
    #[arg(long)]
    pub ids: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Block hashes in prefix order (decimal or 0x-hex), or ids with --ids.
    #[arg(required = true, value_parser = parse_u64)]
    pub hashes: Vec<u64>,
}

/// `ckf lanes`.
#[derive(Debug, Clone, Args)]
pub struct LanesArgs {
    /// The indexer's gRPC endpoint.
    #[arg(long)]
    pub indexer: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `ckf health`.
#[derive(Debug, Clone, Args)]
pub struct HealthArgs {
    /// The server's gRPC endpoint, e.g. http://127.0.0.1:7400.
    #[arg(long)]
    pub endpoint: String,
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
}
