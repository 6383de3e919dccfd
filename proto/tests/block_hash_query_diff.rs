//! The hand-written `BlockHashQuery` decoder against a `prost-derive` twin of the same messages,
//! on arbitrary bytes and on structured adversarial encodings (packed runs with wrong, huge,
//! overlong or overflowing length varints, unpacked values, other wire types for field 1,
//! unknown fields, several occurrences), alone and nested in the batch and stream requests, read
//! from buffers cut into small chunks (so length varints and words straddle chunk boundaries).
//! Both must agree on success, on the error text, on the decoded values, on what is left of the
//! buffer after a length-delimited decode, and on the state a `merge` into a non-empty message
//! leaves (also after a failure).

use ckf_proto::v1;
use proptest::prelude::*;
use prost::Message;
use prost::bytes::Buf;

/// The messages exactly as `prost-derive` generates them (same names, so error texts compare).
mod reference {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct BlockHashQuery {
        #[prost(fixed64, repeated, tag = "1")]
        pub block_hashes: Vec<u64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct FindMatchesBatchRequest {
        #[prost(message, repeated, tag = "1")]
        pub queries: Vec<BlockHashQuery>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct FindMatchesStreamRequest {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(message, repeated, tag = "2")]
        pub queries: Vec<BlockHashQuery>,
    }
}

/// A buffer over `bytes` whose chunks have the given sizes in turn (cycled; a size of 0 is taken
/// as 1, since a `Buf` may only yield an empty chunk at its end).
struct Chunked<'a> {
    bytes: &'a [u8],
    sizes: &'a [usize],
    /// Index into `sizes` of the current chunk, and how much of it has been consumed.
    at: usize,
    used: usize,
}

impl<'a> Chunked<'a> {
    fn new(bytes: &'a [u8], sizes: &'a [usize]) -> Self {
        Chunked {
            bytes,
            sizes,
            at: 0,
            used: 0,
        }
    }

    fn size(&self) -> usize {
        if self.sizes.is_empty() {
            usize::MAX
        } else {
            self.sizes[self.at % self.sizes.len()].max(1)
        }
    }
}

impl Buf for Chunked<'_> {
    fn remaining(&self) -> usize {
        self.bytes.len()
    }

    fn chunk(&self) -> &[u8] {
        let len = (self.size() - self.used).min(self.bytes.len());
        &self.bytes[..len]
    }

    fn advance(&mut self, mut cnt: usize) {
        assert!(cnt <= self.bytes.len(), "advance past the end");
        self.bytes = &self.bytes[cnt..];
        // Walk the chunk sizes so later chunks keep their boundaries.
        while cnt > 0 {
            let left = self.size() - self.used;
            if cnt < left {
                self.used += cnt;
                cnt = 0;
            } else {
                cnt -= left;
                self.at += 1;
                self.used = 0;
            }
        }
    }
}

/// The outcome of one decode: the message (or the error text) and the bytes left unread.
type Outcome<T> = (Result<T, String>, usize);

fn run<T: Message + Clone>(
    start: &T,
    bytes: &[u8],
    sizes: &[usize],
    delimited: bool,
) -> (Outcome<()>, T) {
    let mut message = start.clone();
    let mut buf = Chunked::new(bytes, sizes);
    let result = if delimited {
        message.merge_length_delimited(&mut buf)
    } else {
        message.merge(&mut buf)
    };
    (
        (result.map_err(|e| e.to_string()), buf.remaining()),
        message,
    )
}

