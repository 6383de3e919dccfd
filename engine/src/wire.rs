//! msgpack decoding of engine `EventBatch` payloads.
//!
//! The decoder walks the payload's bytes once, token by token (markers classified by
//! [`rmp::Marker`]), instead of building a generic value tree first: every limit binds before
//! anything is allocated for it, a value of the wrong type is skipped in place so the rest of
//! the batch still decodes, and an `extra_keys` entry of unknown shape can be hashed over its
//! exact msgpack bytes. The rules (batch and event shapes, block hashes, extra keys) are in the
//! crate README, "Decoding rules"; the field names and orders are those of vLLM's and SGLang's
//! `kv_events.py` msgspec structs, and TensorRT-LLM's wire structs (its `pyexecutor`
//! `kv_cache_events` module: tagged-map events with `mm_keys`, `lora_id` without `lora_name`,
//! token ids that may be strings, an item's digest in place of its first token id: see
//! [`IMAGE_DIGEST_TOKEN`]).

use std::collections::HashSet;
use std::ops::Range;

use thiserror::Error;

mod reader;

use reader::{Reader, Tok};

use ckf_core::tokens::mm_identifier_hash;

use crate::event::{
    BlockExtras, DecodeNotes, EngineBatch, EngineEvent, RemovedBlocks, StoredBlocks,
};

/// The token id an item digest sent in place of a token id decodes to.
///
/// TensorRT-LLM sends, at the position where a multimodal item (an image) starts, the item's
/// digest in hex as a string instead of a token id, and the item's later positions as ints. A
/// string token id that is not a decimal `u32` but equals, ASCII case-insensitively, the
/// `hash` of an `mm_keys` entry of the same event (any of its blocks; a non-empty `hash` of an
/// entry of type `mm_key`) decodes to this fixed id: the item's identity already enters the
/// hash of every block it overlaps through [`BlockExtras::mm_hashes`], so the position only
/// needs the same id in every request. A token query for such blocks sends this id at the
/// item's first position, and the item itself (identifier, offset, length) as a multimodal
/// item. Any other non-decimal string makes the event malformed.
///
/// `u32::MAX`: no engine's vocabulary reaches it (TensorRT-LLM's token ids are `int32`); an
/// engine that sent `4294967295` as a token id would give the same block hashes.
pub const IMAGE_DIGEST_TOKEN: u32 = u32::MAX;

/// Bounds on one payload, so a hostile or broken publisher cannot make the decoder allocate
/// without limit. A batch breaking `max_events` or `max_depth` is a [`DecodeError`]; an event
/// breaking the per-event limits is skipped and counted (the rest of the batch decodes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Events per batch.
    pub max_events: usize,
    /// Block hashes per event (also bounds `extra_keys` lists and their per-block entries).
    pub max_blocks_per_event: usize,
    /// Token ids per event.
    pub max_tokens_per_event: usize,
    /// msgpack nesting depth of the whole payload (the batch array is depth 1).
    pub max_depth: usize,
}

impl Default for DecodeLimits {
    /// 65,536 events, 65,536 blocks and 4,194,304 tokens per event, depth 32: far beyond any
    /// engine step, still bounded.
    fn default() -> Self {
        Self {
            max_events: 65_536,
            max_blocks_per_event: 65_536,
            max_tokens_per_event: 4_194_304,
            max_depth: 32,
        }
    }
}

/// Why a payload is not an `EventBatch` (the whole batch is refused; nothing is applied).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// The payload ends inside a msgpack value.
    #[error("payload truncated")]
    Truncated,
    /// Bytes that are not msgpack (the reserved marker `0xc1`).
    #[error("invalid msgpack: {0}")]
    Syntax(String),
    /// Bytes left after the batch value.
    #[error("{0} trailing bytes after the batch")]
    Trailing(usize),
    /// The batch envelope has the wrong shape (not `[ts, events, dp_rank?]` nor a map with
    /// `ts` and `events`, or an envelope field of the wrong type).
    #[error("batch envelope: {0}")]
    Type(String),
    /// The batch breaks a [`DecodeLimits`] bound (`max_events`, `max_depth`).
    #[error("limit exceeded: {0}")]
    Limit(String),
}

