//! Producer ingest throughput: `DcCkfState` store/remove block ops per second at 50%, 85% and
//! 95% slot load on an in-cache table (2^16 buckets) and at 85% on 2^20 and 2^22 buckets
//! (table and exact state far beyond the caches), next to an exact refcount index doing the
//! same ops in the same run.
//!
//! Run: `cargo bench -p ckf-core --bench producer` (hand-rolled harness; prints a table).
//! `CKF_BENCH_BUCKETS=1048576` runs only the rows of that table size, `CKF_BENCH_NO_HASHERS=1`
//! skips the hasher comparison.
//!
//! Profile mode: `cargo bench -p ckf-core --bench producer -- profile [BUCKETS] [LOAD%] [RUNS]
//! [pub]` (default 65536 buckets at 85%, one run, no publication; `pub` takes a publication
//! batch every 64 events as the `+pub` column does). It builds one row's workload once, then
//! RUNS times applies its warm-up to a fresh state and its timed events with the hint, and
//! prints the median and best rate, a digest of the final table (equal digests: two builds
//! placed every fingerprint alike) and, with `pub`, of every batch (its images in order and its
//! cycles broken), and the instruction-count recipe: the binary under `valgrind
//! --tool=callgrind --toggle-collect='*steady_for_profile*'` counts only the steady-state
//! ingest (no generation, no warm-up). Comparing two builds: alternate their profile runs.
//!
//! Growth mode: `cargo bench -p ckf-core --bench producer -- growth [BUCKETS] [LOAD%]`
//! (default 4194304 buckets at 85%). It fills a fresh `DcCkfState` from empty with the row's
//! warm-up stores (with the hint and a publication batch every 64 events, as the actor runs),
//! so the block map grows through every size and each growth (a rehash of every entry) happens
//! inside one store; the same with the block map reserved up front for the target load's blocks
//! (`DcCkfConfig::reserve_blocks`: no growth, the reservation's allocation timed apart); and
//! the exact `HashMap<u64, 16-byte entry>` with the same stores (hashbrown also rehashes when
//! it grows). Three runs each, the order reversed every run; for each side it prints the run
//! with the shortest *longest event* (wall clock: the pause the producer's actor, and so the
//! DC's whole event stream, sees during a growth): its fill rate (on-CPU), longest event and
//! events over 10 ms, and the ratios to the unreserved ckf and to the exact map.
//!
//! Restore mode: `cargo bench -p ckf-core --bench producer -- restore [BUCKETS] [LOAD%]`
//! (default 4194304 buckets at 85%): the warm-up stores' ownership image restored into fresh
//! states, presized from the tracked count (a producer checkpoint's summary) and grown through
//! every size, alternating; best wall time, rebuilds and their time per side.
//!
//! Workload: 4 members, each an LRU-like cache of `capacity` blocks. Every step one member
//! stores an event of 16 blocks (80% fresh hashes, 20% blocks another member holds, so some
//! stores are `n -> n+1` transitions) and evicts its 16 oldest blocks in one removed event. The
//! member capacity is chosen so the table sits at the target load. Events are generated before
//! timing; the timed loop only applies them. Two CKF runs per row on fresh states: ingest only,
//! and ingest plus a publication batch (`take_batch`: sampling, net-reversion drop, image
//! order) every 64 events (~1,000 block ops), as a producer actor publishing often would.
//!
//! Time is the thread's on-CPU time (`/proc/thread-self/schedstat`, falling back to wall clock
//! where that file is missing), so a machine shared with other busy processes slows every
//! column alike instead of whichever run happened to be descheduled. Cache interference from
//! neighbours still applies: compare ratios, not absolute figures, across machines.
//!
//! Baseline: `HashMap<u64, u32>` refcounts (same fast hasher) applying the same block ops:
//! the cost of exact refcounting alone, without ownership sets or a filter.
//!
//! Hasher comparison (second table): the block map's own access pattern (`HashMap<u64, 16-byte
//! entry>`, the size of the producer's `Owners`; insert-or-increment on store, decrement and
//! remove at zero on remove) over the same block ops, once per candidate map hasher: the
//! producer's (`FoldHashBuilder`, foldhash's fixed-seed fast hasher), `rustc_hash::FxBuildHasher`
//! and std's SipHash `RandomState`. Each is run three times, interleaved, and the best on-CPU
//! rate kept; ratios are against the producer's hasher (see `src/dc/hasher.rs` for why it is
//! foldhash). The 2^22-bucket row is left out of that table (nine more fills of 14 M blocks).
//!
//! Prefetch hint (`hint`): the "ckf" and "+pub" columns apply each event after
//! `DcCkfState::prefetch_next` of the next event's blocks, as the producer's actor does within
//! an ingest batch; `hint` is that rate over the same ingest without the hint. Both are run
//! twice in A-B-B-A order on fresh states and keep their best run (the state ignores the hint
//! below 2^20 buckets, so those rows show the noise of identical runs).
//!
//! Memory floor (`floor ops/s`, `ckf/floor`): the same block ops with no filter and no map,
//! only the cache lines a block op touches: two random 64-byte lines of a region the size of
//! the filter table (its two candidate buckets, one of them written) and two of a region the
//! size of the exact state (the block map's two candidate lines, one written), chosen from
//! the block hash's mix, prefetched [`FLOOR_PREFETCH_OPS`] ops ahead in one unbroken ring
//! (across events, which the real ingest does not do), on memory marked for huge pages like
//! the state's tables. No design that touches four random lines per op runs faster on this
//! machine; in cache it is ~20 ns per op here (mostly the hashing and loop), out of cache
//! it is the DRAM bound.

