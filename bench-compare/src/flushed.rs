//! Queries on a flushed cache: before each timed query every cache level is evicted by reading
//! an eviction buffer, so each structure starts its query cold.
//!
//! Why an eviction buffer and not `clflush`: `clflush` needs the addresses of a structure's
//! memory, which dynamo's CKF and radix trees do not expose from outside their crate. Reading a
//! buffer twice the size of the last-level cache (and at least 64 MiB, read as [`Evictor`]
//! says) evicts every structure's lines, whoever owns its memory. It also takes the TLB's
//! entries and the page-table lines, which cost each structure according to its pages (ckf-core's
//! table is on 2 MiB pages where the kernel grants them; a `Vec` elsewhere usually on 4 KiB).
//! The run prints a sanity check, not a proof: a pointer chase through a 4 MiB array, warm and
//! right after an eviction ([`chase_check`]), flagged under [`MIN_COLD_RATIO`]. In an idle
//! process the cold chase ran ~10x the warm one; inside full bench runs 1.4-5.5x on AMD EPYC
//! Zen 5 with the same eviction (the warm chase shares the LLC with everything else and varies
//! from 25 to 77 ticks per line), while the queries' flushed times stayed alike from run to run.
//!
//! Every structure times the same queries, one eviction before each; in each round the
//! structures take turns (the first rotating) on queries far apart in the fixed random order.
//! See [`time_flushed`] for what is warm again when the clock starts.

use std::hint::black_box;

use crate::query::Timed;
use crate::timing::{Lat, summarize, ticks};

/// Smallest eviction buffer, bytes.
const MIN_EVICT_BYTES: usize = 64 << 20;
/// A probe chase after an eviction under this many times its warm chase is flagged.
pub const MIN_COLD_RATIO: f64 = 2.0;
/// Queries of at most this many blocks are reported on their own as "short".
pub const SHORT_BLOCKS: usize = 8;

/// The eviction buffer, read in chunks of at most half the last-level cache, each chunk twice
/// in a scattered order.
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
    /// A buffer of at least twice `llc` bytes and at least [`MIN_EVICT_BYTES`], in chunks of
    /// the largest power of two at most half of `llc` (at least 64 KiB; 16 MiB when `llc` is
    /// 0, unknown), the buffer a whole number of chunks; written once so its pages exist.
    pub fn new(llc: usize) -> Self {
        let half = if llc == 0 { 32 << 20 } else { llc / 2 };
        let chunk = (1usize << half.max(64 << 10).ilog2()).max(64 << 10);
        let bytes = (2 * llc).max(MIN_EVICT_BYTES).div_ceil(chunk) * chunk;
        let words = (0..bytes / 8).map(|i| i as u64).collect();
        Self {
            words,
            chunk_lines: chunk / 64,
        }
    }

    /// Buffer bytes.
    pub fn bytes(&self) -> usize {
        self.words.len() * 8
    }

    /// Reads one word of every line of the buffer, chunk by chunk, each chunk twice, in the
    /// order of [`scattered`] (no pass looks like a stream). Reads, not writes: the timed
    /// query then fills its lines over clean ones, with no write-back in its way.
    #[inline(never)]
    pub fn evict(&self) -> u64 {
        let mut acc = 0;
        for chunk in self.words.chunks(self.chunk_lines * 8) {
            for _ in 0..2 {
                for line in scattered(chunk.len() / 8) {
                    acc ^= chunk[line * 8];
                }
            }
        }
        acc
    }
}

