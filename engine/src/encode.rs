//! The vLLM KV-event encoding, for the built-in publisher of `ckf demo` and for tests: the exact
//! bytes vLLM's `ZmqEventPublisher` sends as the payload frame.
//!
//! Origin: `vllm/distributed/kv_events.py`, whose structs msgspec encodes as msgpack:
//! - the batch `EventBatch(array_like=True, omit_defaults=True)` is the array
//!   `[ts, events, data_parallel_rank]`; msgspec keeps a `None` rank as `nil` (`array_like`
//!   structs never drop fields), `ts` is always a float64;
//! - the events `KVCacheEvent(omit_defaults=True, tag=True)` are maps whose first key is
//!   `"type"` (the class name), then the fields in declaration order. Fields without a default
//!   (`block_hashes`, `parent_block_hash`, `token_ids`, `block_size`, `lora_id`, `medium`,
//!   `lora_name` of `BlockStored`; `block_hashes`, `medium` of `BlockRemoved`) are always
//!   written, `nil` included; fields with a `None` default are left out when `None`. The map
//!   header is sized for the struct's largest possible map, as msgspec does: `BlockStored` (16
//!   keys at most) always gets a map16 header, the others a fixmap;
//! - the older positional layout (vLLM before `lora_name`, events `array_like=True` too) is the
//!   array `[type, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]`,
//!   `[type, block_hashes, medium]` or `[type]`.
//!
//! Integers take msgpack's shortest form (non-negative ones as fixint/uint*), strings and arrays
//! likewise. Block hashes are 64-bit integers, vLLM's default (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`).
//! The golden payloads in `engine/tests/fixtures/encode_*.msgpack` come from the real msgspec
//! encoder (`gen_encode.py` there) and the tests compare byte for byte.

use std::io;

use rmp::encode as mp;
use rmpv::Value;

/// The payload layout of the events in a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Current vLLM: events are maps tagged by `"type"`.
    Tagged,
    /// Older vLLM: events are arrays tagged by their first element; only the fields that layout
    /// had are written (`lora_name` and every optional field are dropped).
    Positional,
}

/// One `EventBatch`: what a publisher sends per sequence number.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// Publisher wall-clock time, seconds since the Unix epoch.
    pub ts: f64,
    /// The events, applied in order.
    pub events: Vec<Event>,
    /// The data-parallel rank of the publisher (vLLM always sets it; `None` encodes as `nil`).
    pub data_parallel_rank: Option<i64>,
}

/// One KV-cache event.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// `BlockStored`.
    Stored(BlockStored),
    /// `BlockRemoved`.
    Removed(BlockRemoved),
    /// `AllBlocksCleared`.
    AllCleared,
}

/// `BlockStored`: consecutive full blocks of one request, chained after `parent_block_hash`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BlockStored {
    /// Engine block hashes, one per block, in prefix order.
    pub block_hashes: Vec<u64>,
    /// The engine hash of the block before the first one (`None`: the first is a root).
    pub parent_block_hash: Option<u64>,
    /// The blocks' tokens, `block_size` per block.
    pub token_ids: Vec<u32>,
    /// Tokens per block.
    pub block_size: u32,
    /// Deprecated LoRA id (vLLM keeps it for compatibility).
    pub lora_id: Option<i64>,
    /// Storage tier: `"GPU"`, `"CPU"`, ... (`None`: unspecified).
    pub medium: Option<String>,
    /// LoRA adapter name (tagged layout only).
    pub lora_name: Option<String>,
    /// Per block: the extra hash keys (LoRA name, `[mm_identifier, offset]`, cache salt, ...),
    /// published untagged; any msgpack value (tagged layout only).
    pub extra_keys: Option<Vec<Option<Vec<Value>>>>,
    /// KV-cache group index (tagged layout only).
    pub group_idx: Option<i64>,
    /// KV-cache spec kind, e.g. `"full_attention"` (tagged layout only).
    pub kv_cache_spec_kind: Option<String>,
    /// Sliding window of the spec, in tokens (tagged layout only).
    pub kv_cache_spec_sliding_window: Option<i64>,
    /// `"LOCAL"` or `"REMOTE"` relative to the publisher (tagged layout only).
    pub locality: Option<String>,
    /// Secondary offloading tier id (tagged layout only).
    pub ownership: Option<String>,
    /// Session that triggered the store (tagged layout only).
    pub session_id: Option<String>,
    /// Per block, the lookahead tokens hashed beyond it (tagged layout only).
    pub lookahead_token_ids: Option<Vec<Vec<u32>>>,
}

/// `BlockRemoved`: blocks evicted from `medium`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BlockRemoved {
    /// Engine block hashes.
    pub block_hashes: Vec<u64>,
    /// Storage tier (`None`: unspecified).
    pub medium: Option<String>,
    /// KV-cache group index (tagged layout only).
    pub group_idx: Option<i64>,
    /// `"LOCAL"` or `"REMOTE"` (tagged layout only).
    pub locality: Option<String>,
    /// Secondary offloading tier id (tagged layout only).
    pub ownership: Option<String>,
}

