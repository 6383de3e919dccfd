//! What a producer's durability checkpoint costs its actor for the engine path: the engine
//! feed's lineage (engine hash -> canonical hash per member) copied in one pass
//! ([`EngineFeed::image`], sorted) next to the copy a checkpoint makes now, in steps of
//! 65,536 blocks (whole members) between events ([`EngineFeed::begin_image`] /
//! [`EngineFeed::image_step`]): its longest step is what ingest waits. Both next to building
//! the same lineage (the stores that fed it) in the same run.
//!
//! Run: `cargo bench -p ckf-engine --bench lineage_image [-- BLOCKS [MEMBERS]]` (default 10^7
//! blocks over 64 members, stored 64 per event; wall time, one run).

use std::time::{Duration, Instant};

use ckf_engine::event::{EngineBatch, EngineEvent, StoredBlocks};
use ckf_engine::feed::EngineFeed;
use ckf_engine::filters::EngineFilters;

/// Blocks per stored event (one chain).
const CHAIN: u64 = 64;
/// Tokens per block.
const BLOCK_SIZE: u32 = 16;

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .map(|a| a.parse().expect("BLOCKS [MEMBERS]: counts"))
        .collect();
    let blocks = args.first().copied().unwrap_or(10_000_000);
    let members = args.get(1).copied().unwrap_or(64).max(1);
    let mut feed = EngineFeed::new(EngineFilters::default());
    let started = Instant::now();
    for (sequence, first) in (0..blocks).step_by(CHAIN as usize).enumerate() {
        let n = CHAIN.min(blocks - first);
        let batch = EngineBatch {
            events: vec![EngineEvent::Stored(StoredBlocks {
                block_hashes: (first..first + n).map(|h| h + 1).collect(),
                token_ids: (0..n as u32 * BLOCK_SIZE)
                    .map(|t| t.wrapping_add(first as u32 * 7))
                    .collect(),
                block_size: BLOCK_SIZE,
                ..StoredBlocks::default()
            })],
            ..EngineBatch::default()
        };
        let member = (sequence as u64 % members, 0);
        let fed = feed.translate(member, sequence as i64, &batch);
        assert_eq!(fed.events.len(), 1, "every chain is applied");
    }
    let build = started.elapsed();
    let started = Instant::now();
    let image = feed.image();
    let one_pass = started.elapsed();
    let entries: usize = image.lineage.iter().map(|m| m.blocks.len()).sum();
    assert_eq!(entries as u64, blocks);
    drop(image);

    let started = Instant::now();
    let mut longest = Duration::ZERO;
    let mut steps = 0;
    let step = Instant::now();
    let _tables = feed.begin_image();
    longest = longest.max(step.elapsed());
    loop {
        let step = Instant::now();
        let more = feed.image_step(1 << 16);
        longest = longest.max(step.elapsed());
        steps += 1;
        if !more {
            break;
        }
    }
    let lineage = feed.take_lineage_image().expect("every member copied");
    let stepped = started.elapsed();
    assert_eq!(
        lineage.iter().map(|m| m.blocks.len()).sum::<usize>(),
        entries
    );
    println!(
        "engine lineage of {blocks} blocks, {members} members: built in {:.0} ms, {:.1} MiB; \
         image in one pass {:.1} ms ({:.3}x the build); in {steps} steps {:.1} ms, longest {:.2} ms",
        build.as_secs_f64() * 1e3,
        feed.bytes_used() as f64 / (1 << 20) as f64,
        one_pass.as_secs_f64() * 1e3,
        one_pass.as_secs_f64() / build.as_secs_f64(),
        stepped.as_secs_f64() * 1e3,
        longest.as_secs_f64() * 1e3,
    );
}
