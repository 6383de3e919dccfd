//! The built-in synthetic workload: deterministic, Mooncake-conversation-like prefix sharing, so
//! `ckf demo` needs no trace file.
//!
//! Shape (all choices from a generator seeded with `seed`):
//! - every request starts with the shared root block id 0 (as in the Mooncake traces), then one
//!   of [`SYSTEM_PROMPTS`] system prompts (1..=6 blocks; prompt k is chosen with weight 1/(k+1));
//! - a request either opens a new conversation (probability [`NEW_CONVERSATION`], or when none
//!   is open) with 1..=12 fresh user blocks, or continues a random open conversation: its whole
//!   previous context, the previous answer (1..=2 fresh blocks) and 1..=4 fresh user blocks;
//! - a conversation lasts 1 + Geometric(1/3) turns (mean 3) and closes early past
//!   [`MAX_CONTEXT_BLOCKS`]; at most [`MAX_OPEN`] are open at once (the first listed closes to make room);
//! - arrivals are a Poisson process of 3.3 requests/s (Mooncake's conversation trace rate).
//!
//! Ids are fresh integers, so equal ids at a position mean an equal prefix, exactly as in the
//! Mooncake format.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::trace::{Request, TOKENS_PER_BLOCK};

/// Number of distinct system prompts.
pub const SYSTEM_PROMPTS: usize = 6;
/// Probability that a request opens a new conversation.
pub const NEW_CONVERSATION: f64 = 0.4;
/// A conversation closes once its context exceeds this many blocks.
pub const MAX_CONTEXT_BLOCKS: usize = 160;
/// Most conversations open at once.
pub const MAX_OPEN: usize = 96;
/// Mean inter-arrival time in milliseconds.
const MEAN_GAP_MS: f64 = 300.0;

struct Conversation {
    context: Vec<u64>,
    turns_left: u32,
}

/// `requests` synthetic requests; the same `(requests, seed)` always gives the same workload.
pub fn synthetic_workload(requests: usize, seed: u64) -> Vec<Request> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut next_id = 1u64;
    let mut fresh = |n: usize| -> Vec<u64> {
        let ids = (next_id..next_id + n as u64).collect();
        next_id += n as u64;
        ids
    };
    let prompts: Vec<Vec<u64>> = (0..SYSTEM_PROMPTS).map(|k| fresh(1 + k % 6)).collect();
    let weights: Vec<f64> = (0..SYSTEM_PROMPTS)
        .map(|k| 1.0 / (k as f64 + 1.0))
        .collect();
    let total_weight: f64 = weights.iter().sum();

    let mut open: Vec<Conversation> = Vec::new();
    let mut out = Vec::with_capacity(requests);
    let mut clock_ms = 0.0f64;
    for _ in 0..requests {
        let start_new = open.is_empty() || rng.random_bool(NEW_CONVERSATION);
        let index = if start_new {
            if open.len() >= MAX_OPEN {
                open.remove(0);
            }
            let mut pick = rng.random_range(0.0..total_weight);
            let mut prompt = 0;
            while pick >= weights[prompt] && prompt + 1 < SYSTEM_PROMPTS {
                pick -= weights[prompt];
                prompt += 1;
            }
            let mut context = vec![0];
            context.extend(&prompts[prompt]);
            context.extend(fresh(rng.random_range(1..=12)));
            let mut turns_left = 1;
            while rng.random_bool(2.0 / 3.0) {
                turns_left += 1;
            }
            open.push(Conversation {
                context,
                turns_left,
            });
            open.len() - 1
        } else {
            let index = rng.random_range(0..open.len());
            let answer = rng.random_range(1..=2);
            let user = rng.random_range(1..=4);
            let conversation = &mut open[index];
            conversation.context.extend(fresh(answer));
            conversation.context.extend(fresh(user));
            index
        };
        let conversation = &mut open[index];
        let blocks = conversation.context.len() as u64;
        let input_length = blocks * TOKENS_PER_BLOCK - rng.random_range(0..TOKENS_PER_BLOCK);
        let gap: f64 = rng.random_range(f64::EPSILON..1.0);
        clock_ms += -gap.ln() * MEAN_GAP_MS;
        out.push(Request {
            timestamp_ms: clock_ms as u64,
            input_length,
            output_length: rng.random_range(16..=800),
            hash_ids: conversation.context.clone(),
        });
        conversation.turns_left -= 1;
        if conversation.turns_left == 0 || conversation.context.len() > MAX_CONTEXT_BLOCKS {
            open.swap_remove(index);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn deterministic_per_seed() {
        assert_eq!(synthetic_workload(300, 5), synthetic_workload(300, 5));
        assert_ne!(synthetic_workload(300, 5), synthetic_workload(300, 6));
    }

    #[test]
    fn mooncake_like_shape() {
        let w = synthetic_workload(3000, 1);
        assert_eq!(w.len(), 3000);
        assert!(w.iter().all(|r| r.hash_ids[0] == 0));
        assert!(w.windows(2).all(|p| p[0].timestamp_ms <= p[1].timestamp_ms));
        for r in &w {
            assert_eq!(
                r.hash_ids.len() as u64,
                r.input_length.div_ceil(TOKENS_PER_BLOCK),
                "input_length matches the block count"
            );
        }
        // Prefix sharing: with an infinite cache a good share of blocks are prefix hits.
        let mut seen: HashSet<Vec<u64>> = HashSet::new();
        let (mut hits, mut total) = (0usize, 0usize);
        for r in &w {
            let depth = (1..=r.hash_ids.len())
                .take_while(|&n| seen.contains(&r.hash_ids[..n]))
                .count();
            hits += depth;
            total += r.hash_ids.len();
            for n in 1..=r.hash_ids.len() {
                seen.insert(r.hash_ids[..n].to_vec());
            }
        }
        let rate = hits as f64 / total as f64;
        assert!((0.3..0.9).contains(&rate), "infinite-cache hit rate {rate}");
    }
}
