//! Token ids: ints fitting `u32`, decimal strings, and the item digest TensorRT-LLM sends in
//! place of a token id ([`IMAGE_DIGEST_TOKEN`]), checked against the event's `mm_keys` once they
//! are read.

use std::ops::Range;

use crate::wire::reader::{Reader, Tok};
use crate::wire::values::Field;

/// The token id an item digest sent in place of a token id decodes to.
///
/// TensorRT-LLM sends, at the position where a multimodal item (an image) starts, the item's
/// digest in hex as a string instead of a token id, and the item's later positions as ints. A
/// string token id that is not a decimal `u32` but equals, ASCII case-insensitively, the
/// `hash` of an `mm_keys` entry of the same event (any of its blocks; a non-empty `hash` of an
/// entry of type `mm_key`) decodes to this fixed id: the item's identity already enters the
/// hash of every block it overlaps through [`crate::event::BlockExtras::mm_hashes`], so the
/// position only needs the same id in every request. A token query for such blocks sends this id at the
/// item's first position, and the item itself (identifier, offset, length) as a multimodal
/// item. Any other non-decimal string makes the event malformed.
///
/// `u32::MAX`: no engine's vocabulary reaches it (TensorRT-LLM's token ids are `int32`); an
/// engine that sent `4294967295` as a token id would give the same block hashes.
pub const IMAGE_DIGEST_TOKEN: u32 = u32::MAX;

/// A token id sent as a string: ASCII decimal digits only (no sign, no blank), at least one,
/// the value fitting `u32` (leading zeros allowed).
pub(super) fn decimal_u32(digits: &[u8]) -> Option<u32> {
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

/// known.
#[derive(Debug)]
pub(super) struct StringToken {
    /// Its index in the event's token ids.
    pub(super) slot: usize,
    /// Where its bytes are in the payload.
    pub(super) bytes: Range<usize>,
}

impl Reader<'_, '_> {
    /// A list of token ids at `depth`: ints fitting `u32` and decimal strings are their value.
    /// Another string is left for [`Fields::resolve_string_tokens`] (it may be an item
    /// digest, checked once the event's `mm_keys` are read): its slot holds
    /// [`IMAGE_DIGEST_TOKEN`] and the second list names the slot and the string's bytes.
    pub(super) fn read_tokens(
        &mut self,
        depth: usize,
        max: usize,
    ) -> Field<(Vec<u32>, Vec<StringToken>)> {
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
}