impl DecodeError {
    /// A short stable label for metrics: `"truncated"`, `"syntax"`, `"trailing"`, `"type"`,
    /// `"limit"`.
    pub fn kind_label(&self) -> &'static str {
        match self {
            Self::Truncated => "truncated",
            Self::Syntax(_) => "syntax",
            Self::Trailing(_) => "trailing",
            Self::Type(_) => "type",
            Self::Limit(_) => "limit",
        }
    }
}

/// Decodes one `EventBatch` payload (vLLM, SGLang or TensorRT-LLM; tagged-map or positional
/// events).
///
/// # Errors
/// A [`DecodeError`] when the payload or its envelope is not a batch; malformed events inside
/// a good envelope are skipped and counted in [`EngineBatch::notes`] instead.
pub fn decode_batch(payload: &[u8], limits: &DecodeLimits) -> Result<EngineBatch, DecodeError> {
    let mut rd = Reader {
        buf: payload,
        pos: 0,
        limits,
    };
    let mut batch = EngineBatch::default();
    let mut ts = None;
    let mut events = None;
    // The envelope is depth 1, its fields depth 2, events depth 3, event fields depth 4.
    let envelope = rd.next()?;
    if let Tok::Array(_) | Tok::Map(_) = envelope {
        rd.enter(1)?;
    }
    match envelope {
        Tok::Array(n) => {
            if n < 2 {
                rd.skip_items(u64::from(n), 2)?;
                return Err(DecodeError::Type(format!("batch array of {n} elements")));
            }
            ts = Some(rd.read_ts()?);
            events = Some(rd.read_events(&mut batch.notes)?);
            if n >= 3 {
                batch.dp_rank = rd.read_dp_rank()?;
            }
            for _ in 3..n {
                rd.skip_value(2)?;
                batch.notes.unknown_fields += 1;
            }
        }
        Tok::Map(n) => {
            for _ in 0..n {
                let key = rd.next()?;
                match key {
                    Tok::Str(b"ts") => ts = Some(rd.read_ts()?),
                    Tok::Str(b"events") => events = Some(rd.read_events(&mut batch.notes)?),
                    Tok::Str(b"data_parallel_rank" | b"attn_dp_rank") => {
                        batch.dp_rank = rd.read_dp_rank()?;
                    }
                    other => {
                        rd.skip_rest(&other, 2)?;
                        rd.skip_value(2)?;
                        batch.notes.unknown_fields += 1;
                    }
                }
            }
        }
        other => {
            return Err(DecodeError::Type(format!(
                "batch is {}, not an array or map",
                other.kind()
            )));
        }
    }
    if rd.pos != payload.len() {
        return Err(DecodeError::Trailing(payload.len() - rd.pos));
    }
    batch.ts = ts.ok_or_else(|| DecodeError::Type("no ts".into()))?;
    batch.events = events.ok_or_else(|| DecodeError::Type("no events".into()))?;
    Ok(batch)
}

/// Why one event is skipped (the event was still consumed whole).
type Bad = String;

/// `Err` = fatal for the batch; `Ok(Err)` = this value was of the wrong shape (and consumed).
type Field<T> = Result<Result<T, Bad>, DecodeError>;

impl Reader<'_, '_> {
    fn read_ts(&mut self) -> Result<f64, DecodeError> {
        match self.next()? {
            Tok::Float(f) => Ok(f),
            Tok::Uint(u) => Ok(u as f64),
            Tok::Int(i) => Ok(i as f64),
            other => {
                self.skip_rest(&other, 2)?;
                Err(DecodeError::Type(format!("ts is {}", other.kind())))
            }
        }
    }

    fn read_dp_rank(&mut self) -> Result<Option<u32>, DecodeError> {
        match self.next()? {
            Tok::Nil => Ok(None),
            t @ (Tok::Uint(_) | Tok::Int(_)) => t
                .as_u32()
                .map(Some)
                .ok_or_else(|| DecodeError::Type("dp rank out of u32 range".into())),
            other => {
                self.skip_rest(&other, 2)?;
                Err(DecodeError::Type(format!("dp rank is {}", other.kind())))
            }
        }
    }

