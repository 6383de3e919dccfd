//! `Fanout`: the barrier across attachments, fencing on a full or closed sink, stale detaches,
//! backed-up sinks, delta splitting, drain markers; and a proptest replaying every attachment's frames against
//! the producer's table.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::time::Instant;

use ckf_core::addressing::Addressing;
use ckf_core::bucket;
use ckf_core::dc::{DcCkfConfig, DcCkfState, MemberId};
use ckf_core::dirty::PublicationBatch;
use ckf_core::fanout::{
    AttachRefused, Fanout, FenceCause, FrameLimits, FrameSink, Outbound, PublishReport, SinkError,
};
use ckf_core::frames::BucketImage;
use ckf_core::publication::{FenceReason, PublishError};
use ckf_core::{LaneLease, PoolId, ProducerIdentity, ProducerIncarnation, TableFormat};
use proptest::prelude::*;

/// One attachment's queue as its reader sees it.
#[derive(Debug)]
struct Queue {
    /// Frames with the broken-cycle count of the batch they carry (deltas only, once known).
    frames: VecDeque<(Outbound, Option<u32>)>,
    capacity: usize,
    reader_gone: bool,
    sender_dropped: bool,
}

type Shared = Rc<RefCell<Queue>>;

fn queue(capacity: usize) -> Shared {
    Rc::new(RefCell::new(Queue {
        frames: VecDeque::new(),
        capacity,
        reader_gone: false,
        sender_dropped: false,
    }))
}

/// The sender half handed to the fan-out; dropping it closes the queue.
struct TestSink(Shared);

impl FrameSink for TestSink {
    fn try_send(&mut self, frame: Outbound) -> Result<(), SinkError> {
        let mut q = self.0.borrow_mut();
        if q.reader_gone {
            return Err(SinkError::Closed);
        }
        if q.frames.len() >= q.capacity {
            return Err(SinkError::Full);
        }
        q.frames.push_back((frame, None));
        Ok(())
    }

    fn backed_up(&self) -> bool {
        let q = self.0.borrow();
        q.frames.len() * 2 > q.capacity
    }
}

impl Drop for TestSink {
    fn drop(&mut self) {
        self.0.borrow_mut().sender_dropped = true;
    }
}

fn format(buckets: u64) -> TableFormat {
    TableFormat::new(buckets, 1).unwrap()
}

fn setup(buckets: u64, attachments: usize) -> (DcCkfState, Fanout<TestSink>) {
    let identity = ProducerIdentity {
        pool: PoolId::new("d", "dc-a").unwrap(),
        incarnation: ProducerIncarnation(9),
        format: format(buckets),
    };
    let state = DcCkfState::new(DcCkfConfig::new(format(buckets))).unwrap();
    (state, Fanout::new(&identity, attachments))
}

fn lease(epoch: u64) -> LaneLease {
    LaneLease {
        consumer_instance: 1,
        lane: 0,
        epoch,
    }
}

fn pop(q: &Shared) -> Option<Outbound> {
    q.borrow_mut().frames.pop_front().map(|(f, _)| f)
}

const WIDE: FrameLimits = FrameLimits::UNLIMITED;