use std::collections::HashMap;
use std::hint::black_box;
use std::time::Instant;

use ckf_core::TableFormat;
use ckf_core::addressing::fmix64;
use ckf_core::dc::{DcCkfConfig, DcCkfState, FoldHashBuilder};

mod producer_workload;

use producer_workload::{
    BATCH_EVERY_EVENTS, EVENT_BLOCKS, Entry, Event, HASHERS, SHARED_PERCENT, STEADY_BLOCK_OPS,
    apply_baseline, apply_block_map, apply_ckf, block_ops, hasher_rates, rate, sized_workload,
};

/// How many block ops ahead the memory floor prefetches (the ingest's own ring is 8 blocks
/// within an event; a longer unbroken ring only favours the floor).
const FLOOR_PREFETCH_OPS: usize = 16;

/// `n` zeroed 64-byte lines whose 2 MiB-aligned interior is marked `MADV_HUGEPAGE` before the
/// zero fill, as the producer's tables are (`ckf_core`'s `memory::zeroed_vec`, which is
/// crate-private).
fn huge_lines(n: usize) -> Vec<[u64; 8]> {
    let mut v: Vec<[u64; 8]> = Vec::with_capacity(n);
    const HUGE: usize = 2 << 20;
    let start = v.as_ptr() as usize;
    let (lo, hi) = (start.next_multiple_of(HUGE), (start + n * 64) & !(HUGE - 1));
    if hi > lo {
        // SAFETY: [lo, hi) lies inside the allocation just made; the advice only changes how
        // the kernel backs its pages (best effort, the result is ignored).
        unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE) };
    }
    v.resize(n, [0; 8]);
    v
}