    /// The events array (depth 2); each event at depth 3.
    fn read_events(&mut self, notes: &mut DecodeNotes) -> Result<Vec<EngineEvent>, DecodeError> {
        let n = match self.next()? {
            Tok::Array(n) => n,
            other => {
                self.skip_rest(&other, 2)?;
                return Err(DecodeError::Type(format!("events is {}", other.kind())));
            }
        };
        self.enter(2)?;
        if n as usize > self.limits.max_events {
            return Err(DecodeError::Limit(format!(
                "{n} events > max_events {}",
                self.limits.max_events
            )));
        }
        let mut events = Vec::with_capacity(self.cap(n as usize));
        for _ in 0..n {
            match self.read_event(notes)? {
                Ok(ev) => {
                    if let EngineEvent::Unknown { .. } = ev {
                        notes.unknown_events += 1;
                    }
                    events.push(ev);
                }
                Err(why) => {
                    notes.malformed_events += 1;
                    notes.first_malformed.get_or_insert(why);
                }
            }
        }
        Ok(events)
    }

    /// One event at depth 3. `Ok(Ok(None))` is never returned for a well-formed event; it is
    /// kept for symmetry with skipped shapes.
    fn read_event(&mut self, notes: &mut DecodeNotes) -> Field<EngineEvent> {
        const D: usize = 3;
        let tok = self.next()?;
        let mut f = Fields::default();
        let mut bad: Option<Bad> = None;
        // Counted only for the known event types: an unknown type's fields are all unknown.
        let mut unknown_fields = 0;
        let kind: String = match tok {
            Tok::Map(n) => {
                self.enter(D)?;
                let mut kind = None;
                for _ in 0..n {
                    let key = self.next()?;
                    let Tok::Str(key) = key else {
                        self.skip_rest(&key, D + 1)?;
                        self.skip_value(D + 1)?;
                        unknown_fields += 1;
                        continue;
                    };
                    if key == b"type" {
                        match self.read_opt_str()? {
                            Ok(Some(s)) => kind = Some(s),
                            Ok(None) | Err(_) => {
                                bad.get_or_insert_with(|| "type: not a string".into());
                            }
                        }
                        continue;
                    }
                    let Some(name) = FieldName::of(key) else {
                        self.skip_value(D + 1)?;
                        unknown_fields += 1;
                        continue;
                    };
                    if let Err(why) = self.read_field(name, &mut f)? {
                        bad.get_or_insert(why);
                    }
                }
                match kind {
                    Some(k) => k,
                    None => {
                        return Ok(Err(bad.unwrap_or_else(|| "event map without type".into())));
                    }
                }
            }
            Tok::Array(0) => return Ok(Err("empty event array".into())),
            Tok::Array(n) => {
                self.enter(D)?;
                let kind = match self.read_opt_str()? {
                    Ok(Some(k)) => k,
                    _ => {
                        self.skip_items(u64::from(n - 1), D + 1)?;
                        return Ok(Err("event array without a type tag".into()));
                    }
                };
                let order: &[FieldName] = match kind.as_str() {
                    "BlockStored" => &STORED_ORDER,
                    "BlockRemoved" => &REMOVED_ORDER,
                    _ => &[],
                };
                for i in 1..n as usize {
                    match order.get(i - 1) {
                        Some(&name) => {
                            if let Err(why) = self.read_field(name, &mut f)? {
                                bad.get_or_insert(why);
                            }
                        }
                        None => {
                            self.skip_value(D + 1)?;
                            unknown_fields += 1;
                        }
                    }
                }
                kind
            }
            other => {
                self.skip_rest(&other, D)?;
                return Ok(Err(format!("event is {}", other.kind())));
            }
        };
        let ev = match kind.as_str() {
            "BlockStored" | "BlockRemoved" | "AllBlocksCleared" => {
                notes.unknown_fields += unknown_fields;
                if let Some(why) = bad {
                    return Ok(Err(format!("{kind}: {why}")));
                }
                if let Err(why) = f.resolve_string_tokens(self.buf) {
                    return Ok(Err(format!("{kind}: token_ids: {why}")));
                }
                match f.build(&kind) {
                    Ok(ev) => ev,
                    Err(why) => return Ok(Err(format!("{kind}: {why}"))),
                }
            }
            _ => EngineEvent::Unknown {
                kind: bounded_kind(kind),
            },
        };
        Ok(Ok(ev))
    }

