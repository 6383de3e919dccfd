//! `Ingest.ReportLoad`: one worker's load, pushed into the pool's load the producer reports to
//! its indexers (the rules: `ckf_core::pool_load`; the shares: [`crate::engines::load`]).
//! Checked like `PublishBatch` (the caller's grant first, then the source id and the values);
//! every answer but a shutdown is counted in `ckf_producer_load_pushes_total{outcome}`.

use std::time::Duration;

use ckf_core::identity::SourceId;
use ckf_core::pool_load::PushedLoad;
use ckf_core::route::EngineLoad;
use ckf_proto::v1;

use super::service::IngestService;
use crate::access::Caller;
use crate::error::RequestError;

/// Authorizes, decodes and keeps one pushed load.
///
/// # Errors
/// [`RequestError::Access`] outside the caller's grant; [`RequestError::BadLoadSourceId`];
/// [`RequestError::Load`] for values out of range, a scraped engine or no room for the worker;
/// [`RequestError::ShuttingDown`]. Nothing changed.
pub fn handle(
    service: &IngestService,
    caller: &Caller,
    request: &v1::ReportLoadRequest,
) -> Result<v1::ReportLoadResponse, RequestError> {
    let answer = report(service, caller, request);
    let outcome = match &answer {
        Ok(_) => Some("accepted"),
        Err(RequestError::Access(_)) => Some("denied"),
        Err(RequestError::Load(refused)) => Some(refused.label()),
        Err(RequestError::ShuttingDown) => None,
        Err(_) => Some("invalid"),
    };
    if let Some(outcome) = outcome {
        service
            .metrics
            .engine
            .load_pushes
            .with_label_values(&[outcome])
            .inc();
    }
    answer
}

fn report(
    service: &IngestService,
    caller: &Caller,
    request: &v1::ReportLoadRequest,
) -> Result<v1::ReportLoadResponse, RequestError> {
    if service.shutdown.is_triggered() {
        return Err(RequestError::ShuttingDown);
    }
    caller.authorize_load(&request.source_id, request.worker_id)?;
    SourceId::new(request.source_id.clone()).map_err(RequestError::BadLoadSourceId)?;
    let accepted = service
        .load
        .push(&from_wire(request))
        .map_err(RequestError::Load)?;
    Ok(v1::ReportLoadResponse {
        prefill_tokens_per_s: accepted.prefill_tokens_per_s,
        expires_in_ms: u64::try_from(accepted.expires_in.as_millis()).unwrap_or(u64::MAX),
    })
}

/// The request's load as the pool's rules take it (no value is checked here).
fn from_wire(request: &v1::ReportLoadRequest) -> PushedLoad {
    PushedLoad {
        worker_id: request.worker_id,
        load: EngineLoad {
            running: request.running,
            waiting: request.waiting,
            kv_usage: request.kv_usage,
        },
        prefill_tokens_per_s: request.prefill_tokens_per_s,
        age: Duration::from_millis(request.age_ms),
    }
}