/// The memory floor's block ops per second (see the module docs): every block of `events`
/// reads two random lines of `filter_lines` and two of `map_lines` and writes one of each.
fn floor_rate(events: &[Event], filter_lines: usize, map_lines: usize, ops: f64) -> f64 {
    let mut filter = huge_lines(filter_lines.max(1));
    let mut map = huge_lines(map_lines.max(1));
    let hashes: Vec<u64> = events
        .iter()
        .flat_map(|e| e.blocks.iter().copied())
        .collect();
    // Four line indices from one mix: 32-bit halves scaled to each region (multiply-shift),
    // the second of each pair from a remix, as the filter's alternate and the map's second
    // line are independent of the first.
    let (nf, nm) = (filter.len(), map.len());
    let lines = move |h: u64| {
        let (a, b) = (fmix64(h ^ 0xF100_0F00), fmix64(h ^ 0x0BAD_CAFE));
        let scale = |x: u64, n: usize| (((x & 0xFFFF_FFFF) * n as u64) >> 32) as usize;
        [
            scale(a, nf),
            scale(b, nf),
            scale(a >> 32, nm),
            scale(b >> 32, nm),
        ]
    };
    let touch = |v: &[[u64; 8]], i: usize| {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: prefetch is a hint; the pointer is in bounds.
        unsafe {
            std::arch::x86_64::_mm_prefetch(
                v.as_ptr().add(i).cast(),
                std::arch::x86_64::_MM_HINT_T0,
            )
        };
        #[cfg(not(target_arch = "x86_64"))]
        black_box(&v[i]);
    };
    let mut sink = 0u64;
    let floor = rate(ops, || {
        for (k, &h) in hashes.iter().enumerate() {
            if let Some(&ahead) = hashes.get(k + FLOOR_PREFETCH_OPS) {
                let [f1, f2, m1, m2] = lines(ahead);
                touch(&filter, f1);
                touch(&filter, f2);
                touch(&map, m1);
                touch(&map, m2);
            }
            let [f1, f2, m1, m2] = lines(h);
            let (fa, fb) = (filter[f1][0], filter[f2][0]);
            filter[if fa <= fb { f1 } else { f2 }][0] += 1;
            let (ma, mb) = (map[m1][1], map[m2][1]);
            map[if ma <= mb { m1 } else { m2 }][1] = ma ^ mb ^ h;
            sink = sink.wrapping_add(fa ^ mb);
        }
    });
    black_box((sink, &filter, &map));
    floor
}

/// The steady-state ingest alone, as its own symbol so a profiler can collect only this
/// (callgrind's `--toggle-collect`).
#[inline(never)]
fn steady_for_profile(
    state: &mut DcCkfState,
    events: &[Event],
    publish: bool,
    batches: &mut u64,
) -> u64 {
    apply_ckf(state, events, publish, true, Some(batches))
}

/// Smallest table the profile and growth modes take: the workload sizes its members from the table, and
/// a handful of buckets leaves them no room to churn.
const MIN_BUCKETS: u64 = 64;

/// Prints `message` with the modes' usage and exits with status 2.
fn usage_error(message: &str) -> ! {
    eprintln!(
        "error: {message}\nusage: producer profile [BUCKETS] [LOAD%] [RUNS] [pub] \
         (defaults 65536 85 1, no publication)\n       producer growth [BUCKETS] [LOAD%] \
         (defaults 4194304 85)\nBUCKETS even and >= {MIN_BUCKETS}, LOAD% in 1..=99, \
         RUNS >= 1"
    );
    std::process::exit(2)
}

/// The modes' BUCKETS argument (`default` when absent).
fn bucket_count_arg(arg: Option<&String>, default: u64) -> u64 {
    arg.map_or(default, |a| {
        a.parse()
            .ok()
            .filter(|&n: &u64| n >= MIN_BUCKETS && n % 2 == 0)
            .unwrap_or_else(|| {
                usage_error(&format!(
                    "BUCKETS must be an even count >= {MIN_BUCKETS}, e.g. 1048576, not {a:?}"
                ))
            })
    })
}

/// The modes' LOAD% argument as a fraction (0.85 when absent).
fn load_arg(arg: Option<&String>) -> f64 {
    arg.map_or(0.85, |a| {
        a.trim_end_matches('%')
            .parse::<f64>()
            .ok()
            .filter(|p| (1.0..=99.0).contains(p))
            .unwrap_or_else(|| {
                usage_error(&format!(
                    "LOAD% must be a percentage in 1..=99, e.g. 85, not {a:?}"
                ))
            })
            / 100.0
    })
}

