//! ZMQ ingestion of inference engines' KV events (vLLM, SGLang, TensorRT-LLM publishers).
//!
//! | file | owns |
//! | --- | --- |
//! | [`config`] | `[engine]`, `[[engines]]`, `--engine` specs, their validation, ranks -> endpoints |
//! | [`publisher`] | one task per publisher socket (engine x dp rank): SUB, replay DEALER, frames -> actor |
//! | [`guard`] | the loopback proxy that bounds every engine connection's ZMTP frames before zeromq reads them |
//! | [`load`] | each engine's load scraped from its `metrics_url`, the pool's sum (`ckf_producer_pool_*`) |
//! | [`metrics`] | `ckf_producer_engine_*` and `ckf_producer_pool_*` metrics |
//!
//! The rules are `ckf-engine`'s: each message is read and handed to the sequence rule by
//! [`ckf_engine::intake`]; in the state actor, [`ckf_engine::feed`] translates each batch
//! (filters, lineage) and applies it to the state. The tasks here only move bytes, execute
//! the sequence rule's actions and count what the rules found.

pub mod config;
pub mod guard;
pub mod load;
pub mod metrics;
pub mod publisher;

use std::time::Duration;

use ckf_engine::event::EngineBatch;
use ckf_engine::sequence::ClearReason;

/// One publisher socket as the actor sees it: who it feeds and its metric labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublisherId {
    /// The engine's worker id.
    pub worker_id: u64,
    /// The socket's dp rank (the member's rank when a batch names none).
    pub rank: u32,
    /// `"worker/rank"`.
    pub label: String,
    /// The rank's PUB endpoint.
    pub endpoint: String,
}

impl PublisherId {
    /// The socket as the engine feed keys it: `(worker_id, rank)`.
    pub fn key(&self) -> ckf_engine::feed::PublisherKey {
        (self.worker_id, self.rank)
    }

    /// `[publisher, endpoint]` label values.
    pub fn labels(&self) -> [&str; 2] {
        [&self.label, &self.endpoint]
    }
}

/// What a publisher task asks the state actor to do.
#[derive(Debug)]
pub enum EngineStep {
    /// Translate (lineage) and apply one decoded batch, in order; `sequence` becomes the
    /// publisher's last applied sequence, which a restarted producer resumes after
    /// ([`ckf_engine::sequence::PublisherSequence::resume`]).
    Apply {
        /// The batch's sequence number (the engine's, per PUB socket).
        sequence: i64,
        /// The decoded batch.
        batch: EngineBatch,
    },
    /// Clear every member this publisher fed, in the state and the lineage.
    Clear(ClearReason),
}

/// Settings of every publisher task (from `[engine]`).
#[derive(Debug, Clone)]
pub struct EngineSettings {
    /// Bounds on every message (`engine.max_frame_bytes` is its size bound).
    pub intake: ckf_engine::intake::IntakeLimits,
    /// Replay deadline (without a reply).
    pub replay_timeout: Duration,
    /// Silence after which the last applied batch is verified again; `None` never.
    pub verify_idle: Option<Duration>,
    /// Live batches buffered while a replay runs.
    pub max_buffered_batches: usize,
}
