//! `LocalCkfAdapter`: producer -> consumer in process, with injected faults
//! and recovery. A lost final delta is caught by the drain marker -> lane retired -> new lease ->
//! barrier snapshot -> ready again with the producer's bytes. Other lanes are never affected.

use std::sync::Arc;

use ckf_core::adapter::{AdapterError, Fault, LocalCkfAdapter};
use ckf_core::addressing::{TableFormat, fmix64};
use ckf_core::dc::{DcCkfConfig, DcCkfState, KvEvent, KvEventKind, MemberId};
use ckf_core::global::{AttachError, GlobalCkfIndexer, Manifest};
use ckf_core::identity::{IndexerDomainId, PoolId, ProducerIdentity, ProducerIncarnation};
use ckf_core::lane::{DeltaError, IngestOutcome, LagPolicy, LaneState, RetireReason};

fn format() -> TableFormat {
    TableFormat::new(256, 21).unwrap()
}

fn indexer() -> Arc<GlobalCkfIndexer> {
    let m = Manifest {
        domain: IndexerDomainId::new("prod").unwrap(),
        format: format(),
        lanes: vec![
            PoolId::new("prod", "dc-a").unwrap(),
            PoolId::new("prod", "dc-b").unwrap(),
        ],
    };
    Arc::new(GlobalCkfIndexer::with_policy(m, 77, LagPolicy::DISABLED).unwrap())
}

fn adapter(ix: &Arc<GlobalCkfIndexer>, dc: &str) -> LocalCkfAdapter {
    let identity = ProducerIdentity {
        pool: PoolId::new("prod", dc).unwrap(),
        incarnation: ProducerIncarnation(dc.len() as u64),
        format: format(),
    };
    let state = DcCkfState::new(DcCkfConfig::new(format())).unwrap();
    LocalCkfAdapter::attach(state, identity, ix.clone(), 256).unwrap()
}

fn store(worker: u64, hashes: &[u64]) -> KvEvent {
    KvEvent {
        member: MemberId::new(worker, 0),
        kind: KvEventKind::Stored {
            block_hashes: hashes.to_vec(),
            parent_hash: None,
        },
    }
}

fn blocks(from: u64, n: u64) -> Vec<u64> {
    (from..from + n).map(fmix64).collect()
}

/// The lane holds exactly the producer's bytes and finds every tracked block.
/// Injects `fault` into `a`, has worker 1 store `hashes`, and returns the retirement the adapter
/// recovered from on that delivery (panics when there was none).
fn recovered_from(a: &mut LocalCkfAdapter, fault: Fault, hashes: &[u64]) -> RetireReason {
    a.inject(fault);
    let (_, d) = a.apply(&store(1, hashes)).unwrap();
    let reason = d.recovered.clone();
    reason.unwrap_or_else(|| panic!("no recovery: {d:?}"))
}

/// Drains `a` and asserts its lane answered the exact marker with `Drained`.
fn assert_drains(a: &mut LocalCkfAdapter) {
    let outcome = a.drain().unwrap().outcome;
    assert!(
        matches!(outcome, Some(IngestOutcome::Drained { .. })),
        "{outcome:?}"
    );
}

fn assert_converged(ix: &GlobalCkfIndexer, a: &LocalCkfAdapter) {
    let st = a.lane_status();
    assert!(st.ready && st.state == LaneState::Active, "{st:?}");
    assert_eq!(
        ix.table().lane_words(a.lane() as usize),
        a.state().buckets()
    );
    for m in a.state().members().collect::<Vec<_>>() {
        let mut hs: Vec<u64> = a.state().member_blocks(m);
        hs.sort_unstable();
        assert_eq!(
            ix.find_prefix_matches(&hs).depth(a.lane()),
            Some(hs.len() as u32)
        );
    }
}

