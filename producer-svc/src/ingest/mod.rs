//! The `ckf.v1.Ingest` service: one file per RPC handler.
//!
//! | file | RPC |
//! | --- | --- |
//! | [`publish`] | `Publish`: bidi stream of batches, one result per batch, in order |
//! | [`publish_batch`] | `PublishBatch`: one batch, one result |
//! | [`get_stats`] | `GetStats`: exact-state and filter statistics |
//! | [`get_member_blocks`] | `GetMemberBlocks`: one member's canonical block hashes, sorted |
//! | [`get_source_sequence`] | `GetSourceSequence`: a source's last applied and next expected sequence |
//! | [`report_load`] | `ReportLoad`: one worker's pushed load into the pool's load |
//! | [`service`] | [`IngestService`]: what every handler shares; `submit` decodes, authorizes and asks the actor |
//! | [`convert`] | wire <-> [`crate::events`] |
//!
//! Handlers decode, hand the batch to the state actor through its bounded channel (waiting
//! when it is full: backpressure) and encode the actor's answer; `ReportLoad` goes to the
//! pool's [`LoadBoard`](crate::engines::load::LoadBoard) instead. No rule is applied here.

pub mod convert;
pub mod get_member_blocks;
pub mod get_source_sequence;
pub mod get_stats;
pub mod publish;
pub mod publish_batch;
pub mod report_load;
pub mod service;

use ckf_proto::v1;
use ckf_proto::v1::ingest_server::Ingest;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

pub use service::IngestService;

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

    async fn report_load(
        &self,
        request: Request<v1::ReportLoadRequest>,
    ) -> Result<Response<v1::ReportLoadResponse>, Status> {
        let caller = match self.access.caller("report_load", &request) {
            Ok(caller) => caller,
            Err(status) => {
                self.metrics
                    .engine
                    .load_pushes
                    .with_label_values(&["denied"])
                    .inc();
                return Err(status);
            }
        };
        report_load::handle(self, &caller, request.get_ref())
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