    /// Reads one field value (depth 4) into `f`; a wrong shape is consumed and reported.
    fn read_field(&mut self, name: FieldName, f: &mut Fields) -> Field<()> {
        const D: usize = 4;
        let lim = *self.limits;
        let r = match name {
            FieldName::BlockHashes => self
                .read_hashes(D)
                .map(|r| r.map(|v| f.block_hashes = Some(v))),
            FieldName::Parent => self.read_opt_hash().map(|r| r.map(|v| f.parent = v)),
            FieldName::TokenIds => self.read_tokens(D, lim.max_tokens_per_event).map(|r| {
                r.map(|(ids, strings)| {
                    f.token_ids = Some(ids);
                    f.string_tokens = strings;
                })
            }),
            FieldName::BlockSize => self.read_opt_u32().map(|r| {
                r.and_then(|v| v.ok_or_else(|| "nil".to_owned()))
                    .map(|v| f.block_size = Some(v))
            }),
            FieldName::LoraId => self.read_opt_int().map(|r| r.map(|v| f.lora_id = v)),
            FieldName::Medium => self.read_opt_str().map(|r| r.map(|v| f.medium = v)),
            FieldName::LoraName => self.read_opt_str().map(|r| r.map(|v| f.lora_name = v)),
            FieldName::CacheSalt => self.read_opt_str().map(|r| r.map(|v| f.cache_salt = v)),
            FieldName::ExtraKeys => self.read_extra_keys(D).map(|r| r.map(|v| f.extra_keys = v)),
            FieldName::MmKeys => self.read_mm_keys(D).map(|r| r.map(|v| f.mm_keys = v)),
            FieldName::GroupIdx => self.read_opt_u32().map(|r| r.map(|v| f.group_idx = v)),
            FieldName::SpecKind => self.read_opt_str().map(|r| r.map(|v| f.spec_kind = v)),
            FieldName::SlidingWindow => {
                self.read_opt_u32().map(|r| r.map(|v| f.sliding_window = v))
            }
            FieldName::Ignored => self.skip_value(D).map(Ok),
        }?;
        Ok(r.map_err(|why| format!("{}: {why}", name.label())))
    }

    fn read_opt_str(&mut self) -> Field<Option<String>> {
        self.read_opt_str_at(4)
    }

    /// nil or a UTF-8 string, the value at `depth`.
    fn read_opt_str_at(&mut self, depth: usize) -> Field<Option<String>> {
        Ok(match self.next()? {
            Tok::Nil => Ok(None),
            Tok::Str(b) => match std::str::from_utf8(b) {
                Ok(s) => Ok(Some(s.to_owned())),
                Err(_) => Err("invalid UTF-8".into()),
            },
            other => {
                self.skip_rest(&other, depth)?;
                Err(format!("{} where a string is expected", other.kind()))
            }
        })
    }

    fn read_opt_u32(&mut self) -> Field<Option<u32>> {
        Ok(match self.next()? {
            Tok::Nil => Ok(None),
            t @ (Tok::Uint(_) | Tok::Int(_)) => t
                .as_u32()
                .map(Some)
                .ok_or_else(|| "out of u32 range".into()),
            other => {
                self.skip_rest(&other, 4)?;
                Err(format!("{} where an int is expected", other.kind()))
            }
        })
    }

    /// nil, or any int as its decimal text (a LoRA id: `u64` or `i64` as sent).
    fn read_opt_int(&mut self) -> Field<Option<String>> {
        self.read_opt_int_at(4)
    }

    /// [`Self::read_opt_int`] of the value at `depth`.
    fn read_opt_int_at(&mut self, depth: usize) -> Field<Option<String>> {
        Ok(match self.next()? {
            Tok::Nil => Ok(None),
            Tok::Uint(u) => Ok(Some(u.to_string())),
            Tok::Int(i) => Ok(Some(i.to_string())),
            other => {
                self.skip_rest(&other, depth)?;
                Err(format!("{} where an int is expected", other.kind()))
            }
        })
    }

