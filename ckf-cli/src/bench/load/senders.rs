//! The senders: the queries each message carries, and one sender's loop per mode (unary,
//! batch, stream, tokens, health) sending messages and recording their answers.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Result, bail};
use ckf_proto::v1::{self, query_client::QueryClient};
use ckf_svc_kit::access::AuthedChannel;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use crate::bench::args::LoadMode;
use crate::bench::feed::block_tokens;
use crate::bench::replay::load_workload;
use crate::hashing::block_hashes;

use crate::bench::load::schedule::Schedule;
use crate::bench::load::tally::{ID_MISMATCH, NOT_SERVING, Tally, code_name};

/// The service `--mode health` checks: the Query service the other modes drive.
pub const HEALTH_CHECKED_SERVICE: &str = "ckf.v1.Query";

/// The queries of a run: one block-hash sequence per workload request, in order.
pub fn workload_queries(
    trace: Option<&Path>,
    limit: Option<usize>,
    seed: u64,
) -> Result<Vec<Vec<u64>>> {
    let workload = load_workload(trace, limit, seed)?;
    let queries: Vec<Vec<u64>> = workload
        .requests
        .iter()
        .map(|r| block_hashes(&r.hash_ids))
        .collect();
    if queries.is_empty() {
        bail!("the workload ({}) has no requests", workload.source);
    }
    Ok(queries)
}

/// What one message carries: `per_message` consecutive queries from `k x per_message`, cycling.
pub fn message_queries(
    queries: &[Vec<u64>],
    per_message: usize,
    k: u64,
) -> impl Iterator<Item = &Vec<u64>> {
    let first = (k as usize).wrapping_mul(per_message);
    (0..per_message).map(move |i| &queries[first.wrapping_add(i) % queries.len()])
}

/// One connection's clients: the Query service, and the health service on the same channel.
#[derive(Clone)]
pub(crate) struct Client {
    pub(crate) query: QueryClient<AuthedChannel>,
    pub(crate) health: HealthClient<AuthedChannel>,
}

/// One sender: sends messages until the schedule ends, tallying answers and errors.
pub(crate) async fn sender(
    mut client: Client,
    mode: LoadMode,
    per_message: usize,
    block_size: u32,
    queries: Arc<Vec<Vec<u64>>>,
    schedule: Arc<Schedule>,
    paced: Option<flume::Receiver<(u64, Instant)>>,
) -> Tally {
    let mut tally = Tally::new();
    // Stream mode: the sender's open stream (request sender, answers), reopened after an error.
    let mut stream: Option<(
        mpsc::Sender<v1::FindMatchesStreamRequest>,
        tonic::Streaming<v1::FindMatchesStreamResponse>,
    )> = None;
    loop {
        let next = match &paced {
            // Open loop: the pacer thread hands out each message at its due time.
            Some(rx) => rx.recv_async().await.ok().map(|(k, due)| (k, Some(due))),
            None => schedule.take(),
        };
        let Some((k, due)) = next else { break };
        let batch = || -> Vec<v1::BlockHashQuery> {
            message_queries(&queries, per_message, k)
                .map(|q| v1::BlockHashQuery {
                    block_hashes: q.clone(),
                })
                .collect()
        };
        let sent = Instant::now();
        if let Some(due) = due {
            tally.delayed(sent.saturating_duration_since(due));
        }
        tally.sent += per_message as u64;
        let outcome: Result<(), &'static str> = match mode {
            LoadMode::Unary => {
                let block_hashes = message_queries(&queries, 1, k)
                    .next()
                    .cloned()
                    .unwrap_or_default();
                client
                    .query
                    .find_matches(v1::FindMatchesRequest { block_hashes })
                    .await
                    .map(drop)
                    .map_err(|s| code_name(s.code()))
            }
            LoadMode::Tokens => {
                let ids = message_queries(&queries, 1, k)
                    .next()
                    .cloned()
                    .unwrap_or_default();
                let token_ids = ids
                    .iter()
                    .flat_map(|&h| block_tokens(h, block_size))
                    .collect();
                client
                    .query
                    .find_matches_by_tokens(v1::FindMatchesByTokensRequest {
                        token_ids,
                        // Sent, so an indexer with another block size refuses the run's
                        // queries (INVALID_ARGUMENT) instead of probing other blocks.
                        block_size,
                        ..Default::default()
                    })
                    .await
                    .map(drop)
                    .map_err(|s| code_name(s.code()))
            }
            LoadMode::Batch => client
                .query
                .find_matches_batch(v1::FindMatchesBatchRequest { queries: batch() })
                .await
                .map(drop)
                .map_err(|s| code_name(s.code())),
            LoadMode::Stream => {
                let result = stream_one(&mut client, &mut stream, k, batch()).await;
                if result.is_err() {
                    stream = None;
                }
                result
            }
            LoadMode::Health => match client
                .health
                .check(HealthCheckRequest {
                    service: HEALTH_CHECKED_SERVICE.into(),
                })
                .await
            {
                Ok(answer) if answer.get_ref().status == ServingStatus::Serving as i32 => Ok(()),
                Ok(_) => Err(NOT_SERVING),
                Err(status) => Err(code_name(status.code())),
            },
        };
        match outcome {
            Ok(()) => tally.answered(due.unwrap_or(sent).elapsed(), per_message),
            Err(code) => tally.failed(code),
        }
    }
    tally
}

/// Sends message `id` on the sender's stream (opening it first if needed) and waits for its
/// answer, which must carry the same id.
pub(crate) async fn stream_one(
    client: &mut Client,
    stream: &mut Option<(
        mpsc::Sender<v1::FindMatchesStreamRequest>,
        tonic::Streaming<v1::FindMatchesStreamResponse>,
    )>,
    id: u64,
    queries: Vec<v1::BlockHashQuery>,
) -> Result<(), &'static str> {
    if stream.is_none() {
        let (tx, rx) = mpsc::channel(1);
        let answers = client
            .query
            .find_matches_stream(ReceiverStream::new(rx))
            .await
            .map_err(|s| code_name(s.code()))?
            .into_inner();
        *stream = Some((tx, answers));
    }
    let (tx, answers) = stream.as_mut().expect("opened above");
    tx.send(v1::FindMatchesStreamRequest { id, queries })
        .await
        .map_err(|_| code_name(Code::Unavailable))?;
    match answers.message().await {
        Ok(Some(answer)) if answer.id == id => Ok(()),
        Ok(Some(_)) => Err(ID_MISMATCH),
        Ok(None) => Err(code_name(Code::Unavailable)),
        Err(status) => Err(code_name(status.code())),
    }
}