#[test]
fn lost_final_delta_is_caught_by_the_drain_marker_and_recovered() {
    let ix = indexer();
    let mut a = adapter(&ix, "dc-a");
    let mut b = adapter(&ix, "dc-b");
    a.apply(&store(1, &blocks(0, 40))).unwrap();
    b.apply(&store(1, &blocks(1000, 40))).unwrap();
    // The final delta is lost; no later delta exposes the gap.
    a.inject(Fault::DropNextDelta);
    let (out, delivery) = a.apply(&store(2, &blocks(100, 5))).unwrap();
    assert_eq!(out.applied, 5);
    assert_eq!(delivery.outcome, None);
    assert_eq!(a.stats().deltas_dropped, 1);
    assert_ne!(
        ix.table().lane_words(0),
        a.state().buckets(),
        "the lane misses the lost delta"
    );
    let epoch = a.lane_status().lease.unwrap().epoch;
    let installed = a.lane_status().installed_sequence.unwrap();

    let d = a.drain().unwrap();
    assert_eq!(
        d.outcome,
        Some(IngestOutcome::Retired(RetireReason::LostFinalDelta {
            installed,
            marker: installed + 1
        }))
    );
    assert!(matches!(
        d.recovered,
        Some(RetireReason::LostFinalDelta { .. })
    ));
    let st = a.lane_status();
    assert_eq!(st.retirements, 1);
    assert_eq!(st.lease.unwrap().epoch, epoch + 1, "a new lease");
    assert_converged(&ix, &a);
    // The recovered stream drains exactly.
    assert_drains(&mut a);
    assert!(a.lane_status().drained);
    assert_eq!(a.stats().snapshots, 2);
    assert_eq!(a.stats().recoveries, 1);
    // The other lane never noticed.
    assert_eq!(b.lane_status().retirements, 0);
    assert_converged(&ix, &b);
    assert_drains(&mut b);
}

#[test]
fn dropped_middle_delta_is_a_gap_and_recovers() {
    let ix = indexer();
    let mut a = adapter(&ix, "dc-a");
    a.apply(&store(1, &blocks(0, 10))).unwrap();
    a.inject(Fault::DropNextDelta);
    a.apply(&store(1, &blocks(10, 10))).unwrap();
    let (_, d) = a.apply(&store(1, &blocks(20, 10))).unwrap();
    assert!(
        matches!(d.recovered, Some(RetireReason::Gap { .. })),
        "{d:?}"
    );
    assert_converged(&ix, &a);
    assert_drains(&mut a);
}

#[test]
fn duplicated_delta_retires_and_recovers() {
    let ix = indexer();
    let mut a = adapter(&ix, "dc-a");
    let reason = recovered_from(&mut a, Fault::DuplicateNextDelta, &blocks(0, 10));
    assert!(matches!(reason, RetireReason::Gap { .. }), "{reason:?}");
    assert_converged(&ix, &a);
}

#[test]
fn corrupt_delta_changes_no_word_retires_and_recovers() {
    let ix = indexer();
    let mut a = adapter(&ix, "dc-a");
    let mut b = adapter(&ix, "dc-b");
    b.apply(&store(3, &blocks(500, 30))).unwrap();
    let reason = recovered_from(&mut a, Fault::CorruptNextDelta, &blocks(0, 10));
    assert!(
        matches!(
            reason,
            RetireReason::MalformedDelta(DeltaError::DuplicateBucket { .. })
        ),
        "{reason:?}"
    );
    assert_converged(&ix, &a);
    assert_converged(&ix, &b);
    assert_eq!(b.lane_status().retirements, 0);
}

#[test]
fn consumer_failure_midway_retires_and_recovers() {
    let ix = indexer();
    let mut a = adapter(&ix, "dc-a");
    a.apply(&store(1, &blocks(0, 50))).unwrap();
    let reason = recovered_from(&mut a, Fault::FailApplyAfter(1), &blocks(50, 50));
    assert!(
        matches!(reason, RetireReason::ApplyFailed { .. }),
        "{reason:?}"
    );
    assert_converged(&ix, &a);
}

#[test]
fn attach_to_an_unknown_pool_is_refused() {
    let ix = indexer();
    let identity = ProducerIdentity {
        pool: PoolId::new("prod", "dc-z").unwrap(),
        incarnation: ProducerIncarnation(1),
        format: format(),
    };
    let state = DcCkfState::new(DcCkfConfig::new(format())).unwrap();
    let err = LocalCkfAdapter::attach(state, identity, ix.clone(), 256).unwrap_err();
    assert_eq!(
        err,
        AdapterError::Attach(AttachError::UnknownPool {
            pool: PoolId::new("prod", "dc-z").unwrap(),
            configured: ix.manifest().lanes.clone(),
        })
    );
    assert_eq!(ix.ready_mask(), 0);
}

#[test]
fn a_second_adapter_for_the_same_pool_fences_the_first() {
    let ix = indexer();
    let mut old = adapter(&ix, "dc-a");
    old.apply(&store(1, &blocks(0, 10))).unwrap();
    let mut new = adapter(&ix, "dc-a");
    new.apply(&store(1, &blocks(100, 10))).unwrap();
    // The old stream is now stale: its frames are ignored, which the adapter reports.
    let err = old.apply(&store(1, &blocks(200, 10))).unwrap_err();
    assert!(
        matches!(err, AdapterError::Unexpected(IngestOutcome::Ignored(_))),
        "{err:?}"
    );
    assert_converged(&ix, &new);
}
