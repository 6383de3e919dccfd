//! msgpack decoding of engine `EventBatch` payloads.
//!
//! The decoder walks the payload's bytes once, token by token (markers classified by
//! [`rmp::Marker`]), instead of building a generic value tree first: every limit binds before
//! anything is allocated for it, a value of the wrong type is skipped in place so the rest of
//! the batch still decodes, and an `extra_keys` entry of unknown shape can be hashed over its
//! exact msgpack bytes. The rules (batch and event shapes, block hashes, extra keys) are in the
//! docs/engine-wire.md; the field names and orders are those of vLLM's and SGLang's
//! `kv_events.py` msgspec structs, and TensorRT-LLM's wire structs (its `pyexecutor`
//! `kv_cache_events` module: tagged-map events with `mm_keys`, `lora_id` without `lora_name`,
//! token ids that may be strings, an item's digest in place of its first token id: see
//! [`IMAGE_DIGEST_TOKEN`]).
//!
//! | file | owns |
//! | --- | --- |
//! | `wire/limits.rs` | [`DecodeLimits`], [`DecodeError`] |
//! | `wire/reader.rs` | the msgpack token reader: one token at a time, depth and size bounds |
//! | `wire/batch.rs` | [`decode_batch`]: the envelope and its events array |
//! | `wire/event.rs` | one event (map or array) and each of its fields; [`MAX_KIND_BYTES`] |
//! | `wire/fields.rs` | field names and positional orders, the fields read, the event built from them |
//! | `wire/values.rs` | one typed value (string, int, hash, hash list, array header) |
//! | `wire/tokens.rs` | token ids, [`IMAGE_DIGEST_TOKEN`] |
//! | `wire/extras.rs` | `extra_keys` and `mm_keys` into a block's extras |

mod batch;
mod event;
mod extras;
mod fields;
mod limits;
mod reader;
mod tokens;
mod values;

pub use batch::decode_batch;
pub use event::MAX_KIND_BYTES;
pub use limits::{DecodeError, DecodeLimits};
pub use tokens::IMAGE_DIGEST_TOKEN;

#[cfg(test)]
mod tests;
