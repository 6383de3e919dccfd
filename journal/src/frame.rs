//! Record framing, shared by log segments and checkpoints.
//!
//! A record on disk is `len: u32 LE | crc: u32 LE | payload: len bytes`, where `crc` is the
//! CRC-32C (Castagnoli) of the payload. CRC-32C detects every burst error up to 32 bits and
//! every odd number of bit errors in a record; it is what ext4, Btrfs, iSCSI and RocksDB use for
//! the same job.
//!
//! A checkpoint ends with an *end frame*: `len == END_MARKER`, then the number of records
//! before it (`u64 LE`) and the CRC-32C of those 8 bytes. A checkpoint without its end frame is
//! incomplete and never used.

use std::io::{self, Read, Write};

/// Largest payload of one record (bytes). Bounds the allocation a corrupt length can cause on
/// recovery; producers split larger images into several records.
pub const MAX_RECORD_BYTES: usize = 256 << 20;

/// `len` value that marks a checkpoint's end frame.
pub(crate) const END_MARKER: u32 = u32::MAX;

/// Bytes of a record's `len | crc` prefix.
pub const FRAME_OVERHEAD: usize = 8;

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
    let mut prefix = [0u8; FRAME_OVERHEAD];
    prefix[..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    prefix[4..].copy_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    out.write_all(&prefix)?;
    out.write_all(payload)
}

/// Appends a checkpoint's end frame for `records` records.
pub(crate) fn encode_end(records: u64, out: &mut impl Write) -> io::Result<()> {
    let count = records.to_le_bytes();
    out.write_all(&END_MARKER.to_le_bytes())?;
    out.write_all(&count)?;
    out.write_all(&crc32c::crc32c(&count).to_le_bytes())
}

/// One frame as read back.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Frame {
    /// A record whose checksum matched.
    Record(Vec<u8>),
    /// A checkpoint's end frame with a valid checksum: the number of records before it.
    End(u64),
    /// Clean end of input, at a frame boundary.
    Eof,
}

/// Why a frame could not be read. `offset` is where the bad frame starts in the file.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum FrameFault {
    /// The input ended inside a frame (a torn write).
    Truncated,
    /// The length is above [`MAX_RECORD_BYTES`].
    Oversized(u32),
    /// The length is zero: no record is empty, so this is a zero-filled region (blocks a power
    /// loss left unwritten) or damage.
    Empty,
    /// The payload's CRC-32C does not match its prefix.
    Checksum,
}

impl std::fmt::Display for FrameFault {
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
fn read_full(input: &mut impl Read, buf: &mut [u8]) -> io::Result<Result<bool, FrameFault>> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]) {
            Ok(0) if filled == 0 => return Ok(Ok(false)),
            Ok(0) => return Ok(Err(FrameFault::Truncated)),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Ok(true))
}

/// Reads the next frame. I/O errors are `Err`; damaged frames are `Ok(Err(fault))`.
pub(crate) fn decode(input: &mut impl Read) -> io::Result<Result<Frame, FrameFault>> {
    let mut prefix = [0u8; FRAME_OVERHEAD];
    match read_full(input, &mut prefix)? {
        Ok(true) => {}
        Ok(false) => return Ok(Ok(Frame::Eof)),
        Err(fault) => return Ok(Err(fault)),
    }
    let len = u32::from_le_bytes(prefix[..4].try_into().expect("4 bytes"));
    let crc = u32::from_le_bytes(prefix[4..].try_into().expect("4 bytes"));
    if len == END_MARKER {
        // The crc field holds the low half of the count; read the rest.
        let mut rest = [0u8; 8];
        match read_full(input, &mut rest)? {
            Ok(true) => {}
            Ok(false) => return Ok(Err(FrameFault::Truncated)),
            Err(fault) => return Ok(Err(fault)),
        }
        let mut count = [0u8; 8];
        count[..4].copy_from_slice(&prefix[4..]);
        count[4..].copy_from_slice(&rest[..4]);
        let stored = u32::from_le_bytes(rest[4..].try_into().expect("4 bytes"));
        if crc32c::crc32c(&count) != stored {
            return Ok(Err(FrameFault::Checksum));
        }
        return Ok(Ok(Frame::End(u64::from_le_bytes(count))));
    }
    if len == 0 {
        return Ok(Err(FrameFault::Empty));
    }
    if len as usize > MAX_RECORD_BYTES {
        return Ok(Err(FrameFault::Oversized(len)));
    }
    let mut payload = vec![0u8; len as usize];
    match read_full(input, &mut payload)? {
        Ok(true) => {}
        Ok(false) => return Ok(Err(FrameFault::Truncated)),
        Err(fault) => return Ok(Err(fault)),
    }
    if crc32c::crc32c(&payload) != crc {
        return Ok(Err(FrameFault::Checksum));
    }
    Ok(Ok(Frame::Record(payload)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn read_all(bytes: &[u8]) -> (Vec<Frame>, Option<FrameFault>) {
        let mut input = bytes;
        let mut frames = Vec::new();
        loop {
            match decode(&mut input).unwrap() {
                Ok(Frame::Eof) => return (frames, None),
                Ok(f) => frames.push(f),
                Err(fault) => return (frames, Some(fault)),
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
            let (frames, fault) = read_all(&bytes);
            prop_assert_eq!(fault, None);
            let mut expected: Vec<Frame> = payloads.iter().cloned().map(Frame::Record).collect();
            expected.push(Frame::End(payloads.len() as u64));
            prop_assert_eq!(frames, expected);

            // Cutting anywhere but a frame boundary is a torn write, never a short record.
            let at = cut.index(bytes.len());
            let (frames, fault) = read_all(&bytes[..at]);
            let mut boundary = 0;
            let mut boundaries = vec![0];
            for p in &payloads {
                boundary += FRAME_OVERHEAD + p.len();
                boundaries.push(boundary);
            }
            if boundaries.contains(&at) {
                prop_assert_eq!(fault, None);
                prop_assert_eq!(frames.len(), boundaries.iter().position(|&b| b == at).unwrap());
            } else {
                prop_assert_eq!(fault, Some(FrameFault::Truncated));
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
            let (frames, fault) = read_all(&bytes);
            // A flip in the length makes it truncated/oversized/mismatched; anywhere else a
            // checksum mismatch. Never the original record, never a different one.
            prop_assert!(frames.is_empty(), "read {:?}", frames);
            prop_assert!(fault.is_some());
        }
    }

    #[test]
    fn zeros_are_not_records() {
        let (frames, fault) = read_all(&[0u8; 64]);
        assert!(frames.is_empty());
        assert_eq!(fault, Some(FrameFault::Empty));
    }

    #[test]
    fn an_oversized_length_is_refused_before_allocating() {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&(MAX_RECORD_BYTES as u32 + 1).to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        let (_, fault) = read_all(&bytes);
        assert_eq!(
            fault,
            Some(FrameFault::Oversized(MAX_RECORD_BYTES as u32 + 1))
        );
    }
}