/// `profile [BUCKETS] [LOAD%] [RUNS] [pub]` (see the module docs).
fn profile(args: &[String]) {
    if args.len() > 4 {
        usage_error(&format!("unexpected argument {:?}", args[4]));
    }
    let bucket_count = bucket_count_arg(args.first(), 1 << 16);
    let load = load_arg(args.get(1));
    let runs: usize = args.get(2).map_or(1, |a| {
        a.parse()
            .ok()
            .filter(|&n: &usize| n >= 1)
            .unwrap_or_else(|| usage_error(&format!("RUNS must be at least 1, not {a:?}")))
    });
    let publish = match args.get(3).map(String::as_str) {
        None => false,
        Some("pub") => true,
        Some(other) => usage_error(&format!(
            "the 4th argument is `pub` (a publication batch every {BATCH_EVERY_EVENTS} events), \
             not {other:?}"
        )),
    };
    let format = TableFormat::new(bucket_count, 0xBE7C)
        .unwrap_or_else(|e| usage_error(&format!("BUCKETS {bucket_count}: {e}")));
    let w = sized_workload(format, load);
    let ops = block_ops(&w.steady);
    let mut rates = Vec::with_capacity(runs);
    let mut summary = String::new();
    for _ in 0..runs {
        let mut state = DcCkfState::new(DcCkfConfig::new(format)).unwrap();
        // Untimed and outside `steady_for_profile`, so the profile does not count it; without
        // the hint, which changes no state.
        apply_ckf(&mut state, &w.warmup, false, false, None);
        state.take_batch();
        let kicks_before = state.stats().kicks_total;
        let mut omitted = 0;
        let mut batches = 0u64;
        rates.push(rate(ops as f64, || {
            omitted = steady_for_profile(&mut state, &w.steady, publish, &mut batches)
        }));
        let stats = state.stats();
        // The end state's digest: two builds that place every fingerprint and block alike
        // print the same one.
        let digest = state
            .buckets()
            .iter()
            .fold(0u64, |d, &word| fmix64(d ^ word));
        summary = format!(
            "{omitted} omitted, {:.3} load, {:.3} kicks/op, table digest {digest:016x}{}",
            stats.load_factor,
            (stats.kicks_total - kicks_before) as f64 / ops as f64,
            if publish {
                format!(", batch digest {batches:016x}")
            } else {
                String::new()
            },
        );
    }
    rates.sort_by(f64::total_cmp);
    println!(
        "profile: {bucket_count} buckets at {:.0}%, {ops} block ops{}, {summary}; \
         M block ops/s over {runs} run(s): median {:.2}, best {:.2}",
        load * 100.0,
        if publish {
            format!(" with a publication batch every {BATCH_EVERY_EVENTS} events")
        } else {
            String::new()
        },
        rates[rates.len() / 2] / 1e6,
        rates[rates.len() - 1] / 1e6,
    );
    println!(
        "instructions per block op: valgrind --tool=callgrind --toggle-collect='*steady_for_profile*' \
         <this binary> profile {bucket_count} {:.0} 1{}, then divide the total by {ops}",
        load * 100.0,
        if publish { " pub" } else { "" },
    );
}

/// Runs of the growth mode per side (interleaved; each side keeps its best).
const GROWTH_RUNS: usize = 3;

/// A fill shorter than this (milliseconds, wall clock) gets a warning: the on-CPU clock
/// (`/proc/thread-self/schedstat`) advances in scheduler ticks.
const GROWTH_MIN_FILL_MS: f64 = 100.0;

/// Events slower than this count as pauses in the growth mode (milliseconds).
const GROWTH_PAUSE_MS: f64 = 10.0;