#[test]
fn attach_drains_pending_changes_to_the_others_before_its_snapshot() {
    let (mut state, mut fanout) = setup(64, 2);
    let qa = queue(8);
    let r = fanout.attach(&mut state, 0, lease(1), WIDE, TestSink(qa.clone()));
    assert_eq!((r.barrier, r.result), (None, Ok(0)));
    let Some(Outbound::Snapshot(snap_a)) = pop(&qa) else {
        panic!("a snapshot first")
    };
    assert!(snap_a.buckets.iter().all(|&w| w == 0));

    state.store(MemberId::new(1, 0), &[11, 12, 13]);
    assert!(state.pending_dirty() > 0);
    let qb = queue(8);
    let r = fanout.attach(&mut state, 1, lease(2), WIDE, TestSink(qb.clone()));
    assert_eq!(r.result, Ok(0));
    let barrier = r.barrier.expect("the pending batch was published");
    assert_eq!((barrier.delivered, barrier.fenced.len()), (1, 0));
    assert_eq!(state.pending_dirty(), 0);
    // A got the pending change as its delta 0 -> 1 ...
    let Some(Outbound::Deltas(deltas, _)) = pop(&qa) else {
        panic!("a delta for a")
    };
    assert_eq!(deltas.len(), 1);
    assert_eq!(deltas[0].images.len(), barrier.batch_images);
    assert_eq!((deltas[0].base_sequence, deltas[0].sequence), (0, 1));
    let mut rebuilt = snap_a.buckets.clone();
    for i in &deltas[0].images {
        rebuilt[i.bucket as usize] = i.image;
    }
    assert_eq!(rebuilt, state.buckets());
    // ... and B's barrier snapshot already contains it (and nothing else was queued).
    let Some(Outbound::Snapshot(snap_b)) = pop(&qb) else {
        panic!("a snapshot for b")
    };
    assert_eq!(snap_b.buckets, state.buckets());
    assert!(pop(&qb).is_none());

    // Both streams continue with their own sequences.
    state.remove(MemberId::new(1, 0), &[12]);
    let report = fanout.publish(&mut state).expect("a batch");
    assert_eq!(report.delivered, 2);
    let Some(Outbound::Deltas(a, _)) = pop(&qa) else {
        panic!()
    };
    let Some(Outbound::Deltas(b, _)) = pop(&qb) else {
        panic!()
    };
    assert_eq!((a[0].base_sequence, a[0].sequence), (1, 2));
    assert_eq!((b[0].base_sequence, b[0].sequence), (0, 1));
    assert_eq!(a[0].images, b[0].images);
    assert!(fanout.publish(&mut state).is_none(), "nothing pending");

    // The exact drain markers; then the fan-out is closed.
    let drained = fanout.drain();
    assert_eq!((drained.queued, drained.missed.len()), (2, 0));
    let Some(Outbound::Drain(m)) = pop(&qa) else {
        panic!()
    };
    assert_eq!(m.sequence, 2);
    let Some(Outbound::Drain(m)) = pop(&qb) else {
        panic!()
    };
    assert_eq!(m.sequence, 1);
    assert_eq!(fanout.attached(), 0);
    assert!(qa.borrow().sender_dropped && qb.borrow().sender_dropped);
    let r = fanout.attach(&mut state, 0, lease(3), WIDE, TestSink(queue(8)));
    assert_eq!(r.result, Err(AttachRefused::ShuttingDown));
}

#[test]
fn a_full_queue_fences_only_that_attachment_and_stale_detaches_are_ignored() {
    let (mut state, mut fanout) = setup(64, 2);
    let qa = queue(2);
    let qb = queue(64);
    fanout
        .attach(&mut state, 0, lease(1), WIDE, TestSink(qa.clone()))
        .result
        .unwrap();
    fanout
        .attach(&mut state, 1, lease(2), WIDE, TestSink(qb.clone()))
        .result
        .unwrap();
    let mut fenced = Vec::new();
    for i in 0..4u64 {
        state.store(MemberId::new(i, 0), &[100 + i]);
        fenced.extend(fanout.publish(&mut state).expect("a batch").fenced);
    }
    // A's queue (snapshot + 1 batch) overflowed: A is fenced, once, and its queue closed.
    assert_eq!(fenced.len(), 1);
    assert_eq!(
        (fenced[0].attachment, &fenced[0].cause),
        (0, &FenceCause::Sink(SinkError::Full))
    );
    assert_eq!(fanout.attached(), 1);
    assert!(!fanout.is_attached(0));
    assert_eq!(qa.borrow().frames.len(), 2);
    assert!(qa.borrow().sender_dropped);
    // B saw every batch.
    let mut b_deltas = 0;
    while let Some(entry) = pop(&qb) {
        if let Outbound::Deltas(d, _) = entry {
            b_deltas += d.len();
        }
    }
    assert_eq!(b_deltas, 4);
    // A detach naming an older lease does not touch the current attachment.
    assert!(!fanout.detach(1, lease(1), FenceReason::UncertainDelivery));
    assert_eq!(fanout.attached(), 1);
    assert!(fanout.detach(1, lease(2), FenceReason::UncertainDelivery));
    assert_eq!(fanout.attached(), 0);
    assert!(qb.borrow().sender_dropped);
    // A stale lease is refused on re-attach.
    let r = fanout.attach(&mut state, 1, lease(2), WIDE, TestSink(queue(2)));
    assert!(matches!(
        r.result,
        Err(AttachRefused::Publisher(PublishError::StaleLease { .. }))
    ));
}

