//! `Fanout`: one producer state published to several attachments (indexer endpoints), with the
//! barrier rule across them, delta splitting and drain markers.
//!
//! Each attachment has its own [`DcCkfPublisher`] (lease, sequence, fence) and, while it is
//! attached, a [`FrameSink`]: the bounded queue toward whatever sends its frames (in
//! `producer-svc`, a tokio channel to the attachment's relay-client task). The fan-out owns the
//! rules that need every attachment at once (see [`crate::publication`], "Several publishers,
//! one state"):
//!
//! * **One batch for all.** [`Fanout::publish`] takes the state's pending batch once and turns
//!   it into deltas for every streaming attachment; an attachment still waiting for its
//!   snapshot is skipped (its barrier snapshot includes the change).
//! * **The barrier.** [`Fanout::attach`] installs the new lease, then drains the pending batch to
//!   every *other* streaming attachment, then copies the barrier snapshot, so no change falls
//!   between their streams and the new snapshot.
//! * **Splitting.** A batch bigger than an attachment's [`FrameLimits`] becomes consecutive
//!   deltas ([`PublicationBatch::split`]) in the batch's image order: a relocated fingerprint
//!   still reaches its new bucket before it leaves its old one, now across frames. All deltas of
//!   one batch go to the sink as one [`Outbound::Deltas`] entry.
//! * **Never wait.** Frames go out with [`FrameSink::try_send`]. An attachment whose sink is full
//!   or closed, or whose publisher refuses a delta, is fenced ([`FenceReason::UncertainDelivery`])
//!   and its sink dropped; whoever reads the sink sees it closed and re-attaches with a new lease
//!   and a new barrier snapshot.
//! * **Backed up.** A sink more than half full is [`FrameSink::backed_up`]: its reader is
//!   falling behind. [`Fanout::backed_up`] says whether any streaming attachment's sink is, so
//!   the caller can cut batches less often while it is (the changes coalesce in the pending
//!   batch instead of filling the queue) and a reader that stalls for a moment is not fenced.
//!   The fan-out itself never holds a batch back: a batch handed to [`Fanout::publish`] goes
//!   out at once, and a sink that is full still fences.
//! * **Drain.** [`Fanout::drain`] queues the exact drain marker on every streaming attachment,
//!   fences them all ([`FenceReason::Shutdown`]) and refuses later attaches.
//!
//! Nothing here measures or logs: every call returns what happened ([`PublishReport`],
//! [`AttachReport`], [`DrainReport`]) and the service turns that into metrics and log lines.

use std::time::Instant;

use thiserror::Error;

use crate::dc::DcCkfState;
use crate::dirty::PublicationBatch;
use crate::frames::{DcCkfDelta, DcCkfSnapshot, DrainMarker};
use crate::identity::{LaneLease, ProducerIdentity};
use crate::publication::{DcCkfPublisher, FenceReason, PublishError, PublisherState};

/// A frame for one attachment's sender.
#[derive(Debug, Clone)]
pub enum Outbound {
    /// A barrier snapshot (the sender chunks it).
    Snapshot(DcCkfSnapshot),
    /// The consecutive deltas of one batch (several when it was split to fit the attachment's
    /// [`FrameLimits`]; one sink entry either way), with the producer-clock instant of the
    /// batch's oldest change (for change-to-ack latency).
    Deltas(Vec<DcCkfDelta>, Instant),
    /// The exact drain marker; the last frame of a graceful shutdown.
    Drain(DrainMarker),
}

/// Why a [`FrameSink`] did not take a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Error)]
pub enum SinkError {
    /// The bounded queue is full: the sender fell behind.
    #[error("attachment queue full")]
    Full,
    /// The receiving side is gone.
    #[error("attachment task gone")]
    Closed,
}

/// The bounded, non-blocking queue of one attachment.
///
/// Dropping the sink must close the queue for its reader: that is how a fenced attachment's
/// sender learns it has to re-attach.
pub trait FrameSink {
    /// Queues `frame` without waiting.
    ///
    /// # Errors
    /// [`SinkError::Full`] or [`SinkError::Closed`]; the frame is dropped.
    fn try_send(&mut self, frame: Outbound) -> Result<(), SinkError>;

    /// Whether more than half of the queue is taken: the reader is falling behind. The
    /// default, for a sink that cannot tell, is `false`.
    fn backed_up(&self) -> bool {
        false
    }
}

/// Size limits of one attachment's frames (from the lease grant and the producer's own limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLimits {
    /// Most images one delta frame may carry (0 is treated as 1).
    pub max_images_per_delta: usize,
}

impl FrameLimits {
    /// No limit.
    pub const UNLIMITED: Self = Self {
        max_images_per_delta: usize::MAX,
    };
}

/// Why an attach was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AttachRefused {
    /// [`Fanout::close`] or [`Fanout::drain`] was called: the producer is shutting down.
    #[error("the producer is shutting down")]
    ShuttingDown,
    /// The publisher refused the lease or the snapshot, or the sink refused the snapshot
    /// (reported as [`PublishError::Fenced`] with [`FenceReason::UncertainDelivery`]).
    #[error(transparent)]
    Publisher(#[from] PublishError),
}