/// One fill from empty.
struct Fill {
    /// Block ops per second over the whole fill, by `producer_workload::cpu_ns` (on-CPU).
    rate: f64,
    /// The longest event, in milliseconds of wall clock: what the producer's actor, and so the
    /// DC's whole event stream, waits (a descheduled event would count too; hence the best of
    /// [`GROWTH_RUNS`]).
    longest_ms: f64,
    /// Events longer than [`GROWTH_PAUSE_MS`] (wall clock).
    pauses: usize,
    /// The whole fill, in milliseconds of wall clock.
    total_ms: f64,
}

/// Applies `events` in order, `apply(i)` applying event `i`, timing each call.
fn fill(events: &[Event], mut apply: impl FnMut(usize)) -> Fill {
    let mut longest = 0u64;
    let mut pauses = 0;
    let start = Instant::now();
    let rate = rate(block_ops(events) as f64, || {
        for i in 0..events.len() {
            let t = Instant::now();
            apply(i);
            let ns = t.elapsed().as_nanos() as u64;
            longest = longest.max(ns);
            pauses += usize::from(ns as f64 > GROWTH_PAUSE_MS * 1e6);
        }
    });
    Fill {
        rate,
        longest_ms: longest as f64 / 1e6,
        pauses,
        total_ms: start.elapsed().as_secs_f64() * 1e3,
    }
}

/// Fills a fresh `DcCkfState` whose block map reserves `reserve_blocks` (0: none) from empty
/// with `events` (stores), as the producer's actor would: the next event's hint before each,
/// a publication batch after every [`BATCH_EVERY_EVENTS`]th (timed with that event). Returns
/// the fill, the state's final (load factor, tracked blocks) and the wall time of building
/// the state (the reservation's allocation, outside the fill), in milliseconds.
fn fill_ckf(
    format: TableFormat,
    reserve_blocks: u64,
    events: &[Event],
) -> (Fill, (f64, usize), f64) {
    let built = Instant::now();
    let mut state = DcCkfState::new(DcCkfConfig {
        reserve_blocks,
        ..DcCkfConfig::new(format)
    })
    .unwrap();
    let build_ms = built.elapsed().as_secs_f64() * 1e3;
    let run = fill(events, |i| {
        if let Some(next) = events.get(i + 1) {
            state.prefetch_next(&next.blocks);
        }
        black_box(state.store(events[i].member, &events[i].blocks));
        if i % BATCH_EVERY_EVENTS == BATCH_EVERY_EVENTS - 1 {
            black_box(state.take_batch());
        }
    });
    let stats = state.stats();
    (run, (stats.load_factor, stats.unique_blocks), build_ms)
}

/// Fills the exact `HashMap<u64, 16-byte entry>` from empty with the same stores.
fn fill_exact(events: &[Event]) -> Fill {
    let mut index: HashMap<u64, Entry, FoldHashBuilder> = HashMap::default();
    let run = fill(events, |i| apply_block_map(&mut index, &events[i..=i]));
    black_box(&index);
    run
}

/// The `[BUCKETS] [LOAD%]` arguments of the growth and restore modes (default 4194304 buckets
/// at 85%): the table format, the load and the row's warm-up stores.
fn fill_args(args: &[String]) -> (TableFormat, f64, Vec<Event>) {
    if args.len() > 2 {
        usage_error(&format!("unexpected argument {:?}", args[2]));
    }
    let bucket_count = bucket_count_arg(args.first(), 1 << 22);
    let load = load_arg(args.get(1));
    let format = TableFormat::new(bucket_count, 0xBE7C)
        .unwrap_or_else(|e| usage_error(&format!("BUCKETS {bucket_count}: {e}")));
    (format, load, sized_workload(format, load).warmup)
}

