//! Fan-out of publication batches to every indexer attachment, owned by the state actor.
//!
//! One [`DcCkfPublisher`] per configured indexer endpoint (its lease, sequence and fence) lives
//! here, next to the state, because the barrier rule needs both: before a publisher's barrier
//! snapshot, the pending dirty buckets are taken once and delivered as deltas to every *other*
//! streaming publisher, so no change falls between their streams and the new snapshot
//! (`ckf_core::publication`, "Several publishers, one state").
//!
//! Frames leave through one bounded queue per attachment to its relay-client task, filled with
//! `try_send` (one entry per batch): the actor never waits on a slow indexer. An attachment whose queue is full (or
//! whose task is gone) is fenced and dropped; its task notices the closed queue, reconnects and
//! gets a new lease and a new barrier snapshot. A delta bigger than the indexer accepts is split
//! into consecutive deltas, keeping the image order (a relocated fingerprint still reaches its
//! new bucket before it leaves its old one, now across frames).

use std::time::Instant;

use ckf_core::dc::DcCkfState;
use ckf_core::dirty::PublicationBatch;
use ckf_core::frames::{DcCkfDelta, DcCkfSnapshot, DrainMarker};
use ckf_core::identity::{LaneLease, ProducerIdentity};
use ckf_core::publication::{DcCkfPublisher, FenceReason, PublishError, PublisherState};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use crate::metrics::Metrics;

/// A frame for one attachment's relay-client task.
#[derive(Debug, Clone)]
pub enum Outbound {
    /// A barrier snapshot; the task chunks it.
    Snapshot(DcCkfSnapshot),
    /// The consecutive deltas of one batch (several when it was split to fit the indexer's
    /// limits; one queue entry either way), with the producer-clock instant of the batch's
    /// oldest change (for the ack-lag metric).
    Deltas(Vec<DcCkfDelta>, Instant),
    /// The exact drain marker; the last frame of a graceful shutdown.
    Drain(DrainMarker),
}

/// Size limits of one attachment's frames, from the lease grant and the producer's own limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLimits {
    /// Most images one delta frame may carry (at least 1).
    pub max_images_per_delta: usize,
}

/// Why an attach request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttachRefused {
    /// The producer is shutting down.
    #[error("the producer is shutting down")]
    ShuttingDown,
    /// The publisher refused the lease or the snapshot.
    #[error(transparent)]
    Publisher(#[from] PublishError),
}

struct Slot {
    publisher: DcCkfPublisher,
    /// The open queue of the current attachment, if any.
    frames: Option<mpsc::Sender<Outbound>>,
    limits: FrameLimits,
    name: String,
}

/// Every attachment of the producer, indexed like the configured endpoints.
pub struct Fanout {
    slots: Vec<Slot>,
    metrics: Metrics,
}

impl Fanout {
    /// One (unattached) publisher per endpoint name.
    pub fn new(identity: &ProducerIdentity, endpoints: &[String], metrics: Metrics) -> Self {
        Self {
            slots: endpoints
                .iter()
                .map(|name| Slot {
                    publisher: DcCkfPublisher::new(identity.clone()),
                    frames: None,
                    limits: FrameLimits {
                        max_images_per_delta: usize::MAX,
                    },
                    name: name.clone(),
                })
                .collect(),
            metrics,
        }
    }

    /// Attaches endpoint `index` under `lease`: installs the lease, drains the pending dirty
    /// buckets to every other streaming attachment, then queues a barrier snapshot on `frames`.
    /// Returns the snapshot's sequence. A previous attachment of the same endpoint is dropped.
    ///
    /// # Errors
    /// [`AttachRefused::Publisher`] for a stale lease or a refused snapshot; the endpoint is
    /// then unattached.
    pub fn attach(
        &mut self,
        state: &mut DcCkfState,
        index: usize,
        lease: LaneLease,
        limits: FrameLimits,
        frames: mpsc::Sender<Outbound>,
    ) -> Result<u64, AttachRefused> {
        let slot = &mut self.slots[index];
        slot.frames = None;
        slot.publisher.install_lease(lease)?;
        slot.limits = FrameLimits {
            max_images_per_delta: limits.max_images_per_delta.max(1),
        };
        // The barrier: nothing may be pending when the snapshot copies the table. The new
        // publisher is awaiting its snapshot, so `deliver` skips it.
        self.publish(state);
        let slot = &mut self.slots[index];
        let snapshot = match slot.publisher.snapshot(state) {
            Ok(s) => s,
            Err(e) => {
                slot.publisher.fence(FenceReason::UncertainDelivery);
                return Err(e.into());
            }
        };
        let sequence = snapshot.sequence;
        match frames.try_send(Outbound::Snapshot(snapshot)) {
            Ok(()) => {
                slot.frames = Some(frames);
                Ok(sequence)
            }
            Err(_) => {
                // A fresh queue has room; only a task that already gave up gets here.
                slot.publisher.fence(FenceReason::UncertainDelivery);
                Err(PublishError::Fenced(FenceReason::UncertainDelivery).into())
            }
        }
    }

