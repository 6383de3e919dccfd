//! The attach loop of one relay session: attach, publish, and on a failure fence the publisher,
//! back off and attach again, standing by while another live producer holds the lane. What to
//! do after each failure is `ckf_core::relay_session::AttachPolicy`'s decision.

use std::time::{Duration, Instant};

use ckf_core::global::AttachMode;
use ckf_core::relay_session::{AttachPolicy, NextAttach, StandbyCause};
use tracing::Instrument;

use super::attachment::{DrainOutcome, IndexerAttachment};
use super::backoff::Backoff;
use super::session::{Failure, SessionEnd};
use crate::actor::Command;
use crate::config::StartMode;
use crate::metrics::AttachmentState;

/// Most one standby refusal log line per endpoint this often (every refusal is counted).
pub const STANDBY_LOG_EVERY: Duration = Duration::from_secs(60);

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
        let mut policy = AttachPolicy::new(match self.settings.start_mode {
            StartMode::Takeover => AttachMode::Takeover,
            StartMode::IfVacant => AttachMode::IfVacant,
        });
        // Who holds the lane while this producer stands by (for the logs and the outcome).
        let mut standby: Option<Standby> = None;
        loop {
            if self.shutdown.is_triggered() {
                return self.ended_not_attached(standby.as_ref(), policy.standby());
            }
            let session = tracing::error_span!("session", lease = tracing::field::Empty);
            let f = match self
                .session(policy.mode(), policy.standing_by())
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
                SessionEnd::Shutdown => {
                    return self.ended_not_attached(standby.as_ref(), policy.standby());
                }
                SessionEnd::Failed(f) => f,
            };
            let decision = policy.after_failure(&f.as_session_failure());
            if !policy.standing_by() {
                standby = None;
            }
            match decision.next {
                NextAttach::StillOccupied => {
                    // Still held by the other live producer: nothing changed at the indexer.
                    let st = standby.get_or_insert_with(|| Standby::new(f.detail.clone()));
                    self.standby_refused(st, &f.detail);
                    self.retry_after(backoff.next_delay()).await;
                }
                NextAttach::StandBy => {
                    self.detached(&f, decision.yielded).await;
                    // The message is matched by the e2e tests (tests/): keep it stable.
                    tracing::error!(
                        indexer = %self.endpoint,
                        pool = %self.identity.pool,
                        detail = %f.detail,
                        "another producer holds this pool at this indexer; standing by, retrying IF_VACANT until the lane is vacant"
                    );
                    self.set_state(AttachmentState::Superseded);
                    standby = Some(Standby::new(f.detail.clone()));
                    backoff.reset();
                    // `superseded` stays exported until the first refusal confirms the other
                    // producer is live (`standby`) or a lease is granted.
                    self.retry_after(backoff.next_delay()).await;
                }
                NextAttach::Stop => {
                    self.detached(&f, decision.yielded).await;
                    // A clean shutdown fence: nothing to recover.
                    self.set_state(AttachmentState::Drained);
                    return DrainOutcome::NotAttached;
                }
                NextAttach::Retry { reset_backoff } => {
                    self.detached(&f, decision.yielded).await;
                    if reset_backoff {
                        backoff.reset();
                    }
                    let delay = backoff.next_delay();
                    let retry_in_ms = delay.as_millis() as u64;
                    // The messages are matched by the e2e tests (tests/): keep them stable,
                    // both starting `attachment ended`. Only a granted lease has a publisher
                    // to fence (`fence`).
                    let what = if f.lease.is_some() {
                        "attachment ended; publisher fenced, re-attaching after the backoff"
                    } else {
                        "attachment ended before a lease was granted; nothing to fence, re-attaching after the backoff"
                    };
                    tracing::warn!(
                        indexer = %self.endpoint,
                        reason = f.label,
                        detail = %f.detail,
                        retry_in_ms,
                        "{what}"
                    );
                    self.set_state(AttachmentState::Backoff);
                    self.retry_after(delay).await;
                }
            }
        }
    }

    /// What every failure but a refused `IF_VACANT` attach does: say when this producer yields
    /// the lane, count the detachment and fence the publisher under the failed lease.
    async fn detached(&self, f: &Failure, yielded: bool) {
        if yielded {
            // The indexer retired this attachment for silence (this process stalled past the
            // heartbeat deadline): a standby producer may have recovered the lane since.
            tracing::warn!(
                indexer = %self.endpoint,
                detail = %f.detail,
                "silent past the indexer's heartbeat deadline; re-attaching IF_VACANT so a producer that took the lane meanwhile keeps it"
            );
        }
        self.metrics
            .detachments
            .with_label_values(&[&self.endpoint, f.label])
            .inc();
        self.fence(f).await;
    }

    /// The end of the task when shutdown finds it not attached; `cause`: why the policy
    /// stands by, if it does.
    fn ended_not_attached(
        &self,
        standby: Option<&Standby>,
        cause: Option<StandbyCause>,
    ) -> DrainOutcome {
        match standby {
            Some(st) => {
                tracing::info!("shutdown while standing by; no drain marker");
                self.set_state(AttachmentState::Standby);
                let detail = st.superseded.clone();
                match cause {
                    // A hot standby refused all along was never superseded.
                    Some(StandbyCause::NeverHeld) => DrainOutcome::StandingBy { detail },
                    Some(StandbyCause::Superseded) | None => DrainOutcome::Superseded { detail },
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
