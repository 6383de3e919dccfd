//! Record framing, shared by log segments and checkpoints.
//!
//! A record on disk is `len: u32 LE | crc: u32 LE | payload: len bytes`, where `crc` is the
//! CRC-32C (Castagnoli) of the payload. CRC-32C detects every burst error up to 32 bits and
//! every odd number of bit errors in a record; it is what ext4, Btrfs, iSCSI and RocksDB use for
//! the same job.
//!
//! A checkpoint ends with an *end marker*: `len == END_MARKER`, then the number of records
//! before it (`u64 LE`) and the CRC-32C of those 8 bytes. A checkpoint without its end marker is
//! incomplete and never used.

use std::io::{self, Read, Write};

/// Largest payload of one record (bytes). Bounds the allocation a corrupt length can cause on
/// recovery; producers split larger images into several records.
pub const MAX_RECORD_BYTES: usize = 256 << 20;

/// `len` value that marks a checkpoint's end marker.
pub(crate) const END_MARKER: u32 = u32::MAX;

/// Bytes of a record's `len | crc` prefix.
pub const RECORD_OVERHEAD: usize = 8;

/// Appends one framed record to `out`.
///
/// # Panics
/// When `payload` exceeds [`MAX_RECORD_BYTES`] (a caller bug: producers chunk their images).
pub(crate) fn encode(payload: &[u8], out: &mut impl Write) -> io::Result<()> {
    assert!(
        !payload.is_empty() && payload.len() <= MAX_RECORD_BYTES,
        "record of {} bytes: records hold 1..=MAX_RECORD_BYTES bytes",
        payload.len()
    );
    let mut prefix = [0u8; RECORD_OVERHEAD];
    prefix[..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    prefix[4..].copy_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    out.write_all(&prefix)?;
    out.write_all(payload)
}

/// Appends a checkpoint's end marker for `records` records.
pub(crate) fn encode_end(records: u64, out: &mut impl Write) -> io::Result<()> {
    let count = records.to_le_bytes();
    out.write_all(&END_MARKER.to_le_bytes())?;
    out.write_all(&count)?;
    out.write_all(&crc32c::crc32c(&count).to_le_bytes())
}

/// One entry as read back.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Entry {
    /// A record whose checksum matched.
    Record(Vec<u8>),
    /// A checkpoint's end marker with a valid checksum: the number of records before it.
    End(u64),
    /// Clean end of input, at a record boundary.
    Eof,
}

/// Why an entry could not be read. `offset` is where the bad entry starts in the file.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum EntryFault {
    /// The input ended inside a record (a torn write).
    Truncated,
    /// The length is above [`MAX_RECORD_BYTES`].
    Oversized(u32),
    /// The length is zero: no record is empty, so this is a zero-filled region (blocks a power
    /// loss left unwritten) or damage.
    Empty,
    /// The payload's CRC-32C does not match its prefix.
    Checksum,
}

impl std::fmt::Display for EntryFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Truncated => f.write_str("the file ends inside a record (torn write)"),
            Self::Oversized(len) => write!(
                f,
                "record length {len} exceeds the {MAX_RECORD_BYTES}-byte limit (corrupt length)"
            ),
            Self::Checksum => f.write_str("record checksum (CRC-32C) mismatch"),
            Self::Empty => f.write_str("zero record length (zero-filled or damaged)"),
        }
    }
}

/// Reads exactly `buf.len()` bytes; `Ok(false)` on a clean EOF before the first byte,
/// `Err(Truncated)` on an EOF after it.
fn read_full(input: &mut impl Read, buf: &mut [u8]) -> io::Result<Result<bool, EntryFault>> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]) {
            Ok(0) if filled == 0 => return Ok(Ok(false)),
            Ok(0) => return Ok(Err(EntryFault::Truncated)),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Ok(true))
}