    /// Ends endpoint `index`'s attachment under `lease` (its task saw a failure or a
    /// retirement). Ignored when the endpoint has since attached under another lease.
    pub fn detach(&mut self, index: usize, lease: LaneLease, reason: FenceReason) {
        let slot = &mut self.slots[index];
        if slot.publisher.lease() == Some(lease) {
            slot.publisher.fence(reason);
            slot.frames = None;
        }
    }

    /// Takes the pending batch (if anything net-changed) and delivers it to every streaming
    /// attachment. Returns whether a batch was taken.
    pub fn publish(&mut self, state: &mut DcCkfState) -> bool {
        let Some(batch) = state.take_batch() else {
            return false;
        };
        self.metrics.batches.inc();
        self.metrics.batch_images.observe(batch.images.len() as f64);
        self.metrics
            .cycles_broken
            .inc_by(u64::from(batch.cycles_broken));
        self.deliver(&batch);
        true
    }

    fn deliver(&mut self, batch: &PublicationBatch) {
        for slot in &mut self.slots {
            let Some(frames) = &slot.frames else { continue };
            if slot.publisher.state() != PublisherState::Streaming {
                continue;
            }
            let mut deltas = Vec::new();
            let mut ok = true;
            for part in split(batch, slot.limits.max_images_per_delta) {
                match slot.publisher.delta(&part) {
                    Ok(delta) => deltas.push(delta),
                    Err(e) => {
                        tracing::warn!(indexer = %slot.name, error = %e, "publisher refused a delta; re-attaching");
                        ok = false;
                        break;
                    }
                }
            }
            if ok && let Err(e) = frames.try_send(Outbound::Deltas(deltas, batch.oldest_change)) {
                let why = match e {
                    TrySendError::Full(_) => "attachment queue full",
                    TrySendError::Closed(_) => "attachment task gone",
                };
                tracing::warn!(indexer = %slot.name, why, "fencing the attachment; it will re-attach with a new snapshot");
                ok = false;
            }
            if !ok {
                slot.publisher.fence(FenceReason::UncertainDelivery);
                slot.frames = None;
            }
        }
    }

    /// Queues the exact drain marker on every streaming attachment and closes every queue.
    /// Returns the number of markers queued. Call after the final [`publish`](Self::publish).
    pub fn drain(&mut self) -> usize {
        let mut queued = 0;
        for slot in &mut self.slots {
            let Some(frames) = slot.frames.take() else {
                continue;
            };
            match slot.publisher.drain_marker() {
                Ok(marker) => match frames.try_send(Outbound::Drain(marker)) {
                    Ok(()) => queued += 1,
                    Err(_) => {
                        tracing::warn!(indexer = %slot.name, "attachment queue full at shutdown; no drain marker")
                    }
                },
                Err(e) => {
                    tracing::warn!(indexer = %slot.name, error = %e, "no drain marker")
                }
            }
            slot.publisher.fence(FenceReason::Shutdown);
        }
        queued
    }

    /// Endpoints with an open attachment queue.
    pub fn attached(&self) -> usize {
        self.slots.iter().filter(|s| s.frames.is_some()).count()
    }
}

