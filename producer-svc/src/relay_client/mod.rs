//! One publisher task per configured indexer endpoint: the client side of `ckf.v1.Relay`.
//!
//! Each endpoint is an independent attachment with its own lease, barrier snapshot and sequence
//! continuity. The task runs [sessions](session) in a loop: when one fails (transport error,
//! stream end, `Retired` reply, a fence by the producer) the session names the
//! [`FenceReason`] (a `Retired` reason converts with ckf-proto's `From<v1::RetireReason>`), the
//! task tells the state actor to fence that publisher and acts on the reason's
//! [`Disposition`] (`ckf_core::failure`): [`Disposition::NewLeaseAndSnapshot`] waits out a
//! bounded exponential [`Backoff`] with jitter and attaches again (new lease, new barrier
//! snapshot); [`Disposition::Omission`] (a shutdown) ends the task. Every transition is logged
//! with its reason and exported as `ckf_producer_attachment_state`.
//!
//! Log context: the task runs inside a `relay` span (`indexer`, `pool`) and each session inside
//! a `session` span whose `lease` is recorded once granted, so the events themselves carry only
//! what is new (the end-to-end-matched events keep their fields unchanged).
//!
//! One failure is terminal: `Retired(SUPERSEDED)` on the current stream means *another*
//! attachment for this pool got a newer lease (a second producer process for the pool, or the
//! same indexer listed twice), because this task never runs two sessions at once. Re-attaching
//! would supersede the other producer in turn and the two would take the lane from each other
//! forever, so the task stops publishing to that endpoint, logs an error and waits for shutdown
//! (`DrainOutcome::Superseded`). A pool has exactly one producer.
//!
//! | file | owns |
//! | --- | --- |
//! | [`session`] | one attachment: connect, attach, snapshot chunks, deltas, heartbeats, drain |
//! | [`backoff`] | reconnect delays |

pub mod backoff;
pub mod session;

use std::time::Duration;

use ckf_core::failure::{Disposed, Disposition};
use ckf_core::identity::ProducerIdentity;
use ckf_core::publication::FenceReason;
use ckf_svc_kit::Shutdown;
use tracing::Instrument;

pub use backoff::Backoff;
use session::{Failure, SessionEnd};

use crate::actor::{ActorHandle, Command};
use crate::metrics::{AttachmentState, Metrics};

/// Transport settings of every publisher task (from the configuration).
#[derive(Debug, Clone)]
pub struct RelaySettings {
    /// Idle time before a heartbeat (further capped by the granted deadline / 3).
    pub heartbeat_interval: Duration,
    /// First reconnect delay.
    pub initial_backoff: Duration,
    /// Largest reconnect delay.
    pub max_backoff: Duration,
    /// Connect, lease-grant and per-frame send timeout.
    pub connect_timeout: Duration,
    /// How long to wait for the drained acknowledgement.
    pub drain_timeout: Duration,
    /// HTTP/2 keepalive ping interval and timeout.
    pub keepalive: Duration,
    /// The producer's own message size limit, in bytes.
    pub max_message_bytes: usize,
    /// Queue entries (batches) per attachment before the actor fences it.
    pub attachment_queue: usize,
    /// Trust roots and client certificate for `https://` endpoints (`[indexer_tls]`); the
    /// files are read again on every connection attempt, so rotated ones are picked up.
    pub tls: Option<ckf_svc_kit::tls::ClientTls>,
    /// The bearer token presented on every Relay stream (`indexer_token_file`), if any.
    pub indexer_token: std::sync::Arc<crate::access::IndexerToken>,
}

/// How one endpoint's publication ended at shutdown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainOutcome {
    /// The indexer acknowledged the exact drain marker `sequence`.
    Drained {
        /// The final sequence.
        sequence: u64,
    },
    /// The drain marker `sequence` was sent but not acknowledged.
    Unacknowledged {
        /// The drain marker's sequence.
        sequence: u64,
        /// What happened instead.
        why: String,
    },
    /// Not streaming at shutdown: no drain marker was sent.
    NotAttached,
    /// Another producer took over the pool at this indexer; publication there stopped.
    Superseded {
        /// The indexer's explanation.
        detail: String,
    },
}

/// The publisher task of one configured indexer endpoint: its attachment loop (attach, stream,
/// fence, back off, re-attach). Not the generated `ckf.v1.Relay` client, which it drives.
pub struct IndexerAttachment {
    index: usize,
    endpoint: String,
    identity: ProducerIdentity,
    actor: ActorHandle,
    metrics: Metrics,
    settings: RelaySettings,
    shutdown: Shutdown,
}

