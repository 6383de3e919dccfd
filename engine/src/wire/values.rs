//! Reading one typed value of an event (an optional string, int or block hash, a list of block
//! hashes, a bounded array header): a value of the wrong shape is consumed and reported as the
//! reason its event is skipped ([`Bad`]), never failing the batch.

use crate::wire::limits::DecodeError;
use crate::wire::reader::{Reader, Tok};

/// Why one event is skipped (the event was still consumed whole).
pub(super) type Bad = String;

/// `Err` = fatal for the batch; `Ok(Err)` = this value was of the wrong shape (and consumed).
pub(super) type Field<T> = Result<Result<T, Bad>, DecodeError>;

/// The most bytes of a rejected string shown in a malformed-event reason.
pub(super) const MAX_SHOWN_BYTES: usize = 72;

/// An engine block hash as 64 bits: an unsigned int as is, a negative int as its two's
/// complement bit pattern, bytes (at least 8) as their last 8 bytes big-endian.
pub(super) fn hash_of(tok: &Tok<'_>) -> Result<u64, Bad> {
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

impl Reader<'_, '_> {
    pub(super) fn read_opt_str(&mut self) -> Field<Option<String>> {
        self.read_opt_str_at(4)
    }

    /// nil or a UTF-8 string, the value at `depth`.
    pub(super) fn read_opt_str_at(&mut self, depth: usize) -> Field<Option<String>> {
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

    pub(super) fn read_opt_u32(&mut self) -> Field<Option<u32>> {
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
    pub(super) fn read_opt_int(&mut self) -> Field<Option<String>> {
        self.read_opt_int_at(4)
    }

    /// [`Self::read_opt_int`] of the value at `depth`.
    pub(super) fn read_opt_int_at(&mut self, depth: usize) -> Field<Option<String>> {
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

    pub(super) fn read_opt_hash(&mut self) -> Field<Option<u64>> {
        let tok = self.next()?;
        if let Tok::Nil = tok {
            return Ok(Ok(None));
        }
        let r = hash_of(&tok).map(Some);
        self.skip_rest(&tok, 4)?;
        Ok(r)
    }

    /// A list of block hashes at `depth`.
    pub(super) fn read_hashes(&mut self, depth: usize) -> Field<Vec<u64>> {
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

    /// Reads an array header at `depth` with at most `max` items; anything else (or a longer
    /// array) is consumed and reported.
    pub(super) fn list_header(&mut self, depth: usize, max: usize) -> Field<usize> {
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
}
