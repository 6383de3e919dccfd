//! Worker removals: how long a `WorkerRemoved` (or a member's `Cleared`) holds the producer's
//! actor, by the number of dp ranks and blocks it releases, at a state tracking `BLOCKS`
//! blocks (default 10^7).
//!
//! Run: `cargo bench -p ckf-core --bench removal [-- BLOCKS]`.
//!
//! Each row fills a fresh `DcCkfState` (2^22 buckets, the producer's defaults, so
//! `slice_lines` is `SLICE_LINES`) with `BLOCKS` blocks: the removed
//! worker's ranks x blocks per rank, the rest owned by another worker. Then it times
//! `remove_worker` (the command: it retires the ranks) and every
//! following `release_step` (each one slice of actor work), taking a publication batch after
//! each as the actor does (timed apart). It prints the total sweep, the slices, the longest
//! slice and the longest publication, and the ratio of each many-rank row's total to the
//! single-rank row releasing the same block count in the same run (the removal's cost must not
//! multiply blocks by ranks). Times are the thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), so
//! other busy processes on the machine do not inflate the longest slice; one run per row,
//! compare ratios across machines.

use std::time::Duration;

use ckf_core::TableFormat;
use ckf_core::addressing::fmix64;
use ckf_core::dc::{DcCkfConfig, DcCkfState, MemberId, SLICE_LINES};

/// Blocks stored per event while filling.
const EVENT_BLOCKS: u64 = 1_024;

struct Row {
    ranks: u64,
    per_rank: u64,
}

struct Timing {
    command: Duration,
    total: Duration,
    slices: u64,
    longest_slice: Duration,
    longest_publish: Duration,
}

fn fill(blocks: u64, row: &Row) -> DcCkfState {
    let mut state = DcCkfState::new(DcCkfConfig {
        slice_lines: SLICE_LINES,
        ..DcCkfConfig::new(TableFormat::new(1 << 22, 17).unwrap())
    })
    .unwrap();
    state.presize_blocks(blocks).unwrap();
    let mut next = 0u64;
    let mut store = |state: &mut DcCkfState, member: MemberId, n: u64| {
        let mut left = n;
        while left > 0 {
            let k = left.min(EVENT_BLOCKS);
            let hashes: Vec<u64> = (next..next + k).map(fmix64).collect();
            next += k;
            left -= k;
            state.store(member, &hashes);
        }
    };
    for rank in 0..row.ranks {
        store(&mut state, MemberId::new(1, rank as u32), row.per_rank);
    }
    let removed = row.ranks * row.per_rank;
    store(&mut state, MemberId::new(2, 0), blocks - removed);
    while state.take_batch().is_some() {}
    assert_eq!(state.stats().unique_blocks as u64, blocks);
    state
}

/// The calling thread's CPU time.
fn cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant Linux defines.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// A stopwatch on [`cpu`] time.
struct Instant(Duration);

impl Instant {
    fn now() -> Self {
        Self(cpu())
    }
    fn elapsed(&self) -> Duration {
        cpu() - self.0
    }
}

fn remove(mut state: DcCkfState) -> Timing {
    let started = Instant::now();
    state.remove_worker(1);
    let command = started.elapsed();
    let mut longest_slice = command;
    let mut longest_publish = Duration::ZERO;
    let mut slices = 1;
    loop {
        let published = Instant::now();
        state.take_batch();
        longest_publish = longest_publish.max(published.elapsed());
        if !state.releasing() {
            break;
        }
        let slice = Instant::now();
        state.release_step();
        longest_slice = longest_slice.max(slice.elapsed());
        slices += 1;
    }
    let total = started.elapsed();
    assert_eq!(state.releasing_edges(), 0);
    Timing {
        command,
        total,
        slices,
        longest_slice,
        longest_publish,
    }
}