/// Merges `bytes` (in `sizes` chunks) into a copy of `start_hashes` as each message kind, with
/// both decoders, plain and length-delimited; asserts they agree in every way.
fn agree(bytes: &[u8], sizes: &[usize], start_hashes: &[u64]) {
    for delimited in [false, true] {
        // The query alone.
        let ours_start = v1::BlockHashQuery {
            block_hashes: start_hashes.to_vec(),
        };
        let reference_start = reference::BlockHashQuery {
            block_hashes: start_hashes.to_vec(),
        };
        let (ours, ours_message) = run(&ours_start, bytes, sizes, delimited);
        let (expected, expected_message) = run(&reference_start, bytes, sizes, delimited);
        assert_eq!(
            ours, expected,
            "query, delimited {delimited}, {bytes:02x?} in chunks {sizes:?}"
        );
        assert_eq!(
            ours_message.block_hashes, expected_message.block_hashes,
            "query, delimited {delimited}, {bytes:02x?} in chunks {sizes:?}"
        );

        // The batch request (its queries are field 1 too).
        let ours_start = v1::FindMatchesBatchRequest {
            queries: vec![v1::BlockHashQuery {
                block_hashes: start_hashes.to_vec(),
            }],
        };
        let reference_start = reference::FindMatchesBatchRequest {
            queries: vec![reference::BlockHashQuery {
                block_hashes: start_hashes.to_vec(),
            }],
        };
        let (ours, ours_message) = run(&ours_start, bytes, sizes, delimited);
        let (expected, expected_message) = run(&reference_start, bytes, sizes, delimited);
        assert_eq!(
            ours, expected,
            "batch, delimited {delimited}, {bytes:02x?} in chunks {sizes:?}"
        );
        assert_eq!(
            hashes_of(&ours_message.queries),
            expected_message
                .queries
                .iter()
                .map(|q| q.block_hashes.clone())
                .collect::<Vec<_>>(),
            "batch, delimited {delimited}, {bytes:02x?} in chunks {sizes:?}"
        );

        // The stream request (queries are field 2).
        let (ours, ours_message) = run(
            &v1::FindMatchesStreamRequest::default(),
            bytes,
            sizes,
            delimited,
        );
        let (expected, expected_message) = run(
            &reference::FindMatchesStreamRequest::default(),
            bytes,
            sizes,
            delimited,
        );
        assert_eq!(
            ours, expected,
            "stream, delimited {delimited}, {bytes:02x?} in chunks {sizes:?}"
        );
        assert_eq!(ours_message.id, expected_message.id);
        assert_eq!(
            hashes_of(&ours_message.queries),
            expected_message
                .queries
                .iter()
                .map(|q| q.block_hashes.clone())
                .collect::<Vec<_>>(),
        );
    }
}

fn hashes_of(queries: &[v1::BlockHashQuery]) -> Vec<Vec<u64>> {
    queries.iter().map(|q| q.block_hashes.clone()).collect()
}

fn varint(mut value: u64, out: &mut Vec<u8>) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// How a length-delimited field states its length.
#[derive(Clone, Debug)]
enum Length {
    /// The true length, shortest varint.
    Exact,
    /// The true length plus a small offset (may go negative: clamped at 0).
    Off(i8),
    /// The true length padded to `n` varint bytes with continuation bytes (2..=11: 11 is invalid).
    Overlong(u8),
    /// A fixed huge or odd value.
    Value(u64),
    /// A raw varint body, possibly unterminated or overflowing (e.g. ten 0xff).
    Raw(Vec<u8>),
}

impl Length {
    fn put(&self, true_len: usize, out: &mut Vec<u8>) {
        match self {
            Length::Exact => varint(true_len as u64, out),
            Length::Off(d) => varint((true_len as i64 + i64::from(*d)).max(0) as u64, out),
            Length::Overlong(n) => {
                let mut v = true_len as u64;
                for _ in 1..*n {
                    out.push(v as u8 & 0x7f | 0x80);
                    v >>= 7;
                }
                out.push(v as u8 & 0x7f);
            }
            Length::Value(v) => varint(*v, out),
            Length::Raw(raw) => out.extend_from_slice(raw),
        }
    }
}