/// Why an attachment was fenced during a publication.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FenceCause {
    /// The publisher refused a delta (e.g. [`PublishError::SequenceExhausted`]).
    #[error("publisher refused a delta: {0}")]
    Refused(PublishError),
    /// The sink did not take the batch's deltas.
    #[error(transparent)]
    Sink(SinkError),
}

/// One attachment fenced by a publication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fenced {
    /// The attachment's index.
    pub attachment: usize,
    /// Why.
    pub cause: FenceCause,
}

/// What one [`Fanout::publish`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishReport {
    /// Images in the batch taken from the state.
    pub batch_images: usize,
    /// Ordering cycles broken in that batch ([`PublicationBatch::cycles_broken`]).
    pub cycles_broken: u32,
    /// Attachments that received the batch (as one [`Outbound::Deltas`] entry each).
    pub delivered: usize,
    /// Attachments fenced by this publication, in index order.
    pub fenced: Vec<Fenced>,
}

/// What one [`Fanout::attach`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachReport {
    /// The barrier publication to the other attachments, if a batch was pending.
    pub barrier: Option<PublishReport>,
    /// The barrier snapshot's sequence, or why the attach was refused (the attachment is then
    /// not attached).
    pub result: Result<u64, AttachRefused>,
}

/// Why a streaming attachment got no drain marker.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DrainMiss {
    /// The publisher had no marker to give.
    #[error("no drain marker: {0}")]
    NoMarker(PublishError),
    /// The sink did not take the marker.
    #[error(transparent)]
    Sink(SinkError),
}

/// What [`Fanout::drain`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainReport {
    /// Drain markers queued.
    pub queued: usize,
    /// Attached attachments that got no marker, in index order.
    pub missed: Vec<(usize, DrainMiss)>,
}

/// One indexer endpoint of the fan-out: its publisher, the sink of its current stream (when
/// attached) and that stream's frame limits. (The consumer side's attached stream is
/// [`crate::global::Attachment`].)
#[derive(Debug)]
struct Endpoint<S> {
    publisher: DcCkfPublisher,
    /// The open sink of the current attachment, if any.
    sink: Option<S>,
    limits: FrameLimits,
}

/// Every attachment of one producer state, indexed `0..len` (see the module docs).
#[derive(Debug)]
pub struct Fanout<S> {
    attachments: Vec<Endpoint<S>>,
    closed: bool,
}

impl<S: FrameSink> Fanout<S> {
    /// `count` unattached publishers for `identity`.
    pub fn new(identity: &ProducerIdentity, count: usize) -> Self {
        Self {
            attachments: (0..count)
                .map(|_| Endpoint {
                    publisher: DcCkfPublisher::new(identity.clone()),
                    sink: None,
                    limits: FrameLimits::UNLIMITED,
                })
                .collect(),
            closed: false,
        }
    }

    /// Number of attachments.
    pub fn len(&self) -> usize {
        self.attachments.len()
    }

    /// Whether there are no attachments at all.
    pub fn is_empty(&self) -> bool {
        self.attachments.is_empty()
    }

    /// Attachment `index`'s publisher (lease, sequence, state).
    ///
    /// # Panics
    /// When `index >= len()`.
    pub fn publisher(&self, index: usize) -> &DcCkfPublisher {
        &self.attachments[index].publisher
    }

    /// Whether attachment `index` has an open sink (it is streaming).
    ///
    /// # Panics
    /// When `index >= len()`.
    pub fn is_attached(&self, index: usize) -> bool {
        self.attachments[index].sink.is_some()
    }

    /// Attachments with an open sink.
    pub fn attached(&self) -> usize {
        self.attachments.iter().filter(|a| a.sink.is_some()).count()
    }

    /// Attachment `index`'s open sink, if it is attached (e.g. to read how full its queue is).
    ///
    /// # Panics
    /// When `index >= len()`.
    pub fn sink(&self, index: usize) -> Option<&S> {
        self.attachments[index].sink.as_ref()
    }

    /// Whether any streaming attachment's sink is [backed up](FrameSink::backed_up): its
    /// reader is falling behind (see the module docs). An attachment still waiting for its
    /// snapshot does not count.
    pub fn backed_up(&self) -> bool {
        self.attachments.iter().any(|a| {
            a.publisher.state() == PublisherState::Streaming
                && a.sink.as_ref().is_some_and(FrameSink::backed_up)
        })
    }

