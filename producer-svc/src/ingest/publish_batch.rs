//! `Ingest.PublishBatch`: one batch in, its per-event results out.

use ckf_proto::v1;

use super::service::IngestService;
use crate::error::RequestError;

/// Applies one batch.
///
/// # Errors
/// [`RequestError`] when the batch is refused whole (bad source id, too many events) or the
/// producer is shutting down.
pub async fn handle(
    service: &IngestService,
    caller: &crate::access::Caller,
    batch: v1::KvEventBatch,
) -> Result<v1::KvEventBatchResult, RequestError> {
    service.submit_as(caller, batch).await
}