fn length() -> impl Strategy<Value = Length> {
    prop_oneof![
        6 => Just(Length::Exact),
        2 => (-9i8..=9).prop_map(Length::Off),
        2 => (2u8..=11).prop_map(Length::Overlong),
        2 => prop_oneof![
            Just(1u64 << 40),
            Just(1u64 << 63),
            Just(u64::MAX),
            Just(u64::MAX - 7),
            Just((1u64 << 63) + 8),
            Just(i64::MAX as u64 + 1),
            Just(usize::MAX as u64 - 15),
            any::<u64>(),
        ]
        .prop_map(Length::Value),
        1 => prop_oneof![
            // Ten continuation-free max bytes: overflows u64.
            Just(vec![0xff; 9].into_iter().chain([0x01]).collect::<Vec<u8>>()),
            Just(vec![0xff; 9].into_iter().chain([0x02]).collect::<Vec<u8>>()),
            Just(vec![0xff; 10]),
            Just(vec![0x80; 10].into_iter().chain([0x00]).collect::<Vec<u8>>()),
            Just(vec![0x88, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00]),
            prop::collection::vec(any::<u8>(), 0..12),
        ]
        .prop_map(Length::Raw),
    ]
}

/// One field of a `BlockHashQuery` body.
#[derive(Clone, Debug)]
enum Piece {
    /// Field 1 packed: the words (and `extra` stray bytes), with its length stated by `length`.
    Packed(Vec<u64>, Vec<u8>, Length),
    /// Field 1 unpacked (wire type 1).
    Unpacked(u64),
    /// Field 1 with wire type 0, 3, 4, 5, 6 or 7 and a few following bytes.
    WrongWire(u8, Vec<u8>),
    /// Another field number, any wire type, and a few following bytes.
    Unknown(u32, u8, Vec<u8>),
    /// Bytes as they come.
    Raw(Vec<u8>),
}

impl Piece {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            Piece::Packed(words, extra, len) => {
                out.push(0x0a);
                len.put(words.len() * 8 + extra.len(), out);
                for w in words {
                    out.extend_from_slice(&w.to_le_bytes());
                }
                out.extend_from_slice(extra);
            }
            Piece::Unpacked(v) => {
                out.push(0x09);
                out.extend_from_slice(&v.to_le_bytes());
            }
            Piece::WrongWire(wire, rest) => {
                out.push(0x08 | wire);
                out.extend_from_slice(rest);
            }
            Piece::Unknown(tag, wire, rest) => {
                varint(u64::from(*tag) << 3 | u64::from(*wire), out);
                out.extend_from_slice(rest);
            }
            Piece::Raw(raw) => out.extend_from_slice(raw),
        }
    }
}

fn piece() -> impl Strategy<Value = Piece> {
    prop_oneof![
        6 => (
            prop::collection::vec(any::<u64>(), 0..12),
            prop_oneof![4 => Just(vec![]), 1 => prop::collection::vec(any::<u8>(), 1..8)],
            length()
        )
            .prop_map(|(w, e, l)| Piece::Packed(w, e, l)),
        2 => any::<u64>().prop_map(Piece::Unpacked),
        1 => (
            prop::sample::select(vec![0u8, 3, 4, 5, 6, 7]),
            prop::collection::vec(any::<u8>(), 0..10)
        )
            .prop_map(|(w, r)| Piece::WrongWire(w, r)),
        2 => (
            prop_oneof![2u32..20, Just(536_870_911u32), Just(0u32)],
            0u8..8,
            prop::collection::vec(any::<u8>(), 0..10)
        )
            .prop_map(|(t, w, r)| Piece::Unknown(t, w, r)),
        1 => prop::collection::vec(any::<u8>(), 0..6).prop_map(Piece::Raw),
    ]
}

/// A query body, and optionally the batch or stream framing around one or more such bodies.
fn query_body() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(piece(), 0..6).prop_map(|pieces| {
        let mut out = Vec::new();
        for p in &pieces {
            p.put(&mut out);
        }
        out
    })
}

/// Bodies nested as the queries of an outer message (field `tag`), each with its own length form,
/// plus an optional stream id in front and raw bytes after.
fn nested() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec((query_body(), length()), 1..4),
        prop::sample::select(vec![1u8, 2]),
        prop::option::of(any::<u64>()),
        prop::collection::vec(any::<u8>(), 0..4),
    )
        .prop_map(|(bodies, tag, id, tail)| {
            let mut out = Vec::new();
            if let Some(id) = id {
                out.push(0x08);
                varint(id, &mut out);
            }
            for (body, len) in bodies {
                out.push(tag << 3 | 2);
                len.put(body.len(), &mut out);
                out.extend_from_slice(&body);
            }
            out.extend_from_slice(&tail);
            out
        })
}

