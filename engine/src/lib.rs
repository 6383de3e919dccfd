//! # ckf-engine
//!
//! The rules for taking KV-cache events as inference engines publish them (vLLM, SGLang,
//! TensorRT-LLM over ZMQ), with no sockets and no runtime: the producer service owns the
//! sockets and calls this crate for every decision.
//!
//! | module | owns |
//! | --- | --- |
//! | [`zmtp`] | bounds on the raw ZMTP stream from an engine, checked before the ZMQ library reads it |
//! | [`intake`] | one message from a publisher socket: its size, parts, batch and dp rank checked, then handed to the sequence rule |
//! | [`message`] | ZMQ multipart messages: `[topic, sequence, payload]`, replay replies and end marker |
//! | [`wire`] | msgpack decoding of batches and events (tagged maps and positional arrays) |
//! | [`event`] | decoded engine batches and events, engine block hashes as 64 bits |
//! | [`sequence`] | per publisher socket: the convergence rule (verify, fill, re-read, clear) over live and replayed batches and connection events |
//! | [`feed`] | what a producer keeps between batches (lineage, filters, members fed and last batch per publisher socket); applies each batch to the state |
//! | [`filters`] | which events enter the filter: medium, KV-cache group, block size |
//! | [`lineage`] | per member: engine hash -> canonical hash, turning engine events into `KvEvent`s |
//! | [`load`] | an engine's load (requests running and waiting, KV-cache usage) from its Prometheus text, vLLM and SGLang names |
//! | `encode` | (feature `encode`) the vLLM encoding, for the built-in publisher (`ckf demo`) and tests |
//!
//! A message's path: the producer's socket task calls [`intake`] (which uses [`message`],
//! [`wire`] and [`sequence`]) and sends the batches it returns to the state actor, which calls
//! [`feed`] (which uses [`filters`] and [`lineage`]) to apply them to `ckf_core::dc::DcCkfState`.

#[cfg(feature = "encode")]
pub mod encode;
pub mod event;
pub mod feed;
pub mod filters;
pub mod intake;
pub mod lineage;
pub mod load;
pub mod message;
pub mod sequence;
pub mod wire;
pub mod zmtp;
