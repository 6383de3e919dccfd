//! Reading one event (a tagged map or a positional array) and each of its fields; an event of
//! an unknown type is kept by its bounded type name.

use crate::event::{DecodeNotes, EngineEvent};
use crate::wire::fields::{FieldName, Fields, REMOVED_ORDER, STORED_ORDER};
use crate::wire::reader::{Reader, Tok};
use crate::wire::values::{Bad, Field};

/// The longest unknown event type kept, in bytes: a type tag is a label, not a payload.
pub const MAX_KIND_BYTES: usize = 64;

/// `kind` cut to at most [`MAX_KIND_BYTES`] (on a char boundary).
pub(super) fn bounded_kind(mut kind: String) -> String {
    if kind.len() > MAX_KIND_BYTES {
        let mut end = MAX_KIND_BYTES;
        while !kind.is_char_boundary(end) {
            end -= 1;
        }
        kind.truncate(end);
    }
    kind
}

impl Reader<'_, '_> {
    /// One event at depth 3. `Ok(Ok(None))` is never returned for a well-formed event; it is
    /// kept for symmetry with skipped shapes.
    pub(super) fn read_event(&mut self, notes: &mut DecodeNotes) -> Field<EngineEvent> {
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
    pub(super) fn read_field(&mut self, name: FieldName, f: &mut Fields) -> Field<()> {
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
}