/// Every line of a chunk of `lines` lines (a power of two) once: line `i * K mod lines` for
/// an odd `K`, a permutation.
fn scattered(lines: usize) -> impl Iterator<Item = usize> {
    debug_assert!(lines.is_power_of_two());
    (0..lines).map(move |i| i.wrapping_mul(0x9E37_79B1) & (lines - 1))
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

/// Ticks per line of a 4 MiB pointer chase warm (the fastest of three in a row) and right
/// after an eviction (the median of five).
pub fn chase_check(evictor: &Evictor) -> (f64, f64) {
    // One cycle through all 65,536 lines of 4 MiB in a random order.
    let lines = (4usize << 20) / 64;
    let mut cycle: Vec<usize> = (0..lines).collect();
    cycle.sort_by_key(|&i| ckf_core::addressing::fmix64(i as u64 ^ 0xC01D));
    let mut probe = vec![0u64; lines * 8];
    for (i, &line) in cycle.iter().enumerate() {
        probe[line * 8] = cycle[(i + 1) % lines] as u64;
    }
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
    (warm as f64 / lines as f64, cold[2] as f64 / lines as f64)
}

/// One structure's flushed latencies: all timed queries and the short ones (`None`: none).
pub struct Flushed {
    pub all: Lat,
    pub short: Option<Lat>,
}

/// Times the first `n` queries of `order` (at most half of it, and at least one per structure:
/// else `None`) once per structure, each after an eviction, then one untimed query of the same
/// structure from the other half (its code, and the parts every query reads, warm again, as in
/// a serving process), then `touch(q)` (the query's input read, as a request just decoded
/// is). So the rows of the timed query are what is cold, but for those it shares with the
/// warm-up query (the Mooncake trace's requests share their first block). `blocks(q)` is query
/// `q`'s length, for the short-query split.
pub fn time_flushed(
    impls: &mut [Timed<'_>],
    order: &[usize],
    n: usize,
    blocks: impl Fn(usize) -> usize,
    touch: impl Fn(usize) -> u64,
    evictor: &Evictor,
    scale: f64,
) -> Option<Vec<Flushed>> {
    let (queries, warm) = order.split_at(n.min(order.len() / 2));
    if queries.is_empty() || queries.len() < impls.len() {
        return None;
    }
    let mut samples: Vec<Vec<(u64, bool)>> = impls
        .iter()
        .map(|_| Vec::with_capacity(queries.len()))
        .collect();
    let count = impls.len();
    for j in 0..queries.len() {
        for k in 0..count {
            let k = (j + k) % count;
            // Structure k times query j + k n / count in this round: never the query another
            // structure has just read (ckf-core and ckf-core +chain read one table, and rows
            // read a moment ago partly survive an eviction).
            let q = queries[(j + k * queries.len() / count) % queries.len()];
            black_box(evictor.evict());
            black_box((impls[k].run)(warm[(j * count + k) % warm.len()]));
            black_box(touch(q));
            let t0 = ticks();
            let r = (impls[k].run)(black_box(q));
            let t1 = ticks();
            black_box(r);
            samples[k].push((t1 - t0, blocks(q) <= SHORT_BLOCKS));
        }
    }
    let flushed = samples
        .into_iter()
        .map(|s| {
            let short: Vec<u64> = s.iter().filter(|x| x.1).map(|x| x.0).collect();
            Flushed {
                all: summarize(s.iter().map(|x| x.0).collect(), scale),
                short: (!short.is_empty()).then(|| summarize(short, scale)),
            }
        })
        .collect();
    Some(flushed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_eviction_reads_every_line_of_a_buffer_twice_the_llc() {
        for lines in [1usize, 2, 64, 1 << 12] {
            let mut seen = vec![0u8; lines];
            for line in scattered(lines) {
                seen[line] += 1;
            }
            assert!(seen.iter().all(|&c| c == 1), "{lines} lines");
        }
        for llc in [0usize, 8 << 20, 12 << 20, 32 << 20, 36 << 20, 96 << 20] {
            let e = Evictor::new(llc);
            let chunk = e.chunk_lines * 64;
            assert!(chunk.is_power_of_two());
            assert!(llc == 0 || chunk <= llc / 2, "llc {llc} chunk {chunk}");
            assert!(2 * chunk > llc / 2, "llc {llc} chunk {chunk}");
            assert!(e.bytes() >= (2 * llc).max(MIN_EVICT_BYTES));
            assert_eq!(e.bytes() % chunk, 0);
        }
    }

    #[test]
    fn every_structure_times_every_query_once_apart_from_the_others() {
        let seen = std::cell::RefCell::new(vec![Vec::new(), Vec::new()]);
        let mut impls: Vec<Timed> = (0..2)
            .map(|k| Timed {
                name: "x",
                run: Box::new({
                    let seen = &seen;
                    move |q| {
                        seen.borrow_mut()[k].push(q);
                        q as u32
                    }
                }),
            })
            .collect();
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
        let f = time_flushed(&mut impls, &order, 8, |q| q * 2, touch, &e, 1.0).unwrap();
        drop(impls);
        let seen = seen.into_inner();
        for calls in &seen {
            // Warm-up and timed queries alternate: warm-ups from the untimed half.
            let timed: Vec<usize> = calls.iter().skip(1).step_by(2).copied().collect();
            let mut sorted = timed.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..8).collect::<Vec<_>>());
            assert!(calls.iter().step_by(2).all(|&q| q >= 8));
        }
        // In each round the two structures time queries half the set apart.
        for j in 0..8 {
            assert_eq!((seen[0][2 * j + 1] + 4) % 8, seen[1][2 * j + 1]);
        }
        assert_eq!(touched.get(), 16);
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].all.samples, 8);
        // Queries 0..=4 have at most 8 blocks.
        assert_eq!(f[1].short.map(|l| l.samples), Some(5));
        // At most half the queries are timed: the rest warm up.
        let mut one = [Timed {
            name: "c",
            run: Box::new(|q| q as u32),
        }];
        let f = time_flushed(&mut one, &order, 15, |q| q + 100, |q| q as u64, &e, 1.0).unwrap();
        assert_eq!(f[0].all.samples, 10);
        assert!(f[0].short.is_none());
        // Fewer timed queries than structures would have two time one query back to back.
        assert!(time_flushed(&mut one, &order[..1], 1, |q| q, |q| q as u64, &e, 1.0).is_none());
    }
}
