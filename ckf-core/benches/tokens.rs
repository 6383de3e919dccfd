//! Token hashing for queries by token ids (`ckf.v1.Query/FindMatchesByTokens`):
//! `ckf_core::tokens::sequence_hashes` in ns per block, next to two baselines measured in the
//! same run on the same requests:
//!
//! - **copying**: the same function as it was before 2026-12-05, each block's token ids first
//!   copied into a fresh `Vec<u8>` of little-endian bytes, then hashed (one allocation and one
//!   copy per block);
//! - **one pass**: `xxh3_64` over the request's whole token bytes once, with no blocks and no
//!   chain: a lower bound for any function that reads every token byte once.
//!
//! Run: `cargo bench -p ckf-core --bench tokens` (hand-rolled harness; prints one table).
//! Requests: 256 per block size (their token ids stay within the L3, as a request just decoded
//! does), hashed 16 times per round, their block counts the first 256 of the Mooncake trace's
//! query lengths (p50 14, p99 167 blocks) when the trace is readable (else a fixed mix of 4, 14,
//! 64 and 167 blocks), random token ids, block sizes 16,
//! 64 and 512 tokens, no multimodal items. The three implementations take turns in 7 rounds;
//! each keeps its best round (wall clock, so a preempted round does not count).
//!
//! The trace is the public Mooncake FAST'25 conversation trace (Apache-2.0), not part of this
//! repository: read from `CKF_TRACE` when that environment variable is set, else the fixed mix.

use std::hint::black_box;
use std::time::Instant;

use ckf_core::addressing::fmix64;
use ckf_core::tokens::{BlockSeed, chain_step, sequence_hashes};
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

const REQUESTS: usize = 256;
const PASSES: usize = 16;
const ROUNDS: usize = 7;

/// Block counts of the trace's requests (`hash_ids` per line), or a fixed mix without it.
fn block_counts() -> Vec<usize> {
    let text = std::env::var("CKF_TRACE")
        .ok()
        .and_then(|path| std::fs::read_to_string(path).ok());
    let from_trace: Vec<usize> = text
        .map(|text| {
            text.lines()
                .filter_map(|line| {
                    let ids = line.split("\"hash_ids\"").nth(1)?;
                    let list = ids.split('[').nth(1)?.split(']').next()?;
                    Some(list.split(',').filter(|x| !x.trim().is_empty()).count())
                })
                .filter(|&n| n > 0)
                .collect()
        })
        .unwrap_or_default();
    if from_trace.is_empty() {
        [4, 14, 14, 14, 64, 167].repeat(REQUESTS / 6 + 1)
    } else {
        from_trace
    }
}

/// The block hash as it was computed before the in-place path: a fresh little-endian copy.
fn copying_block_hash(tokens: &[u32], seed: BlockSeed) -> u64 {
    let mut bytes = Vec::with_capacity(tokens.len() * 4);
    for token in tokens {
        bytes.extend_from_slice(&token.to_le_bytes());
    }
    xxh3_64_with_seed(&bytes, seed.0)
}

fn copying_sequence_hashes(tokens: &[u32], block_size: usize, seed: BlockSeed) -> Vec<u64> {
    let mut hashes = Vec::with_capacity(tokens.len() / block_size);
    let mut parent = None;
    for block in tokens.chunks_exact(block_size) {
        let hash = chain_step(parent, copying_block_hash(block, seed));
        hashes.push(hash);
        parent = Some(hash);
    }
    hashes
}

/// Best-of-rounds seconds of each implementation over `requests`.
fn time_all(requests: &[Vec<u32>], block_size: usize) -> [f64; 3] {
    let seed = BlockSeed::DEFAULT;
    let mut best = [f64::INFINITY; 3];
    for _ in 0..ROUNDS {
        for (i, slot) in best.iter_mut().enumerate() {
            let start = Instant::now();
            let mut sink = 0u64;
            for tokens in std::iter::repeat_n(requests, PASSES).flatten() {
                sink ^= match i {
                    0 => sequence_hashes(black_box(tokens), block_size, seed, &[])
                        .expect("block size > 0")
                        .last()
                        .copied()
                        .unwrap_or(0),
                    1 => copying_sequence_hashes(black_box(tokens), block_size, seed)
                        .last()
                        .copied()
                        .unwrap_or(0),
                    _ => xxh3_64(bytemuck::cast_slice(black_box(tokens))),
                };
            }
            black_box(sink);
            *slot = slot.min(start.elapsed().as_secs_f64());
        }
    }
    best
}

fn main() {
    let counts = block_counts();
    println!(
        "token hashing: {REQUESTS} requests per block size x {PASSES} passes, block counts from {} ({} values), best of {ROUNDS} interleaved rounds",
        if counts.len() > 6 {
            "the Mooncake trace"
        } else {
            "a fixed mix"
        },
        counts.len()
    );
    println!(
        "{:>10} {:>8} {:>14} {:>14} {:>14} {:>13} {:>13}",
        "block size",
        "blocks",
        "ours ns/blk",
        "copying ns/blk",
        "1 pass ns/blk",
        "ours/copying",
        "ours/1 pass"
    );
    for block_size in [16usize, 64, 512] {
        let mut blocks = 0usize;
        let requests: Vec<Vec<u32>> = (0..REQUESTS)
            .map(|r| {
                let n = counts[r % counts.len()];
                blocks += n;
                (0..n * block_size)
                    .map(|t| fmix64((r * 1_000_003 + t) as u64) as u32)
                    .collect()
            })
            .collect();
        // The two implementations agree on every request (the bench would compare nothing
        // otherwise).
        for tokens in requests.iter().take(50) {
            assert_eq!(
                sequence_hashes(tokens, block_size, BlockSeed::DEFAULT, &[]).unwrap(),
                copying_sequence_hashes(tokens, block_size, BlockSeed::DEFAULT)
            );
        }
        let [ours, copying, one_pass] = time_all(&requests, block_size);
        let per_block = |s: f64| s * 1e9 / (blocks * PASSES) as f64;
        println!(
            "{:>10} {:>8} {:>14.1} {:>14.1} {:>14.1} {:>13.2} {:>13.2}",
            block_size,
            blocks,
            per_block(ours),
            per_block(copying),
            per_block(one_pass),
            ours / copying,
            ours / one_pass
        );
    }
    println!(
        "ours = sequence_hashes (block hashes in place, chained); copying = the same with a \
         fresh little-endian copy per block (before 2026-12-05); 1 pass = xxh3 over all token \
         bytes once (no blocks, no chain), a lower bound. ours/copying < 1: ours is faster; \
         ours/1 pass >= 1 always (how far from the bound)."
    );
}
