//! A fast, deterministic hasher for the producer's exact maps.
//!
//! Keys are 64-bit block hashes, which are already uniformly distributed, and small
//! [`MemberId`](super::MemberId)s. SipHash (the std default) would cost more than the whole
//! cuckoo insertion, so the maps use one folded 64x64->128 multiply per word instead: the high
//! and low halves of the product are XORed, which mixes every input bit into the low bits
//! (the bucket index of `std`'s hashbrown tables) and the top 7 bits (its control tag).
//!
//! Not HashDoS-resistant: block hashes come from the pool's own inference workers, not from
//! untrusted clients.

use std::hash::{BuildHasher, Hasher};

const K: u64 = 0x9E37_79B9_7F4A_7C15;

#[inline(always)]
fn folded_multiply(a: u64, b: u64) -> u64 {
    let p = u128::from(a).wrapping_mul(u128::from(b));
    (p as u64) ^ ((p >> 64) as u64)
}

/// [`BuildHasher`] for [`FoldHasher`]s. Zero-sized; every map built with it hashes identically.
#[derive(Debug, Clone, Copy, Default)]
pub struct FoldHashBuilder;

impl BuildHasher for FoldHashBuilder {
    type Hasher = FoldHasher;
    #[inline(always)]
    fn build_hasher(&self) -> FoldHasher {
        FoldHasher(0)
    }
}

/// Folded-multiply hasher; see the module docs.
#[derive(Debug, Clone, Copy)]
pub struct FoldHasher(u64);

impl Hasher for FoldHasher {
    #[inline(always)]
    fn finish(&self) -> u64 {
        self.0
    }

    #[inline(always)]
    fn write_u64(&mut self, x: u64) {
        self.0 = folded_multiply(self.0 ^ x, K);
    }

    #[inline(always)]
    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word) ^ ((chunk.len() as u64) << 59));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_and_sequential_keys_spread() {
        let b = FoldHashBuilder;
        let mut low = std::collections::HashSet::new();
        let mut top = std::collections::HashSet::new();
        for x in 0u64..1024 {
            let h = b.hash_one(x);
            low.insert(h & 1023);
            top.insert(h >> 57);
        }
        assert!(low.len() > 600, "low bits collide: {}", low.len());
        assert_eq!(top.len(), 128);
    }
}
