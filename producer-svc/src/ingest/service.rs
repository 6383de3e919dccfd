//! The state every `Ingest` handler shares, and the one path a batch takes into the state actor.

use ckf_core::dc::Quotas;
use ckf_core::identity::ProducerIdentity;
use ckf_proto::v1;
use ckf_svc_kit::Shutdown;

use super::convert;
use crate::actor::{ActorHandle, Command};
use crate::error::RequestError;
use crate::events::{BatchReport, IngestBatch};
use crate::metrics::Metrics;

/// Shared by every handler: the actor's command channel and the producer's identity.
#[derive(Debug, Clone)]
pub struct IngestService {
    pub(super) actor: ActorHandle,
    pub(super) identity: ProducerIdentity,
    pub(super) shutdown: Shutdown,
    pub(super) max_events_per_batch: usize,
    /// The size quotas checked at decode (`[quotas]`; the holding ones are the actor's).
    pub(super) quotas: Quotas,
    /// Counts size-quota refusals (`ckf_producer_quota_refusals_total`).
    pub(super) metrics: Metrics,
    /// Who may call, publish as which source and touch which workers (`[ingest_auth]`).
    pub(super) access: std::sync::Arc<crate::access::IngestAccess>,
    /// The pool's load, where `ReportLoad` pushes a worker's share.
    pub(super) load: std::sync::Arc<crate::engines::load::LoadBoard>,
}

impl IngestService {
    /// A service feeding `actor`, refusing batches above `max_events_per_batch` events or
    /// `quotas`' size limits, and pushing loads into `load`.
    pub fn new(
        actor: ActorHandle,
        identity: ProducerIdentity,
        shutdown: Shutdown,
        max_events_per_batch: usize,
        quotas: Quotas,
        metrics: Metrics,
        load: std::sync::Arc<crate::engines::load::LoadBoard>,
    ) -> Self {
        Self {
            load,
            actor,
            identity,
            shutdown,
            max_events_per_batch,
            quotas,
            metrics,
            access: std::sync::Arc::new(crate::access::IngestAccess::off(
                &prometheus::Registry::new(),
            )),
        }
    }

    /// The same service checking every call against `access` (`[ingest_auth]`).
    pub fn with_access(mut self, access: std::sync::Arc<crate::access::IngestAccess>) -> Self {
        self.access = access;
        self
    }

    /// [`IngestService::submit`] after `caller`'s grant allowed the batch (source id, workers).
    ///
    /// # Errors
    /// [`RequestError::Access`] for a refused batch (nothing applied), else as `submit`.
    pub(crate) async fn submit_as(
        &self,
        caller: &crate::access::Caller,
        batch: v1::KvEventBatch,
    ) -> Result<v1::KvEventBatchResult, RequestError> {
        caller.authorize(&batch)?;
        self.submit(batch).await
    }

    /// Decodes `batch`, applies it through the actor and returns the wire result.
    ///
    /// # Errors
    /// [`RequestError`] for a batch refused whole or a producer that is shutting down.
    pub(crate) async fn submit(
        &self,
        batch: v1::KvEventBatch,
    ) -> Result<v1::KvEventBatchResult, RequestError> {
        if self.shutdown.is_triggered() {
            return Err(RequestError::ShuttingDown);
        }
        let batch = convert::batch_from_wire(batch, self.max_events_per_batch, &self.quotas)
            .inspect_err(|e| {
                if let RequestError::Quota(q) = e {
                    self.metrics
                        .quota_refusals
                        .with_label_values(&[q.limit()])
                        .inc();
                }
            })?;
        let report = self.apply(batch).await?;
        Ok(convert::report_to_wire(&report))
    }

    async fn apply(&self, batch: IngestBatch) -> Result<BatchReport, RequestError> {
        self.actor
            .ask(|reply| Command::Ingest { batch, reply })
            .await
            .map_err(RequestError::from)
    }
}
