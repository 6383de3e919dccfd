//! Clears in slices, through the producer state: exact at once, swept slice by slice.

use crate::addressing::TableFormat;
use crate::dc::config::DcCkfConfig;
use crate::dc::events::MemberId;
use crate::dc::state::DcCkfState;

fn state(slice_lines: u32) -> DcCkfState {
    DcCkfState::new(DcCkfConfig {
        slice_lines,
        ..DcCkfConfig::new(TableFormat::new(1 << 14, 5).unwrap())
    })
    .unwrap()
}

fn hashes(from: u64, n: u64) -> Vec<u64> {
    (from..from + n)
        .map(|h| h.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect()
}

/// A worker's removal over many dp ranks retires them at once (the members own nothing,
/// exact queries say so), then the sweep drops their blocks slice by slice: the table keeps
/// their fingerprints until then, and ends equal to a state that never stored them.
#[test]
fn a_removal_is_exact_at_once_and_swept_in_slices() {
    let mut s = state(64);
    let kept = MemberId::new(2, 0);
    let shared = hashes(0, 50);
    s.store(kept, &shared);
    for rank in 0..300u32 {
        let own = hashes(1_000 + u64::from(rank) * 40, 40);
        s.store(MemberId::new(1, rank), &own);
        s.store(MemberId::new(1, rank), &shared[..5]);
    }
    let resident = s.stats().resident_fingerprints;
    assert_eq!(resident, 50 + 300 * 40);
    let outcome = s.remove_worker(1);
    assert_eq!(outcome.applied, 300 * 45);
    assert_eq!(s.member_owned(MemberId::new(1, 7)), 0);
    assert!(!s.owns(MemberId::new(1, 7), hashes(1_280, 1)[0]));
    assert_eq!(s.refcount(shared[0]), 1, "a retired rank still counted");
    assert_eq!(s.refcount(hashes(1_000, 1)[0]), 0);
    assert!(s.releasing());
    assert_eq!(
        s.stats().resident_fingerprints,
        resident,
        "swept inside the clear"
    );
    let mut steps = 0;
    while s.release_step() {
        steps += 1;
    }
    assert!(steps > 2, "{steps} steps");
    assert_eq!(s.releasing_edges(), 0);
    let stats = s.stats();
    assert_eq!(stats.resident_fingerprints, 50);
    assert_eq!(stats.unique_blocks, 50);
    assert_eq!(stats.ownership_edges, 50);
    assert_eq!(s.count_resident(), 50);
    assert!(
        shared
            .iter()
            .all(|&h| s.refcount(h) == 1 && s.may_contain(h))
    );
    assert_eq!(s.member_blocks(kept), {
        let mut v = shared.clone();
        v.sort_unstable();
        v
    });
}

/// At the tag limit, a cleared member's tag is reused only once its blocks are swept.
#[test]
fn a_retired_tag_is_reused_only_after_its_sweep() {
    let mut s = state(1);
    s.members.tag_limit = 2;
    let (a, b, c) = (
        MemberId::new(1, 0),
        MemberId::new(2, 0),
        MemberId::new(3, 0),
    );
    s.store(a, &hashes(0, 100));
    s.store(b, &hashes(100, 10));
    s.clear_member(a);
    assert_eq!(
        s.store(c, &hashes(200, 5)).omitted,
        5,
        "a tag reused unswept"
    );
    s.finish_releases();
    assert_eq!(s.store(c, &hashes(200, 5)).applied, 5);
    assert_eq!(s.member_blocks(c).len(), 5);
    assert!(hashes(0, 100).iter().all(|&h| s.refcount(h) == 0));
}

/// A member cleared and storing again before the sweep got to its blocks: the fresh tag's
/// blocks survive the sweep, the old ones go, and a block both held keeps its fingerprint.
#[test]
fn a_member_storing_again_during_the_sweep_keeps_what_it_stored_since() {
    let mut s = state(16);
    let m = MemberId::new(3, 1);
    let old = hashes(0, 2_000);
    s.store(m, &old);
    assert_eq!(s.clear_member(m).applied, 2_000);
    assert!(s.releasing());
    let again = &old[1_500..];
    assert_eq!(s.store(m, again).applied, 500);
    assert_eq!(s.member_owned(m), 500);
    s.finish_releases();
    assert_eq!(s.member_blocks(m).len(), 500);
    assert_eq!(s.stats().resident_fingerprints, 500);
    assert!(again.iter().all(|&h| s.owns(m, h) && s.may_contain(h)));
    assert!(old[..1_500].iter().all(|&h| s.refcount(h) == 0));
}

/// With `slice_lines = 0` a clear completes inside its call.
#[test]
fn an_unsliced_clear_completes_in_its_call() {
    let mut s = state(0);
    let m = MemberId::new(1, 0);
    s.store(m, &hashes(0, 5_000));
    s.clear_member(m);
    assert!(!s.releasing());
    assert_eq!(s.stats().resident_fingerprints, 0);
    assert_eq!(s.stats().unique_blocks, 0);
}
