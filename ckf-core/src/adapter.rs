//! `LocalCkfAdapter`: the in-process producer -> consumer composition (docs/design.md, "Lane
//! recovery and failure boundaries": "The in-process `LocalCkfAdapter` exercises this complete
//! boundary today").
//!
//! One adapter owns a pool's [`DcCkfState`] and its [`DcCkfPublisher`], and feeds one lane of a
//! shared [`GlobalCkfIndexer`] directly (no transport). Every frame goes through the same
//! acceptance rules a remote stream would meet. Faults can be injected on the "wire" (drop,
//! duplicate or corrupt the next delta, fail the consumer midway through applying one), and the
//! adapter recovers exactly as [`crate::failure`] prescribes: a retired lane is a stream
//! uncertainty for a trustworthy producer, so it takes a **new lease and sends a barrier
//! snapshot**; the producer's exact state is never touched.
//!
//! Test and demo support only: compiled with the `testing` feature (ckf-core's own tests turn
//! it on), never into the services.
//!
//! ```text
//! apply(event) -> publish(): take_batch -> delta N->N+1 -> [fault?] -> ingest
//! drain(): publish pending -> drain marker N -> Drained | Retired(LostFinalDelta) -> recover
//! recover(): grant_lease -> install_lease -> barrier snapshot (chunked) -> Activated
//! ```

use std::sync::Arc;

use thiserror::Error;

use crate::dc::{DcCkfState, EventOutcome, KvEvent};
use crate::failure::{Disposed, Disposition};
use crate::frames::BucketImage;
use crate::global::{AttachError, GlobalCkfIndexer};
use crate::identity::{LaneIndex, ProducerIdentity};
use crate::lane::{Frame, IngestOutcome, LaneStatus, RetireReason};
use crate::publication::{DcCkfPublisher, PublishError};

/// A fault injected on the in-process "wire" or in the consumer. Each applies once, to the next
/// delta the adapter publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The next delta is lost (never delivered); its sequence is consumed.
    DropNextDelta,
    /// The next delta is delivered twice (the replay is a gap and retires the lane).
    DuplicateNextDelta,
    /// The next delta's first image is repeated (a malformed delta; nothing is applied).
    CorruptNextDelta,
    /// The consumer fails after storing this many images of the next delta (feature `testing`:
    /// it needs the consumer's fault hook).
    #[cfg(feature = "testing")]
    FailApplyAfter(usize),
}

/// Errors the adapter cannot recover from by itself.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AdapterError {
    /// The consumer refused the attach (unknown pool, format mismatch): configuration.
    #[error("attach refused: {0}")]
    Attach(#[from] AttachError),
    /// The publisher refused (stale lease, exhausted sequence, ...).
    #[error("publisher: {0}")]
    Publish(#[from] PublishError),
    /// A frame of the current stream was neither applied nor answered with a retirement
    /// (e.g. ignored as stale): another stream holds the lane.
    #[error("consumer answered {0:?}; another stream holds the lane")]
    Unexpected(IngestOutcome),
}

/// What one publication step did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The consumer's answer to the frame (None when nothing was pending or it was dropped).
    pub outcome: Option<IngestOutcome>,
    /// The lane was retired and recovered with a new lease and barrier snapshot.
    pub recovered: Option<RetireReason>,
}

/// Counters of the adapter's stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdapterStats {
    /// Deltas delivered (including duplicates and corrupted ones).
    pub deltas_delivered: u64,
    /// Deltas dropped by fault injection.
    pub deltas_dropped: u64,
    /// Barrier snapshots sent (the first one included).
    pub snapshots: u64,
    /// Recoveries (new lease + snapshot after a retirement).
    pub recoveries: u64,
}

/// In-process producer -> consumer lane; see the module docs.
#[derive(Debug)]
pub struct LocalCkfAdapter {
    state: DcCkfState,
    publisher: DcCkfPublisher,
    indexer: Arc<GlobalCkfIndexer>,
    lane: LaneIndex,
    chunk_bytes: usize,
    fault: Option<Fault>,
    stats: AdapterStats,
}

impl LocalCkfAdapter {
    /// Attaches `state` (published as `identity`) to its lane of `indexer`: grants a lease and
    /// sends a barrier snapshot in chunks of at most `chunk_bytes` bytes.
    ///
    /// # Errors
    /// [`AdapterError::Attach`] (unknown pool, format mismatch), [`AdapterError::Publish`].
    pub fn attach(
        state: DcCkfState,
        identity: ProducerIdentity,
        indexer: Arc<GlobalCkfIndexer>,
        chunk_bytes: usize,
    ) -> Result<Self, AdapterError> {
        let lane = indexer
            .lane_of(&identity.pool)
            .ok_or_else(|| AttachError::UnknownPool {
                pool: identity.pool.clone(),
                configured: indexer.manifest().lanes.clone(),
            })?;
        let mut adapter = Self {
            state,
            publisher: DcCkfPublisher::new(identity),
            indexer,
            lane,
            chunk_bytes,
            fault: None,
            stats: AdapterStats::default(),
        };
        adapter.resnapshot()?;
        Ok(adapter)
    }

    /// The producer state (read-only; mutate through [`LocalCkfAdapter::apply`]).
    pub fn state(&self) -> &DcCkfState {
        &self.state
    }

    /// The consumer lane.
    pub fn lane(&self) -> LaneIndex {
        self.lane
    }

    /// The publisher (lease, sequence, stream state).
    pub fn publisher(&self) -> &DcCkfPublisher {
        &self.publisher
    }

