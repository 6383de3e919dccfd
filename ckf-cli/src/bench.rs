//! The benchmark tools: `ckf replay` (a workload through live producers and an indexer),
//! `ckf simulate` (every policy offline, the oracle as index, timed by the serving model) and
//! `ckf load` (load on the
//! Query RPCs), with what they are made of.
//!
//! | module | owns |
//! | --- | --- |
//! | [`args`] | the flags of `replay`, `simulate`, `load` and the fleet / timeout / feed flags `demo` shares |
//! | [`replay`] | `ckf replay` and `ckf simulate`: workload, live configuration, report printing |
//! | [`load`] | `ckf load`: closed / open loop load on the Query RPCs, HDR latency summary, indexer CPU per query from `/proc` |
//! | [`trace`] | Mooncake JSONL trace parsing and validation (line + field errors) |
//! | [`synth`] | the built-in deterministic synthetic workload |
//! | [`fleet`] | D DCs x W workers x R ranks, LRU prefix caches, KV events per serve |
//! | [`oracle`] | exact per-DC block holdings: the truth answers are judged against |
//! | [`policy`] | `deepest-prefix`, `random`, `round-robin`, `least-loaded`, `expected-ttft` DC choice |
//! | [`sim`] | offline replays (oracle as index) timed by the serving model: hit rate and time to first token per policy |
//! | [`live`] | the live replay driver against producers and an indexer |
//! | [`events`] | a serve's KV events as a `ckf.v1` batch; per-source sequences |
//! | [`probe`] | visibility probes: event-to-visible lag and per-DC watermarks |
//! | [`feed`] | `--feed zmq`: trace block ids -> tokens, canonical hashes, vLLM events with engine hashes |
//! | [`publisher`] | a built-in engine publisher: vLLM's ZMQ PUB + ROUTER replay protocol |
//! | [`accuracy`] | judging answers against the oracle (over/under-estimates by cause) |
//! | [`stats`] | latency histograms and percentile summaries (`hdrhistogram`) |
//! | [`report`] | the report (text and JSON) |
//! | [`scrape`] | one counter from a Prometheus `/metrics` endpoint (relay bytes), via `ckf_svc_kit::scrape` |

pub mod accuracy;
pub mod args;
pub mod events;
pub mod feed;
pub mod fleet;
pub mod live;
pub mod load;
pub mod oracle;
pub mod policy;
pub mod probe;
pub mod publisher;
pub mod replay;
pub mod report;
pub mod scrape;
pub mod sim;
pub mod stats;
pub mod synth;
pub mod trace;
