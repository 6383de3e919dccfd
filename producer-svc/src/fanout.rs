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
    use ckf_core::frames::BucketImage;

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
