//! Publication protocol on the producer side: lease install rules, barrier snapshot, sequence
//! chain, drain marker, fencing and sequence exhaustion (docs/design.md, "Publication protocol").

use ckf_core::dc::{DcCkfConfig, DcCkfState, MemberId};
use ckf_core::publication::{DcCkfPublisher, FenceReason, PublishError, PublisherState};
use ckf_core::{LaneLease, PoolId, ProducerIdentity, ProducerIncarnation, TableFormat};

const M: MemberId = MemberId::new(1, 0);

fn format() -> TableFormat {
    TableFormat::new(64, 9).unwrap()
}

fn identity() -> ProducerIdentity {
    ProducerIdentity {
        pool: PoolId::new("prod", "dc-a").unwrap(),
        incarnation: ProducerIncarnation(7),
        format: format(),
    }
}

fn lease(consumer_instance: u64, epoch: u64) -> LaneLease {
    LaneLease {
        consumer_instance,
        lane: 2,
        epoch,
    }
}

fn state() -> DcCkfState {
    DcCkfState::new(DcCkfConfig::new(format())).unwrap()
}

/// Stores `n` fresh blocks and takes the resulting batch.
fn churn(state: &mut DcCkfState, from: u64, n: u64) -> ckf_core::dirty::PublicationBatch {
    let hashes: Vec<u64> = (from..from + n).collect();
    state.store(M, &hashes);
    state.take_batch().expect("new blocks change buckets")
}

/// A publisher of [`identity`] under lease epoch 1 that has sent its barrier snapshot of `s`.
fn snapshotted(s: &DcCkfState) -> DcCkfPublisher {
    let mut p = DcCkfPublisher::new(identity());
    p.install_lease(lease(1, 1)).unwrap();
    p.snapshot(s).unwrap();
    p
}

#[test]
fn lease_install_rules() {
    let mut p = DcCkfPublisher::new(identity());
    assert_eq!(p.state(), PublisherState::AwaitingLease);
    assert_eq!(p.lease(), None);
    p.install_lease(lease(1, 5)).unwrap();
    assert_eq!(p.state(), PublisherState::AwaitingSnapshot);
    // Same consumer instance: equal or older epochs are refused and change nothing.
    for epoch in [5, 4, 1] {
        assert_eq!(
            p.install_lease(lease(1, epoch)),
            Err(PublishError::StaleLease {
                installed: lease(1, 5),
                offered: lease(1, epoch)
            })
        );
        assert_eq!(p.lease(), Some(lease(1, 5)));
    }
    p.install_lease(lease(1, 6)).unwrap();
    assert_eq!(p.lease(), Some(lease(1, 6)));
    // A restarted consumer (new instance) may start its epochs over.
    p.install_lease(lease(2, 1)).unwrap();
    assert_eq!(p.lease(), Some(lease(2, 1)));
    assert_eq!(p.state(), PublisherState::AwaitingSnapshot);
    assert_eq!(p.identity(), &identity());
}

#[test]
fn frames_need_lease_then_snapshot() {
    let mut s = state();
    let mut p = DcCkfPublisher::new(identity());
    assert_eq!(p.snapshot(&s), Err(PublishError::NoLease));
    assert!(matches!(
        p.drain_marker(),
        Err(PublishError::NotStreaming(_))
    ));
    let batch = churn(&mut s, 1, 3);
    assert_eq!(
        p.delta(&batch),
        Err(PublishError::NotStreaming(PublisherState::AwaitingLease))
    );
    p.install_lease(lease(1, 1)).unwrap();
    assert_eq!(
        p.delta(&batch),
        Err(PublishError::NotStreaming(PublisherState::AwaitingSnapshot))
    );
    assert_eq!(p.sequence(), 0);
    let snap = p.snapshot(&s).unwrap();
    assert_eq!(snap.sequence, 0);
    assert_eq!(snap.buckets, s.buckets());
    assert_eq!(snap.tag.lease, lease(1, 1));
    assert_eq!(snap.tag.incarnation, ProducerIncarnation(7));
    assert_eq!(p.state(), PublisherState::Streaming);
}

#[test]
fn snapshot_is_refused_while_dirty_buckets_are_pending() {
    let mut s = state();
    let mut p = DcCkfPublisher::new(identity());
    p.install_lease(lease(1, 1)).unwrap();
    s.store(M, &[10, 11]);
    let pending = s.pending_dirty();
    assert!(pending > 0);
    assert_eq!(p.snapshot(&s), Err(PublishError::PendingDirty { pending }));
    assert_eq!(p.state(), PublisherState::AwaitingSnapshot);
    s.take_batch().unwrap();
    assert_eq!(s.pending_dirty(), 0);
    let snap = p.snapshot(&s).unwrap();
    assert!(s.buckets().iter().any(|&w| w != 0));
    assert_eq!(snap.buckets, s.buckets());
}

#[test]
fn snapshot_refuses_a_state_of_another_format() {
    let other = DcCkfState::new(DcCkfConfig::new(TableFormat::new(128, 9).unwrap())).unwrap();
    let mut p = DcCkfPublisher::new(identity());
    p.install_lease(lease(1, 1)).unwrap();
    assert!(matches!(
        p.snapshot(&other),
        Err(PublishError::FormatMismatch { .. })
    ));
}

