//! The built-in synthetic workload: deterministic, Mooncake-conversation-like prefix sharing, so
//! `ckf demo` needs no trace file.
//!
//! Shape (all choices from a generator seeded with `seed`):
//! - every request starts with the shared root block id 0 (as in the Mooncake traces), then one
//!   of [`SYSTEM_PROMPTS`] system prompts (1..=6 blocks; prompt k is chosen with weight 1/(k+1));
//! - a request either opens a new conversation (probability [`NEW_CONVERSATION`], or when no
//!   open conversation is ready) with 1..=12 fresh user blocks, or continues a random *ready*
//!   open conversation: its whole previous context, the previous answer (1..=2 fresh blocks) and
//!   1..=4 fresh user blocks;
//! - after each turn the user thinks: the conversation is ready again only after
//!   [`MIN_THINK_REQUESTS`] + Exponential(mean [`MEAN_EXTRA_THINK_REQUESTS`]) further requests
//!   (about 1.5 s + 4.5 s at the arrival rate below), so turns of one conversation are far apart,
//!   as in the Mooncake trace (median 288 requests between a prefix's reuses in its first 2,000);
//! - a conversation lasts 1 + Geometric(1/3) turns (mean 3) and closes early past
//!   [`MAX_CONTEXT_BLOCKS`]; at most [`MAX_OPEN`] are open at once (the first listed closes to
//!   make room);
//! - arrivals are a Poisson process of 33 requests/s: ten times the Mooncake conversation
//!   trace's rate, what keeps the serving model's default fleet (three DCs of four engines)
//!   busy; only the serving model reads the timestamps.
//!
//! Ids are fresh integers, so equal ids at a position mean an equal prefix, exactly as in the
//! Mooncake format.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::bench::trace::{Request, TOKENS_PER_BLOCK};

/// Number of distinct system prompts.
pub const SYSTEM_PROMPTS: usize = 6;
/// Probability that a request opens a new conversation.
pub const NEW_CONVERSATION: f64 = 0.4;
/// A conversation closes once its context exceeds this many blocks.
pub const MAX_CONTEXT_BLOCKS: usize = 160;
/// Most conversations open at once.
pub const MAX_OPEN: usize = 512;
/// Fewest requests between two turns of one conversation.
pub const MIN_THINK_REQUESTS: usize = 50;
/// Mean of the exponential part of the think time, in requests.
pub const MEAN_EXTRA_THINK_REQUESTS: f64 = 150.0;
/// Mean inter-arrival time in milliseconds.
const MEAN_GAP_MS: f64 = 30.0;

struct Conversation {
    context: Vec<u64>,
    turns_left: u32,
    ready_at: usize,
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
    for now in 0..requests {
        let ready: Vec<usize> = (0..open.len())
            .filter(|&i| open[i].ready_at <= now)
            .collect();
        let start_new = ready.is_empty() || rng.random_bool(NEW_CONVERSATION);
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
                ready_at: now,
            });
            open.len() - 1
        } else {
            let index = ready[rng.random_range(0..ready.len())];
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
        let think: f64 = rng.random_range(f64::EPSILON..1.0);
        conversation.ready_at =
            now + MIN_THINK_REQUESTS + (-think.ln() * MEAN_EXTRA_THINK_REQUESTS) as usize;
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

    #[test]
    fn turns_of_a_conversation_are_at_least_the_think_time_apart() {
        let w = synthetic_workload(3000, 2);
        let mut continuations = 0;
        for (i, r) in w.iter().enumerate() {
            // Every request holds fresh ids, so a request that extends an earlier one whole is
            // the next turn of the same conversation.
            if let Some(j) = (0..i).rev().find(|&j| {
                r.hash_ids.len() > w[j].hash_ids.len() && r.hash_ids.starts_with(&w[j].hash_ids)
            }) {
                assert!(i - j >= MIN_THINK_REQUESTS, "turns {j} and {i} too close");
                continuations += 1;
            }
        }
        assert!(continuations > 300, "{continuations} continuations");
    }
}
