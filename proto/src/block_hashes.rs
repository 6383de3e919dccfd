//! `ckf.v1.BlockHashQuery` with a decoder that copies its packed `fixed64` hashes in bulk.
//!
//! The generated decoder of a packed `repeated fixed64` pushes one value at a time onto an
//! empty `Vec` (the `Vec` grows 4, 8, 16, 32, ... and every value is read through `Buf`), which
//! was a tenth of the indexer's CPU for a `FindMatchesBatch` of Mooncake queries (27 hashes
//! each). This type is the same message (the same field, tag and wire form; `prost-build` maps
//! `.ckf.v1.BlockHashQuery` here with `extern_path`), whose decoder reserves the field's whole
//! length at once and copies the little-endian words out of each contiguous chunk of the buffer.
//! Anything it does not expect (an unpacked field, a length that is not a multiple of 8 or runs
//! past the buffer, a length varint split across chunks) goes to prost's own decoder, so every
//! input decodes or fails exactly as the generated code would.

use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType, decode_varint, fixed64, skip_field};
use prost::{DecodeError, Message};

/// One query of a batch: 64-bit sequence block hashes in prefix order (`ckf.v1.BlockHashQuery`,
/// field 1, packed `fixed64`).
#[derive(Clone, PartialEq, Eq, Hash, Default, Debug)]
pub struct BlockHashQuery {
    /// The query's block hashes, in prefix order.
    pub block_hashes: Vec<u64>,
}

impl Message for BlockHashQuery {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        fixed64::encode_packed(1, &self.block_hashes, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            1 => merge_hashes(wire_type, &mut self.block_hashes, buf, ctx).map_err(|mut error| {
                error.push("BlockHashQuery", "block_hashes");
                error
            }),
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        fixed64::encoded_len_packed(1, &self.block_hashes)
    }

    fn clear(&mut self) {
        self.block_hashes.clear();
    }
}

/// Appends one occurrence of the `fixed64` field to `values`: a well-formed packed run in bulk,
/// anything else through prost's decoder.
fn merge_hashes(
    wire_type: WireType,
    values: &mut Vec<u64>,
    buf: &mut impl Buf,
    ctx: DecodeContext,
) -> Result<(), DecodeError> {
    if wire_type == WireType::LengthDelimited {
        // Read the length from a copy of the current chunk, so that nothing is consumed when
        // the fast path does not apply.
        let mut peek = buf.chunk();
        let before = peek.len();
        if let Ok(len) = decode_varint(&mut peek) {
            let prefix = before - peek.len();
            let fits = len
                .checked_add(prefix as u64)
                .is_some_and(|total| total <= buf.remaining() as u64);
            if fits && len % 8 == 0 {
                buf.advance(prefix);
                copy_words(values, buf, (len / 8) as usize);
                return Ok(());
            }
        }
    }
    fixed64::merge_repeated(wire_type, values, buf, ctx)
}