#[test]
fn sequence_chain_and_exact_drain_marker() {
    let mut s = state();
    let mut p = DcCkfPublisher::new(identity());
    p.install_lease(lease(1, 1)).unwrap();
    let snap = p.snapshot(&s).unwrap();
    assert_eq!(p.drain_marker().unwrap().sequence, snap.sequence);
    let mut expected_base = snap.sequence;
    for i in 0..5 {
        let batch = churn(&mut s, 100 + 10 * i, 4);
        let d = p.delta(&batch).unwrap();
        assert_eq!(d.base_sequence, expected_base);
        assert_eq!(d.sequence, expected_base + 1);
        assert_eq!(d.images, batch.images);
        assert_eq!(d.tag.lease, lease(1, 1));
        expected_base = d.sequence;
        let drain = p.drain_marker().unwrap();
        assert_eq!(drain.sequence, d.sequence);
        assert_eq!(drain.tag, d.tag);
    }
    assert_eq!(p.sequence(), 5);
    // A re-snapshot keeps N; the next delta continues from it.
    assert_eq!(p.snapshot(&s).unwrap().sequence, 5);
    let d = p.delta(&churn(&mut s, 900, 2)).unwrap();
    assert_eq!((d.base_sequence, d.sequence), (5, 6));
    // A new lease starts a new sequence space and needs a new snapshot.
    p.install_lease(lease(1, 2)).unwrap();
    assert_eq!(p.sequence(), 0);
    let batch = churn(&mut s, 950, 2);
    assert!(p.delta(&batch).is_err());
}

#[test]
fn fence_blocks_frames_until_new_lease_and_snapshot() {
    let mut s = state();
    let mut p = snapshotted(&s);
    p.delta(&churn(&mut s, 1, 2)).unwrap();
    p.fence(FenceReason::UncertainDelivery);
    let fenced = PublishError::Fenced(FenceReason::UncertainDelivery);
    assert_eq!(
        p.state(),
        PublisherState::Fenced(FenceReason::UncertainDelivery)
    );
    let batch = churn(&mut s, 10, 2);
    assert_eq!(p.delta(&batch), Err(fenced.clone()));
    assert_eq!(p.drain_marker(), Err(fenced.clone()));
    assert_eq!(p.snapshot(&s), Err(fenced));
    assert_eq!(
        p.sequence(),
        1,
        "a refused frame must not advance the sequence"
    );
    // The fenced lease cannot be reinstalled.
    assert!(matches!(
        p.install_lease(lease(1, 1)),
        Err(PublishError::StaleLease { .. })
    ));
    p.install_lease(lease(1, 2)).unwrap();
    assert!(matches!(
        p.delta(&batch),
        Err(PublishError::NotStreaming(_))
    ));
    let snap = p.snapshot(&s).unwrap();
    assert_eq!(snap.tag.lease.epoch, 2);
    let d = p.delta(&churn(&mut s, 20, 2)).unwrap();
    assert_eq!(
        (d.base_sequence, d.sequence),
        (snap.sequence, snap.sequence + 1)
    );
}

#[test]
fn sequence_exhaustion_fences() {
    let mut s = state();
    let mut p = DcCkfPublisher::new(identity());
    p.install_lease_at(lease(1, 1), u64::MAX - 2).unwrap();
    let snap = p.snapshot(&s).unwrap();
    assert_eq!(snap.sequence, u64::MAX - 2);
    let d = p.delta(&churn(&mut s, 1, 2)).unwrap();
    assert_eq!(d.sequence, u64::MAX - 1);
    let d = p.delta(&churn(&mut s, 10, 2)).unwrap();
    assert_eq!(d.sequence, u64::MAX);
    assert_eq!(p.drain_marker().unwrap().sequence, u64::MAX);
    let batch = churn(&mut s, 20, 2);
    assert_eq!(
        p.delta(&batch),
        Err(PublishError::SequenceExhausted(u64::MAX))
    );
    assert_eq!(
        p.state(),
        PublisherState::Fenced(FenceReason::SequenceExhausted)
    );
    assert!(p.drain_marker().is_err());
    p.install_lease(lease(1, 2)).unwrap();
    assert_eq!(p.snapshot(&s).unwrap().sequence, 0);
    assert_eq!(p.delta(&churn(&mut s, 30, 2)).unwrap().sequence, 1);
}

#[test]
fn empty_batch_is_refused_and_age_is_reported() {
    let mut s = state();
    let mut p = snapshotted(&s);
    let mut batch = churn(&mut s, 1, 2);
    batch.oldest_change -= std::time::Duration::from_millis(1500);
    let d = p.delta(&batch).unwrap();
    assert!(d.oldest_change_age_ms >= 1500, "{}", d.oldest_change_age_ms);
    batch.images.clear();
    assert_eq!(p.delta(&batch), Err(PublishError::EmptyBatch));
    assert_eq!(p.sequence(), 1);
}

#[test]
fn several_publishers_share_one_state() {
    // The composition documented in `publication`: one batch per tick, handed to every
    // publisher; a publisher that is not streaming skips it and catches up by snapshot.
    let mut s = state();
    let mut a = DcCkfPublisher::new(identity());
    let mut b = DcCkfPublisher::new(identity());
    a.install_lease(lease(1, 1)).unwrap();
    a.snapshot(&s).unwrap();
    let mut a_view = s.buckets().to_vec();
    let batch = churn(&mut s, 1, 8);
    for image in a.delta(&batch).unwrap().images {
        a_view[image.bucket as usize] = image.image;
    }
    assert!(b.delta(&batch).is_err());
    b.install_lease(lease(2, 1)).unwrap();
    let b_view = b.snapshot(&s).unwrap().buckets;
    assert_eq!(a_view, s.buckets());
    assert_eq!(b_view, s.buckets());
}