/// Reads the next entry. I/O errors are `Err`; damaged entries are `Ok(Err(fault))`.
pub(crate) fn decode(input: &mut impl Read) -> io::Result<Result<Entry, EntryFault>> {
    let mut prefix = [0u8; RECORD_OVERHEAD];
    match read_full(input, &mut prefix)? {
        Ok(true) => {}
        Ok(false) => return Ok(Ok(Entry::Eof)),
        Err(fault) => return Ok(Err(fault)),
    }
    let len = u32::from_le_bytes(prefix[..4].try_into().expect("4 bytes"));
    let crc = u32::from_le_bytes(prefix[4..].try_into().expect("4 bytes"));
    if len == END_MARKER {
        // The crc field holds the low half of the count; read the rest.
        let mut rest = [0u8; 8];
        match read_full(input, &mut rest)? {
            Ok(true) => {}
            Ok(false) => return Ok(Err(EntryFault::Truncated)),
            Err(fault) => return Ok(Err(fault)),
        }
        let mut count = [0u8; 8];
        count[..4].copy_from_slice(&prefix[4..]);
        count[4..].copy_from_slice(&rest[..4]);
        let stored = u32::from_le_bytes(rest[4..].try_into().expect("4 bytes"));
        if crc32c::crc32c(&count) != stored {
            return Ok(Err(EntryFault::Checksum));
        }
        return Ok(Ok(Entry::End(u64::from_le_bytes(count))));
    }
    if len == 0 {
        return Ok(Err(EntryFault::Empty));
    }
    if len as usize > MAX_RECORD_BYTES {
        return Ok(Err(EntryFault::Oversized(len)));
    }
    let mut payload = vec![0u8; len as usize];
    match read_full(input, &mut payload)? {
        Ok(true) => {}
        Ok(false) => return Ok(Err(EntryFault::Truncated)),
        Err(fault) => return Ok(Err(fault)),
    }
    if crc32c::crc32c(&payload) != crc {
        return Ok(Err(EntryFault::Checksum));
    }
    Ok(Ok(Entry::Record(payload)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn read_all(bytes: &[u8]) -> (Vec<Entry>, Option<EntryFault>) {
        let mut input = bytes;
        let mut entries = Vec::new();
        loop {
            match decode(&mut input).unwrap() {
                Ok(Entry::Eof) => return (entries, None),
                Ok(f) => entries.push(f),
                Err(fault) => return (entries, Some(fault)),
            }
        }
    }

    proptest! {
        #[test]
        fn records_round_trip_and_every_truncation_is_detected(
            payloads in prop::collection::vec(prop::collection::vec(any::<u8>(), 1..64), 1..6),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut bytes = Vec::new();
            for p in &payloads {
                encode(p, &mut bytes).unwrap();
            }
            encode_end(payloads.len() as u64, &mut bytes).unwrap();
            let (entries, fault) = read_all(&bytes);
            prop_assert_eq!(fault, None);
            let mut expected: Vec<Entry> = payloads.iter().cloned().map(Entry::Record).collect();
            expected.push(Entry::End(payloads.len() as u64));
            prop_assert_eq!(entries, expected);

            // Cutting anywhere but a record boundary is a torn write, never a short record.
            let at = cut.index(bytes.len());
            let (entries, fault) = read_all(&bytes[..at]);
            let mut boundary = 0;
            let mut boundaries = vec![0];
            for p in &payloads {
                boundary += RECORD_OVERHEAD + p.len();
                boundaries.push(boundary);
            }
            if boundaries.contains(&at) {
                prop_assert_eq!(fault, None);
                prop_assert_eq!(entries.len(), boundaries.iter().position(|&b| b == at).unwrap());
            } else {
                prop_assert_eq!(fault, Some(EntryFault::Truncated));
            }
        }

        #[test]
        fn a_flipped_bit_is_never_read_as_a_record(
            payload in prop::collection::vec(any::<u8>(), 1..64),
            bit in any::<prop::sample::Index>(),
        ) {
            let mut bytes = Vec::new();
            encode(&payload, &mut bytes).unwrap();
            let bit = bit.index(bytes.len() * 8);
            bytes[bit / 8] ^= 1 << (bit % 8);
            let (entries, fault) = read_all(&bytes);
            // A flip in the length makes it truncated/oversized/mismatched; anywhere else a
            // checksum mismatch. Never the original record, never a different one.
            prop_assert!(entries.is_empty(), "read {:?}", entries);
            prop_assert!(fault.is_some());
        }
    }

    #[test]
    fn zeros_are_not_records() {
        let (entries, fault) = read_all(&[0u8; 64]);
        assert!(entries.is_empty());
        assert_eq!(fault, Some(EntryFault::Empty));
    }

    #[test]
    fn an_oversized_length_is_refused_before_allocating() {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&(MAX_RECORD_BYTES as u32 + 1).to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        let (_, fault) = read_all(&bytes);
        assert_eq!(
            fault,
            Some(EntryFault::Oversized(MAX_RECORD_BYTES as u32 + 1))
        );
    }
}