    fn read_opt_hash(&mut self) -> Field<Option<u64>> {
        let tok = self.next()?;
        if let Tok::Nil = tok {
            return Ok(Ok(None));
        }
        let r = hash_of(&tok).map(Some);
        self.skip_rest(&tok, 4)?;
        Ok(r)
    }

    /// A list of block hashes at `depth`.
    fn read_hashes(&mut self, depth: usize) -> Field<Vec<u64>> {
        let n = match self.list_header(depth, self.limits.max_blocks_per_event)? {
            Ok(n) => n,
            Err(why) => return Ok(Err(why)),
        };
        let mut out = Vec::with_capacity(self.cap(n));
        let mut bad = None;
        for _ in 0..n {
            let tok = self.next()?;
            match hash_of(&tok) {
                Ok(h) => out.push(h),
                Err(why) => {
                    bad.get_or_insert(why);
                }
            }
            self.skip_rest(&tok, depth + 1)?;
        }
        Ok(bad.map_or(Ok(out), Err))
    }

    /// A list of token ids at `depth`: ints fitting `u32` and decimal strings are their value.
    /// Another string is left for [`Fields::resolve_string_tokens`] (it may be an item
    /// digest, checked once the event's `mm_keys` are read): its slot holds
    /// [`IMAGE_DIGEST_TOKEN`] and the second list names the slot and the string's bytes.
    fn read_tokens(&mut self, depth: usize, max: usize) -> Field<(Vec<u32>, Vec<StringToken>)> {
        let n = match self.list_header(depth, max)? {
            Ok(n) => n,
            Err(why) => return Ok(Err(why)),
        };
        let mut out = Vec::with_capacity(self.cap(n));
        let mut strings = Vec::new();
        let mut bad = None;
        for _ in 0..n {
            let tok = self.next()?;
            let id = match tok {
                // TensorRT-LLM declares token ids `int | str`: a decimal string is the id.
                Tok::Str(b) => Ok(decimal_u32(b).unwrap_or_else(|| {
                    // `next` left `pos` just past the string's bytes.
                    strings.push(StringToken {
                        slot: out.len(),
                        bytes: self.pos - b.len()..self.pos,
                    });
                    IMAGE_DIGEST_TOKEN
                })),
                ref t => t
                    .as_u32()
                    .ok_or_else(|| format!("token id {t:?} does not fit u32")),
            };
            match id {
                Ok(t) => out.push(t),
                Err(why) => {
                    bad.get_or_insert(why);
                }
            }
            self.skip_rest(&tok, depth + 1)?;
        }
        Ok(bad.map_or(Ok((out, strings)), Err))
    }

    /// Reads an array header at `depth` with at most `max` items; anything else (or a longer
    /// array) is consumed and reported.
    fn list_header(&mut self, depth: usize, max: usize) -> Field<usize> {
        let tok = self.next()?;
        match tok {
            Tok::Array(n) => {
                self.enter(depth)?;
                if n as usize > max {
                    self.skip_items(u64::from(n), depth + 1)?;
                    return Ok(Err(format!("{n} items > limit {max}")));
                }
                Ok(Ok(n as usize))
            }
            other => {
                self.skip_rest(&other, depth)?;
                Ok(Err(format!("{} where an array is expected", other.kind())))
            }
        }
    }

    /// The header of a per-block list (`extra_keys`, `mm_keys`): `None` for nil (and for an
    /// empty list where `empty_is_none`), else its length. A list of more than
    /// `max_blocks_per_event` entries, or another type, is skipped whole and refused.
    fn read_block_list(&mut self, depth: usize, empty_is_none: bool) -> Field<Option<u32>> {
        let max = self.limits.max_blocks_per_event;
        match self.next()? {
            Tok::Nil => Ok(Ok(None)),
            Tok::Array(0) if empty_is_none => Ok(Ok(None)),
            Tok::Array(n) => {
                self.enter(depth)?;
                if n as usize > max {
                    self.skip_items(u64::from(n), depth + 1)?;
                    return Ok(Err(format!("{n} blocks > limit {max}")));
                }
                Ok(Ok(Some(n)))
            }
            other => {
                self.skip_rest(&other, depth)?;
                Ok(Err(format!("{} where an array is expected", other.kind())))
            }
        }
    }

