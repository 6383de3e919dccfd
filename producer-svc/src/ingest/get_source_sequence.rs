//! `Ingest.GetSourceSequence`: where one source stands (last applied batch sequence, the one
//! expected next), so a source that reconnects, to a restarted producer or not, knows which
//! batch to send (the rules: `ckf_core::sources`, the wire contract: `proto/ckf/v1/ingest.proto`).

use ckf_core::identity::SourceId;
use ckf_proto::v1;

use super::service::IngestService;
use crate::access::Caller;
use crate::actor::Command;
use crate::error::RequestError;

/// Validates the source id, checks `caller`'s grant and asks the state actor. The answer is
/// taken between two commands, so it covers every batch the actor applied before it.
///
/// # Errors
/// [`RequestError::BadRequestedSourceId`] for a source id `KvEventBatch` would refuse;
/// [`RequestError::Access`] for a source outside the caller's grant;
/// [`RequestError::ShuttingDown`] once the actor has stopped.
pub async fn handle(
    service: &IngestService,
    caller: &Caller,
    request: v1::GetSourceSequenceRequest,
) -> Result<v1::SourceSequence, RequestError> {
    let source = SourceId::new(request.source_id).map_err(RequestError::BadRequestedSourceId)?;
    caller.authorize_source_read(source.as_str())?;
    let source_id = source.as_str().to_owned();
    let last = service
        .actor
        .ask(|reply| Command::SourceSequence { source, reply })
        .await?;
    Ok(answer(source_id, last, service.identity.incarnation.0))
}

/// The wire answer for a source whose last applied sequence is `last` (`None`: not tracked).
fn answer(source_id: String, last: Option<u64>, incarnation: u64) -> v1::SourceSequence {
    v1::SourceSequence {
        source_id,
        known: last.is_some(),
        last_applied: last.unwrap_or(0),
        // `checked_add`: after u64::MAX every sequence is a duplicate (`SourceSequences`).
        next_sequence: last.and_then(|l| l.checked_add(1)),
        incarnation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_follow_the_sequence_rule() {
        let known = answer("s".into(), Some(41), 7);
        assert_eq!(
            (known.known, known.last_applied, known.next_sequence),
            (true, 41, Some(42))
        );
        assert_eq!((known.source_id.as_str(), known.incarnation), ("s", 7));
        // Sequence 0 is a valid first batch: `known` tells it from "never seen".
        let zero = answer("s".into(), Some(0), 7);
        assert_eq!((zero.known, zero.next_sequence), (true, Some(1)));
        let unknown = answer("s".into(), None, 7);
        assert_eq!(
            (unknown.known, unknown.last_applied, unknown.next_sequence),
            (false, 0, None)
        );
        let spent = answer("s".into(), Some(u64::MAX), 7);
        assert_eq!((spent.known, spent.next_sequence), (true, None));
    }
}