#[test]
fn the_fanout_is_backed_up_while_a_streaming_sink_is_more_than_half_full() {
    let (mut state, mut fanout) = setup(64, 3);
    let qa = queue(4);
    let qb = queue(64);
    fanout
        .attach(&mut state, 0, lease(1), WIDE, TestSink(qa.clone()))
        .result
        .unwrap();
    fanout
        .attach(&mut state, 1, lease(2), WIDE, TestSink(qb.clone()))
        .result
        .unwrap();
    // Attachment 2 never attaches: no sink, never backed up.
    assert!(pop(&qa).is_some() && pop(&qb).is_some());
    assert!(!fanout.backed_up());
    let mut batch = 0u64;
    let mut publish = |state: &mut DcCkfState, fanout: &mut Fanout<TestSink>| {
        batch += 1;
        state.store(MemberId::new(batch, 0), &[200 + batch]);
        let report = fanout.publish(state).expect("a batch");
        assert!(report.fenced.is_empty(), "{report:?}");
    };
    // Half of A's 4 slots taken: not yet backed up.
    publish(&mut state, &mut fanout);
    publish(&mut state, &mut fanout);
    assert!(!fanout.backed_up());
    // More than half: backed up (B, with room, does not matter).
    publish(&mut state, &mut fanout);
    assert!(fanout.backed_up());
    assert!(fanout.sink(0).is_some_and(FrameSink::backed_up));
    assert!(fanout.sink(1).is_some_and(|s| !s.backed_up()));
    assert!(fanout.sink(2).is_none());
    // The reader catches up: no longer backed up.
    assert!(pop(&qa).is_some());
    assert!(!fanout.backed_up());
    // Backed up again, then fenced by a full queue: a fenced attachment does not count.
    publish(&mut state, &mut fanout);
    assert!(fanout.backed_up());
    publish(&mut state, &mut fanout);
    batch += 1;
    state.store(MemberId::new(batch, 0), &[200 + batch]);
    let report = fanout.publish(&mut state).expect("a batch");
    assert_eq!(report.fenced.len(), 1);
    assert!(!fanout.is_attached(0));
    assert!(!fanout.backed_up());
}

#[test]
fn a_closed_queue_fences_and_a_refused_snapshot_leaves_the_attachment_unattached() {
    let (mut state, mut fanout) = setup(64, 1);
    let q = queue(8);
    fanout
        .attach(&mut state, 0, lease(1), WIDE, TestSink(q.clone()))
        .result
        .unwrap();
    q.borrow_mut().reader_gone = true;
    state.store(MemberId::new(1, 0), &[5]);
    let report = fanout.publish(&mut state).unwrap();
    assert_eq!(report.fenced[0].cause, FenceCause::Sink(SinkError::Closed));
    assert_eq!(fanout.attached(), 0);
    // A sink that cannot take the snapshot: refused, fenced, not attached.
    let r = fanout.attach(&mut state, 0, lease(2), WIDE, TestSink(queue(0)));
    assert_eq!(
        r.result,
        Err(AttachRefused::Publisher(PublishError::Fenced(
            FenceReason::UncertainDelivery
        )))
    );
    assert_eq!(fanout.attached(), 0);
}