/// `growth [BUCKETS] [LOAD%]`: fills a fresh `DcCkfState` from empty with the warm-up stores
/// of the row for LOAD% of BUCKETS (they end a little below LOAD%; the steady churn adds the
/// rest), so the block map grows from its smallest size through every step, each growth a
/// rehash inside one store ([`fill_ckf`]); and the exact `HashMap<u64, 16-byte entry>`
/// (hashbrown, which also rehashes on growth) with the same stores; and a state reserved for
/// the target load's blocks. [`GROWTH_RUNS`] runs each, the order reversed every run; each
/// side reports its run with the shortest longest event (rate, longest event and pauses all
/// from that run), and the ratios.
fn growth(args: &[String]) {
    let (format, load, events) = fill_args(args);
    let bucket_count = format.bucket_count;
    if events.is_empty() {
        usage_error(&format!(
            "{bucket_count} buckets at {:.0}% leave no store to fill with; take more buckets or \
             a higher load",
            load * 100.0
        ));
    }
    let keep = |best: &mut Option<Fill>, run: Fill| {
        if best.as_ref().is_none_or(|b| run.longest_ms < b.longest_ms) {
            *best = Some(run);
        }
    };
    // Reserved for what the target load holds: the fill ends a little below it.
    let reserve = (format.slot_count() as f64 * load) as u64;
    let (mut ckf, mut reserved, mut exact) = (None, None, None);
    let mut end = (0.0, 0usize);
    let mut reserve_ms = f64::INFINITY;
    for run in 0..GROWTH_RUNS {
        let mut sides = [0, 1, 2];
        if run % 2 == 1 {
            sides.reverse();
        }
        for side in sides {
            match side {
                0 => {
                    let (f, state_end, _) = fill_ckf(format, 0, &events);
                    end = state_end;
                    keep(&mut ckf, f);
                }
                1 => {
                    let (f, _, build_ms) = fill_ckf(format, reserve, &events);
                    reserve_ms = reserve_ms.min(build_ms);
                    keep(&mut reserved, f);
                }
                _ => keep(&mut exact, fill_exact(&events)),
            }
        }
    }
    let (ckf, reserved, exact) = (ckf.unwrap(), reserved.unwrap(), exact.unwrap());
    println!(
        "growth: {bucket_count} buckets (target {:.0}%) filled from empty to {:.3} load ({} \
         tracked blocks, {} stores of {EVENT_BLOCKS} blocks, a publication batch every \
         {BATCH_EVERY_EVENTS}); per side, of {GROWTH_RUNS} runs in alternating order, the one with \
         the shortest longest event",
        load * 100.0,
        end.0,
        end.1,
        events.len()
    );
    for (name, f) in [
        ("ckf", &ckf),
        ("ckf reserved", &reserved),
        ("exact HashMap", &exact),
    ] {
        println!(
            "  {name:<14} {:>7.2} M block ops/s, longest event {:>8.3} ms, {} events over \
             {GROWTH_PAUSE_MS} ms",
            f.rate / 1e6,
            f.longest_ms,
            f.pauses
        );
    }
    println!(
        "  ckf / exact: rate {:.2}, longest event {:.2}",
        ckf.rate / exact.rate,
        ckf.longest_ms / exact.longest_ms
    );
    println!(
        "  ckf reserved / ckf: rate {:.2}, longest event {:.4}; the reservation ({reserve} \
         blocks) took {reserve_ms:.1} ms when the state was built, before any event",
        reserved.rate / ckf.rate,
        reserved.longest_ms / ckf.longest_ms
    );
    if ckf.total_ms.min(exact.total_ms) < GROWTH_MIN_FILL_MS {
        println!(
            "  (a fill took under {GROWTH_MIN_FILL_MS} ms: the on-CPU clock ticks every few ms, \
             so these rates mean nothing; take more buckets)"
        );
    }
}

