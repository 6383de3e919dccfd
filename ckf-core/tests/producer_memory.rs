//! The producer's exact state stays at or under 32 bytes per tracked block (the memory budget of
//! the exact state), and
//! `DcCkfStats`' capacity-based accounting is what the allocator really handed out.
//!
//! A counting global allocator tracks the live heap bytes of this test binary, so the test
//! compares `bytes_used` against real allocations rather than against a formula. The counter
//! is process-wide, so nothing else may allocate while it runs: the test is a plain `main`
//! (`harness = false` in Cargo.toml), one thread, no test harness beside it (libtest's own
//! thread allocated now and then inside the measured window).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use ckf_core::TableFormat;
use ckf_core::addressing::fmix64;
use ckf_core::dc::{DcCkfConfig, DcCkfState, MemberId};

/// Live heap bytes (requested sizes, without allocator overhead).
static LIVE: AtomicIsize = AtomicIsize::new(0);

struct Counting;

// SAFETY: every call is forwarded to `System` unchanged; the counter has no effect on memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: forwarded with the caller's pointer, layout and size.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn live() -> i64 {
    LIVE.load(Ordering::Relaxed) as i64
}

/// Bytes the state holds on the heap by the allocator's count: everything allocated between
/// `before` (taken before `DcCkfState::new`) and now, while only the state allocated.
fn held_since(before: i64) -> i64 {
    live() - before
}

fn main() {
    exact_state_is_at_most_32_bytes_per_block_and_accounting_matches_allocations();
    println!("producer_memory: ok");
}

fn exact_state_is_at_most_32_bytes_per_block_and_accounting_matches_allocations() {
    // Large enough that the table never fills: this is about the exact maps.
    let format = TableFormat::new(1 << 18, 11).unwrap();
    let config = DcCkfConfig::new(format);

    // One owner per block, blocks stored one at a time: every growth step of the block map is
    // seen right after it happens (where bytes per block are highest).
    let before = live();
    let mut s = DcCkfState::new(config).unwrap();
    let base = s.stats();
    let heap_of_struct = std::mem::size_of::<DcCkfState>() as i64;
    assert_eq!(
        held_since(before),
        base.bytes_used as i64 - heap_of_struct,
        "empty state: bytes_used is the struct plus its allocations"
    );
    let m = MemberId::new(1, 0);
    let mut last_exact = base.exact_bytes;
    let mut growth_steps = 0;
    let mut worst: f64 = 0.0;
    for i in 0..600_000u64 {
        s.store(m, &[fmix64(i)]);
        let st = s.stats();
        let grew = st.exact_bytes > last_exact;
        if grew {
            growth_steps += 1;
            last_exact = st.exact_bytes;
        }
        // A handful of blocks in the smallest table cost more per block; the bound is about a
        // state that tracks blocks in earnest.
        if i >= 4096 {
            let per = st.exact_bytes_per_tracked_block();
            worst = worst.max(per);
            assert!(
                per <= 32.0,
                "{} blocks: {per:.1} exact bytes per block ({} bytes)",
                st.unique_blocks,
                st.exact_bytes
            );
        }
        // Right after each growth step and at several sizes, the accounting equals what the
        // allocator handed out.
        if grew || i % 65_536 == 0 {
            assert_eq!(
                held_since(before),
                st.bytes_used as i64 - heap_of_struct,
                "{} blocks: bytes_used vs live heap",
                st.unique_blocks
            );
        }
    }
    assert!(
        growth_steps >= 20,
        "the block map grew {growth_steps} times"
    );
    assert!(
        worst > 20.0,
        "worst {worst:.1}: the bound was checked at a growth step"
    );

    // Several owners per block, some past the three inline tags (the spill map), stored as
    // 16-block events like the engines send.
    for round in 0..5u64 {
        let member = MemberId::new(100 + round, 0);
        // The events are built on the stack so the test allocates nothing the state does not.
        for first in (0..200_000u64).step_by(16) {
            let chunk: [u64; 16] = std::array::from_fn(|j| fmix64(first + j as u64));
            s.store(member, &chunk);
        }
        let st = s.stats();
        assert_eq!(
            held_since(before),
            st.bytes_used as i64 - heap_of_struct,
            "round {round}: bytes_used vs live heap"
        );
        // Up to three owners per block fit the 16-byte entry. From the third round on, the
        // first 200,000 blocks have four to six owners and the others spill (a spill-map entry
        // and 4 bytes per further owner): accounted for, but not bounded by 32 bytes per block.
        if round < 2 {
            let per = st.exact_bytes_per_tracked_block();
            assert!(per <= 32.0, "round {round}: {per:.1} exact bytes per block");
        }
    }

    // Everything cleared: the exact maps are given back.
    for w in [1u64, 100, 101, 102, 103, 104] {
        s.remove_worker(w);
    }
    let st = s.stats();
    assert_eq!(st.unique_blocks, 0);
    assert_eq!(
        held_since(before),
        st.bytes_used as i64 - heap_of_struct,
        "cleared: bytes_used vs live heap"
    );
    assert!(
        st.exact_bytes < 4096,
        "cleared: {} exact bytes",
        st.exact_bytes
    );
    drop(s);
    assert_eq!(held_since(before), 0, "the state freed everything");
}