#[test]
fn oversized_batches_become_consecutive_deltas() {
    let (mut state, mut fanout) = setup(64, 1);
    let q = queue(8);
    let narrow = FrameLimits {
        max_images_per_delta: 2,
    };
    fanout
        .attach(&mut state, 0, lease(1), narrow, TestSink(q.clone()))
        .result
        .unwrap();
    let _snapshot = pop(&q).unwrap();
    state.store(MemberId::new(1, 0), &[1, 2, 3, 4, 5, 6, 7]);
    fanout.publish(&mut state);
    let Some(Outbound::Deltas(deltas, _)) = pop(&q) else {
        panic!()
    };
    assert!(deltas.len() > 1);
    let mut rebuilt = vec![0u64; 64];
    for (i, d) in deltas.iter().enumerate() {
        assert!(d.images.len() <= 2);
        assert_eq!(d.base_sequence, i as u64);
        assert_eq!(d.sequence, i as u64 + 1);
        for img in &d.images {
            rebuilt[img.bucket as usize] = img.image;
        }
    }
    assert_eq!(rebuilt, state.buckets());
}

#[test]
fn split_keeps_order_and_bounds() {
    let batch = PublicationBatch {
        images: (0..10u32)
            .map(|b| BucketImage {
                bucket: 9 - b,
                image: u64::from(b),
            })
            .collect(),
        oldest_change: Instant::now(),
        cycles_broken: 2,
    };
    let parts = batch.split(4);
    assert_eq!(
        parts.iter().map(|p| p.images.len()).collect::<Vec<_>>(),
        [4, 4, 2]
    );
    let joined: Vec<_> = parts.iter().flat_map(|p| p.images.clone()).collect();
    assert_eq!(joined, batch.images);
    assert_eq!(
        parts.iter().map(|p| p.cycles_broken).sum::<u32>(),
        batch.cycles_broken
    );
    assert_eq!(batch.split(10).len(), 1);
    assert_eq!(batch.split(0).len(), 10, "0 is treated as 1");
}

// ---- proptest: random interleavings against replicas rebuilt from the frames ----

/// Copies of each (fingerprint, candidate pair) in a table.
fn pair_copies(table: &[u64], addressing: &Addressing) -> HashMap<(u16, u32), u32> {
    let mut copies = HashMap::new();
    for (b, &word) in table.iter().enumerate() {
        for fp in bucket::slots(word) {
            if fp != 0 {
                let alt = addressing.alternate(b as u32, fp);
                *copies.entry((fp, alt.min(b as u32))).or_insert(0) += 1;
            }
        }
    }
    copies
}

/// What one attachment's reader has rebuilt from its frames.
struct Replica {
    queue: Shared,
    limit: usize,
    table: Option<Vec<u64>>,
    sequence: u64,
    drained: Option<u64>,
}

