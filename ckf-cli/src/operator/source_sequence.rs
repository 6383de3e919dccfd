//! `ckf source-sequence`: where a producer's ingest source stands (`GetSourceSequence`) and
//! what to send next.

use anyhow::{Context, Result};
use ckf_proto::v1::ingest_client::IngestClient;
use ckf_proto::v1::{GetSourceSequenceRequest, SourceSequence};
use ckf_svc_kit::access::with_bearer;
use serde_json::json;
use tonic::Request;

use crate::connect::{client_tls, connect_with, token_of};
use crate::operator::args::SourceSequenceArgs;

/// `ckf source-sequence`: one line (or one JSON object) saying where the source stands.
///
/// # Errors
/// An unreachable producer, or its refusal (`INVALID_ARGUMENT` for a bad source id,
/// `UNAUTHENTICATED` / `PERMISSION_DENIED` under `[ingest_auth]`) with its message.
pub async fn source_sequence(args: SourceSequenceArgs) -> Result<()> {
    let token = token_of(args.token_file.as_deref())?;
    let tls = client_tls(&args.tls)?;
    let mut client = IngestClient::new(connect_with(&args.producer, tls.as_ref()).await?);
    let answer = client
        .get_source_sequence(with_bearer(
            Request::new(GetSourceSequenceRequest {
                source_id: args.source.clone(),
            }),
            token.as_ref(),
        ))
        .await
        .context("GetSourceSequence")?
        .into_inner();
    if args.json {
        let out = json!({
            "source_id": answer.source_id, "known": answer.known,
            "last_applied": answer.last_applied, "next_sequence": answer.next_sequence,
            "incarnation": answer.incarnation,
        });
        crate::outln!("{out}")?;
    } else {
        crate::outln!("{}", source_sequence_line(&answer))?;
    }
    Ok(())
}

/// The text form of a `GetSourceSequence` answer: what to send next, then the incarnation.
pub fn source_sequence_line(answer: &SourceSequence) -> String {
    let position = match (answer.known, answer.next_sequence) {
        (false, _) => "unknown to the producer (never seen, or forgotten): any sequence is \
                       accepted as its first batch"
            .to_owned(),
        (true, Some(next)) => format!("last applied {}, next {next}", answer.last_applied),
        (true, None) => format!(
            "last applied {}, no next sequence (use a new source id)",
            answer.last_applied
        ),
    };
    format!(
        "source {:?}: {position}; producer incarnation {:#018x}",
        answer.source_id, answer.incarnation
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_sequence_lines_say_what_to_send_next() {
        let mut answer = SourceSequence {
            source_id: "router-1".into(),
            known: true,
            last_applied: 41,
            next_sequence: Some(42),
            incarnation: 0xab,
        };
        assert_eq!(
            source_sequence_line(&answer),
            "source \"router-1\": last applied 41, next 42; producer incarnation \
             0x00000000000000ab"
        );
        answer.next_sequence = None;
        answer.last_applied = u64::MAX;
        assert!(
            source_sequence_line(&answer).contains("no next sequence (use a new source id)"),
            "{}",
            source_sequence_line(&answer)
        );
        answer.known = false;
        answer.last_applied = 0;
        assert!(
            source_sequence_line(&answer).contains("unknown to the producer"),
            "{}",
            source_sequence_line(&answer)
        );
    }
}
