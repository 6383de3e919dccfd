//! # ckf-cli
//!
//! The `ckf` command: replays prefix-cache workloads through ckf-relay producers and an indexer
//! and reports routing quality, accuracy against an exact oracle, speed and cost; plus the
//! operator's `query`, `load`, `lanes`, `health` and `certs` commands.
//!
//! | module | owns |
//! | --- | --- |
//! | [`trace`] | Mooncake JSONL trace parsing and validation (line + field errors) |
//! | [`synth`] | the built-in deterministic synthetic workload |
//! | [`hashing`] | `hash_ids` -> chained 64-bit sequence block hashes (the documented rule) |
//! | [`fleet`] | D DCs x W workers x R ranks, LRU prefix caches, KV events per serve |
//! | [`oracle`] | exact per-DC block holdings: the truth answers are judged against |
//! | [`policy`] | `ckf`, `random`, `round-robin` DC choice |
//! | [`sim`] | offline replays (oracle as index) for policy comparison |
//! | [`stats`] | percentile summaries (`hdrhistogram`) |
//! | [`events`] | a serve's KV events as a `ckf.v1` batch; per-source sequences |
//! | [`probe`] | visibility probes: event-to-visible lag and per-DC watermarks |
//! | [`feed`] | `--feed zmq`: trace block ids -> tokens, canonical hashes, vLLM events with engine hashes |
//! | [`publisher`] | a built-in engine publisher: vLLM's ZMQ PUB + ROUTER replay protocol |
//! | [`accuracy`] | judging answers against the oracle (over/under-estimates by cause) |
//! | [`load`] | `ckf load`: closed / open loop load on the Query RPCs, HDR latency summary, indexer CPU per query from `/proc` |
//! | [`live`] | the live replay driver against producers and an indexer |
//! | [`report`] | the report (text and JSON) |
//! | [`scrape`] | one counter from a Prometheus `/metrics` endpoint (relay bytes), via `ckf_svc_kit::scrape` |
//! | [`demo`] | in-process indexer + producers on loopback for `ckf demo` |
//! | [`certs`] | `ckf certs`: development CA, indexer / producer / query certificates, token files (rcgen) |
//! | [`cli`], [`commands`] | flags, and running each subcommand |

pub mod accuracy;
pub mod certs;
pub mod cli;
pub mod commands;
pub mod demo;
pub mod events;
pub mod feed;
pub mod fleet;
pub mod hashing;
pub mod live;
pub mod load;
pub mod oracle;
pub mod policy;
pub mod probe;
pub mod publisher;
pub mod report;
pub mod scrape;
pub mod sim;
pub mod stats;
pub mod synth;
pub mod trace;
