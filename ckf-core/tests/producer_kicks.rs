//! Kick behaviour at scale: no short kick cycles (the eviction slot must not be a function of
//! the fingerprint and the kick count alone, or fingerprints walk the same slots in lock-step)
//! and `docs/design.md`, "Cuckoo filter cases", case 1 on a table designed for 1,048,576 blocks.
//!
//! Session keys are hashed to block hashes with **FNV-1a 64** (offset basis
//! `0xcbf29ce484222325`, prime `0x100000001b3`) over the key's UTF-8 bytes: a simple, widely
//! known byte hash whose low bits are weakly mixed, which is exactly the kind of input that
//! exposes correlated or periodic placement.

use ckf_core::TableFormat;
use ckf_core::addressing::fmix64;
use ckf_core::dc::{DcCkfConfig, DcCkfState, MemberId};

/// FNV-1a 64 of `bytes`.
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[test]
fn fnv1a64_matches_reference_vectors() {
    assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
}

/// A table sized by the sizing helper for 500,000 blocks accepts `"session_1"` ..
/// `"session_500000"` without one omission, for several seeds and members.
#[test]
fn five_hundred_thousand_sessions_without_omission() {
    for seed in [0u64, 0xDEAD_BEEF] {
        let format = TableFormat::for_expected_blocks(500_000, seed).unwrap();
        let mut state = DcCkfState::new(DcCkfConfig::new(format)).unwrap();
        let hashes: Vec<u64> = (1..=500_000u32)
            .map(|i| fnv1a64(format!("session_{i}").as_bytes()))
            .collect();
        for (i, chunk) in hashes.chunks(64).enumerate() {
            let member = MemberId::new(i as u64 % 4, 0);
            let out = state.store(member, chunk);
            assert_eq!(out.first_error, None, "seed {seed:#x}, chunk {i}");
        }
        let stats = state.stats();
        assert_eq!(stats.omissions_total, 0);
        assert_eq!(stats.unique_blocks, 500_000);
        assert_eq!(stats.resident_fingerprints, 500_000);
        assert!(hashes.iter().all(|&h| state.may_contain(h)));
    }
}

/// Case 1: on a table designed for 1,048,576 blocks, no insertion of random keys fails before
/// 90% slot load, and at 95% slot load the false-positive rate on 1,000,000 absent keys is at
/// most 2.5e-4 (theory for 16-bit fingerprints and 4 slots: 2 * 4 * 0.95 / 65,536 = 1.16e-4).
#[test]
fn case_01_fill_to_95_percent_and_false_positive_rate() {
    let format = TableFormat::for_expected_blocks(1 << 20, 0x00C0_FFEE).unwrap();
    let slots = format.slot_count();
    let mut state = DcCkfState::new(DcCkfConfig::new(format)).unwrap();
    let member = MemberId::new(0, 0);
    let target = slots * 95 / 100;
    let mut i = 0u64;
    let mut first_failure_load = None;
    while state.stats().resident_fingerprints < target {
        let chunk: Vec<u64> = (i..i + 1024).map(|k| fmix64(k ^ 0x1111)).collect();
        i += 1024;
        let room = (target - state.stats().resident_fingerprints) as usize;
        for &h in &chunk[..room.min(chunk.len())] {
            let out = state.store(member, &[h]);
            if out.omitted == 1 && first_failure_load.is_none() {
                first_failure_load = Some(state.stats().load_factor);
            }
        }
    }
    if let Some(load) = first_failure_load {
        assert!(load >= 0.90, "first omission at load {load:.4}");
    }
    let stats = state.stats();
    assert!(stats.resident_fingerprints >= target);
    let absent = 1_000_000u64;
    let false_positives = (0..absent)
        .map(|k| fmix64(k ^ 0x2222_0000_0000))
        .filter(|&h| state.refcount(h) == 0 && state.may_contain(h))
        .count();
    let fpr = false_positives as f64 / absent as f64;
    println!(
        "case 1: {} buckets, load {:.4}, first omission at {:?}, {} omissions, {} kicks, \
         FPR {fpr:.2e} ({false_positives} of {absent})",
        format.bucket_count,
        stats.load_factor,
        first_failure_load,
        stats.omissions_total,
        stats.kicks_total
    );
    assert!(fpr <= 2.5e-4, "false-positive rate {fpr:.2e}");
}

/// Format v2 (any even bucket count): a table sized for N expected blocks
/// takes N random blocks with no capacity omission, lands at the target load (within the
/// two-bucket rounding), and costs <= 17.5 bits per tracked block per lane, for expected sizes
/// that are far from any power of two (v1 would have sized 300,001 blocks at 131,072 buckets:
/// 57% load, 28 bits per block).
#[test]
fn a_table_sized_for_n_blocks_holds_n_at_the_target_load() {
    for (n, seed) in [(2_000u64, 1u64), (10_007, 2), (300_001, 3), (777_777, 4)] {
        let format = TableFormat::for_expected_blocks(n, seed).unwrap();
        assert!(
            !format.bucket_count.is_power_of_two(),
            "{n}: {}",
            format.bucket_count
        );
        let mut state = DcCkfState::new(DcCkfConfig::new(format)).unwrap();
        let hashes: Vec<u64> = (0..n).map(|k| fmix64(k ^ (seed << 40))).collect();
        for (i, chunk) in hashes.chunks(16).enumerate() {
            let out = state.store(MemberId::new(i as u64 % 8, 0), chunk);
            assert_eq!(out.first_error, None, "n={n}, chunk {i}");
        }
        let stats = state.stats();
        assert_eq!(stats.omissions_total, 0, "n={n}");
        assert_eq!(stats.resident_fingerprints, n, "n={n}");
        assert!(hashes.iter().all(|&h| state.may_contain(h)), "n={n}");
        let bits = format.table_bytes() as f64 * 8.0 / n as f64;
        assert!(bits <= 17.5, "n={n}: {bits:.3} bits per block");
        assert!(
            (0.915..=ckf_core::addressing::TARGET_LOAD + 1e-9).contains(&stats.load_factor),
            "n={n}: load {}",
            stats.load_factor
        );
    }
}
