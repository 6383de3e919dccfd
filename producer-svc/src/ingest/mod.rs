//! The `ckf.v1.Ingest` service: one file per RPC handler.
//!
//! | file | RPC |
//! | --- | --- |
//! | [`publish`] | `Publish`: bidi stream of batches, one result per batch, in order |
//! | [`publish_batch`] | `PublishBatch`: one batch, one result |
//! | [`get_stats`] | `GetStats`: exact-state and filter statistics |
//! | [`get_member_blocks`] | `GetMemberBlocks`: one member's canonical block hashes, sorted |
//! | [`get_source_sequence`] | `GetSourceSequence`: a source's last applied and next expected sequence |
//! | [`convert`] | wire <-> [`crate::events`] |
//!
//! Handlers decode, hand the batch to the state actor through its bounded channel (waiting
//! when it is full: backpressure) and encode the actor's answer. No rule is applied here.

pub mod convert;
pub mod get_member_blocks;
pub mod get_source_sequence;
pub mod get_stats;
pub mod publish;
pub mod publish_batch;

use ckf_core::dc::Quotas;
use ckf_core::identity::ProducerIdentity;
use ckf_proto::v1;
use ckf_proto::v1::ingest_server::Ingest;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use crate::actor::{ActorHandle, Command};
use crate::error::RequestError;
use crate::events::{BatchReport, IngestBatch};
use crate::metrics::Metrics;
use ckf_svc_kit::Shutdown;

/// Shared by every handler: the actor's command channel and the producer's identity.
#[derive(Debug, Clone)]
pub struct IngestService {
    actor: ActorHandle,
    identity: ProducerIdentity,
    shutdown: Shutdown,
    max_events_per_batch: usize,
    /// The size quotas checked at decode (`[quotas]`; the holding ones are the actor's).
    quotas: Quotas,
    /// Counts size-quota refusals (`ckf_producer_quota_refusals_total`).
    metrics: Metrics,
    /// Who may call, publish as which source and touch which workers (`[ingest_auth]`).
    access: std::sync::Arc<crate::access::IngestAccess>,
}

impl IngestService {
    /// A service feeding `actor`, refusing batches above `max_events_per_batch` events or
    /// `quotas`' size limits.
    pub fn new(
        actor: ActorHandle,
        identity: ProducerIdentity,
        shutdown: Shutdown,
        max_events_per_batch: usize,
        quotas: Quotas,
        metrics: Metrics,
    ) -> Self {
        Self {
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

#[tonic::async_trait]
impl Ingest for IngestService {
    type PublishStream = publish::ResultStream;

    async fn publish(
        &self,
        request: Request<Streaming<v1::KvEventBatch>>,
    ) -> Result<Response<Self::PublishStream>, Status> {
        let caller = self.access.caller("publish", &request)?;
        let peer = request.remote_addr();
        Ok(Response::new(publish::handle(
            self.clone(),
            caller,
            peer,
            request.into_inner(),
        )))
    }

    async fn publish_batch(
        &self,
        request: Request<v1::KvEventBatch>,
    ) -> Result<Response<v1::KvEventBatchResult>, Status> {
        let caller = self.access.caller("publish_batch", &request)?;
        let span = tracing::debug_span!(
            "publish_batch",
            peer = ?request.remote_addr(),
            source = %request.get_ref().source_id
        );
        publish_batch::handle(self, &caller, request.into_inner())
            .instrument(span)
            .await
            .map(Response::new)
            .map_err(Status::from)
    }

    async fn get_member_blocks(
        &self,
        request: Request<v1::GetMemberBlocksRequest>,
    ) -> Result<Response<v1::MemberBlocks>, Status> {
        self.access.caller("get_member_blocks", &request)?;
        get_member_blocks::handle(self, request.into_inner())
            .await
            .map(Response::new)
            .map_err(Status::from)
    }

    async fn get_source_sequence(
        &self,
        request: Request<v1::GetSourceSequenceRequest>,
    ) -> Result<Response<v1::SourceSequence>, Status> {
        let caller = self.access.caller("get_source_sequence", &request)?;
        get_source_sequence::handle(self, &caller, request.into_inner())
            .await
            .map(Response::new)
            .map_err(Status::from)
    }

    async fn get_stats(
        &self,
        request: Request<v1::GetStatsRequest>,
    ) -> Result<Response<v1::ProducerStats>, Status> {
        self.access.caller("get_stats", &request)?;
        get_stats::handle(self)
            .await
            .map(Response::new)
            .map_err(Status::from)
    }
}