impl IndexerAttachment {
    /// A task for endpoint number `index` (its position in the configuration).
    pub fn new(
        index: usize,
        endpoint: String,
        identity: ProducerIdentity,
        actor: ActorHandle,
        metrics: Metrics,
        settings: RelaySettings,
        shutdown: Shutdown,
    ) -> Self {
        Self {
            index,
            endpoint,
            identity,
            actor,
            metrics,
            settings,
            shutdown,
        }
    }

    fn set_state(&self, state: AttachmentState) {
        self.metrics.set_attachment_state(&self.endpoint, state);
    }

    /// Attaches, publishes and re-attaches until shutdown; returns how the final drain went.
    /// Runs in a `relay` span naming the indexer and the pool.
    pub async fn run(self) -> DrainOutcome {
        // Error level: the span (and its fields) stays enabled under any log filter that lets
        // one of its events through.
        let span =
            tracing::error_span!("relay", indexer = %self.endpoint, pool = %self.identity.pool);
        self.sessions().instrument(span).await
    }

    async fn sessions(&self) -> DrainOutcome {
        let mut backoff = Backoff::new(self.settings.initial_backoff, self.settings.max_backoff);
        loop {
            if self.shutdown.is_triggered() {
                self.set_state(AttachmentState::Drained);
                return DrainOutcome::NotAttached;
            }
            let session = tracing::error_span!("session", lease = tracing::field::Empty);
            let f = match self.session().instrument(session).await {
                SessionEnd::Drained { sequence } => {
                    // The message is matched by the e2e tests (tests/): keep it stable.
                    tracing::info!(indexer = %self.endpoint, sequence, "drained: the indexer acknowledged the final sequence");
                    self.set_state(AttachmentState::Drained);
                    return DrainOutcome::Drained { sequence };
                }
                SessionEnd::DrainUnacknowledged { sequence, why } => {
                    tracing::warn!(sequence, %why, "drain marker not acknowledged");
                    self.set_state(AttachmentState::Drained);
                    return DrainOutcome::Unacknowledged { sequence, why };
                }
                SessionEnd::Shutdown => {
                    tracing::info!("shutdown while not streaming; no drain marker");
                    self.set_state(AttachmentState::Drained);
                    return DrainOutcome::NotAttached;
                }
                SessionEnd::Failed(f) => f,
            };
            self.metrics
                .detachments
                .with_label_values(&[&self.endpoint, f.label])
                .inc();
            self.fence(&f).await;
            if f.fence == FenceReason::Superseded {
                // Supersession is the one fence not recovered by its disposition (a new lease
                // would supersede the other producer in turn): see the module docs.
                // The message is matched by the e2e tests (tests/): keep it stable.
                tracing::error!(
                    indexer = %self.endpoint,
                    pool = %self.identity.pool,
                    detail = %f.detail,
                    "another producer attached for this pool; this producer stops publishing to this indexer (a pool has exactly one producer)"
                );
                self.set_state(AttachmentState::Superseded);
                self.shutdown.wait().await;
                return DrainOutcome::Superseded { detail: f.detail };
            }
            match f.fence.disposition() {
                Disposition::Omission => {
                    // A clean shutdown fence: nothing to recover.
                    self.set_state(AttachmentState::Drained);
                    return DrainOutcome::NotAttached;
                }
                // A fenced publisher never needs more than a new lease and a barrier snapshot
                // (`ckf_core::failure`); the stronger dispositions do not arise from a fence.
                Disposition::NewLeaseAndSnapshot
                | Disposition::RetireLane
                | Disposition::ProducerRebuild => {}
            }
            if f.was_streaming {
                backoff.reset();
            }
            let delay = backoff.next_delay();
            // The message is matched by the e2e tests (tests/): keep it stable.
            tracing::warn!(
                indexer = %self.endpoint,
                reason = f.label,
                detail = %f.detail,
                retry_in_ms = delay.as_millis() as u64,
                "attachment ended; publisher fenced, re-attaching after the backoff"
            );
            self.set_state(AttachmentState::Backoff);
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = self.shutdown.wait() => {}
            }
            if !self.shutdown.is_triggered() {
                self.metrics
                    .reconnects
                    .with_label_values(&[&self.endpoint])
                    .inc();
            }
        }
    }

    /// Tells the state actor to fence this endpoint's publisher under the failed lease.
    async fn fence(&self, f: &Failure) {
        let Some(lease) = f.lease else { return };
        let detach = Command::Detach {
            endpoint: self.index,
            lease,
            reason: f.fence,
        };
        // A stopped actor has nothing left to fence.
        let _ = self.actor.tell(detach).await;
    }
}