impl Replica {
    /// Applies every queued frame, checking the stream's rules on the way.
    fn replay(&mut self, addressing: &Addressing) -> Result<(), TestCaseError> {
        loop {
            let Some((frame, cycles)) = self.queue.borrow_mut().frames.pop_front() else {
                return Ok(());
            };
            prop_assert!(self.drained.is_none(), "a frame after the drain marker");
            match frame {
                Outbound::Snapshot(s) => {
                    prop_assert!(self.table.is_none(), "one snapshot per attachment");
                    prop_assert_eq!(s.sequence, 0, "a new lease starts at sequence 0");
                    self.sequence = s.sequence;
                    self.table = Some(s.buckets);
                }
                Outbound::Deltas(deltas, _) => {
                    let table = self.table.as_mut().expect("snapshot before deltas");
                    let cycles = cycles.expect("every delivered batch was reported");
                    prop_assert!(!deltas.is_empty());
                    let mut after = table.clone();
                    for d in &deltas {
                        for i in &d.images {
                            after[i.bucket as usize] = i.image;
                        }
                    }
                    let before = pair_copies(table, addressing);
                    let after_copies = pair_copies(&after, addressing);
                    for d in &deltas {
                        prop_assert_eq!(d.base_sequence, self.sequence, "contiguous sequences");
                        prop_assert_eq!(d.sequence, self.sequence + 1);
                        prop_assert!(!d.images.is_empty());
                        prop_assert!(d.images.len() <= self.limit, "split to the limit");
                        self.sequence = d.sequence;
                        for i in &d.images {
                            table[i.bucket as usize] = i.image;
                            if cycles > 0 {
                                continue;
                            }
                            // Image order across split frames: a (fingerprint, pair) held
                            // before and after the batch never drops below min(before, after).
                            let now = pair_copies(table, addressing);
                            for (key, &was) in &before {
                                let kept = was.min(*after_copies.get(key).unwrap_or(&0));
                                prop_assert!(
                                    *now.get(key).unwrap_or(&0) >= kept,
                                    "{:?} transiently missing",
                                    key
                                );
                            }
                        }
                    }
                    prop_assert_eq!(&*table, &after[..]);
                }
                Outbound::Drain(m) => {
                    prop_assert_eq!(m.sequence, self.sequence, "the exact drain marker");
                    self.drained = Some(m.sequence);
                }
            }
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Store(u64, Vec<u64>),
    Remove(u64, Vec<u64>),
    /// Attach with a queue of this many entries.
    Attach(usize, usize),
    /// Detach under the current lease, or (`true`) an older one.
    Detach(usize, bool),
    Publish,
    /// The reader stops reading: the queue is full from now on.
    Fill(usize),
    /// The reader reads everything and makes room again.
    Read(usize),
    /// The reader goes away.
    Gone(usize),
}

fn op(n: usize) -> impl Strategy<Value = Op> {
    let hashes = || prop::collection::vec(0..40u64, 1..6);
    prop_oneof![
        4 => (0..4u64, hashes()).prop_map(|(m, h)| Op::Store(m, h)),
        2 => (0..4u64, hashes()).prop_map(|(m, h)| Op::Remove(m, h)),
        2 => (0..n, prop_oneof![Just(1usize), Just(2), Just(64)]).prop_map(|(i, c)| Op::Attach(i, c)),
        1 => (0..n, any::<bool>()).prop_map(|(i, s)| Op::Detach(i, s)),
        3 => Just(Op::Publish),
        1 => (0..n).prop_map(Op::Fill),
        2 => (0..n).prop_map(Op::Read),
        1 => (0..n).prop_map(Op::Gone),
    ]
}

/// Tags the deltas queued by one fan-out call with that call's batch.
fn tag(replicas: &[Option<Replica>], report: Option<&PublishReport>) -> Result<(), TestCaseError> {
    let mut tagged = 0;
    for r in replicas.iter().flatten() {
        for (frame, cycles) in r.queue.borrow_mut().frames.iter_mut() {
            if matches!(frame, Outbound::Deltas(..)) && cycles.is_none() {
                let report = report.expect("deltas only from a reported batch");
                *cycles = Some(report.cycles_broken);
                tagged += 1;
            }
        }
    }
    prop_assert_eq!(tagged, report.map_or(0, |r| r.delivered));
    Ok(())
}

/// Every streaming attachment, replayed, holds exactly the producer's table at its sequence.
fn check_streaming(
    state: &DcCkfState,
    fanout: &Fanout<TestSink>,
    replicas: &mut [Option<Replica>],
) -> Result<(), TestCaseError> {
    for (i, r) in replicas.iter_mut().enumerate() {
        let Some(r) = r else { continue };
        r.replay(state.addressing())?;
        let attached = fanout.is_attached(i);
        prop_assert_eq!(attached, !r.queue.borrow().sender_dropped);
        if attached {
            prop_assert_eq!(r.table.as_deref(), Some(state.buckets()));
            prop_assert_eq!(r.sequence, fanout.publisher(i).sequence());
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_streaming_attachment_replays_to_the_producers_table(
        buckets in prop_oneof![Just(8u64), Just(16), Just(64)],
        limits in prop::collection::vec(prop_oneof![Just(1usize), Just(2), Just(3), Just(usize::MAX)], 2..=3),
        ops in prop::collection::vec(op(3), 1..100),
    ) {
        let n = limits.len();
        let (mut state, mut fanout) = setup(buckets, n);
        let mut replicas: Vec<Option<Replica>> = (0..n).map(|_| None).collect();
        let mut epoch = 0u64;
        for op in ops {
            match op {
                Op::Store(m, h) => { state.store(MemberId::new(m, 0), &h); }
                Op::Remove(m, h) => { state.remove(MemberId::new(m, 0), &h); }
                Op::Attach(i, capacity) => {
                    let i = i % n;
                    epoch += 1;
                    let q = queue(capacity);
                    let limit = FrameLimits { max_images_per_delta: limits[i] };
                    let r = fanout.attach(&mut state, i, lease(epoch), limit, TestSink(q.clone()));
                    tag(&replicas, r.barrier.as_ref())?;
                    prop_assert_eq!(state.pending_dirty(), 0, "the barrier drained everything");
                    match r.result {
                        Ok(sequence) => prop_assert_eq!(sequence, 0),
                        Err(e) => prop_assert_eq!(
                            e,
                            AttachRefused::Publisher(PublishError::Fenced(FenceReason::UncertainDelivery))
                        ),
                    }
                    // The previous attachment's queue was dropped and is not read any more.
                    replicas[i] = Some(Replica { queue: q, limit: limits[i], table: None, sequence: 0, drained: None });
                    check_streaming(&state, &fanout, &mut replicas)?;
                }
                Op::Detach(i, stale) => {
                    let i = i % n;
                    let Some(current) = fanout.publisher(i).lease() else { continue };
                    let was = fanout.is_attached(i);
                    if stale {
                        let older = LaneLease { epoch: current.epoch - 1, ..current };
                        prop_assert!(!fanout.detach(i, older, FenceReason::UncertainDelivery));
                        prop_assert_eq!(fanout.is_attached(i), was);
                    } else {
                        prop_assert!(fanout.detach(i, current, FenceReason::UncertainDelivery));
                        prop_assert!(!fanout.is_attached(i));
                    }
                }
                Op::Publish => {
                    let report = fanout.publish(&mut state);
                    tag(&replicas, report.as_ref())?;
                    prop_assert_eq!(state.pending_dirty(), 0);
                    check_streaming(&state, &fanout, &mut replicas)?;
                }
                Op::Fill(i) => {
                    if let Some(r) = &replicas[i % n] {
                        let mut q = r.queue.borrow_mut();
                        q.capacity = q.frames.len();
                    }
                }
                Op::Read(i) => {
                    if let Some(r) = &mut replicas[i % n] {
                        r.replay(state.addressing())?;
                        r.queue.borrow_mut().capacity = 64;
                    }
                }
                Op::Gone(i) => {
                    if let Some(r) = &replicas[i % n] {
                        r.queue.borrow_mut().reader_gone = true;
                    }
                }
            }
        }
        // Shutdown: the final batch, then one exact drain marker per attached attachment.
        let report = fanout.publish(&mut state);
        tag(&replicas, report.as_ref())?;
        let attached: Vec<usize> = (0..n).filter(|&i| fanout.is_attached(i)).collect();
        let drained = fanout.drain();
        prop_assert_eq!(drained.queued + drained.missed.len(), attached.len());
        prop_assert_eq!(fanout.attached(), 0);
        for i in attached {
            let r = replicas[i].as_mut().expect("attached");
            let marker_expected = !drained.missed.iter().any(|(m, _)| *m == i);
            r.replay(state.addressing())?;
            prop_assert_eq!(r.table.as_deref(), Some(state.buckets()));
            prop_assert_eq!(r.drained.is_some(), marker_expected);
        }
    }
}
