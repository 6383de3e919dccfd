//! The fields of one event: their names (map keys) and positional orders, what was read of
//! them in any order ([`Fields`]), and the event they build once checked.

use std::collections::HashSet;

use crate::event::{BlockExtras, EngineEvent, RemovedBlocks, StoredBlocks};
use crate::wire::extras::{RawExtra, RawMm, classify};
use crate::wire::tokens::StringToken;
use crate::wire::values::{Bad, MAX_SHOWN_BYTES};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FieldName {
    BlockHashes,
    Parent,
    TokenIds,
    BlockSize,
    LoraId,
    Medium,
    LoraName,
    CacheSalt,
    ExtraKeys,
    /// TensorRT-LLM `mm_keys` (map events only).
    MmKeys,
    GroupIdx,
    SpecKind,
    SlidingWindow,
    /// Known fields this crate has no use for (`locality`, `ownership`, `session_id`,
    /// `lookahead_token_ids`): skipped unchecked, not counted as unknown.
    Ignored,
}

/// vLLM `BlockStored` field order after the tag (positional events).
pub(super) const STORED_ORDER: [FieldName; 15] = [
    FieldName::BlockHashes,
    FieldName::Parent,
    FieldName::TokenIds,
    FieldName::BlockSize,
    FieldName::LoraId,
    FieldName::Medium,
    FieldName::LoraName,
    FieldName::ExtraKeys,
    FieldName::GroupIdx,
    FieldName::SpecKind,
    FieldName::SlidingWindow,
    FieldName::Ignored, // locality
    FieldName::Ignored, // ownership
    FieldName::Ignored, // session_id
    FieldName::Ignored, // lookahead_token_ids
];

/// vLLM `BlockRemoved` field order after the tag (positional events).
pub(super) const REMOVED_ORDER: [FieldName; 5] = [
    FieldName::BlockHashes,
    FieldName::Medium,
    FieldName::GroupIdx,
    FieldName::Ignored, // locality
    FieldName::Ignored, // ownership
];

impl FieldName {
    pub(super) fn of(key: &[u8]) -> Option<Self> {
        Some(match key {
            b"block_hashes" => Self::BlockHashes,
            b"parent_block_hash" => Self::Parent,
            b"token_ids" => Self::TokenIds,
            b"block_size" => Self::BlockSize,
            b"lora_id" => Self::LoraId,
            b"medium" => Self::Medium,
            b"lora_name" => Self::LoraName,
            b"cache_salt" => Self::CacheSalt,
            b"extra_keys" => Self::ExtraKeys,
            b"mm_keys" => Self::MmKeys,
            b"group_idx" => Self::GroupIdx,
            b"kv_cache_spec_kind" => Self::SpecKind,
            b"kv_cache_spec_sliding_window" => Self::SlidingWindow,
            b"locality" | b"ownership" | b"session_id" | b"lookahead_token_ids" => Self::Ignored,
            _ => return None,
        })
    }

    pub(super) fn label(self) -> &'static str {
        match self {
            Self::BlockHashes => "block_hashes",
            Self::Parent => "parent_block_hash",
            Self::TokenIds => "token_ids",
            Self::BlockSize => "block_size",
            Self::LoraId => "lora_id",
            Self::Medium => "medium",
            Self::LoraName => "lora_name",
            Self::CacheSalt => "cache_salt",
            Self::ExtraKeys => "extra_keys",
            Self::MmKeys => "mm_keys",
            Self::GroupIdx => "group_idx",
            Self::SpecKind => "kv_cache_spec_kind",
            Self::SlidingWindow => "kv_cache_spec_sliding_window",
            Self::Ignored => "ignored",
        }
    }
}

