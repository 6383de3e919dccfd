//! Test support shared by the vector kernels' bit-for-bit checks of their locate against
//! [`Addressing::locate`] (`search/avx512.rs`, `search/avx2.rs`).

use crate::addressing::{Addressing, MAX_BUCKETS};

/// `(bucket count, lanes)` of the tables every vector locate is checked on: the smallest
/// counts, even counts that are not powers of two (format v2), a large power of two and the
/// largest count, with lane counts that make the row offsets odd multiples.
pub(super) const SHAPES: [(u64, u64); 7] = [
    (2, 1),
    (4, 3),
    (6, 7),
    (1000, 16),
    (1 << 20, 5),
    (3_000_002, 9),
    (MAX_BUCKETS, 2),
];

/// Inverse of `fmix64` (each xor-shift by 33 undoes itself; odd multipliers invert mod
/// 2^64): block hashes whose mixed word is chosen, so the edge buckets are hit on purpose.
fn unfmix64(mut k: u64) -> u64 {
    use crate::addressing::{FMIX_C1, FMIX_C2, FMIX_SHIFT};
    let inv = |c: u64| {
        let mut x = c;
        for _ in 0..6 {
            x = x.wrapping_mul(2u64.wrapping_sub(c.wrapping_mul(x)));
        }
        x
    };
    k ^= k >> FMIX_SHIFT;
    k = k.wrapping_mul(inv(FMIX_C2));
    k ^= k >> FMIX_SHIFT;
    k = k.wrapping_mul(inv(FMIX_C1));
    k ^ (k >> FMIX_SHIFT)
}

/// Bucket counts where a 32-bit multiply or a signed compare would go wrong first: the
/// format's limit, counts just below / above powers of two, and the smallest ones.
const EDGE_COUNTS: [u64; 10] = [
    MAX_BUCKETS,
    (1 << 32) - 4,
    (1 << 31) + 2,
    1 << 31,
    (1 << 31) - 2,
    (1 << 16) + 2,
    (1 << 16) - 2,
    6,
    4,
    2,
];

/// Every fingerprint (raw 0 included) with the bucket bits at 0, 1, the middle and the top
/// (`bucket_a` = 0 and `n - 1`), so offsets and alternates reach both ends of the table.
fn edge_hashes(seed: u64) -> Vec<u64> {
    let mut v = Vec::new();
    for fp in 0..=u64::from(u16::MAX) {
        for low in [0u64, 1, 0x8000_0000, 0xFFFF_FFFE, 0xFFFF_FFFF] {
            v.push(unfmix64(fp << 48 | 0x5A5A << 32 | low) ^ seed);
        }
    }
    v
}

/// A vector locate, `locate(hashes, seed, buckets, lanes) -> (fp, a, b)`, against the
/// scalar rule on every [`EDGE_COUNTS`] table and every [`edge_hashes`] chunk; panics on the
/// first difference, or when a table's first or last bucket was never reached.
pub(super) fn check_edges(
    mut locate: impl FnMut(&[u64; 8], u64, u64, u64) -> ([u64; 8], [u64; 8], [u64; 8]),
) {
    for (i, &buckets) in EDGE_COUNTS.iter().enumerate() {
        let seed = 0x5EED ^ buckets;
        let lanes = [1u64, 16, 7][i % 3];
        let addressing =
            Addressing::new(&crate::addressing::TableFormat::new(buckets, seed).unwrap()).unwrap();
        let (mut top, mut bottom) = (false, false);
        for hashes in edge_hashes(seed).chunks_exact(8) {
            let hashes: &[u64; 8] = hashes.try_into().unwrap();
            let (fp, a, b) = locate(hashes, seed, buckets, lanes);
            assert_chunk(&addressing, lanes, hashes, (&fp, &a, &b));
            let last = (buckets - 1) * lanes;
            top |= a.iter().chain(&b).any(|&o| o == last);
            bottom |= a.contains(&0) || b.contains(&0);
        }
        assert!(top && bottom, "n={buckets}: edges not reached");
    }
}

/// Panics unless position `i` of a located chunk (`fp`, and the row offsets `a`, `b` of the
/// primary and the alternate candidate bucket, in words) is what the scalar rule gives for
/// `hashes[i]`, for all 8 positions.
pub(super) fn assert_chunk(
    addressing: &Addressing,
    lanes: u64,
    hashes: &[u64; 8],
    (fp, a, b): (&[u64; 8], &[u64; 8], &[u64; 8]),
) {
    for (i, &h) in hashes.iter().enumerate() {
        let loc = addressing.locate(h);
        assert_eq!(fp[i], u64::from(loc.fingerprint), "{h:#x}");
        assert_eq!(a[i], u64::from(loc.bucket_a) * lanes, "{h:#x}");
        assert_eq!(b[i], u64::from(loc.bucket_b) * lanes, "{h:#x}");
    }
}
