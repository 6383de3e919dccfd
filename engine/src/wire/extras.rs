//! What enters a block's hash besides its tokens: vLLM `extra_keys` (LoRA name, cache salt,
//! multimodal `[identifier, offset]` pairs, anything else hashed over its msgpack bytes) and
//! TensorRT-LLM `mm_keys`, read per block and sorted into [`BlockExtras`].

use ckf_core::tokens::mm_identifier_hash;

use crate::event::BlockExtras;
use crate::wire::limits::DecodeError;
use crate::wire::reader::{Reader, Tok};
use crate::wire::values::Bad;
use crate::wire::values::{Field, MAX_SHOWN_BYTES};

/// One block's TensorRT-LLM `mm_keys`, hashed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct RawMm {
    /// [`mm_identifier_hash`] of each item key's identifier.
    pub(super) mm_hashes: Vec<u64>,
    /// xxh3 of each key of another `type`.
    pub(super) other: Vec<u64>,
    /// Each item key's non-empty `hash`, ASCII-lowercased: the digests a string token id
    /// may name ([`IMAGE_DIGEST_TOKEN`]).
    pub(super) digests: Vec<String>,
}

/// One decoded `mm_keys` entry.
pub(super) enum MmKey {
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
/// An extra-key entry before the event's `lora_name` is known (map order is free).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum RawExtra {
    Str(String),
    Mm(String),
    Other(u64),
}

/// Sorts one block's extra-key entries: the string equal to `lora_name` is the LoRA, the first
/// other string the cache salt (a further distinct string, never sent by vLLM, is kept as an
/// `other` hash so it still separates blocks), pairs are multimodal items.
pub(super) fn classify(entries: Vec<RawExtra>, lora_name: Option<&str>) -> BlockExtras {
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

impl Reader<'_, '_> {
    /// The header of a per-block list (`extra_keys`, `mm_keys`): `None` for nil (and for an
    /// empty list where `empty_is_none`), else its length. A list of more than
    /// `max_blocks_per_event` entries, or another type, is skipped whole and refused.
    pub(super) fn read_block_list(
        &mut self,
        depth: usize,
        empty_is_none: bool,
    ) -> Field<Option<u32>> {
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

    /// A per-block list (`extra_keys`, `mm_keys`): nil (`None`), or one entry per block, each
    /// nil (`T::default()`) or a list of at most `max_blocks_per_event` items that `item` reads
    /// at `depth + 2` into the block's `T`. A bad entry or item is skipped and the first reason
    /// kept: the field is then refused.
    fn read_per_block<T: Default>(
        &mut self,
        depth: usize,
        empty_is_none: bool,
        mut item: impl FnMut(&mut Self, &mut T, usize) -> Result<Option<Bad>, DecodeError>,
    ) -> Field<Option<Vec<T>>> {
        let max = self.limits.max_blocks_per_event;
        let n = match self.read_block_list(depth, empty_is_none)? {
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
                    out.push(T::default());
                    continue;
                }
                Tok::Array(m) if m as usize <= max => {
                    self.enter(depth + 1)?;
                    m
                }
                Tok::Array(m) => {
                    self.skip_rest(&tok, depth + 1)?;
                    bad.get_or_insert_with(|| format!("{m} entries in a block > limit {max}"));
                    continue;
                }
                other => {
                    self.skip_rest(&other, depth + 1)?;
                    bad.get_or_insert_with(|| format!("block entry is {}", other.kind()));
                    continue;
                }
            };
            let mut block = T::default();
            for _ in 0..m {
                if let Some(why) = item(self, &mut block, depth + 2)? {
                    bad.get_or_insert(why);
                }
            }
            out.push(block);
        }
        Ok(bad.map_or(Ok(Some(out)), Err))
    }

    /// vLLM `extra_keys`: nil, or a list (one per block) of nil or a list of entries.
    pub(super) fn read_extra_keys(&mut self, depth: usize) -> Field<Option<Vec<Vec<RawExtra>>>> {
        self.read_per_block(depth, false, |reader, block: &mut Vec<RawExtra>, depth| {
            block.push(reader.read_extra_entry(depth)?);
            Ok(None)
        })
    }

    /// One extra-key entry at `depth`: a string, an `[identifier, offset]` pair, or anything
    /// else (hashed over its exact msgpack bytes).
    pub(super) fn read_extra_entry(&mut self, depth: usize) -> Result<RawExtra, DecodeError> {
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
    pub(super) fn read_mm_keys(&mut self, depth: usize) -> Field<Option<Vec<RawMm>>> {
        self.read_per_block(depth, true, |reader, block: &mut RawMm, depth| {
            Ok(match reader.read_mm_key(depth)? {
                Ok(MmKey::Item { id, digest }) => {
                    block.mm_hashes.extend(id);
                    block.digests.extend(digest);
                    None
                }
                Ok(MmKey::Other(h)) => {
                    block.other.push(h);
                    None
                }
                Err(why) => Some(why),
            })
        })
    }

    /// One `mm_keys` entry at `depth`: a map `{"type": "mm_key", "hash": str,
    /// "start_offset": int, "uuid": str?}`. Its identifier is `uuid` when non-empty, else
    /// `hash`; `start_offset` (where the block's run starts inside the item) is checked and
    /// does not enter the hash, as the offset of a vLLM `[identifier, offset]` extra key.
    /// A map of another `type` is hashed over its exact msgpack bytes (an `other` key).
    pub(super) fn read_mm_key(&mut self, depth: usize) -> Field<MmKey> {
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