/// Most keys a `BlockStored` map can hold (the tag and 15 fields): msgspec sizes the header by it.
const STORED_MAX_KEYS: usize = 16;
/// Most keys a `BlockRemoved` map can hold (the tag and 5 fields).
const REMOVED_MAX_KEYS: usize = 6;

/// Encodes one batch as the payload frame of vLLM's publisher.
///
/// # Panics
/// Only on an array of 2^32 items or more, which msgpack cannot represent.
pub fn encode_batch(batch: &Batch, layout: Layout) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    // Writing into a Vec<u8> cannot fail (it only grows); the io::Result is rmp's generic shape.
    write_batch(&mut out, batch, layout).expect("writing msgpack into a Vec<u8> cannot fail");
    out
}

/// Encodes one event alone, as it appears inside a batch.
///
/// # Panics
/// As [`encode_batch`].
pub fn encode_event(event: &Event, layout: Layout) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    write_event(&mut out, event, layout).expect("writing msgpack into a Vec<u8> cannot fail");
    out
}

fn write_batch(out: &mut Vec<u8>, batch: &Batch, layout: Layout) -> io::Result<()> {
    mp::write_array_len(out, 3)?;
    mp::write_f64(out, batch.ts)?;
    write_array_len(out, batch.events.len())?;
    for event in &batch.events {
        write_event(out, event, layout)?;
    }
    write_opt_int(out, batch.data_parallel_rank)
}

fn write_event(out: &mut Vec<u8>, event: &Event, layout: Layout) -> io::Result<()> {
    match (event, layout) {
        (Event::Stored(s), Layout::Tagged) => write_stored_map(out, s),
        (Event::Stored(s), Layout::Positional) => {
            mp::write_array_len(out, 7)?;
            mp::write_str(out, "BlockStored")?;
            write_stored_head(out, s)?;
            write_opt_str(out, s.medium.as_deref())
        }
        (Event::Removed(r), Layout::Tagged) => write_removed_map(out, r),
        (Event::Removed(r), Layout::Positional) => {
            mp::write_array_len(out, 3)?;
            mp::write_str(out, "BlockRemoved")?;
            write_u64s(out, &r.block_hashes)?;
            write_opt_str(out, r.medium.as_deref())
        }
        (Event::AllCleared, Layout::Tagged) => {
            mp::write_map_len(out, 1)?;
            mp::write_str(out, "type")?;
            mp::write_str(out, "AllBlocksCleared")?;
            Ok(())
        }
        (Event::AllCleared, Layout::Positional) => {
            mp::write_array_len(out, 1)?;
            mp::write_str(out, "AllBlocksCleared")?;
            Ok(())
        }
    }
}

/// The five leading `BlockStored` fields both layouts share, values only.
fn write_stored_head(out: &mut Vec<u8>, s: &BlockStored) -> io::Result<()> {
    write_u64s(out, &s.block_hashes)?;
    write_opt_uint(out, s.parent_block_hash)?;
    write_array_len(out, s.token_ids.len())?;
    for &t in &s.token_ids {
        mp::write_uint(out, u64::from(t))?;
    }
    mp::write_uint(out, u64::from(s.block_size))?;
    write_opt_int(out, s.lora_id)
}

