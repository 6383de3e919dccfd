//! `Ingest.Publish`: a bidi stream of batches; every batch gets its result, in order.
//!
//! One task per stream reads a batch, waits for the actor's answer and sends the result before
//! it reads the next batch, so a slow actor slows the client down (HTTP/2 flow control) instead
//! of buffering. A batch refused whole (bad source id, too many events, a size quota) gets its
//! refusal in its result (`KvEventBatchResult.refused`: the status code and message
//! `PublishBatch` would have failed with) and the stream goes on with the next batch: one bad
//! batch loses nothing behind it. Only shutdown ends the stream with a status (`UNAVAILABLE`),
//! which is how long-lived streams let the server stop. The task runs in an `ingest_stream`
//! span naming the client's address (`peer`).

use std::net::SocketAddr;
use std::pin::Pin;

use ckf_proto::v1;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};
use tracing::Instrument;

use super::service::IngestService;
use crate::error::RequestError;

/// The response stream type.
pub type ResultStream =
    Pin<Box<dyn Stream<Item = Result<v1::KvEventBatchResult, Status>> + Send + 'static>>;

/// Results buffered per stream before the reader waits for the client to read them.
const RESULT_BUFFER: usize = 4;

/// Starts the stream's task (for the client at `peer`, when known) and returns its result
/// stream.
pub fn handle(
    service: IngestService,
    caller: crate::access::Caller,
    peer: Option<SocketAddr>,
    mut batches: Streaming<v1::KvEventBatch>,
) -> ResultStream {
    let (tx, rx) = mpsc::channel(RESULT_BUFFER);
    let stopped = service.shutdown.wait();
    let span = tracing::debug_span!("ingest_stream", peer = ?peer);
    let task = async move {
        tokio::pin!(stopped);
        loop {
            let next = tokio::select! {
                biased;
                () = &mut stopped => Err(Status::from(RequestError::ShuttingDown)),
                next = batches.message() => match next {
                    Ok(Some(batch)) => {
                        // The echo of a refused batch: its source id only when it is canonical
                        // (a refused id is quoted, bounded and escaped, in the message).
                        let source_id = ckf_core::identity::check_source_id(&batch.source_id)
                            .map_or_else(|_| String::new(), |()| batch.source_id.clone());
                        let sequence = batch.sequence;
                        match service.submit_as(&caller, batch).await {
                            Ok(result) => Ok(result),
                            Err(RequestError::ShuttingDown) => {
                                Err(Status::from(RequestError::ShuttingDown))
                            }
                            Err(e) => {
                                tracing::debug!(error = %e, "batch refused; the stream goes on");
                                Ok(super::convert::refusal_to_wire(source_id, sequence, &e))
                            }
                        }
                    }
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(%status, "ingest stream broke");
                        break;
                    }
                },
            };
            let failed = next.is_err();
            if tx.send(next).await.is_err() || failed {
                break;
            }
        }
    };
    tokio::spawn(task.instrument(span));
    Box::pin(ReceiverStream::new(rx))
}
