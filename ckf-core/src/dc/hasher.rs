//! The hasher of the producer's exact maps: `foldhash`'s fixed-seed fast hasher.
//!
//! Keys are 64-bit block hashes, which are already uniformly distributed, and small
//! [`MemberId`](super::MemberId)s. SipHash (the std default) would cost more than the whole
//! cuckoo insertion; `foldhash::fast` hashes one `u64` with one folded 64x64->128 multiply (the
//! high and low halves of the product XORed), which mixes every input bit into the low bits (the
//! bucket index of hashbrown's tables) and the top 7 bits (its control tag).
//!
//! Why the crate and not our own: the crate used to carry a hand-written hasher doing the same
//! folded multiply. `cargo bench -p ckf-core --bench producer` compared the two (and
//! `rustc-hash`, and SipHash) on the block map's own access pattern, same block ops, same run:
//! the hand-written one did not measurably win (foldhash/ours 0.82-1.13 over six table sizes and
//! loads, no consistent sign; rustc-hash 0.90-1.32; SipHash 0.29-0.48), so the well-kept crate
//! (already in the dependency tree through hashbrown) replaced it. The figures are in
//! `ckf-core/README.md`.
//!
//! The seed is fixed ([`foldhash::fast::FixedState`]), so every map hashes identically in
//! every run: iteration orders, and with them test failures, are reproducible. Not
//! HashDoS-resistant: block hashes come from the pool's own inference workers, not from untrusted
//! clients.

/// [`std::hash::BuildHasher`] of the producer's maps (block map, spill set, member index):
/// `foldhash::fast::FixedState`, fixed seed. Zero-cost to build; every map built with it hashes
/// identically.
pub type FoldHashBuilder = foldhash::fast::FixedState;

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use super::*;

    #[test]
    fn small_and_sequential_keys_spread() {
        // Member ids and small test keys are sequential: they must still spread over the low
        // bits (bucket index) and the top 7 bits (control tag) of hashbrown's tables.
        let b = FoldHashBuilder::default();
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

    #[test]
    fn every_map_hashes_identically() {
        let (a, b) = (FoldHashBuilder::default(), FoldHashBuilder::default());
        for x in [0u64, 1, 0xDEAD_BEEF, u64::MAX] {
            assert_eq!(a.hash_one(x), b.hash_one(x));
        }
    }
}