/// Other whole-state units of actor work at this size, printed before the table: a
/// checkpoint's capture in one pass (`ownership_image_unsorted`, what the producer's actor did
/// before captures were sliced) next to the same capture in slices (`begin_capture` /
/// `capture_step` / `capture_images`, what it does now: the longest step is what ingest waits),
/// a member's blocks (`GetMemberBlocks`) read in one pass and in slices, and a copy of the
/// table (what a barrier snapshot starts from).
fn others(state: &mut DcCkfState) {
    let t = Instant::now();
    let image = state.ownership_image_unsorted();
    let one_pass = t.elapsed();
    let edges: usize = image.iter().map(|m| m.blocks.len()).sum();
    drop(image);

    let t = Instant::now();
    let mut capture = state.begin_capture();
    let mut steps = 0u64;
    let mut longest = Duration::ZERO;
    loop {
        let step = Instant::now();
        let more = state.capture_step(&mut capture);
        longest = longest.max(step.elapsed());
        steps += 1;
        if !more {
            break;
        }
    }
    let step = Instant::now();
    let images = state.capture_images(capture);
    longest = longest.max(step.elapsed());
    let sliced = t.elapsed();
    let read: usize = images.iter().map(|m| m.blocks.len()).sum();
    assert_eq!(read, edges, "nothing moved between the steps");
    drop(images);

    // `GetMemberBlocks`: one pass (`member_blocks`) next to the scan in slices.
    let member = state.members().next().expect("a member");
    let t = Instant::now();
    let owned = state.member_blocks(member).len();
    let one_pass_scan = t.elapsed();
    let mut scan = state.begin_member_scan(member);
    let mut longest_scan = Duration::ZERO;
    loop {
        let step = Instant::now();
        let answer = state.member_scan_step(&mut scan);
        longest_scan = longest_scan.max(step.elapsed());
        if let Some(blocks) = answer {
            assert_eq!(blocks.len(), owned);
            break;
        }
    }
    println!(
        "member blocks ({owned} of {member}): one pass {:.1} ms; in slices, longest {:.2} ms",
        ms(one_pass_scan),
        ms(longest_scan)
    );

    let t = Instant::now();
    let table = state.buckets().to_vec();
    let copy = t.elapsed();
    println!(
        "checkpoint capture of {edges} edges: one pass {:.1} ms; in slices {:.1} ms total \
         ({:.2}x), {steps} steps, longest {:.2} ms; table copy: {:.1} ms for {} buckets",
        ms(one_pass),
        ms(sliced),
        sliced.as_secs_f64() / one_pass.as_secs_f64(),
        ms(longest),
        ms(copy),
        table.len()
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let blocks: u64 = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with("--"))
        .map(|a| a.parse().expect("BLOCKS: a block count"))
        .unwrap_or(10_000_000);
    let big = blocks.min(10_000_000);
    let rows = [
        Row {
            ranks: 1,
            per_rank: 100_000,
        },
        Row {
            ranks: 100_000,
            per_rank: 1,
        },
        Row {
            ranks: 1,
            per_rank: big,
        },
        Row {
            ranks: 100_000,
            per_rank: big / 100_000,
        },
    ];
    println!("worker removal at {blocks} tracked blocks (2^22 buckets, default slices)");
    println!(
        "{:>8} {:>10} {:>12} {:>11} {:>10} {:>7} {:>12} {:>12} {:>9}",
        "ranks",
        "blocks",
        "released",
        "command ms",
        "total ms",
        "slices",
        "slice max ms",
        "publish max",
        "x 1 rank"
    );
    let mut single = Duration::ZERO;
    for (i, row) in rows.iter().enumerate() {
        let mut state = fill(blocks, row);
        if i == 0 {
            others(&mut state);
        }
        let t = remove(state);
        let released = row.ranks * row.per_rank;
        let ratio = if row.ranks == 1 {
            single = t.total;
            1.0
        } else {
            t.total.as_secs_f64() / single.as_secs_f64()
        };
        println!(
            "{:>8} {:>10} {:>12} {:>11.2} {:>10.1} {:>7} {:>12.2} {:>12.2} {:>9.2}",
            row.ranks,
            blocks,
            released,
            ms(t.command),
            ms(t.total),
            t.slices,
            ms(t.longest_slice),
            ms(t.longest_publish),
            ratio
        );
    }
}
