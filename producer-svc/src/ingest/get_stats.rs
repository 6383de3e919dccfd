//! `Ingest.GetStats`: the producer's identity, format and exact-state statistics.

use ckf_proto::v1;

use super::convert;
use super::service::IngestService;
use crate::actor::Command;
use crate::error::RequestError;

/// Asks the state actor for its statistics.
///
/// # Errors
/// [`RequestError::ShuttingDown`] once the actor has stopped.
pub async fn handle(service: &IngestService) -> Result<v1::ProducerStats, RequestError> {
    let (stats, tracked_sources) = service.actor.ask(|reply| Command::Stats { reply }).await?;
    Ok(convert::stats_to_wire(
        &service.identity,
        &stats,
        tracked_sources,
    ))
}