/// Chunk sizes: mostly tiny (1..9 bytes, so varints and words straddle boundaries).
fn sizes() -> impl Strategy<Value = Vec<usize>> {
    prop_oneof![
        1 => Just(vec![]),
        4 => prop::collection::vec(1usize..10, 1..6),
        1 => prop::collection::vec(1usize..40, 1..4),
    ]
}

/// A message as a length-delimited whole sometimes (so `merge_length_delimited` sees a good
/// outer length) and followed by a few more bytes sometimes (so the position after it matters).
fn framed(body: Vec<u8>, frame: Option<Length>, tail: Vec<u8>) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(len) = frame {
        len.put(body.len(), &mut out);
    }
    out.extend_from_slice(&body);
    out.extend_from_slice(&tail);
    out
}

fn frame() -> impl Strategy<Value = Option<Length>> {
    prop::option::of(prop_oneof![
        8 => Just(Length::Exact),
        1 => (-3i8..=3).prop_map(Length::Off),
        1 => (2u8..=4).prop_map(Length::Overlong),
    ])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1200, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_decode_alike(
        bytes in prop::collection::vec(any::<u8>(), 0..64),
        sizes in sizes(),
        start in prop::collection::vec(any::<u64>(), 0..3),
    ) {
        agree(&bytes, &sizes, &start);
    }

    /// A query body, or a batch request nesting several (itself framed or not), with a tail of
    /// arbitrary bytes: both arms in one test so the two strategies share one framing harness.
    #[test]
    fn adversarial_queries_decode_alike(
        body in prop_oneof![query_body(), nested()],
        frame in frame(),
        tail in prop::collection::vec(any::<u8>(), 0..12),
        sizes in sizes(),
        start in prop::collection::vec(any::<u64>(), 0..3),
    ) {
        agree(&framed(body, frame, tail), &sizes, &start);
    }

    #[test]
    fn valid_nested_queries_decode_to_their_values_in_any_chunking(
        queries in prop::collection::vec(prop::collection::vec(any::<u64>(), 0..30), 0..5),
        sizes in sizes(),
        start in prop::collection::vec(any::<u64>(), 0..3),
    ) {
        let request = reference::FindMatchesBatchRequest {
            queries: queries
                .iter()
                .map(|q| reference::BlockHashQuery { block_hashes: q.clone() })
                .collect(),
        };
        let bytes = request.encode_length_delimited_to_vec();
        agree(&bytes, &sizes, &start);
        let mut ours = v1::FindMatchesBatchRequest {
            queries: vec![v1::BlockHashQuery { block_hashes: start.clone() }],
        };
        let mut buf = Chunked::new(&bytes, &sizes);
        ours.merge_length_delimited(&mut buf).unwrap();
        prop_assert_eq!(buf.remaining(), 0);
        let expected: Vec<Vec<u64>> = std::iter::once(start).chain(queries).collect();
        prop_assert_eq!(hashes_of(&ours.queries), expected);
    }
}

