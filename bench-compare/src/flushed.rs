//! Queries on a flushed cache: before each timed query every cache level is evicted by reading
//! an eviction buffer, so each structure starts its query cold.
//!
//! Why an eviction buffer and not `clflush`: `clflush` needs the addresses of a structure's
//! memory, which dynamo's CKF and radix trees do not expose from outside their crate. Reading a
//! buffer twice the size of the last-level cache (and at least 64 MiB, read as [`Evictor`]
//! says) evicts every structure alike, whoever owns its memory. The run checks that it worked:
//! a pointer chase through a 4 MiB array right after an eviction must take at least
//! [`MIN_COLD_RATIO`] times its warm chase, or the figures are flagged as not flushed.
//!
//! Queries run in the fixed random order, one structure after another per query (the first of
//! them rotating with the query), one eviction before each timed query; see [`time_flushed`]
//! for what is warm again when the clock starts.

use std::hint::black_box;
use std::time::{Duration, Instant};

use crate::query::Timed;
use crate::timing::{Lat, summarize, ticks};

/// Smallest eviction buffer, bytes.
const MIN_EVICT_BYTES: usize = 64 << 20;
/// A probe chase after an eviction must take at least this many times its warm chase.
pub const MIN_COLD_RATIO: f64 = 3.0;
/// Pause between reading the query's input and timing the query (see [`time_flushed`]).
/// Without it, on AMD EPYC Zen 5 at 1 GiB, ckf-core's p50 was 1.2-1.7x that of ckf-core
/// +chain, whose chain computation let the lines in flight from the input read arrive first; a
/// 1 us spin at the start of the timed query brought ckf-core level (p50 3.5 -> 3.0 us, the
/// spin included).
const GAP: Duration = Duration::from_micros(5);
/// Queries of at most this many blocks are reported on their own as "short".
pub const SHORT_BLOCKS: usize = 8;

/// The eviction buffer, read in chunks of half the last-level cache, each chunk twice in a
/// scattered order.
///
/// Why so: a last-level cache with a scan-resistant replacement policy keeps lines that were
/// hit before a pass over a buffer it sees once. A single sequential or scattered pass over 2,
/// 4 or 8 times the LLC left a 4 MiB probe mostly cached after its first eviction (AMD EPYC
/// Zen 5: a chase through it at 1.1-2.9x its warm time); a second pass over each chunk while
/// it still fits the LLC hits there, so the buffer's lines are kept in preference to the
/// probe's, and the chase ran at 6-10x its warm time every time.
pub struct Evictor {
    words: Vec<u64>,
    chunk_lines: usize,
}

/// Bytes of the last-level cache from Linux's cache description (the largest `size` under
/// `/sys/devices/system/cpu/cpu0/cache`), or 0 when it cannot be read.
pub fn llc_bytes() -> usize {
    let Ok(dir) = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache") else {
        return 0;
    };
    dir.flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("size")).ok())
        .filter_map(|s| {
            let s = s.trim();
            let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit())?);
            let n: usize = n.parse().ok()?;
            Some(match unit {
                "K" => n << 10,
                "M" => n << 20,
                "G" => n << 30,
                _ => n,
            })
        })
        .max()
        .unwrap_or(0)
}

impl Evictor {
    /// A buffer of twice `llc` bytes (at least [`MIN_EVICT_BYTES`]), in chunks of half of it,
    /// both rounded up to powers of two; written once so its pages exist.
    pub fn new(llc: usize) -> Self {
        let bytes = (2 * llc).max(MIN_EVICT_BYTES).next_power_of_two();
        let words = (0..bytes / 8).map(|i| i as u64).collect();
        Self {
            words,
            chunk_lines: (bytes / 4 / 64).max(1),
        }
    }

    /// Buffer bytes.
    pub fn bytes(&self) -> usize {
        self.words.len() * 8
    }

    /// Reads one word of every line of the buffer, chunk by chunk, each chunk twice (line
    /// `i * K mod lines` for an odd `K`, so no pass looks like a stream). Reads, not writes: the
    /// timed query then fills its lines over clean ones, with no write-back in its way.
    #[inline(never)]
    pub fn evict(&self) -> u64 {
        let mut acc = 0;
        for chunk in self.words.chunks(self.chunk_lines * 8) {
            let lines = chunk.len() / 8;
            for _ in 0..2 {
                for i in 0..lines {
                    acc ^= chunk[(i.wrapping_mul(0x9E37_79B1) & (lines - 1)) * 8];
                }
            }
        }
        acc
    }
}

/// Ticks to follow the chain through every line of `probe` (dependent loads: each costs the
/// latency of the level holding its line, which hardware prefetchers cannot hide).
fn chase_ticks(probe: &[u64]) -> u64 {
    let t0 = ticks();
    let mut at = 0usize;
    for _ in 0..probe.len() / 8 {
        at = probe[at * 8] as usize;
    }
    black_box(at);
    ticks() - t0
}

