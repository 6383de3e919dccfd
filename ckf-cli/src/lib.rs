//! # ckf-cli
//!
//! The `ckf` command, three tools in one binary:
//! * the **operator commands** ([`operator`]): `query`, `lanes`, `source-sequence`, `health`
//!   against running services, and `certs` for development certificates;
//! * the **benchmark tools** ([`bench`](mod@bench)): `replay` and `simulate` (prefix-cache workloads
//!   through ckf-relay producers and an indexer, judged against an exact oracle), and `load`
//!   (load on the Query RPCs);
//! * the **demo** ([`demo`]): an in-process indexer and producers on loopback, replayed.
//!
//! | module | owns |
//! | --- | --- |
//! | [`cli`] | the `ckf` command and its subcommands (clap); each command's flags live beside its code |
//! | [`connect`] | the client TLS flags (`TlsArgs`) and the TLS material they name, token files, channels, the hint under a connection error |
//! | [`duration`] | `--duration` parsing |
//! | [`hashing`] | `hash_ids` -> chained 64-bit sequence block hashes (the documented rule) |
//! | [`operator`] | the operator commands, one file each, and `certs` |
//! | [`bench`](mod@bench) | the benchmark tools and what they are made of (trace, fleet, oracle, policies, live replay, load, report) |
//! | [`demo`] | in-process indexer + producers on loopback for `ckf demo` |
//! | [`out`](mod@out) | standard output (`out!`, `outln!`): a reader closing the pipe ends a command quietly |
//!
//! The operator commands and the benchmark tools do not use each other: both use [`connect`]
//! and [`hashing`] (the benchmark tools also [`duration`]); only [`cli`], `main.rs` and [`demo`]
//! see more than one of them.

pub mod bench;
pub mod cli;
pub mod connect;
pub mod demo;
pub mod duration;
pub mod hashing;
pub mod operator;
pub mod out;
