//! File headers: what a file is and whose state it holds.
//!
//! Every log segment and checkpoint starts with
//! `magic: 8 bytes | version: u16 LE | number: u64 LE | pool len: u16 LE | pool | format len:
//! u16 LE | format | crc: u32 LE`, the CRC-32C covering every byte before it. `magic` says
//! which kind of file it is, `version` the journal's on-disk format ([`FILE_FORMAT_VERSION`]),
//! `number` its place in the journal (a checkpoint `n` holds the state before segment `n`).
//! `pool` and `format` are the [`StateIdentity`] the producer opened the journal with: a file
//! written for another pool or another table format is refused, never loaded.

use std::io::{self, Read, Write};

/// On-disk format version of segments and checkpoints written by this crate.
pub const FILE_FORMAT_VERSION: u16 = 1;

/// Longest pool name or format description stored in a header (bytes).
pub const MAX_IDENTITY_BYTES: usize = 1024;

/// Whose state a journal holds. Both strings are compared byte for byte on open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateIdentity {
    /// The producer's pool (`indexer domain/DC`), e.g. `"global/dc-a"`.
    pub pool: String,
    /// A description of the table format the state was built for, e.g.
    /// `"v1 buckets=65536 seed=0x0 fp=16 slots=4"` (the producer decides its content).
    pub format: String,
}

/// The two kinds of file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// A write-ahead log segment: `wal-<number>.log`.
    Segment,
    /// A checkpoint: `checkpoint-<number>.ckpt`.
    Checkpoint,
}

impl FileKind {
    fn magic(self) -> &'static [u8; 8] {
        match self {
            Self::Segment => b"CKFJWAL\0",
            Self::Checkpoint => b"CKFJCKP\0",
        }
    }

    /// `"segment"` or `"checkpoint"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Segment => "segment",
            Self::Checkpoint => "checkpoint",
        }
    }
}

/// A decoded header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    pub kind: FileKind,
    pub number: u64,
    pub identity: StateIdentity,
}

/// Why a header was refused (the journal's error adds the path).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderFault {
    /// The file is shorter than its header (a crash while creating it).
    #[error("the file ends inside its header")]
    Truncated,
    /// The magic bytes are not a ckf-journal file's of the expected kind.
    #[error("not a ckf-journal {expected} (magic bytes {found:02x?})")]
    BadMagic {
        /// The kind the file name promised.
        expected: &'static str,
        /// The first eight bytes found.
        found: [u8; 8],
    },
    /// Written by a journal format this build does not read.
    #[error(
        "written in journal format version {found}, or its header is damaged (versions so far: 1..={FILE_FORMAT_VERSION}); this build reads version {FILE_FORMAT_VERSION}"
    )]
    Version {
        /// The version found.
        found: u16,
    },
    /// The header's CRC-32C does not match.
    #[error("header checksum (CRC-32C) mismatch")]
    Checksum,
    /// A length field exceeds [`MAX_IDENTITY_BYTES`] or the text is not UTF-8.
    #[error("malformed identity field in the header")]
    Malformed,
}

pub(crate) fn encode(header: &Header, out: &mut impl Write) -> io::Result<()> {
    let mut bytes = Vec::with_capacity(64);
    bytes.extend_from_slice(header.kind.magic());
    bytes.extend_from_slice(&FILE_FORMAT_VERSION.to_le_bytes());
    bytes.extend_from_slice(&header.number.to_le_bytes());
    for text in [&header.identity.pool, &header.identity.format] {
        assert!(text.len() <= MAX_IDENTITY_BYTES, "identity field too long");
        bytes.extend_from_slice(&(text.len() as u16).to_le_bytes());
        bytes.extend_from_slice(text.as_bytes());
    }
    let crc = crc32c::crc32c(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    out.write_all(&bytes)
}

/// Reads a header of `kind` from the start of `input`.
pub(crate) fn decode(
    kind: FileKind,
    input: &mut impl Read,
) -> io::Result<Result<Header, HeaderFault>> {
    let mut seen = Vec::with_capacity(64);
    macro_rules! take {
        ($n:expr) => {{
            let mut buf = vec![0u8; $n];
            match input.read_exact(&mut buf) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    return Ok(Err(HeaderFault::Truncated));
                }
                Err(e) => return Err(e),
            }
            seen.extend_from_slice(&buf);
            buf
        }};
    }
    let magic: [u8; 8] = take!(8).try_into().expect("8 bytes");
    if &magic != kind.magic() {
        return Ok(Err(HeaderFault::BadMagic {
            expected: kind.name(),
            found: magic,
        }));
    }
    let version = u16::from_le_bytes(take!(2).try_into().expect("2 bytes"));
    if version != FILE_FORMAT_VERSION {
        return Ok(Err(HeaderFault::Version { found: version }));
    }
    let number = u64::from_le_bytes(take!(8).try_into().expect("8 bytes"));
    let mut texts = Vec::with_capacity(2);
    for _ in 0..2 {
        let len = u16::from_le_bytes(take!(2).try_into().expect("2 bytes")) as usize;
        if len > MAX_IDENTITY_BYTES {
            return Ok(Err(HeaderFault::Malformed));
        }
        texts.push(take!(len));
    }
    let covered = seen.len();
    let crc = u32::from_le_bytes(take!(4).try_into().expect("4 bytes"));
    if crc32c::crc32c(&seen[..covered]) != crc {
        return Ok(Err(HeaderFault::Checksum));
    }
    let format = texts.pop().expect("two texts");
    let pool = texts.pop().expect("two texts");
    let (Ok(pool), Ok(format)) = (String::from_utf8(pool), String::from_utf8(format)) else {
        return Ok(Err(HeaderFault::Malformed));
    };
    Ok(Ok(Header {
        kind,
        number,
        identity: StateIdentity { pool, format },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            kind: FileKind::Segment,
            number: 7,
            identity: StateIdentity {
                pool: "global/dc-a".into(),
                format: "v1 buckets=65536".into(),
            },
        }
    }

    #[test]
    fn round_trips_and_refuses_the_other_kind() {
        let mut bytes = Vec::new();
        encode(&header(), &mut bytes).unwrap();
        assert_eq!(
            decode(FileKind::Segment, &mut &bytes[..]).unwrap(),
            Ok(header())
        );
        assert!(matches!(
            decode(FileKind::Checkpoint, &mut &bytes[..]).unwrap(),
            Err(HeaderFault::BadMagic {
                expected: "checkpoint",
                ..
            })
        ));
    }

    #[test]
    fn every_flipped_bit_and_every_truncation_is_refused() {
        let mut bytes = Vec::new();
        encode(&header(), &mut bytes).unwrap();
        for bit in 0..bytes.len() * 8 {
            let mut damaged = bytes.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(
                decode(FileKind::Segment, &mut &damaged[..])
                    .unwrap()
                    .is_err(),
                "bit {bit} flipped was accepted"
            );
        }
        for len in 0..bytes.len() {
            assert_eq!(
                decode(FileKind::Segment, &mut &bytes[..len]).unwrap(),
                Err(HeaderFault::Truncated),
                "cut at {len}"
            );
        }
    }

    #[test]
    fn a_newer_format_version_is_named() {
        let mut bytes = Vec::new();
        encode(&header(), &mut bytes).unwrap();
        bytes[8..10].copy_from_slice(&2u16.to_le_bytes());
        assert_eq!(
            decode(FileKind::Segment, &mut &bytes[..]).unwrap(),
            Err(HeaderFault::Version { found: 2 })
        );
    }
}