/// The fields of one event as read, any order.
#[derive(Debug, Default)]
pub(super) struct Fields {
    pub(super) block_hashes: Option<Vec<u64>>,
    pub(super) parent: Option<u64>,
    pub(super) token_ids: Option<Vec<u32>>,
    /// The token ids of `token_ids` sent as non-decimal strings.
    pub(super) string_tokens: Vec<StringToken>,
    pub(super) block_size: Option<u32>,
    /// `lora_id` in decimal.
    pub(super) lora_id: Option<String>,
    pub(super) medium: Option<String>,
    pub(super) lora_name: Option<String>,
    pub(super) cache_salt: Option<String>,
    pub(super) extra_keys: Option<Vec<Vec<RawExtra>>>,
    pub(super) mm_keys: Option<Vec<RawMm>>,
    pub(super) group_idx: Option<u32>,
    pub(super) spec_kind: Option<String>,
    pub(super) sliding_window: Option<u32>,
}

impl Fields {
    /// Checks each token id sent as a non-decimal string against the event's `mm_keys`
    /// hashes (ASCII case-insensitive): a match stays [`IMAGE_DIGEST_TOKEN`], anything else
    /// is the reason the event is malformed. A set of the digests keeps this linear in the
    /// event's size.
    pub(super) fn resolve_string_tokens(&self, buf: &[u8]) -> Result<(), Bad> {
        if self.string_tokens.is_empty() {
            return Ok(());
        }
        let digests: HashSet<&[u8]> = self
            .mm_keys
            .iter()
            .flatten()
            .flat_map(|m| &m.digests)
            .map(|d| d.as_bytes())
            .collect();
        let mut lower = Vec::new();
        for t in &self.string_tokens {
            let b = &buf[t.bytes.clone()];
            lower.clear();
            lower.extend(b.iter().map(u8::to_ascii_lowercase));
            if !digests.contains(lower.as_slice()) {
                let shown = String::from_utf8_lossy(&b[..b.len().min(MAX_SHOWN_BYTES)]);
                return Err(format!(
                    "token id string {shown:?} at {} is not a decimal u32 nor an mm_keys hash \
                     of the event",
                    t.slot
                ));
            }
        }
        Ok(())
    }

    pub(super) fn build(self, kind: &str) -> Result<EngineEvent, Bad> {
        Ok(match kind {
            "BlockStored" => {
                let block_hashes = self.block_hashes.ok_or("no block_hashes")?;
                let mut block_extras: Vec<BlockExtras> = self
                    .extra_keys
                    .unwrap_or_default()
                    .into_iter()
                    .map(|entries| classify(entries, self.lora_name.as_deref()))
                    .collect();
                if let Some(mm) = self.mm_keys {
                    if mm.len() != block_hashes.len() {
                        return Err(format!(
                            "mm_keys: {} entries for {} blocks",
                            mm.len(),
                            block_hashes.len()
                        ));
                    }
                    if block_extras.is_empty() {
                        block_extras.resize(mm.len(), BlockExtras::default());
                    }
                    // Extra keys of another length stay so: the filter skips the event.
                    for (x, m) in block_extras.iter_mut().zip(mm) {
                        x.mm_hashes.extend(m.mm_hashes);
                        x.other.extend(m.other);
                    }
                }
                // A LoRA named by its id alone (TensorRT-LLM sends `lora_name` nil): the id
                // in decimal is the adapter name that enters the block seed.
                let lora_name = match (self.lora_name, self.lora_id) {
                    (Some(name), _) if !name.is_empty() => Some(name),
                    (name, None) => name,
                    (_, Some(id)) => Some(id),
                };
                EngineEvent::Stored(StoredBlocks {
                    block_hashes,
                    parent: self.parent,
                    token_ids: self.token_ids.ok_or("no token_ids")?,
                    block_size: self.block_size.ok_or("no block_size")?,
                    lora_name,
                    cache_salt: self.cache_salt,
                    medium: self.medium,
                    group_idx: self.group_idx,
                    sliding_window: self.sliding_window,
                    spec_kind: self.spec_kind,
                    block_extras,
                })
            }
            "BlockRemoved" => EngineEvent::Removed(RemovedBlocks {
                block_hashes: self.block_hashes.ok_or("no block_hashes")?,
                medium: self.medium,
                group_idx: self.group_idx,
            }),
            _ => EngineEvent::AllCleared,
        })
    }
}
