//! The msgpack token reader under [`crate::wire::decode_batch`]: one token at a time (markers
//! classified by [`rmp::Marker`]), iterative skipping, and the nesting limit.
//!
//! Why not a value tree: a tree is built before any limit can be checked, so a 64 MiB frame of
//! one-byte nils would become gigabytes of values. Reading tokens lets each caller check its
//! bound first, and reservations never exceed the bytes left (each item takes at least one).

use rmp::Marker;

use crate::wire::limits::{DecodeError, DecodeLimits};

/// One msgpack token: a scalar with its data, or a container header (its items follow).
#[derive(Debug, Clone, Copy)]
pub(super) enum Tok<'a> {
    Nil,
    Bool,
    Uint(u64),
    Int(i64),
    Float(f64),
    Str(&'a [u8]),
    Bin(&'a [u8]),
    Ext,
    Array(u32),
    Map(u32),
}

impl Tok<'_> {
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Tok::Nil => "nil",
            Tok::Bool => "bool",
            Tok::Uint(_) | Tok::Int(_) => "int",
            Tok::Float(_) => "float",
            Tok::Str(_) => "str",
            Tok::Bin(_) => "bin",
            Tok::Ext => "ext",
            Tok::Array(_) => "array",
            Tok::Map(_) => "map",
        }
    }

    /// The value as a non-negative integer, whichever int marker carried it.
    pub(super) fn as_u64(&self) -> Option<u64> {
        match *self {
            Tok::Uint(u) => Some(u),
            Tok::Int(i) => u64::try_from(i).ok(),
            _ => None,
        }
    }

    pub(super) fn as_u32(&self) -> Option<u32> {
        self.as_u64().and_then(|u| u32::try_from(u).ok())
    }
}

/// A cursor over one payload.
pub(super) struct Reader<'a, 'l> {
    pub(super) buf: &'a [u8],
    pub(super) pos: usize,
    pub(super) limits: &'l DecodeLimits,
}