/// A well-formed query body mixing packed runs (shortest or padded length varints, up to the
/// 10 bytes a varint may take), unpacked values and unknown fields, and the hashes it carries in
/// order (the simple model: concatenation).
fn valid_mix() -> impl Strategy<Value = (Vec<u8>, Vec<u64>)> {
    let part = prop_oneof![
        3 => (prop::collection::vec(any::<u64>(), 0..10), 1u8..=10)
            .prop_map(|(w, n)| (Piece::Packed(w.clone(), vec![], Length::Overlong(n)), w)),
        2 => any::<u64>().prop_map(|v| (Piece::Unpacked(v), vec![v])),
        1 => (2u64..1000, any::<u64>()).prop_map(|(tag, v)| {
            let mut bytes = Vec::new();
            varint(tag << 3, &mut bytes);
            varint(v, &mut bytes);
            (Piece::Raw(bytes), vec![])
        }),
    ];
    prop::collection::vec(part, 0..8).prop_map(|parts| {
        let mut bytes = Vec::new();
        let mut hashes = Vec::new();
        for (piece, values) in parts {
            piece.put(&mut bytes);
            hashes.extend(values);
        }
        (bytes, hashes)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn well_formed_mixes_decode_to_their_hashes_in_order(
        queries in prop::collection::vec(valid_mix(), 1..4),
        sizes in sizes(),
        start in prop::collection::vec(any::<u64>(), 0..3),
    ) {
        // Alone (the first query), appended to `start` by `merge`.
        let (body, hashes) = &queries[0];
        agree(body, &sizes, &start);
        let mut query = v1::BlockHashQuery { block_hashes: start.clone() };
        query.merge(Chunked::new(body, &sizes)).unwrap();
        let expected: Vec<u64> = start.iter().chain(hashes).copied().collect();
        prop_assert_eq!(&query.block_hashes, &expected);
        // All of them as the queries of a batch request.
        let mut batch = Vec::new();
        for (body, _) in &queries {
            batch.push(0x0a);
            varint(body.len() as u64, &mut batch);
            batch.extend_from_slice(body);
        }
        agree(&batch, &sizes, &start);
        let request = v1::FindMatchesBatchRequest::decode(Chunked::new(&batch, &sizes)).unwrap();
        let expected: Vec<Vec<u64>> = queries.iter().map(|(_, h)| h.clone()).collect();
        prop_assert_eq!(hashes_of(&request.queries), expected);
    }
}

/// Hand-picked inputs around the fast path's edges, each in every 1- and 2-cut chunking.
#[test]
fn edge_inputs_decode_alike_in_every_chunking() {
    let words: Vec<u8> = (1u64..=3).flat_map(u64::to_le_bytes).collect();
    let mut inputs: Vec<Vec<u8>> = Vec::new();
    let mut push = |parts: &[&[u8]]| inputs.push(parts.concat());
    // Zero-length packed field, alone and twice, and between values.
    push(&[&[0x0a, 0x00]]);
    push(&[&[0x0a, 0x00, 0x0a, 0x00]]);
    push(&[
        &[0x0a, 0x08],
        &words[..8],
        &[0x0a, 0x00, 0x09],
        &words[8..16],
    ]);
    // Packed, then unpacked, then packed: values in order.
    push(&[
        &[0x0a, 0x10],
        &words[..16],
        &[0x09],
        &words[16..],
        &[0x0a, 0x08],
        &words[..8],
    ]);
    // Lengths not a multiple of 8, with and without bytes after.
    for len in [1u8, 7, 9, 15, 17, 23] {
        push(&[&[0x0a, len], &words[..(len as usize).min(24)]]);
        push(&[&[0x0a, len], &words, &words]);
    }
    // Lengths past the end, by one byte and by one word.
    push(&[&[0x0a, 25], &words]);
    push(&[&[0x0a, 32], &words]);
    // Overlong length varints of the true length (valid), 10 bytes (valid), 11 bytes (invalid).
    push(&[&[0x0a, 0x98, 0x00], &words]);
    push(&[
        &[
            0x0a, 0x98, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00,
        ],
        &words,
    ]);
    push(&[
        &[
            0x0a, 0x98, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00,
        ],
        &words,
    ]);
    // Huge lengths: 2^40, 2^63, u64::MAX, and a 10-byte varint whose last byte overflows.
    push(&[&[0x0a, 0x80, 0x80, 0x80, 0x80, 0x80, 0x20], &words]);
    push(&[
        &[
            0x0a, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01,
        ],
        &words,
    ]);
    push(&[
        &[
            0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ],
        &words,
    ]);
    push(&[
        &[
            0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02,
        ],
        &words,
    ]);
    push(&[
        &[0x0a, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80],
        &words,
    ]);
    // Other wire types for field 1.
    // Each is followed by bytes that would read as a good packed run (length 8, one word), so
    // a decoder that took them for one would succeed where prost fails or reads otherwise.
    for key in [0x08u8, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f] {
        push(&[&[key], &words]);
        push(&[&[key, 0x08], &words[..8]]);
        push(&[&[key, 0x00]]);
    }
    // Unknown fields before and after, a field-1 key with a multi-byte (overlong) tag varint.
    push(&[&[0x10, 0x05, 0x0a, 0x08], &words[..8], &[0x1a, 0x01, 0x00]]);
    push(&[&[0x8a, 0x00, 0x08], &words[..8]]);
    // Nested in a batch request: a query whose packed length runs past the query's own end
    // but not past the buffer's.
    push(&[&[0x0a, 0x0a, 0x0a, 0x10], &words]);
    push(&[&[0x0a, 0x02, 0x0a, 0x08], &words[..8], &[0x0a, 0x00]]);
    push(&[&[0x0a, 0x1a, 0x0a, 0x18], &words]);
    for input in &inputs {
        agree(input, &[], &[]);
        agree(input, &[], &[9, 9]);
        for a in 1..=input.len() {
            agree(input, &[a], &[5]);
            for b in 1..=10 {
                agree(input, &[a, b], &[]);
            }
            agree_chained(input, a);
        }
    }
}

/// `bytes` as `Bytes` pieces of `size` bytes joined with `Buf::chain` (the common way to build
/// a many-chunk buffer), decoded by ours and, from one slice, by the reference:
/// same outcome, values and (after a success) bytes left, for the query alone and as a batch
/// request.
fn agree_chained(bytes: &[u8], size: usize) {
    let chained = || {
        let mut buf: Box<dyn Buf> = Box::new(&[][..]);
        for piece in bytes.chunks(size) {
            buf = Box::new(buf.chain(prost::bytes::Bytes::copy_from_slice(piece)));
        }
        buf
    };
    let mut buf = chained();
    let mut ours = v1::BlockHashQuery::default();
    let ours_result = ours
        .merge_length_delimited(&mut buf)
        .map_err(|e| e.to_string());
    let mut slice = bytes;
    let mut expected = reference::BlockHashQuery::default();
    let expected_result = expected
        .merge_length_delimited(&mut slice)
        .map_err(|e| e.to_string());
    // Bytes left are compared after a success only: after a failure they depend on the
    // chunking in prost itself (its varint reader consumes a bad varint byte by byte from short
    // chunks but not from one long slice).
    let left = |result: &Result<(), String>, left: usize| result.as_ref().ok().map(|()| left);
    assert_eq!(
        (
            left(&ours_result, buf.remaining()),
            ours_result,
            ours.block_hashes
        ),
        (
            left(&expected_result, slice.len()),
            expected_result,
            expected.block_hashes
        ),
        "{bytes:02x?} chained in pieces of {size}"
    );
    let ours = v1::FindMatchesBatchRequest::decode(chained()).map_err(|e| e.to_string());
    let expected = reference::FindMatchesBatchRequest::decode(bytes).map_err(|e| e.to_string());
    assert_eq!(
        ours.map(|r| hashes_of(&r.queries)),
        expected.map(|r| r.queries.into_iter().map(|q| q.block_hashes).collect()),
        "{bytes:02x?} chained in pieces of {size}"
    );
}

/// The decoded `Vec` never holds more than the input could carry, whatever length was claimed.
#[test]
fn capacity_stays_within_the_input() {
    let words: Vec<u8> = (0u64..4).flat_map(u64::to_le_bytes).collect();
    for claim in [32u64, 40, 1 << 20, 1 << 40, 1 << 63, u64::MAX] {
        let mut bytes = vec![0x0a];
        varint(claim, &mut bytes);
        bytes.extend_from_slice(&words);
        for sizes in [&[][..], &[3], &[1, 8]] {
            let mut query = v1::BlockHashQuery::default();
            let _ = query.merge(Chunked::new(&bytes, sizes));
            assert!(
                query.block_hashes.capacity() <= bytes.len() / 8 + 4,
                "claim {claim}: capacity {}",
                query.block_hashes.capacity()
            );
        }
    }
}