/// How much slower a 4 MiB pointer chase runs right after an eviction than warm.
pub fn cold_ratio(evictor: &Evictor) -> f64 {
    // One cycle through all 65,536 lines of 4 MiB in a random order.
    let lines = (4usize << 20) / 64;
    let mut cycle: Vec<usize> = (0..lines).collect();
    cycle.sort_by_key(|&i| ckf_core::addressing::fmix64(i as u64 ^ 0xC01D));
    let mut probe = vec![0u64; lines * 8];
    for (i, &line) in cycle.iter().enumerate() {
        probe[line * 8] = cycle[(i + 1) % lines] as u64;
    }
    // The warm time: the fastest of three chases in a row; the cold one: the median of five,
    // each right after an eviction.
    let warm = (0..3)
        .map(|_| chase_ticks(&probe))
        .min()
        .unwrap_or(1)
        .max(1);
    let mut cold: Vec<u64> = (0..5)
        .map(|_| {
            black_box(evictor.evict());
            chase_ticks(&probe)
        })
        .collect();
    cold.sort_unstable();
    cold[2] as f64 / warm as f64
}

/// One structure's flushed latencies: all timed queries and the short ones.
pub struct Flushed {
    pub all: Lat,
    pub short: Lat,
}

/// Times the first `n` queries of `order` (at most half of it) once per structure, each after
/// an eviction, then one untimed query of the same structure from the other half (its code,
/// and the parts every query reads, warm again, as in a serving process), then `touch(q)`
/// and a pause of [`GAP`]
/// (the query's input read, as a request just decoded is). So the rows of the timed query are
/// what is cold. `blocks(q)` is query `q`'s length, for the short-query split.
pub fn time_flushed(
    impls: &mut [Timed<'_>],
    order: &[usize],
    n: usize,
    blocks: impl Fn(usize) -> usize,
    touch: impl Fn(usize) -> u64,
    evictor: &Evictor,
    scale: f64,
) -> Vec<Flushed> {
    let (queries, warm) = order.split_at(n.min(order.len() / 2));
    let mut samples: Vec<Vec<(u64, bool)>> = impls
        .iter()
        .map(|_| Vec::with_capacity(queries.len()))
        .collect();
    for (j, &q) in queries.iter().enumerate() {
        let short = blocks(q) <= SHORT_BLOCKS;
        let count = impls.len();
        for k in 0..count {
            let k = (j + k) % count;
            black_box(evictor.evict());
            black_box((impls[k].run)(warm[(j * count + k) % warm.len()]));
            black_box(touch(q));
            // The lines still in flight (the hardware's prefetches past the input just read)
            // arrive, as between decoding a request and searching for it.
            let until = Instant::now() + GAP;
            while Instant::now() < until {
                std::hint::spin_loop();
            }
            let t0 = ticks();
            let r = (impls[k].run)(black_box(q));
            let t1 = ticks();
            black_box(r);
            samples[k].push((t1 - t0, short));
        }
    }
    samples
        .into_iter()
        .map(|s| {
            let short: Vec<u64> = s.iter().filter(|x| x.1).map(|x| x.0).collect();
            Flushed {
                all: summarize(s.iter().map(|x| x.0).collect(), scale),
                short: summarize(if short.is_empty() { vec![0] } else { short }, scale),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_eviction_makes_a_probe_read_cold() {
        let llc = llc_bytes();
        assert!(llc > 0, "no cache size in /sys");
        let e = Evictor::new(llc);
        assert!(e.bytes() >= 2 * llc);
        // A warm chase through 4 MiB hits the caches; after the eviction it goes to DRAM.
        let r = cold_ratio(&e);
        assert!(r >= MIN_COLD_RATIO, "cold ratio {r}");
    }

    #[test]
    fn every_structure_times_every_query_and_short_ones_are_split() {
        let mut calls = [0usize; 2];
        let (a, b) = calls.split_at_mut(1);
        let mut impls = vec![
            Timed {
                name: "a",
                run: Box::new(|q| {
                    a[0] += 1;
                    q as u32
                }),
            },
            Timed {
                name: "b",
                run: Box::new(|q| {
                    b[0] += 1;
                    q as u32
                }),
            },
        ];
        let e = Evictor {
            words: vec![0; 1024],
            chunk_lines: 32,
        };
        let order: Vec<usize> = (0..20).collect();
        let touched = std::cell::Cell::new(0);
        let touch = |q| {
            touched.set(touched.get() + 1);
            q as u64
        };
        let f = time_flushed(&mut impls, &order, 7, |q| q * 2, touch, &e, 1.0);
        drop(impls);
        // Each structure: 7 timed queries and 7 warm-up ones; every timed query touched.
        assert_eq!(calls, [14, 14]);
        assert_eq!(touched.get(), 14);
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].all.samples, 7);
        // Queries 0..=4 have at most 8 blocks.
        assert_eq!(f[1].short.samples, 5);
        // At most half the queries are timed: the rest warm up.
        let mut one = [Timed {
            name: "c",
            run: Box::new(|q| q as u32),
        }];
        let f = time_flushed(&mut one, &order, 15, |q| q, |q| q as u64, &e, 1.0);
        assert_eq!(f[0].all.samples, 10);
    }
}
