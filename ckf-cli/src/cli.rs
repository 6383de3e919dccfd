//! The `ckf` command line: the subcommands, each with the flags defined beside the code that
//! runs it ([`crate::operator::args`], [`crate::bench::args`], [`crate::demo::DemoArgs`],
//! [`crate::operator::certs::CertsArgs`]). Configuration only; nothing here runs a command.

use clap::{Parser, Subcommand};

use crate::bench::args::{LoadArgs, ReplayArgs, SimulateArgs};
use crate::demo::DemoArgs;
use crate::operator::args::{
    HealthArgs, LanesArgs, QueryArgs, ReloadArgs, RouteArgs, SourceSequenceArgs,
};
use crate::operator::certs::CertsArgs;

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
    /// Which DC answers a request first (Query/Route): every ready DC's prefix, load, round trip
    /// and expected time to first token, ranked, and the choice with its reason.
    Route(RouteArgs),
    /// Load generator for the indexer's Query service: closed loop (N in flight over C
    /// connections) or open loop (--rate), unary / batch / stream / tokens / health; QPS, latency
    /// percentiles, errors by status, the indexer's CPU per query.
    Load(LoadArgs),
    /// The indexer's lane table.
    Lanes(LanesArgs),
    /// Ask the indexer to re-read its configuration and apply its catalog of domains and
    /// lanes (Admin/ReloadCatalog; --dry-run: only say what would change).
    ReloadCatalog(ReloadArgs),
    /// gRPC health check (grpc.health.v1): exit 0 when SERVING, 1 otherwise, 2 when unreachable.
    Health(HealthArgs),
    /// Where an ingest source stands at a producer (Ingest.GetSourceSequence): the last batch
    /// sequence applied and the next one expected, in one line.
    SourceSequence(SourceSequenceArgs),
    /// Create a development CA, the indexer's and every pool's certificates, and bearer token
    /// files (for compose, Kubernetes and local TLS; not a production PKI).
    Certs(CertsArgs),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::args::parse_producer;
    use crate::operator::args::{MmItem, TokenList, parse_token_list, parse_u64};

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