/// `restore [BUCKETS] [LOAD%]`: the producer's restart. Fills a state with the row's warm-up
/// stores, takes its ownership image (what a checkpoint holds, blocks sorted), then restores
/// that image into fresh states ([`GROWTH_RUNS`] x 2 runs, the order alternating): presized
/// (`DcCkfState::presize_blocks` with the tracked count, as a checkpoint's summary gives it)
/// and not (the block map grows through every size). Prints each side's best wall time, its
/// block-map rebuilds and their wall time, the exact state's bytes per tracked block after the
/// restore, and the ratio of the times.
fn restore(args: &[String]) {
    let (format, load, events) = fill_args(args);
    let bucket_count = format.bucket_count;
    let mut live = DcCkfState::new(DcCkfConfig::new(format)).unwrap();
    for e in &events {
        live.store(e.member, &e.blocks);
    }
    let unique = live.stats().unique_blocks as u64;
    let images = live.ownership_image();
    drop(live);
    // (wall ms, rebuilds, rebuild ms, exact bytes per block), best run per side.
    let mut best = [(f64::INFINITY, 0u64, 0.0f64, 0.0f64); 2];
    for run in 0..GROWTH_RUNS * 2 {
        for side in if run % 2 == 0 { [0, 1] } else { [1, 0] } {
            let mut state = DcCkfState::new(DcCkfConfig::new(format)).unwrap();
            let t = Instant::now();
            if side == 0 {
                state.presize_blocks(unique).unwrap();
            }
            for image in &images {
                black_box(state.restore_member(image));
            }
            let ms = t.elapsed().as_secs_f64() * 1e3;
            let stats = state.stats();
            assert_eq!(stats.unique_blocks as u64, unique);
            let rebuilds = state.block_map_rebuilds();
            if ms < best[side].0 {
                best[side] = (
                    ms,
                    rebuilds.count,
                    rebuilds.total.as_secs_f64() * 1e3,
                    stats.exact_bytes as f64 / unique as f64,
                );
            }
        }
    }
    println!(
        "restore: {unique} tracked blocks ({bucket_count} buckets, target {:.0}%) from their \
         ownership image into a fresh state; best of {} runs per side, alternating (wall clock)",
        load * 100.0,
        GROWTH_RUNS * 2
    );
    for (name, (ms, count, rebuild_ms, bytes)) in [("presized", best[0]), ("grown", best[1])] {
        println!(
            "  {name:<9} {ms:>9.1} ms, {count:>2} block-map rebuilds taking {rebuild_ms:>8.1} ms; \
             exact state {bytes:.1} bytes per tracked block after"
        );
    }
    println!("  presized / grown: {:.2}", best[0].0 / best[1].0);
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    match args.first().map(String::as_str) {
        Some("profile") => return profile(&args[1..]),
        Some("growth") => return growth(&args[1..]),
        Some("restore") => return restore(&args[1..]),
        Some(other) => usage_error(&format!(
            "unknown mode {other:?} (no argument runs the full table)"
        )),
        None => {}
    }
    println!(
        "producer ingest: 4 members, LRU-like churn, {EVENT_BLOCKS}-block events, \
         {SHARED_PERCENT}% shared stores, {STEADY_BLOCK_OPS} timed block ops per run"
    );
    println!(
        "{:>9} {:>6} {:>6} {:>8} {:>11} {:>11} {:>11} {:>7} {:>7} {:>8} {:>8} {:>8} {:>11} {:>9} {:>7}",
        "buckets",
        "target",
        "load",
        "omitted",
        "ckf ops/s",
        "+pub ops/s",
        "exact ops/s",
        "ratio",
        "+pub",
        "kicks/op",
        "B/block",
        "exact B",
        "floor ops/s",
        "ckf/floor",
        "hint"
    );
    let mut hasher_rows = Vec::new();
    let rows: [(u64, &[f64]); 3] = [
        (1 << 16, &[0.50, 0.85, 0.95]),
        (1 << 20, &[0.85]),
        (1 << 22, &[0.85]),
    ];
    // `CKF_BENCH_BUCKETS=1048576,4194304` runs only the rows of those table sizes.
    let only: Option<Vec<u64>> = std::env::var("CKF_BENCH_BUCKETS")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect());
    let hashers = std::env::var_os("CKF_BENCH_NO_HASHERS").is_none();
    for (bucket_count, loads) in rows {
        if only.as_ref().is_some_and(|o| !o.contains(&bucket_count)) {
            continue;
        }
        let format = TableFormat::new(bucket_count, 0xBE7C).unwrap();
        for &load in loads {
            let w = sized_workload(format, load);
            let ops = block_ops(&w.steady) as f64;

            // [ingest, ingest + publication, ingest without the prefetch hint]. Ingest with and
            // without the hint run twice each in A-B-B-A order (a fresh state each) and keep
            // their best, so neither gains from running first or last.
            let mut rates = [0.0f64; 3];
            let mut last = None;
            let order = [
                (0, false, true),
                (2, false, false),
                (2, false, false),
                (0, false, true),
                (1, true, true),
            ];
            for (i, publish, hint) in order {
                let mut state = DcCkfState::new(DcCkfConfig::new(format)).unwrap();
                apply_ckf(&mut state, &w.warmup, false, hint, None);
                state.take_batch();
                let kicks_before = state.stats().kicks_total;
                let mut omitted = 0;
                let r = rate(ops, || {
                    omitted = apply_ckf(&mut state, &w.steady, publish, hint, None)
                });
                rates[i] = rates[i].max(r);
                // The statistics of the run that publishes, whose dirty set is drained every
                // 64 events (an unpublished run's pending images would count in B/block).
                if publish {
                    last = Some((state.stats(), omitted, kicks_before));
                }
            }
            let mut baseline: HashMap<u64, u32, FoldHashBuilder> = HashMap::default();
            apply_baseline(&mut baseline, &w.warmup);
            let base = rate(ops, || apply_baseline(&mut baseline, &w.steady));
            black_box(&baseline);

            if hashers && bucket_count < 1 << 22 {
                hasher_rows.push((bucket_count, load, hasher_rates(&w, ops)));
            }

            let (stats, omitted, kicks_before) = last.expect("two runs");
            let floor = floor_rate(
                &w.steady,
                bucket_count as usize / 8,
                stats.exact_bytes as usize / 64,
                ops,
            );
            println!(
                "{:>9} {:>5.0}% {:>6.3} {:>8} {:>9.2} M {:>9.2} M {:>9.2} M {:>7.2} {:>7.2} {:>8.3} {:>8.1} {:>8.1} {:>9.2} M {:>9.2} {:>7.2}",
                bucket_count,
                load * 100.0,
                stats.load_factor,
                omitted,
                rates[0] / 1e6,
                rates[1] / 1e6,
                base / 1e6,
                rates[0] / base,
                rates[1] / base,
                (stats.kicks_total - kicks_before) as f64 / ops,
                stats.bytes_per_tracked_block(),
                stats.exact_bytes_per_tracked_block(),
                floor / 1e6,
                rates[0] / floor,
                rates[0] / rates[2],
            );
        }
    }
    println!(
        "ratio = ckf ingest ops/s / exact refcount-index ops/s; +pub = the same with publication; \
         same events, same run, on-CPU time. B/block = producer bytes_used / unique blocks; \
         exact B = exact_bytes (block map + members) / unique blocks. floor = four random lines \
         per block op and nothing else (module docs), same ops, same run; ckf/floor = ckf / floor; \
         hint = ckf / the same ingest without DcCkfState::prefetch_next (taken from 2^20 buckets)."
    );
    println!();
    println!(
        "block map hasher: HashMap<u64, 16-byte entry> applying the same block ops, best of 3"
    );
    print!("{:>9} {:>6}", "buckets", "target");
    for name in HASHERS {
        print!(" {name:>15}");
    }
    for name in &HASHERS[1..] {
        print!(
            " {:>15}",
            format!("{}/ours", name.split(' ').next().unwrap_or(name))
        );
    }
    println!();
    for (bucket_count, load, rates) in hasher_rows {
        print!("{bucket_count:>9} {:>5.0}%", load * 100.0);
        for r in rates {
            print!(" {:>13.2} M", r / 1e6);
        }
        for r in &rates[1..] {
            print!(" {:>15.2}", r / rates[0]);
        }
        println!();
    }
    println!("ratios > 1: that hasher is faster than ours on the block map's own access pattern.");
}