/// Appends `count` little-endian words from `buf` (which holds at least `8 x count` bytes).
fn copy_words(values: &mut Vec<u64>, buf: &mut impl Buf, count: usize) {
    values.reserve(count);
    let mut left = count;
    while left > 0 {
        let chunk = buf.chunk();
        let whole = (chunk.len() / 8).min(left);
        if whole == 0 {
            // A word split across two chunks.
            values.push(buf.get_u64_le());
            left -= 1;
            continue;
        }
        values.extend(
            chunk[..whole * 8]
                .chunks_exact(8)
                .map(|word| u64::from_le_bytes(word.try_into().expect("8-byte chunk"))),
        );
        buf.advance(whole * 8);
        left -= whole;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The message as `prost-derive` generates it: the reference decoder.
    #[derive(Clone, PartialEq, prost::Message)]
    struct Derived {
        #[prost(fixed64, repeated, tag = "1")]
        block_hashes: Vec<u64>,
    }

    /// `bytes` as a buffer of chunks cut at `cuts` (each cut an offset into `bytes`).
    fn chunked(bytes: &[u8], cuts: &[usize]) -> Box<dyn Buf> {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        cuts.sort_unstable();
        let mut buf: Box<dyn Buf> = Box::new(&[][..]);
        let mut start = 0;
        for cut in cuts.into_iter().chain([bytes.len()]) {
            let piece = bytes[start..cut].to_vec();
            buf = Box::new(buf.chain(std::io::Cursor::new(piece)));
            start = cut;
        }
        buf
    }

    /// Decodes with both decoders; they must agree on success and on the value.
    fn agree(bytes: &[u8], cuts: &[usize]) {
        let ours = BlockHashQuery::decode(chunked(bytes, cuts));
        let reference = Derived::decode(bytes);
        match (ours, reference) {
            (Ok(ours), Ok(reference)) => assert_eq!(ours.block_hashes, reference.block_hashes),
            (Err(_), Err(_)) => {}
            (ours, reference) => panic!("{bytes:?} cut at {cuts:?}: {ours:?} vs {reference:?}"),
        }
    }

    proptest! {
        #[test]
        fn encodes_as_the_derived_message_does(hashes in prop::collection::vec(any::<u64>(), 0..80)) {
            let ours = BlockHashQuery { block_hashes: hashes.clone() };
            let reference = Derived { block_hashes: hashes };
            prop_assert_eq!(ours.encode_to_vec(), reference.encode_to_vec());
            prop_assert_eq!(ours.encoded_len(), reference.encoded_len());
        }

        #[test]
        fn decodes_valid_encodings_in_any_chunking(
            runs in prop::collection::vec(prop::collection::vec(any::<u64>(), 0..40), 0..4),
            unpacked in prop::collection::vec(any::<u64>(), 0..4),
            cuts in prop::collection::vec(any::<usize>(), 0..6),
        ) {
            // Several packed runs (decoders concatenate them), unpacked values and an unknown
            // field in between.
            let mut bytes = Vec::new();
            for run in &runs {
                Derived { block_hashes: run.clone() }.encode(&mut bytes).unwrap();
                prost::encoding::uint32::encode(2, &7, &mut bytes);
            }
            for value in &unpacked {
                prost::encoding::fixed64::encode(1, value, &mut bytes);
            }
            agree(&bytes, &cuts);
            let decoded = BlockHashQuery::decode(chunked(&bytes, &cuts)).unwrap();
            let expected: Vec<u64> = runs.concat().into_iter().chain(unpacked).collect();
            prop_assert_eq!(decoded.block_hashes, expected);
        }

        #[test]
        fn fails_exactly_where_the_derived_decoder_fails(
            hashes in prop::collection::vec(any::<u64>(), 0..20),
            flips in prop::collection::vec((any::<usize>(), any::<u8>()), 0..3),
            cut in any::<usize>(),
            cuts in prop::collection::vec(any::<usize>(), 0..4),
        ) {
            let mut bytes = Derived { block_hashes: hashes }.encode_to_vec();
            for (at, value) in flips {
                if !bytes.is_empty() {
                    let at = at % bytes.len();
                    bytes[at] = value;
                }
            }
            bytes.truncate(cut % (bytes.len() + 1));
            agree(&bytes, &cuts);
        }
    }

    #[test]
    fn a_length_that_is_not_whole_words_or_runs_past_the_end_is_refused() {
        // Field 1, length-delimited, 7 bytes: not a whole number of words.
        let mut odd = vec![0x0a, 7];
        odd.extend([0u8; 7]);
        agree(&odd, &[]);
        assert!(BlockHashQuery::decode(&odd[..]).is_err());
        // 16 bytes announced, 8 present.
        let mut short = vec![0x0a, 16];
        short.extend([1u8; 8]);
        agree(&short, &[]);
        assert!(BlockHashQuery::decode(&short[..]).is_err());
        // The length varint split across two chunks still decodes.
        let long = Derived {
            block_hashes: (0..20).collect(),
        }
        .encode_to_vec();
        for cut in 0..long.len() {
            agree(&long, &[cut]);
        }
    }
}