/// `batch` as consecutive parts of at most `max_images` images each, in order; the first part
/// carries the batch's broken-cycle count.
fn split(batch: &PublicationBatch, max_images: usize) -> Vec<PublicationBatch> {
    if batch.images.len() <= max_images {
        return vec![batch.clone()];
    }
    batch
        .images
        .chunks(max_images)
        .enumerate()
        .map(|(i, images)| PublicationBatch {
            images: images.to_vec(),
            oldest_change: batch.oldest_change,
            cycles_broken: if i == 0 { batch.cycles_broken } else { 0 },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ckf_core::addressing::TableFormat;
    use ckf_core::dc::{DcCkfConfig, MemberId};
    use ckf_core::frames::BucketImage;
    use ckf_core::identity::{PoolId, ProducerIncarnation};

    fn setup() -> (DcCkfState, Fanout) {
        let format = TableFormat::new(64, 1).unwrap();
        let identity = ProducerIdentity {
            pool: PoolId::new("d", "dc-a").unwrap(),
            incarnation: ProducerIncarnation(9),
            format,
        };
        let state = DcCkfState::new(DcCkfConfig::new(format)).unwrap();
        let fanout = Fanout::new(&identity, &["a".into(), "b".into()], Metrics::new());
        (state, fanout)
    }

    fn lease(epoch: u64) -> LaneLease {
        LaneLease {
            consumer_instance: 1,
            lane: 0,
            epoch,
        }
    }

    const WIDE: FrameLimits = FrameLimits {
        max_images_per_delta: usize::MAX,
    };

    #[test]
    fn attach_drains_pending_changes_to_the_others_before_its_snapshot() {
        let (mut state, mut fanout) = setup();
        let (tx_a, mut rx_a) = mpsc::channel(8);
        assert_eq!(fanout.attach(&mut state, 0, lease(1), WIDE, tx_a), Ok(0));
        let Ok(Outbound::Snapshot(snap_a)) = rx_a.try_recv() else {
            panic!("a snapshot first")
        };
        assert!(snap_a.buckets.iter().all(|&w| w == 0));

        state.store(MemberId::new(1, 0), &[11, 12, 13]);
        assert!(state.pending_dirty() > 0);
        let (tx_b, mut rx_b) = mpsc::channel(8);
        assert_eq!(fanout.attach(&mut state, 1, lease(2), WIDE, tx_b), Ok(0));
        assert_eq!(state.pending_dirty(), 0);
        // A got the pending change as its delta 0 -> 1 ...
        let Ok(Outbound::Deltas(deltas, _)) = rx_a.try_recv() else {
            panic!("a delta for a")
        };
        assert_eq!(deltas.len(), 1);
        assert_eq!((deltas[0].base_sequence, deltas[0].sequence), (0, 1));
        let mut rebuilt = snap_a.buckets.clone();
        for i in &deltas[0].images {
            rebuilt[i.bucket as usize] = i.image;
        }
        assert_eq!(rebuilt, state.buckets());
        // ... and B's barrier snapshot already contains it (and nothing else was queued).
        let Ok(Outbound::Snapshot(snap_b)) = rx_b.try_recv() else {
            panic!("a snapshot for b")
        };
        assert_eq!(snap_b.buckets, state.buckets());
        assert!(rx_b.try_recv().is_err());

        // Both streams continue with their own sequences.
        state.remove(MemberId::new(1, 0), &[12]);
        assert!(fanout.publish(&mut state));
        let Ok(Outbound::Deltas(a, _)) = rx_a.try_recv() else {
            panic!()
        };
        let Ok(Outbound::Deltas(b, _)) = rx_b.try_recv() else {
            panic!()
        };
        assert_eq!((a[0].base_sequence, a[0].sequence), (1, 2));
        assert_eq!((b[0].base_sequence, b[0].sequence), (0, 1));
        assert_eq!(a[0].images, b[0].images);

        // The exact drain markers.
        assert_eq!(fanout.drain(), 2);
        let Ok(Outbound::Drain(m)) = rx_a.try_recv() else {
            panic!()
        };
        assert_eq!(m.sequence, 2);
        let Ok(Outbound::Drain(m)) = rx_b.try_recv() else {
            panic!()
        };
        assert_eq!(m.sequence, 1);
        assert_eq!(fanout.attached(), 0);
    }

    #[test]
    fn a_full_queue_fences_only_that_attachment_and_stale_detaches_are_ignored() {
        let (mut state, mut fanout) = setup();
        let (tx_a, mut rx_a) = mpsc::channel(2);
        let (tx_b, mut rx_b) = mpsc::channel(64);
        fanout.attach(&mut state, 0, lease(1), WIDE, tx_a).unwrap();
        fanout.attach(&mut state, 1, lease(2), WIDE, tx_b).unwrap();
        for i in 0..4u64 {
            state.store(MemberId::new(i, 0), &[100 + i]);
            fanout.publish(&mut state);
        }
        // A's queue (snapshot + 1 batch) overflowed: A is fenced and its queue closed.
        assert_eq!(fanout.attached(), 1);
        let mut a_entries = 0;
        while rx_a.try_recv().is_ok() {
            a_entries += 1;
        }
        assert_eq!(a_entries, 2);
        assert!(rx_a.is_closed());
        // B saw every batch.
        let mut b_deltas = 0;
        while let Ok(entry) = rx_b.try_recv() {
            if let Outbound::Deltas(d, _) = entry {
                b_deltas += d.len();
            }
        }
        assert_eq!(b_deltas, 4);
        // A detach naming an older lease does not touch the current attachment.
        fanout.detach(1, lease(1), FenceReason::UncertainDelivery);
        assert_eq!(fanout.attached(), 1);
        fanout.detach(1, lease(2), FenceReason::UncertainDelivery);
        assert_eq!(fanout.attached(), 0);
        // A stale lease is refused on re-attach.
        let (tx, _rx) = mpsc::channel(2);
        assert!(matches!(
            fanout.attach(&mut state, 1, lease(2), WIDE, tx),
            Err(AttachRefused::Publisher(PublishError::StaleLease { .. }))
        ));
    }

    #[test]
    fn oversized_batches_become_consecutive_deltas() {
        let (mut state, mut fanout) = setup();
        let (tx, mut rx) = mpsc::channel(8);
        let narrow = FrameLimits {
            max_images_per_delta: 2,
        };
        fanout.attach(&mut state, 0, lease(1), narrow, tx).unwrap();
        let _snapshot = rx.try_recv().unwrap();
        state.store(MemberId::new(1, 0), &[1, 2, 3, 4, 5, 6, 7]);
        fanout.publish(&mut state);
        let Ok(Outbound::Deltas(deltas, _)) = rx.try_recv() else {
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
        let parts = split(&batch, 4);
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
        assert_eq!(split(&batch, 10).len(), 1);
    }
}