    /// vLLM `extra_keys`: nil, or a list (one per block) of nil or a list of entries.
    fn read_extra_keys(&mut self, depth: usize) -> Field<Option<Vec<Vec<RawExtra>>>> {
        let max = self.limits.max_blocks_per_event;
        let n = match self.read_block_list(depth, false)? {
            Ok(Some(n)) => n,
            Ok(None) => return Ok(Ok(None)),
            Err(bad) => return Ok(Err(bad)),
        };
        let mut out = Vec::with_capacity(self.cap(n as usize));
        let mut bad = None;
        for _ in 0..n {
            let tok = self.next()?;
            let m = match tok {
                Tok::Nil => {
                    out.push(Vec::new());
                    continue;
                }
                Tok::Array(m) if m as usize <= max => {
                    self.enter(depth + 1)?;
                    m
                }
                other => {
                    self.skip_rest(&other, depth + 1)?;
                    bad.get_or_insert_with(|| format!("block entry is {}", other.kind()));
                    continue;
                }
            };
            let mut entries = Vec::with_capacity(self.cap(m as usize));
            for _ in 0..m {
                entries.push(self.read_extra_entry(depth + 2)?);
            }
            out.push(entries);
        }
        Ok(bad.map_or(Ok(Some(out)), Err))
    }

    /// One extra-key entry at `depth`: a string, an `[identifier, offset]` pair, or anything
    /// else (hashed over its exact msgpack bytes).
    fn read_extra_entry(&mut self, depth: usize) -> Result<RawExtra, DecodeError> {
        let start = self.pos;
        let tok = self.next()?;
        if let Tok::Str(b) = tok
            && let Ok(s) = std::str::from_utf8(b)
        {
            return Ok(RawExtra::Str(s.to_owned()));
        }
        if let Tok::Array(2) = tok {
            self.enter(depth)?;
            let save = self.pos;
            let first = self.next()?;
            if let Tok::Str(b) = first
                && let Ok(s) = std::str::from_utf8(b)
            {
                let second = self.next()?;
                if matches!(second, Tok::Uint(_) | Tok::Int(_)) {
                    return Ok(RawExtra::Mm(s.to_owned()));
                }
                self.skip_rest(&second, depth + 1)?;
            } else {
                self.pos = save;
                self.skip_items(2, depth + 1)?;
            }
            return Ok(RawExtra::Other(xxhash_rust::xxh3::xxh3_64(
                &self.buf[start..self.pos],
            )));
        }
        self.skip_rest(&tok, depth)?;
        Ok(RawExtra::Other(xxhash_rust::xxh3::xxh3_64(
            &self.buf[start..self.pos],
        )))
    }

    /// TensorRT-LLM `mm_keys`: nil, or a list (one per block) of nil or a list of
    /// `MultimodalKey` maps. An empty list means no keys for any block.
    fn read_mm_keys(&mut self, depth: usize) -> Field<Option<Vec<RawMm>>> {
        let max = self.limits.max_blocks_per_event;
        let n = match self.read_block_list(depth, true)? {
            Ok(Some(n)) => n,
            Ok(None) => return Ok(Ok(None)),
            Err(bad) => return Ok(Err(bad)),
        };
        let mut out = Vec::with_capacity(self.cap(n as usize));
        let mut bad = None;
        for _ in 0..n {
            let tok = self.next()?;
            let m = match tok {
                Tok::Nil => {
                    out.push(RawMm::default());
                    continue;
                }
                Tok::Array(m) if m as usize <= max => {
                    self.enter(depth + 1)?;
                    m
                }
                Tok::Array(m) => {
                    self.skip_rest(&tok, depth + 1)?;
                    bad.get_or_insert_with(|| format!("{m} keys in a block > limit {max}"));
                    continue;
                }
                other => {
                    self.skip_rest(&other, depth + 1)?;
                    bad.get_or_insert_with(|| format!("block entry is {}", other.kind()));
                    continue;
                }
            };
            let mut block = RawMm::default();
            for _ in 0..m {
                match self.read_mm_key(depth + 2)? {
                    Ok(MmKey::Item { id, digest }) => {
                        block.mm_hashes.extend(id);
                        block.digests.extend(digest);
                    }
                    Ok(MmKey::Other(h)) => block.other.push(h),
                    Err(why) => {
                        bad.get_or_insert(why);
                    }
                }
            }
            out.push(block);
        }
        Ok(bad.map_or(Ok(Some(out)), Err))
    }

