//! Decoded engine batches and events.
//!
//! Shapes follow the KV-event structs of vLLM (`vllm/distributed/kv_events.py`), SGLang
//! (`sglang/srt/disaggregation/kv_events.py`) and TensorRT-LLM (its `pyexecutor`
//! `kv_cache_events` module), with every engine block hash reduced to 64 bits (see
//! [`crate::wire`] for the reduction). TensorRT-LLM's extra fields land in the same shapes:
//! its `mm_keys` in [`BlockExtras::mm_hashes`], a `lora_id` sent without `lora_name` in
//! [`StoredBlocks::lora_name`], token ids sent as decimal strings, and item digests sent in
//! place of token ids, in [`StoredBlocks::token_ids`]. Nothing here is canonical yet: the
//! engine hashes become canonical hashes in [`crate::lineage`].

/// One decoded `EventBatch`: a publisher's payload for one sequence number.
#[derive(Debug, Clone, PartialEq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct EngineBatch {
    /// The batch timestamp, seconds since the Unix epoch (as the engine sent it; 0 when the
    /// engine sent an integer 0).
    pub ts: f64,
    /// The data-parallel rank the batch names (`data_parallel_rank` in vLLM, `attn_dp_rank` in
    /// SGLang), `None` when absent or nil: the producer then uses the socket's own rank.
    pub dp_rank: Option<u32>,
    /// The events that decoded, in the batch order. Malformed events are not here (they are
    /// counted in [`EngineBatch::notes`]).
    pub events: Vec<EngineEvent>,
    /// What the decoder tolerated: unknown fields, unknown event types, skipped events.
    pub notes: DecodeNotes,
}

impl EngineBatch {
    /// The batch's identity for [`crate::sequence`]: a digest of its time stamp, dp rank and
    /// every event's kind and block hashes. A replay repeats a batch byte for byte, so the
    /// same batch always has the same identity; a restarted engine's batch under the same
    /// sequence differs at least by its time stamp. Computed from the decoded batch, so a
    /// producer restored from its journal recomputes it from the batch it journaled.
    pub fn identity(&self) -> u64 {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&self.ts.to_bits().to_le_bytes());
        h.update(&self.dp_rank.map_or(u64::MAX, u64::from).to_le_bytes());
        for event in &self.events {
            let (kind, hashes): (u8, &[u64]) = match event {
                EngineEvent::Stored(s) => (1, &s.block_hashes),
                EngineEvent::Removed(r) => (2, &r.block_hashes),
                EngineEvent::AllCleared => (3, &[]),
                EngineEvent::Unknown { .. } => (4, &[]),
            };
            h.update(&[kind]);
            h.update(&(hashes.len() as u64).to_le_bytes());
            for x in hashes {
                h.update(&x.to_le_bytes());
            }
        }
        h.digest()
    }
}

/// One engine event.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum EngineEvent {
    /// `BlockStored`: the engine now holds these blocks.
    Stored(StoredBlocks),
    /// `BlockRemoved`: the engine evicted these blocks.
    Removed(RemovedBlocks),
    /// `AllBlocksCleared`: the engine dropped every block (of this rank).
    AllCleared,
    /// An event whose type this crate does not know (kept so it can be counted by kind).
    Unknown {
        /// The event's type tag as sent (`"type"` of a map, first element of an array), cut to
        /// [`crate::wire::MAX_KIND_BYTES`].
        kind: String,
    },
}

impl EngineEvent {
    /// A short stable label for metrics: `"stored"`, `"removed"`, `"all_cleared"`,
    /// `"unknown"`.
    pub fn kind_label(&self) -> &'static str {
        match self {
            Self::Stored(_) => "stored",
            Self::Removed(_) => "removed",
            Self::AllCleared => "all_cleared",
            Self::Unknown { .. } => "unknown",
        }
    }
}