impl<'a> Reader<'a, '_> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).ok_or(DecodeError::Truncated)?;
        let s = self.buf.get(self.pos..end).ok_or(DecodeError::Truncated)?;
        self.pos = end;
        Ok(s)
    }

    fn be<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        Ok(self.take(N)?.try_into().expect("take returned N bytes"))
    }

    fn len8(&mut self) -> Result<usize, DecodeError> {
        Ok(usize::from(self.be::<1>()?[0]))
    }
    fn len16(&mut self) -> Result<usize, DecodeError> {
        Ok(usize::from(u16::from_be_bytes(self.be()?)))
    }
    fn len32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.be()?))
    }

    /// Reads one token (a container's items are not read).
    pub(super) fn next(&mut self) -> Result<Tok<'a>, DecodeError> {
        let m = Marker::from_u8(self.be::<1>()?[0]);
        Ok(match m {
            Marker::FixPos(v) => Tok::Uint(u64::from(v)),
            Marker::FixNeg(v) => Tok::Int(i64::from(v)),
            Marker::FixMap(n) => Tok::Map(u32::from(n)),
            Marker::FixArray(n) => Tok::Array(u32::from(n)),
            Marker::FixStr(n) => Tok::Str(self.take(usize::from(n))?),
            Marker::Null => Tok::Nil,
            Marker::Reserved => return Err(DecodeError::Syntax("reserved marker 0xc1".into())),
            Marker::False | Marker::True => Tok::Bool,
            Marker::Bin8 => {
                let n = self.len8()?;
                Tok::Bin(self.take(n)?)
            }
            Marker::Bin16 => {
                let n = self.len16()?;
                Tok::Bin(self.take(n)?)
            }
            Marker::Bin32 => {
                let n = self.len32()? as usize;
                Tok::Bin(self.take(n)?)
            }
            Marker::Str8 => {
                let n = self.len8()?;
                Tok::Str(self.take(n)?)
            }
            Marker::Str16 => {
                let n = self.len16()?;
                Tok::Str(self.take(n)?)
            }
            Marker::Str32 => {
                let n = self.len32()? as usize;
                Tok::Str(self.take(n)?)
            }
            Marker::Ext8 => {
                let n = self.len8()?;
                self.take(n + 1)?;
                Tok::Ext
            }
            Marker::Ext16 => {
                let n = self.len16()?;
                self.take(n + 1)?;
                Tok::Ext
            }
            Marker::Ext32 => {
                let n = self.len32()? as usize;
                self.take(n.saturating_add(1))?;
                Tok::Ext
            }
            Marker::FixExt1 => self.take(2).map(|_| Tok::Ext)?,
            Marker::FixExt2 => self.take(3).map(|_| Tok::Ext)?,
            Marker::FixExt4 => self.take(5).map(|_| Tok::Ext)?,
            Marker::FixExt8 => self.take(9).map(|_| Tok::Ext)?,
            Marker::FixExt16 => self.take(17).map(|_| Tok::Ext)?,
            Marker::F32 => Tok::Float(f64::from(f32::from_be_bytes(self.be()?))),
            Marker::F64 => Tok::Float(f64::from_be_bytes(self.be()?)),
            Marker::U8 => Tok::Uint(u64::from(self.be::<1>()?[0])),
            Marker::U16 => Tok::Uint(u64::from(u16::from_be_bytes(self.be()?))),
            Marker::U32 => Tok::Uint(u64::from(u32::from_be_bytes(self.be()?))),
            Marker::U64 => Tok::Uint(u64::from_be_bytes(self.be()?)),
            Marker::I8 => Tok::Int(i64::from(i8::from_be_bytes(self.be()?))),
            Marker::I16 => Tok::Int(i64::from(i16::from_be_bytes(self.be()?))),
            Marker::I32 => Tok::Int(i64::from(i32::from_be_bytes(self.be()?))),
            Marker::I64 => Tok::Int(i64::from_be_bytes(self.be()?)),
            Marker::Array16 => Tok::Array(self.len16()? as u32),
            Marker::Array32 => Tok::Array(self.len32()?),
            Marker::Map16 => Tok::Map(self.len16()? as u32),
            Marker::Map32 => Tok::Map(self.len32()?),
        })
    }

    /// Skips `items` whole values that sit at nesting depth `depth` (iteratively: a deep
    /// payload cannot exhaust the stack; `max_depth` bounds the nesting instead).
    pub(super) fn skip_items(&mut self, items: u64, depth: usize) -> Result<(), DecodeError> {
        // Remaining item counts of the open containers, innermost last; an item read while
        // `open.len() == k` sits at depth `depth + k - 1`.
        let mut open: Vec<u64> = vec![items];
        while let Some(top) = open.last_mut() {
            if *top == 0 {
                open.pop();
                continue;
            }
            *top -= 1;
            let n = match self.next()? {
                Tok::Array(n) => u64::from(n),
                Tok::Map(n) => 2 * u64::from(n),
                _ => continue,
            };
            self.enter(depth + open.len() - 1)?;
            open.push(n);
        }
        Ok(())
    }

    /// Skips one whole value at nesting depth `depth`.
    pub(super) fn skip_value(&mut self, depth: usize) -> Result<(), DecodeError> {
        self.skip_items(1, depth)
    }

    /// Skips the items of `tok` if it is a container header read at depth `depth`.
    pub(super) fn skip_rest(&mut self, tok: &Tok<'_>, depth: usize) -> Result<(), DecodeError> {
        let items = match *tok {
            Tok::Array(n) => u64::from(n),
            Tok::Map(n) => 2 * u64::from(n),
            _ => return Ok(()),
        };
        self.enter(depth)?;
        self.skip_items(items, depth + 1)
    }

    /// Capacity to reserve for `n` items: never more than the bytes left (each item takes at
    /// least one), so a lying header cannot make the decoder allocate.
    pub(super) fn cap(&self, n: usize) -> usize {
        n.min(self.buf.len() - self.pos)
    }

    /// A container header at `depth` counts toward the nesting limit.
    pub(super) fn enter(&self, depth: usize) -> Result<(), DecodeError> {
        if depth > self.limits.max_depth {
            return Err(DecodeError::Limit(format!(
                "nesting deeper than {}",
                self.limits.max_depth
            )));
        }
        Ok(())
    }
}