    /// One `mm_keys` entry at `depth`: a map `{"type": "mm_key", "hash": str,
    /// "start_offset": int, "uuid": str?}`. Its identifier is `uuid` when non-empty, else
    /// `hash`; `start_offset` (where the block's run starts inside the item) is checked and
    /// does not enter the hash, as the offset of a vLLM `[identifier, offset]` extra key.
    /// A map of another `type` is hashed over its exact msgpack bytes (an `other` key).
    fn read_mm_key(&mut self, depth: usize) -> Field<MmKey> {
        let start = self.pos;
        let tok = self.next()?;
        let Tok::Map(k) = tok else {
            self.skip_rest(&tok, depth)?;
            return Ok(Err(format!("key is {}, not a map", tok.kind())));
        };
        self.enter(depth)?;
        let (mut kind, mut hash, mut uuid) = (None, None, None);
        let mut bad: Option<Bad> = None;
        for _ in 0..k {
            let key = self.next()?;
            let Tok::Str(key) = key else {
                self.skip_rest(&key, depth + 1)?;
                self.skip_value(depth + 1)?;
                continue;
            };
            let r = match key {
                b"type" => self.read_opt_str_at(depth + 1)?.map(|v| kind = v),
                b"hash" => self.read_opt_str_at(depth + 1)?.map(|v| hash = v),
                b"uuid" => self.read_opt_str_at(depth + 1)?.map(|v| uuid = v),
                b"start_offset" => self.read_opt_int_at(depth + 1)?.map(|_| ()),
                _ => {
                    self.skip_value(depth + 1)?;
                    Ok(())
                }
            };
            if let Err(why) = r {
                let key = String::from_utf8_lossy(&key[..key.len().min(MAX_SHOWN_BYTES)]);
                bad.get_or_insert_with(|| format!("key field {key}: {why}"));
            }
        }
        if let Some(why) = bad {
            return Ok(Err(why));
        }
        if kind.as_deref().is_some_and(|t| t != "mm_key") {
            return Ok(Ok(MmKey::Other(xxhash_rust::xxh3::xxh3_64(
                &self.buf[start..self.pos],
            ))));
        }
        let Some(hash) = hash else {
            return Ok(Err("key without hash".into()));
        };
        let id = match uuid.filter(|u| !u.is_empty()) {
            Some(uuid) => mm_identifier_hash(&uuid),
            None => mm_identifier_hash(&hash),
        };
        let digest = (!hash.is_empty()).then(|| hash.to_ascii_lowercase());
        Ok(Ok(MmKey::Item { id, digest }))
    }
}

/// The longest unknown event type kept, in bytes: a type tag is a label, not a payload.
pub const MAX_KIND_BYTES: usize = 64;

/// `kind` cut to at most [`MAX_KIND_BYTES`] (on a char boundary).
fn bounded_kind(mut kind: String) -> String {
    if kind.len() > MAX_KIND_BYTES {
        let mut end = MAX_KIND_BYTES;
        while !kind.is_char_boundary(end) {
            end -= 1;
        }
        kind.truncate(end);
    }
    kind
}

/// The most bytes of a rejected string shown in a malformed-event reason.
const MAX_SHOWN_BYTES: usize = 72;

/// A token id sent as a string: ASCII decimal digits only (no sign, no blank), at least one,
/// the value fitting `u32` (leading zeros allowed).
fn decimal_u32(digits: &[u8]) -> Option<u32> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u32, |acc, &c| {
        if !c.is_ascii_digit() {
            return None;
        }
        acc.checked_mul(10)?.checked_add(u32::from(c - b'0'))
    })
}

/// An engine block hash as 64 bits: an unsigned int as is, a negative int as its two's
/// complement bit pattern, bytes (at least 8) as their last 8 bytes big-endian.
fn hash_of(tok: &Tok<'_>) -> Result<u64, Bad> {
    match *tok {
        Tok::Uint(u) => Ok(u),
        Tok::Int(i) => Ok(i as u64),
        Tok::Bin(b) if b.len() >= 8 => Ok(u64::from_be_bytes(
            b[b.len() - 8..].try_into().expect("8 bytes"),
        )),
        Tok::Bin(b) => Err(format!("block hash of {} bytes (< 8)", b.len())),
        ref other => Err(format!("block hash is {}", other.kind())),
    }
}

