//! `-- lanes`: the cost of more than 16 lanes. The same queries on a 16-lane and a 64-lane
//! table of the same total size (2 MiB and 256 MiB: the 64-lane table has a quarter of the
//! buckets per lane), interleaved in rounds so both see the same machine; the ratio 64 / 16 is
//! from the same run. Two workloads: Mooncake (each request stored in each lane with
//! probability 1/4, so lanes stop at different depths) and the synthetic worst case (every lane
//! holds every query block: no lane exits early).

use std::sync::Arc;

use ckf_core::global::GlobalCkfIndexer;

use crate::common::latency::{Lat, summarize, ticks};
use crate::search_tables::{
    build_indexer, ckf_query, fill, synthetic_queries, trace_indexer_sized,
};

/// Rounds the two tables' timings are interleaved in.
const ROUNDS: usize = 20;

/// Times `queries` on `a` and `b` alternately, `samples` queries each in all.
fn interleaved(
    a: &GlobalCkfIndexer,
    b: &GlobalCkfIndexer,
    queries: &[Vec<u64>],
    samples: usize,
    scale: f64,
) -> (Lat, Lat) {
    let mut times = [Vec::with_capacity(samples), Vec::with_capacity(samples)];
    let per_round = samples / ROUNDS;
    let mut next = 0usize;
    for q in queries.iter().take(2000) {
        std::hint::black_box(ckf_query(a, q) + ckf_query(b, q));
    }
    for _ in 0..ROUNDS {
        for (ix, out) in [a, b].into_iter().zip(times.iter_mut()) {
            for j in 0..per_round {
                let q = &queries[(next + j) % queries.len()];
                let t0 = ticks();
                let r = ckf_query(ix, std::hint::black_box(q));
                let t1 = ticks();
                std::hint::black_box(r);
                out.push(t1 - t0);
            }
        }
        next += per_round;
    }
    let [ta, tb] = times;
    (summarize(ta, scale), summarize(tb, scale))
}

fn print_pair(name: &str, narrow: &Lat, wide: &Lat) {
    println!(
        "{name:<40} 16 lanes p50 {:>7.0} p99 {:>7.0} ns | 64 lanes p50 {:>7.0} p99 {:>7.0} ns | \
         64/16 p50 {:>5.2} p99 {:>5.2}",
        narrow.p50,
        narrow.p99,
        wide.p50,
        wide.p99,
        wide.p50 / narrow.p50,
        wide.p99 / narrow.p99
    );
}

/// A `lanes`-lane table of `bytes` in all where every lane holds every block of `queries`.
fn synthetic_indexer(bytes: u64, lanes: usize, queries: &[Vec<u64>]) -> GlobalCkfIndexer {
    let ix = build_indexer(bytes / 8 / lanes as u64, lanes);
    let mut lane_blocks = vec![queries.iter().flatten().copied().collect::<Vec<u64>>(); lanes];
    fill(&ix, &mut lane_blocks, 0.95, 5);
    ix
}

/// Runs the comparison (Mooncake rows only with a trace; 256 MiB only without `no_big`).
pub fn run_lanes(trace: Option<&[Vec<u64>]>, no_big: bool, samples: usize, scale: f64) {
    for (size, bytes) in [("2 MiB", 2u64 << 20), ("256 MiB", 256u64 << 20)] {
        if no_big && bytes > 2 << 20 {
            continue;
        }
        if let Some(trace) = trace {
            let (narrow, ..) = trace_indexer_sized(trace, bytes / 8 / 16, 16);
            let (wide, ..) = trace_indexer_sized(trace, bytes / 8 / 64, 64);
            let (n, w) = interleaved(&narrow, &wide, trace, samples, scale);
            print_pair(&format!("lanes mooncake {size}"), &n, &w);
        }
        for len in [8usize, 128] {
            // As many query blocks as the 64-lane table's lanes hold at half load.
            let per_lane = (bytes / 8 / 64 * 2) as usize;
            let queries =
                synthetic_queries((per_lane / len).clamp(4, 20_000), len, 77 + len as u64);
            let narrow = Arc::new(synthetic_indexer(bytes, 16, &queries));
            let wide = Arc::new(synthetic_indexer(bytes, 64, &queries));
            let (n, w) = interleaved(&narrow, &wide, &queries, samples, scale);
            print_pair(&format!("lanes all-match {size} {len:>3} blocks"), &n, &w);
        }
    }
}