    /// Stream counters.
    pub fn stats(&self) -> AdapterStats {
        self.stats
    }

    /// The consumer's view of the lane.
    pub fn lane_status(&self) -> LaneStatus {
        self.indexer
            .lane_status(self.lane)
            .expect("the adapter's lane is in the manifest")
    }

    /// Arms `fault` for the next delta (replacing any armed fault).
    pub fn inject(&mut self, fault: Fault) {
        self.fault = Some(fault);
    }

    /// Applies one KV event to the producer state and publishes the resulting batch.
    ///
    /// # Errors
    /// As [`LocalCkfAdapter::publish`]; the event itself is applied in any case.
    pub fn apply(&mut self, event: &KvEvent) -> Result<(EventOutcome, Delivery), AdapterError> {
        let outcome = self.state.apply(event);
        Ok((outcome, self.publish()?))
    }

    /// Publishes the pending batch (if any) as one delta, through the armed fault, and recovers
    /// the lane if the consumer retired it.
    ///
    /// # Errors
    /// [`AdapterError::Publish`], [`AdapterError::Unexpected`].
    pub fn publish(&mut self) -> Result<Delivery, AdapterError> {
        let Some(batch) = self.state.take_batch() else {
            return Ok(Delivery {
                outcome: None,
                recovered: None,
            });
        };
        let mut delta = self.publisher.delta(&batch)?;
        let fault = self.fault.take();
        let outcome = match fault {
            Some(Fault::DropNextDelta) => {
                self.stats.deltas_dropped += 1;
                return Ok(Delivery {
                    outcome: None,
                    recovered: None,
                });
            }
            Some(Fault::DuplicateNextDelta) => {
                let frame = Frame::Delta(delta);
                let first = self.deliver(&frame);
                if !matches!(first, IngestOutcome::Applied { .. }) {
                    first
                } else {
                    self.deliver(&frame)
                }
            }
            Some(Fault::CorruptNextDelta) => {
                let first: BucketImage = delta.images[0];
                delta.images.push(first);
                self.deliver(&Frame::Delta(delta))
            }
            #[cfg(feature = "testing")]
            Some(Fault::FailApplyAfter(n)) => {
                self.indexer
                    .inject_apply_fault(self.lane, n)
                    .expect("the adapter's lane is in the manifest");
                self.deliver(&Frame::Delta(delta))
            }
            None => self.deliver(&Frame::Delta(delta)),
        };
        self.settle(outcome)
    }

    /// Publishes anything pending, then sends the exact drain marker. A lost final delta is
    /// caught here (the marker's sequence differs from the installed one): the lane is retired
    /// and the adapter recovers with a new lease and a barrier snapshot.
    ///
    /// # Errors
    /// [`AdapterError::Publish`], [`AdapterError::Unexpected`].
    pub fn drain(&mut self) -> Result<Delivery, AdapterError> {
        let pending = self.publish()?;
        if pending.recovered.is_some() {
            // The snapshot just sent is exact; drain it too.
            return self.drain();
        }
        let marker = self.publisher.drain_marker()?;
        let outcome = self.indexer.ingest_now(&Frame::Drain(marker));
        self.settle(outcome)
    }

    /// Takes a new lease and sends a barrier snapshot (the recovery of
    /// [`Disposition::NewLeaseAndSnapshot`]).
    ///
    /// # Errors
    /// [`AdapterError::Attach`], [`AdapterError::Publish`], [`AdapterError::Unexpected`].
    pub fn resnapshot(&mut self) -> Result<(), AdapterError> {
        let lease = self.indexer.grant_lease(self.publisher.identity())?;
        self.publisher.install_lease(lease)?;
        // Barrier: changes not yet published are part of the snapshot (this adapter is the
        // state's only publisher, so the drained batch has no other recipient).
        while self.state.take_batch().is_some() {}
        let snapshot = self.publisher.snapshot(&self.state)?;
        self.stats.snapshots += 1;
        let mut last = None;
        for chunk in snapshot.chunks(self.chunk_bytes) {
            let outcome = self.indexer.ingest_now(&Frame::Chunk(chunk));
            match outcome {
                IngestOutcome::ChunkAccepted { .. } | IngestOutcome::Activated { .. } => {}
                other => return Err(AdapterError::Unexpected(other)),
            }
            last = Some(outcome);
        }
        match last {
            Some(IngestOutcome::Activated { .. }) => Ok(()),
            other => Err(AdapterError::Unexpected(
                other.unwrap_or(IngestOutcome::ChunkAccepted { next_bucket: 0 }),
            )),
        }
    }

    fn deliver(&mut self, frame: &Frame) -> IngestOutcome {
        self.stats.deltas_delivered += 1;
        self.indexer.ingest_now(frame)
    }

    /// Turns a consumer answer into a delivery, recovering a retired lane.
    fn settle(&mut self, outcome: IngestOutcome) -> Result<Delivery, AdapterError> {
        match outcome {
            IngestOutcome::Applied { .. } | IngestOutcome::Drained { .. } => Ok(Delivery {
                outcome: Some(outcome),
                recovered: None,
            }),
            IngestOutcome::Retired(ref reason) => {
                debug_assert_eq!(reason.disposition(), Disposition::RetireLane);
                let reason = reason.clone();
                self.resnapshot()?;
                self.stats.recoveries += 1;
                Ok(Delivery {
                    outcome: Some(outcome),
                    recovered: Some(reason),
                })
            }
            other => Err(AdapterError::Unexpected(other)),
        }
    }
}