/// One block's TensorRT-LLM `mm_keys`, hashed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct RawMm {
    /// [`mm_identifier_hash`] of each item key's identifier.
    mm_hashes: Vec<u64>,
    /// xxh3 of each key of another `type`.
    other: Vec<u64>,
    /// Each item key's non-empty `hash`, ASCII-lowercased: the digests a string token id
    /// may name ([`IMAGE_DIGEST_TOKEN`]).
    digests: Vec<String>,
}

/// One decoded `mm_keys` entry.
enum MmKey {
    /// A multimodal item: its identifier hash (`None`: empty identifier, ignored) and its
    /// `hash` ASCII-lowercased (`None` when empty).
    Item {
        id: Option<u64>,
        digest: Option<String>,
    },
    /// A key of another `type`, hashed over its msgpack bytes.
    Other(u64),
}

/// A token id sent as a string that is not a decimal `u32`, until the event's `mm_keys` are
/// known.
#[derive(Debug)]
struct StringToken {
    /// Its index in the event's token ids.
    slot: usize,
    /// Where its bytes are in the payload.
    bytes: Range<usize>,
}

/// An extra-key entry before the event's `lora_name` is known (map order is free).
#[derive(Debug, Clone, PartialEq, Eq)]
enum RawExtra {
    Str(String),
    Mm(String),
    Other(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FieldName {
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
const STORED_ORDER: [FieldName; 15] = [
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
const REMOVED_ORDER: [FieldName; 5] = [
    FieldName::BlockHashes,
    FieldName::Medium,
    FieldName::GroupIdx,
    FieldName::Ignored, // locality
    FieldName::Ignored, // ownership
];

impl FieldName {
    fn of(key: &[u8]) -> Option<Self> {
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

    fn label(self) -> &'static str {
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
struct Fields {
    block_hashes: Option<Vec<u64>>,
    parent: Option<u64>,
    token_ids: Option<Vec<u32>>,
    /// The token ids of `token_ids` sent as non-decimal strings.
    string_tokens: Vec<StringToken>,
    block_size: Option<u32>,
    /// `lora_id` in decimal.
    lora_id: Option<String>,
    medium: Option<String>,
    lora_name: Option<String>,
    cache_salt: Option<String>,
    extra_keys: Option<Vec<Vec<RawExtra>>>,
    mm_keys: Option<Vec<RawMm>>,
    group_idx: Option<u32>,
    spec_kind: Option<String>,
    sliding_window: Option<u32>,
}

impl Fields {
    /// Checks each token id sent as a non-decimal string against the event's `mm_keys`
    /// hashes (ASCII case-insensitive): a match stays [`IMAGE_DIGEST_TOKEN`], anything else
    /// is the reason the event is malformed. A set of the digests keeps this linear in the
    /// event's size.
    fn resolve_string_tokens(&self, buf: &[u8]) -> Result<(), Bad> {
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

    fn build(self, kind: &str) -> Result<EngineEvent, Bad> {
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

/// Sorts one block's extra-key entries: the string equal to `lora_name` is the LoRA, the first
/// other string the cache salt (a further distinct string, never sent by vLLM, is kept as an
/// `other` hash so it still separates blocks), pairs are multimodal items.
fn classify(entries: Vec<RawExtra>, lora_name: Option<&str>) -> BlockExtras {
    let mut out = BlockExtras::default();
    for e in entries {
        match e {
            RawExtra::Str(s) if Some(s.as_str()) == lora_name => out.lora_name = Some(s),
            RawExtra::Str(s) => match &out.salt {
                None => out.salt = Some(s),
                Some(first) if *first == s => {}
                Some(_) => out.other.push(xxhash_rust::xxh3::xxh3_64(s.as_bytes())),
            },
            RawExtra::Mm(id) => out.mm_hashes.extend(mm_identifier_hash(&id)),
            RawExtra::Other(h) => out.other.push(h),
        }
    }
    out
}

#[cfg(test)]
mod tests;
