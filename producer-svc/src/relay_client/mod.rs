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
//! Supersession is recovered without fighting: `Retired(SUPERSEDED)` on the current stream
//! means *another* attachment for this pool got a newer lease (a second producer process for
//! the pool, or the same indexer listed twice), because this task never runs two sessions at
//! once. Re-attaching as a fresh producer does (`ATTACH_MODE_TAKEOVER`) would supersede the
//! other producer in turn and the two would take the lane from each other forever. Instead the
//! task logs an ERROR naming the pool and the new holder, exports `superseded` and then
//! `standby`, and from then on attaches to that endpoint with `ATTACH_MODE_IF_VACANT` under the
//! same bounded backoff (at most `max_backoff` apart). The indexer refuses such an attach
//! (`FAILED_PRECONDITION`, metadata `ckf-attach-refused: occupied`) while the other producer's
//! attachment is live, changing nothing; each refusal is counted
//! (`ckf_producer_standby_refusals_total`) and logged at most once per [`STANDBY_LOG_EVERY`].
//! Once the lane is vacant (the other producer drained, was killed and missed the heartbeat
//! deadline, or was retired) the attach is granted and the task publishes a barrier snapshot
//! as usual. A fresh producer start always uses `TAKEOVER`: the newest producer wins, and the
//! older one stands by. The same holds after this producer stalled (SIGSTOP, a frozen VM)
//! past the indexer's heartbeat deadline, told by `Retired(HEARTBEAT_TIMEOUT)` or measured as
//! the longest gap between its own sends: it re-attaches `IF_VACANT`, so a standby that
//! recovered the lane meanwhile keeps it (one lane swap per stall, not two). The producer stays `SERVING` on health and keeps answering Ingest while
//! it stands by: it holds its exact state and is ready to publish it the moment the lane is
//! vacant.
//!
//! | file | owns |
//! | --- | --- |
//! | `attachment` | [`IndexerAttachment`] (one endpoint's task: its parts) and [`RelaySettings`] |
//! | [`session`] | one attachment: connect, attach, snapshot chunks, deltas, heartbeats, drain |
//! | [`backoff`] | reconnect delays |

mod attachment;
pub mod backoff;
pub mod session;

use std::time::Duration;

use std::time::Instant;

use ckf_core::failure::{Disposed, Disposition};
use ckf_core::global::AttachMode;
use ckf_core::publication::FenceReason;
use tracing::Instrument;

pub use attachment::{IndexerAttachment, RelaySettings};
pub use backoff::Backoff;
use session::{Failure, LANE_OCCUPIED, SessionEnd};

/// Most one standby refusal log line per endpoint this often (every refusal is counted).
pub const STANDBY_LOG_EVERY: Duration = Duration::from_secs(60);

use crate::actor::Command;
use crate::metrics::AttachmentState;

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
    /// Another producer took over the pool at this indexer and still held it at shutdown
    /// (this endpoint was standing by).
    Superseded {
        /// The indexer's explanation.
        detail: String,
    },
}

/// An endpoint superseded by another producer, waiting for its lane to be vacant.
#[derive(Debug)]
struct Standby {
    /// How the supersession (or the first refusal) was explained.
    superseded: String,
    /// Refusals since standing by.
    refusals: u64,
    /// When a refusal was last logged.
    logged: Option<Instant>,
}

impl Standby {
    fn new(superseded: String) -> Self {
        Self {
            superseded,
            refusals: 0,
            logged: None,
        }
    }
}

impl IndexerAttachment {
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
        // A fresh start takes the lane over (unless configured as a hot standby); after a
        // supersession, only a vacant lane is taken.
        let mut mode = match self.settings.start_mode {
            crate::config::StartMode::Takeover => AttachMode::Takeover,
            crate::config::StartMode::IfVacant => AttachMode::IfVacant,
        };
        let mut standby: Option<Standby> = None;
        loop {
            if self.shutdown.is_triggered() {
                return self.ended_not_attached(standby.as_ref());
            }
            let session = tracing::error_span!("session", lease = tracing::field::Empty);
            let f = match self
                .session(mode, standby.is_some())
                .instrument(session)
                .await
            {
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
                SessionEnd::Shutdown => return self.ended_not_attached(standby.as_ref()),
                SessionEnd::Failed(f) => f,
            };
            if f.label == LANE_OCCUPIED {
                // Still held by the other live producer: nothing changed at the indexer.
                let st = standby.get_or_insert_with(|| Standby::new(f.detail.clone()));
                self.standby_refused(st, &f.detail);
                self.retry_after(backoff.next_delay()).await;
                continue;
            }
            if f.lease.is_some() {
                // A lease was granted: whatever held the lane before is gone.
                standby = None;
            }
            if f.outlived_deadline && mode == AttachMode::Takeover {
                // The indexer retired this attachment for silence (this process stalled past the
                // heartbeat deadline): a standby producer may have recovered the lane since.
                // Taking it back would swap the lane twice per stall; a vacant lane is granted
                // to IF_VACANT at once, so nothing is lost when no one took it.
                tracing::warn!(
                    indexer = %self.endpoint,
                    detail = %f.detail,
                    "silent past the indexer's heartbeat deadline; re-attaching IF_VACANT so a producer that took the lane meanwhile keeps it"
                );
                mode = AttachMode::IfVacant;
            }
            self.metrics
                .detachments
                .with_label_values(&[&self.endpoint, f.label])
                .inc();
            self.fence(&f).await;
            if f.fence == FenceReason::Superseded {
                // The message is matched by the e2e tests (tests/): keep it stable.
                tracing::error!(
                    indexer = %self.endpoint,
                    pool = %self.identity.pool,
                    detail = %f.detail,
                    "another producer holds this pool at this indexer; standing by, retrying IF_VACANT until the lane is vacant"
                );
                self.set_state(AttachmentState::Superseded);
                mode = AttachMode::IfVacant;
                standby = Some(Standby::new(f.detail.clone()));
                backoff.reset();
                // `superseded` stays exported until the first refusal confirms the other
                // producer is live (`standby`) or a lease is granted.
                self.retry_after(backoff.next_delay()).await;
                continue;
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
            self.retry_after(delay).await;
        }
    }

    /// The end of the task when shutdown finds it not attached.
    fn ended_not_attached(&self, standby: Option<&Standby>) -> DrainOutcome {
        match standby {
            Some(st) => {
                tracing::info!("shutdown while standing by; no drain marker");
                self.set_state(AttachmentState::Standby);
                DrainOutcome::Superseded {
                    detail: st.superseded.clone(),
                }
            }
            None => {
                tracing::info!("shutdown while not streaming; no drain marker");
                self.set_state(AttachmentState::Drained);
                DrainOutcome::NotAttached
            }
        }
    }

    /// Counts one standby refusal and logs it at most once per [`STANDBY_LOG_EVERY`].
    fn standby_refused(&self, st: &mut Standby, detail: &str) {
        self.set_state(AttachmentState::Standby);
        self.metrics
            .standby_refusals
            .with_label_values(&[&self.endpoint])
            .inc();
        st.refusals += 1;
        if st.logged.is_none_or(|at| at.elapsed() >= STANDBY_LOG_EVERY) {
            st.logged = Some(Instant::now());
            // The message is matched by the e2e tests (tests/): keep it stable.
            tracing::warn!(
                indexer = %self.endpoint,
                refusals = st.refusals,
                detail,
                "standing by: the lane is held by another live producer (IF_VACANT refused)"
            );
        }
    }

    /// Waits `delay` (or until shutdown), counting the reconnect that follows.
    async fn retry_after(&self, delay: Duration) {
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