    /// Attaches `index` under `lease`: drops its previous sink, installs the lease, drains the
    /// pending batch to every other streaming attachment (the barrier), then queues a barrier
    /// snapshot on `sink`. On success the attachment streams with `sink`.
    ///
    /// # Errors
    /// In [`AttachReport::result`]: [`AttachRefused::ShuttingDown`] after [`close`](Self::close)
    /// (nothing changes); [`AttachRefused::Publisher`] for a stale lease (nothing else changes),
    /// a refused snapshot or a sink that refused it (the publisher is then fenced).
    ///
    /// # Panics
    /// When `index >= len()`.
    pub fn attach(
        &mut self,
        state: &mut DcCkfState,
        index: usize,
        lease: LaneLease,
        limits: FrameLimits,
        mut sink: S,
    ) -> AttachReport {
        if self.closed {
            return AttachReport {
                barrier: None,
                result: Err(AttachRefused::ShuttingDown),
            };
        }
        let a = &mut self.attachments[index];
        a.sink = None;
        if let Err(e) = a.publisher.install_lease(lease) {
            return AttachReport {
                barrier: None,
                result: Err(e.into()),
            };
        }
        a.limits = limits;
        // The barrier: nothing may be pending when the snapshot copies the table. The new
        // publisher awaits its snapshot, so the publication skips it.
        let barrier = self.publish(state);
        let a = &mut self.attachments[index];
        let result = match a.publisher.snapshot(state) {
            Err(e) => {
                a.publisher.fence(FenceReason::UncertainDelivery);
                Err(e.into())
            }
            Ok(snapshot) => {
                let sequence = snapshot.sequence;
                match sink.try_send(Outbound::Snapshot(snapshot)) {
                    Ok(()) => {
                        a.sink = Some(sink);
                        Ok(sequence)
                    }
                    Err(_) => {
                        a.publisher.fence(FenceReason::UncertainDelivery);
                        Err(PublishError::Fenced(FenceReason::UncertainDelivery).into())
                    }
                }
            }
        };
        AttachReport { barrier, result }
    }

    /// Ends attachment `index` under `lease` (its sender saw a failure or a retirement): fences
    /// the publisher with `reason` and drops the sink. Returns `false`, changing nothing, when
    /// the attachment has since attached under another lease (a stale detach).
    ///
    /// # Panics
    /// When `index >= len()`.
    pub fn detach(&mut self, index: usize, lease: LaneLease, reason: FenceReason) -> bool {
        let a = &mut self.attachments[index];
        if a.publisher.lease() != Some(lease) {
            return false;
        }
        a.publisher.fence(reason);
        a.sink = None;
        true
    }

    /// Takes the pending batch (if anything net-changed) and queues it, split to each
    /// attachment's limits, on every streaming attachment; fences those that cannot take it.
    /// Returns `None` when nothing was pending.
    pub fn publish(&mut self, state: &mut DcCkfState) -> Option<PublishReport> {
        let batch = state.take_batch()?;
        let mut report = PublishReport {
            batch_images: batch.images.len(),
            cycles_broken: batch.cycles_broken,
            delivered: 0,
            fenced: Vec::new(),
        };
        for (index, a) in self.attachments.iter_mut().enumerate() {
            let Some(sink) = &mut a.sink else { continue };
            if a.publisher.state() != PublisherState::Streaming {
                continue;
            }
            match deltas(&mut a.publisher, &batch, a.limits) {
                Ok(deltas) => match sink.try_send(Outbound::Deltas(deltas, batch.oldest_change)) {
                    Ok(()) => {
                        report.delivered += 1;
                        continue;
                    }
                    Err(e) => report.fenced.push(Fenced {
                        attachment: index,
                        cause: FenceCause::Sink(e),
                    }),
                },
                Err(e) => report.fenced.push(Fenced {
                    attachment: index,
                    cause: FenceCause::Refused(e),
                }),
            }
            a.publisher.fence(FenceReason::UncertainDelivery);
            a.sink = None;
        }
        Some(report)
    }

    /// Refuses every later attach ([`AttachRefused::ShuttingDown`]); attachments that stream
    /// keep streaming until [`drain`](Self::drain).
    pub fn close(&mut self) {
        self.closed = true;
    }

    /// Closes the fan-out, queues the exact drain marker on every attached attachment, fences
    /// every publisher ([`FenceReason::Shutdown`]) and drops every sink. Call after the final
    /// [`publish`](Self::publish): a marker names the last batch sent.
    pub fn drain(&mut self) -> DrainReport {
        self.closed = true;
        let mut report = DrainReport {
            queued: 0,
            missed: Vec::new(),
        };
        for (index, a) in self.attachments.iter_mut().enumerate() {
            let Some(mut sink) = a.sink.take() else {
                continue;
            };
            match a.publisher.drain_marker() {
                Ok(marker) => match sink.try_send(Outbound::Drain(marker)) {
                    Ok(()) => report.queued += 1,
                    Err(e) => report.missed.push((index, DrainMiss::Sink(e))),
                },
                Err(e) => report.missed.push((index, DrainMiss::NoMarker(e))),
            }
            a.publisher.fence(FenceReason::Shutdown);
        }
        report
    }
}

/// `batch` as `publisher`'s consecutive deltas, split to `limits`.
fn deltas(
    publisher: &mut DcCkfPublisher,
    batch: &PublicationBatch,
    limits: FrameLimits,
) -> Result<Vec<DcCkfDelta>, PublishError> {
    batch
        .split(limits.max_images_per_delta)
        .iter()
        .map(|part| publisher.delta(part))
        .collect()
}