/// A `BlockStored` event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct StoredBlocks {
    /// Engine hashes of the stored blocks, in chain order (block k's parent is block k-1).
    pub block_hashes: Vec<u64>,
    /// Engine hash of the block preceding the first one, `None` for a request's first block.
    pub parent: Option<u64>,
    /// The tokens of every stored block, concatenated: `block_hashes.len() * block_size`
    /// tokens for a well-formed event (checked by [`crate::filters`], not by the decoder).
    /// A token id sent as a decimal string (TensorRT-LLM) is its value; an item digest sent in
    /// place of a token id (TensorRT-LLM, at an image's first position) is
    /// [`crate::wire::IMAGE_DIGEST_TOKEN`].
    pub token_ids: Vec<u32>,
    /// Tokens per block, as the engine sent it.
    pub block_size: u32,
    /// The adapter name that enters the block seed: `lora_name` as sent (vLLM, SGLang), or,
    /// when `lora_name` is nil, absent or empty and `lora_id` is an int, that id in decimal
    /// (`"7"`: TensorRT-LLM names a LoRA by its id alone).
    pub lora_name: Option<String>,
    /// SGLang `cache_salt` (request-wide). vLLM carries the salt in the extra keys instead.
    pub cache_salt: Option<String>,
    /// Storage medium (`"GPU"`, `"CPU"`, ...), `None` when nil or absent.
    pub medium: Option<String>,
    /// KV-cache group index (vLLM and TensorRT-LLM hybrid models), `None` when nil or absent.
    pub group_idx: Option<u32>,
    /// vLLM `kv_cache_spec_sliding_window`: the window of a sliding-window group.
    pub sliding_window: Option<u32>,
    /// vLLM `kv_cache_spec_kind` (e.g. `"full_attention"`, `"sliding_window"`, `"mamba"`).
    pub spec_kind: Option<String>,
    /// vLLM `extra_keys` decoded per block, with TensorRT-LLM's `mm_keys` of each block added
    /// to its [`BlockExtras::mm_hashes`]: one entry per block, or empty when the event had
    /// neither (nil or absent).
    pub block_extras: Vec<BlockExtras>,
}

/// The extra keys of one stored block (vLLM `extra_keys[k]`, TensorRT-LLM `mm_keys[k]`), sorted
/// into what they mean.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct BlockExtras {
    /// Multimodal identifier hashes ([`ckf_core::tokens::mm_identifier_hash`] of each vLLM
    /// `[identifier, offset]` entry, then of each TensorRT-LLM `mm_key`'s identifier: its
    /// `uuid` when non-empty, else its `hash`), in the order sent.
    pub mm_hashes: Vec<u64>,
    /// A string entry that is not the event's `lora_name`: the request's cache salt.
    pub salt: Option<String>,
    /// A string entry equal to the event's `lora_name`.
    pub lora_name: Option<String>,
    /// Any other entry (bin, int, ..., or an `mm_keys` map of a `type` other than `mm_key`):
    /// `xxh3_64` (seed 0) of the entry's msgpack encoding, so an unknown key still separates
    /// blocks that differ by it.
    pub other: Vec<u64>,
}

/// A `BlockRemoved` event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RemovedBlocks {
    /// Engine hashes of the evicted blocks.
    pub block_hashes: Vec<u64>,
    /// Storage medium, `None` when nil or absent.
    pub medium: Option<String>,
    /// KV-cache group index (vLLM, TensorRT-LLM), `None` when nil or absent.
    pub group_idx: Option<u32>,
}

/// What the decoder tolerated in one batch. None of it is fatal.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct DecodeNotes {
    /// Map keys of events or of the batch that this crate does not know (ignored), plus extra
    /// trailing elements of positional events beyond the known fields.
    pub unknown_fields: u32,
    /// Events of an unknown type (returned as [`EngineEvent::Unknown`]; their fields are not
    /// counted as unknown fields).
    pub unknown_events: u32,
    /// Events skipped because a known field had the wrong type or broke a limit; the rest of
    /// the batch still decoded.
    pub malformed_events: u32,
    /// Why the first malformed event was skipped (for logs).
    pub first_malformed: Option<String>,
}

impl DecodeNotes {
    /// Whether nothing was tolerated.
    pub fn is_clean(&self) -> bool {
        self.unknown_fields == 0 && self.unknown_events == 0 && self.malformed_events == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_follows_time_stamp_rank_and_blocks_only() {
        let stored = |hashes: Vec<u64>| {
            EngineEvent::Stored(StoredBlocks {
                block_hashes: hashes,
                ..StoredBlocks::default()
            })
        };
        let a = EngineBatch {
            ts: 1.5,
            dp_rank: Some(0),
            events: vec![stored(vec![1, 2]), EngineEvent::AllCleared],
            ..EngineBatch::default()
        };
        assert_eq!(a.identity(), a.clone().identity());
        let mut other_ts = a.clone();
        other_ts.ts = 1.25;
        let mut other_rank = a.clone();
        other_rank.dp_rank = None;
        let mut other_blocks = a.clone();
        other_blocks.events[0] = stored(vec![1, 3]);
        let mut other_kind = a.clone();
        other_kind.events[1] = EngineEvent::Unknown { kind: "x".into() };
        for b in [other_ts, other_rank, other_blocks, other_kind] {
            assert_ne!(a.identity(), b.identity(), "{b:?}");
        }
        // What the decoder tolerated is no part of it.
        let mut noted = a.clone();
        noted.notes.unknown_fields = 3;
        assert_eq!(a.identity(), noted.identity());
    }
}
