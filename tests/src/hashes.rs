//! Deterministic block hashes whose fingerprints never collide within one test.
//!
//! A query for a hash that no lane holds can still report it present when a held hash with the
//! same 16-bit fingerprint sits in one of its two candidate buckets (a cuckoo-filter false
//! positive). The tests assert exact depths, so every hash handed out by one [`HashPool`] has a
//! fingerprint no other hash from that pool has: a slot can then only match the very hash that
//! put it there, and expected depths are exact, not probabilistic.

use std::collections::HashSet;

use ckf_core::addressing::{Addressing, TableFormat, fmix64};

/// Hands out distinct block hashes with pairwise distinct fingerprints under one table format.
#[derive(Debug)]
pub struct HashPool {
    addressing: Addressing,
    next: u64,
    used: HashSet<u16>,
}

impl HashPool {
    /// A pool for `format`; `seed` picks the (fixed, reproducible) hash sequence.
    ///
    /// # Panics
    /// When `format` is invalid.
    pub fn new(format: &TableFormat, seed: u64) -> Self {
        Self {
            addressing: Addressing::new(format).expect("valid test format"),
            next: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            used: HashSet::new(),
        }
    }

    /// `n` fresh hashes (a chain, when used as a prefix: order is the prefix order).
    ///
    /// # Panics
    /// When the 65,535 fingerprints are exhausted (tests use a few thousand at most).
    pub fn take(&mut self, n: usize) -> Vec<u64> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            self.next = self.next.wrapping_add(1);
            let hash = fmix64(self.next);
            let fingerprint = self.addressing.locate(hash).fingerprint;
            if self.used.insert(fingerprint) {
                out.push(hash);
            }
            assert!(self.used.len() < 65_000, "fingerprint space exhausted");
        }
        out
    }
}