fn write_stored_map(out: &mut Vec<u8>, s: &BlockStored) -> io::Result<()> {
    let optional = [
        s.extra_keys.is_some(),
        s.group_idx.is_some(),
        s.kv_cache_spec_kind.is_some(),
        s.kv_cache_spec_sliding_window.is_some(),
        s.locality.is_some(),
        s.ownership.is_some(),
        s.session_id.is_some(),
        s.lookahead_token_ids.is_some(),
    ];
    let keys = 8 + optional.iter().filter(|&&present| present).count();
    write_map_header(out, keys, STORED_MAX_KEYS)?;
    mp::write_str(out, "type")?;
    mp::write_str(out, "BlockStored")?;
    mp::write_str(out, "block_hashes")?;
    write_u64s(out, &s.block_hashes)?;
    mp::write_str(out, "parent_block_hash")?;
    write_opt_uint(out, s.parent_block_hash)?;
    mp::write_str(out, "token_ids")?;
    write_array_len(out, s.token_ids.len())?;
    for &t in &s.token_ids {
        mp::write_uint(out, u64::from(t))?;
    }
    mp::write_str(out, "block_size")?;
    mp::write_uint(out, u64::from(s.block_size))?;
    mp::write_str(out, "lora_id")?;
    write_opt_int(out, s.lora_id)?;
    mp::write_str(out, "medium")?;
    write_opt_str(out, s.medium.as_deref())?;
    mp::write_str(out, "lora_name")?;
    write_opt_str(out, s.lora_name.as_deref())?;
    if let Some(extra) = &s.extra_keys {
        mp::write_str(out, "extra_keys")?;
        write_array_len(out, extra.len())?;
        for keys in extra {
            match keys {
                None => mp::write_nil(out)?,
                Some(keys) => {
                    write_array_len(out, keys.len())?;
                    for key in keys {
                        rmpv::encode::write_value(out, key)?;
                    }
                }
            }
        }
    }
    if let Some(group) = s.group_idx {
        mp::write_str(out, "group_idx")?;
        write_int(out, group)?;
    }
    if let Some(kind) = &s.kv_cache_spec_kind {
        mp::write_str(out, "kv_cache_spec_kind")?;
        mp::write_str(out, kind)?;
    }
    if let Some(window) = s.kv_cache_spec_sliding_window {
        mp::write_str(out, "kv_cache_spec_sliding_window")?;
        write_int(out, window)?;
    }
    write_opt_field(out, "locality", s.locality.as_deref())?;
    write_opt_field(out, "ownership", s.ownership.as_deref())?;
    write_opt_field(out, "session_id", s.session_id.as_deref())?;
    if let Some(lookahead) = &s.lookahead_token_ids {
        mp::write_str(out, "lookahead_token_ids")?;
        write_array_len(out, lookahead.len())?;
        for tokens in lookahead {
            write_array_len(out, tokens.len())?;
            for &t in tokens {
                mp::write_uint(out, u64::from(t))?;
            }
        }
    }
    Ok(())
}

fn write_removed_map(out: &mut Vec<u8>, r: &BlockRemoved) -> io::Result<()> {
    let optional = [
        r.group_idx.is_some(),
        r.locality.is_some(),
        r.ownership.is_some(),
    ];
    let keys = 3 + optional.iter().filter(|&&present| present).count();
    write_map_header(out, keys, REMOVED_MAX_KEYS)?;
    mp::write_str(out, "type")?;
    mp::write_str(out, "BlockRemoved")?;
    mp::write_str(out, "block_hashes")?;
    write_u64s(out, &r.block_hashes)?;
    mp::write_str(out, "medium")?;
    write_opt_str(out, r.medium.as_deref())?;
    if let Some(group) = r.group_idx {
        mp::write_str(out, "group_idx")?;
        write_int(out, group)?;
    }
    write_opt_field(out, "locality", r.locality.as_deref())?;
    write_opt_field(out, "ownership", r.ownership.as_deref())
}

/// A map header whose width follows the struct's largest possible map (msgspec's rule), not
/// the number of keys actually written.
fn write_map_header(out: &mut Vec<u8>, keys: usize, max_keys: usize) -> io::Result<()> {
    if max_keys <= 15 {
        mp::write_map_len(out, keys as u32)?;
    } else {
        // map16: 0xde then the count, big-endian (every struct here has far fewer keys).
        out.push(0xde);
        out.extend_from_slice(&(keys as u16).to_be_bytes());
    }
    Ok(())
}

fn write_array_len(out: &mut Vec<u8>, len: usize) -> io::Result<()> {
    let len = u32::try_from(len).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "msgpack arrays hold at most 2^32 - 1 items",
        )
    })?;
    mp::write_array_len(out, len)?;
    Ok(())
}

fn write_u64s(out: &mut Vec<u8>, values: &[u64]) -> io::Result<()> {
    write_array_len(out, values.len())?;
    for &v in values {
        mp::write_uint(out, v)?;
    }
    Ok(())
}

fn write_int(out: &mut Vec<u8>, v: i64) -> io::Result<()> {
    // msgspec writes a non-negative int as fixint/uint*, a negative one as negative fixint/int*;
    // rmp's write_sint follows the same shortest-form table.
    mp::write_sint(out, v)?;
    Ok(())
}

fn write_opt_int(out: &mut Vec<u8>, v: Option<i64>) -> io::Result<()> {
    match v {
        Some(v) => write_int(out, v),
        None => Ok(mp::write_nil(out)?),
    }
}

fn write_opt_uint(out: &mut Vec<u8>, v: Option<u64>) -> io::Result<()> {
    match v {
        Some(v) => {
            mp::write_uint(out, v)?;
            Ok(())
        }
        None => Ok(mp::write_nil(out)?),
    }
}

fn write_opt_str(out: &mut Vec<u8>, v: Option<&str>) -> io::Result<()> {
    match v {
        Some(v) => Ok(mp::write_str(out, v)?),
        None => Ok(mp::write_nil(out)?),
    }
}

/// An optional string field with a `None` default: omitted when `None`.
fn write_opt_field(out: &mut Vec<u8>, key: &str, v: Option<&str>) -> io::Result<()> {
    if let Some(v) = v {
        mp::write_str(out, key)?;
        mp::write_str(out, v)?;
    }
    Ok(())
}
