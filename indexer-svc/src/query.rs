//! `ckf.v1.Query`: `FindMatches` (multi-lane prefix search), `FindMatchesByTokens` (the same
//! search on the canonical hashes of a request's token ids) and `ListLanes` (operator view).
//!
//! `FindMatches` checks the request length against `limits.max_query_blocks`, then calls
//! `GlobalCkfIndexer::find_prefix_matches`, which captures the ready-lane mask once and probes
//! every ready lane in one pass over the transposed table; the response lists each lane ready at
//! capture (depth 0 included) with its pool. `FindMatchesByTokens` turns the request into
//! `ckf_core::tokens::TokenQuery`, whose `lazy_sequence_hashes` checks it against the indexer's
//! block size and limit, then runs `GlobalCkfIndexer::find_prefix_matches_by_tokens`, which on a
//! long request of large blocks hashes them as it searches and stops shortly after the last
//! lane misses (one private `answer` function times, counts and builds the response of both).
//! `ListLanes` reports ckf-core's `LaneStatus` per lane plus each lane's load factor, counted
//! from the table's bucket words.
//!
//! Every call is for one domain: the one its `ckf-domain` metadata names, or the primary
//! (`IndexerState::domain_of`, after the credentials check); a domain not served is refused
//! with `NOT_FOUND`, naming the domains that are. Its limits are the indexer's, its counters
//! the domain's.
//!
//! `FindMatchesBatch` and `FindMatchesStream` carry many queries per message: the whole message
//! is checked against `limits.max_query_batch` and every query against `limits.max_query_blocks`
//! before anything is searched (a refused message has no partial answer; an answer that would
//! not fit `limits.max_message_bytes` is refused too, after the search), then each query runs
//! the same search as `FindMatches` (its own ready-lane capture) and is answered compactly as
//! a ready mask plus packed depths. The stream answers each request message as it is polled,
//! in the response stream's own poll: no task per stream or per message.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use ckf_core::bucket;
use ckf_core::global::GlobalCkfIndexer;
use ckf_core::lane::LaneStatus;
use ckf_core::search::PrefixMatches;
use ckf_core::tokens::TokenQuery;
use ckf_proto::v1::{self, query_server::Query};
use tokio::sync::OwnedSemaphorePermit;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::metrics::QueryMethod;
use crate::state::{Domain, IndexerState};
use crate::status::{BatchAt, QueryError, wire_reason};

/// The Query service.
#[derive(Debug, Clone)]
pub struct QueryService {
    shared: Arc<IndexerState>,
}

impl QueryService {
    /// A Query service over the shared indexer state.
    pub fn new(shared: Arc<IndexerState>) -> Self {
        Self { shared }
    }

    /// The domain `request` is for (`IndexerState::domain_of`), or its refusal.
    fn domain<T>(&self, request: &Request<T>) -> Result<Arc<Domain>, Status> {
        self.shared
            .domain_of(request)
            .map_err(|e| QueryError::Domain(e).into())
    }
}

#[tonic::async_trait]
impl Query for QueryService {
    type FindMatchesStreamStream = StreamAnswers;

    async fn find_matches(
        &self,
        request: Request<v1::FindMatchesRequest>,
    ) -> Result<Response<v1::FindMatchesResponse>, Status> {
        let domain = self.domain(&request)?;
        let hashes = request.into_inner().block_hashes;
        let method = QueryMethod::FindMatches;
        let limit = self.shared.limits.max_query_blocks;
        if hashes.len() > limit as usize {
            domain.queries.method(method).refused.inc();
            return Err(QueryError::TooManyBlocks {
                rpc: "FindMatches",
                blocks: hashes.len(),
                limit,
            }
            .into());
        }
        Ok(Response::new(search(
            &self.shared,
            &domain,
            &hashes,
            method,
        )))
    }

    async fn find_matches_by_tokens(
        &self,
        request: Request<v1::FindMatchesByTokensRequest>,
    ) -> Result<Response<v1::FindMatchesResponse>, Status> {
        let domain = self.domain(&request)?;
        let method = QueryMethod::FindMatchesByTokens;
        let query = TokenQuery::from(request.into_inner());
        // Checked now (under every lane's block size), hashed as the search needs them: a long
        // request whose prefix stops matching early is not hashed to its end.
        let router = &domain.router;
        let blocks = router
            .check_tokens(&query)
            .inspect_err(|_| domain.queries.method(method).refused.inc())
            .map_err(|error| QueryError::Tokens {
                rpc: "FindMatchesByTokens",
                error,
            })?;
        Ok(Response::new(answer(
            &self.shared,
            &domain,
            method,
            blocks,
            |_| {
                router
                    .find_by_tokens(&query)
                    .expect("the query was checked just above with the same rules")
            },
        )))
    }

    async fn route(
        &self,
        request: Request<v1::RouteRequest>,
    ) -> Result<Response<v1::RouteResponse>, Status> {
        let domain = self.domain(&request)?;
        Ok(Response::new(crate::route::answer(
            &self.shared,
            &domain,
            request.into_inner(),
        )?))
    }

    async fn route_batch(
        &self,
        request: Request<v1::RouteBatchRequest>,
    ) -> Result<Response<v1::RouteBatchResponse>, Status> {
        let domain = self.domain(&request)?;
        let requests = request.into_inner().requests;
        let responses = crate::route::answer_batch(&self.shared, &domain, requests)?;
        Ok(Response::new(v1::RouteBatchResponse { responses }))
    }

    async fn find_matches_batch(
        &self,
        request: Request<v1::FindMatchesBatchRequest>,
    ) -> Result<Response<v1::FindMatchesBatchResponse>, Status> {
        let domain = self.domain(&request)?;
        let queries = request.into_inner().queries;
        let results = answer_batch(
            &self.shared,
            &domain,
            &queries,
            BatchAt::Batch,
            QueryMethod::FindMatchesBatch,
        )?;
        Ok(Response::new(v1::FindMatchesBatchResponse { results }))
    }

    async fn find_matches_stream(
        &self,
        request: Request<Streaming<v1::FindMatchesStreamRequest>>,
    ) -> Result<Response<StreamAnswers>, Status> {
        let domain = self.domain(&request)?;
        // Each open stream holds a permit until it is dropped: idle streams cost memory too.
        let permit = Arc::clone(&self.shared.query_streams)
            .try_acquire_owned()
            .map_err(|_| QueryError::TooManyStreams {
                limit: self.shared.limits.max_query_streams,
            })?;
        self.shared.metrics.query_streams.inc();
        Ok(Response::new(StreamAnswers {
            _slot: StreamSlot {
                _permit: permit,
                open: self.shared.metrics.query_streams.clone(),
            },
            shared: Arc::clone(&self.shared),
            removed: Box::pin(domain.removed.wait()),
            domain,
            inbound: request.into_inner(),
            shutdown: Box::pin(self.shared.shutdown.wait()),
            ended: false,
        }))
    }

    async fn list_lanes(
        &self,
        request: Request<v1::ListLanesRequest>,
    ) -> Result<Response<v1::ListLanesResponse>, Status> {
        let domain = self.domain(&request)?;
        let indexer = Arc::clone(&domain.indexer);
        // Counting occupied slots reads every bucket word of every lane: off the async workers.
        let occupied = tokio::task::spawn_blocking(move || occupied_slots(&indexer))
            .await
            .map_err(QueryError::LoadCount)?;
        let indexer = &domain.indexer;
        let manifest = indexer.manifest();
        let slots = manifest.format.slot_count() as f64;
        // The lanes serving a pool now: not a spare slot never added, not a removed lane.
        let lanes = indexer
            .lane_statuses()
            .iter()
            .zip(occupied)
            .filter(|(status, _)| {
                indexer.slot(status.lane).is_some() && !indexer.is_removed(status.lane)
            })
            .map(|(status, occupied)| {
                let block_size = domain.router.block_size(status.lane);
                lane_info(indexer, status, occupied as f64 / slots, block_size)
            })
            .collect();
        Ok(Response::new(v1::ListLanesResponse {
            domain: manifest.domain.to_string(),
            format: Some(manifest.format.into()),
            consumer_instance: indexer.consumer_instance(),
            lanes,
        }))
    }
}

/// The prefix search of one `FindMatches` query: every lane ready at capture with its depth
/// for `hashes` (already within the limits), counted under `method`. (Batch and stream
/// messages run `answer_batch`.)
fn search(
    shared: &IndexerState,
    domain: &Domain,
    hashes: &[u64],
    method: QueryMethod,
) -> v1::FindMatchesResponse {
    answer(shared, domain, method, hashes.len(), |indexer| {
        indexer.find_prefix_matches(hashes)
    })
}

/// Runs `find` (one prefix search of a query of `blocks` blocks), timing it into the query
/// duration histogram and counting it for `method`, and builds its answer.
fn answer(
    shared: &IndexerState,
    domain: &Domain,
    method: QueryMethod,
    blocks: usize,
    find: impl FnOnce(&GlobalCkfIndexer) -> PrefixMatches,
) -> v1::FindMatchesResponse {
    let indexer = &domain.indexer;
    let metrics = &shared.metrics;
    let started = Instant::now();
    let found = find(indexer);
    metrics
        .query_duration
        .observe(started.elapsed().as_secs_f64());
    let counters = domain.queries.method(method);
    counters.answered.inc();
    counters.blocks.inc_by(blocks as u64);
    let matches = found
        .iter()
        .map(|(lane, depth)| v1::LaneMatch {
            lane: u32::from(lane),
            pool: Some(indexer.pool(lane).into()),
            depth,
            cached_tokens: u64::from(depth) * u64::from(domain.router.block_size(lane)),
        })
        .collect();
    let (ready_mask, ready_mask_high) = v1::split_ready_mask(found.ready_mask());
    v1::FindMatchesResponse {
        matches,
        ready_mask,
        ready_mask_high,
    }
}

/// Checks a batch (`at`) against `limits.max_query_batch` and every query against
/// `limits.max_query_blocks`, then answers each query in order.
///
/// # Errors
/// [`QueryError::TooManyQueries`] / [`QueryError::BatchQueryTooLong`] (naming the first
/// offending query's index): nothing is searched; [`QueryError::AnswerTooLarge`]: the answer
/// would exceed `limits.max_message_bytes` (tonic's encoder would fail it with a bare
/// `OUT_OF_RANGE`). Either way every query of the message counts as refused.
fn answer_batch(
    shared: &IndexerState,
    domain: &Domain,
    queries: &[v1::BlockHashQuery],
    at: BatchAt,
    method: QueryMethod,
) -> Result<Vec<v1::QueryResult>, QueryError> {
    let limits = &shared.limits;
    let refuse = |error: QueryError| {
        domain
            .queries
            .method(method)
            .refused
            .inc_by(queries.len() as u64);
        error
    };
    if queries.len() > limits.max_query_batch as usize {
        return Err(refuse(QueryError::TooManyQueries {
            at,
            queries: queries.len(),
            limit: limits.max_query_batch,
        }));
    }
    let too_long = queries
        .iter()
        .position(|q| q.block_hashes.len() > limits.max_query_blocks as usize);
    if let Some(index) = too_long {
        return Err(refuse(QueryError::BatchQueryTooLong {
            at,
            index,
            blocks: queries[index].block_hashes.len(),
            limit: limits.max_query_blocks,
        }));
    }
    let indexer = &domain.indexer;
    // The per-query search times go to an unshared copy of the histogram, added to the shared
    // one once per message (one set of atomic updates per message, not per query), and each
    // query's end time is the next one's start (one clock read per query, not two).
    let duration = shared.metrics.query_duration.local();
    let mut blocks = 0u64;
    let mut started = Instant::now();
    let results: Vec<v1::QueryResult> = queries
        .iter()
        .map(|query| {
            let found = indexer.find_prefix_matches(&query.block_hashes);
            let ended = Instant::now();
            duration.observe(ended.duration_since(started).as_secs_f64());
            started = ended;
            blocks += query.block_hashes.len() as u64;
            compact_result(&found)
        })
        .collect();
    duration.flush();
    // Many queries times many ready lanes can outgrow a small `max_message_bytes` although the
    // request fits. The bound (no answer can be larger) spares the exact count on the usual
    // configurations (1 024 queries on 16 lanes: at most 90 KB against the default 4 MiB).
    let limit = limits.max_message_bytes;
    if answer_bound(queries.len(), indexer.lane_count()) > limit {
        let bytes = answer_bytes(&results, at);
        if bytes as u64 > limit {
            return Err(refuse(QueryError::AnswerTooLarge {
                at,
                queries: queries.len(),
                bytes,
                limit,
            }));
        }
    }
    let counters = domain.queries.method(method);
    counters.answered.inc_by(queries.len() as u64);
    counters.blocks.inc_by(blocks);
    Ok(results)
}

/// Most bytes the answer of `queries` queries over `lanes` lanes (<= 64) takes encoded: per
/// query its `results` key and length (1 + 2: one answer is under 16 KiB), the two ready-mask
/// fields (2 x (1 + 5)), the depths' key and length (1 + 2) and one depth per lane (a u32
/// varint, <= 5); plus a stream answer's id (1 + 10).
fn answer_bound(queries: usize, lanes: usize) -> u64 {
    11 + queries as u64 * (18 + 5 * lanes as u64)
}

/// The encoded size of a batch (`FindMatchesBatchResponse`) or stream
/// (`FindMatchesStreamResponse`) answer carrying `results`, as tonic's encoder counts it.
fn answer_bytes(results: &[v1::QueryResult], at: BatchAt) -> usize {
    use prost::encoding::{encoded_len_varint, message};
    // `results` is field 1 of the batch answer and field 2 of the stream answer (one-byte keys
    // both); the stream's `id` (field 1) is omitted when 0.
    let id = match at {
        BatchAt::Batch | BatchAt::RouteBatch | BatchAt::Stream { id: 0 } => 0,
        BatchAt::Stream { id } => 1 + encoded_len_varint(id),
    };
    id + message::encoded_len_repeated(1, results)
}

/// The compact answer of one query of a batch: the ready mask and one depth per ready lane,
/// in lane order.
fn compact_result(found: &PrefixMatches) -> v1::QueryResult {
    let mut depths = Vec::with_capacity(found.ready_mask().count_ones() as usize);
    depths.extend(found.iter().map(|(_, depth)| depth));
    let (ready_mask, ready_mask_high) = v1::split_ready_mask(found.ready_mask());
    v1::QueryResult {
        ready_mask,
        depths,
        ready_mask_high,
    }
}

/// The response stream of one `FindMatchesStream`: each request message is answered when the
/// server polls for the next response (so the answers keep request order and the stream needs
/// no task of its own). Ends after the first refused message (with its `INVALID_ARGUMENT`),
/// when the client half-closes, or with `UNAVAILABLE` when the indexer shuts down.
pub struct StreamAnswers {
    _slot: StreamSlot,
    shared: Arc<IndexerState>,
    domain: Arc<Domain>,
    /// Resolves when a catalog reload removes the stream's domain.
    removed: Pin<Box<dyn Future<Output = ()> + Send>>,
    inbound: Streaming<v1::FindMatchesStreamRequest>,
    shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
    ended: bool,
}

/// An open stream's place under `limits.max_query_streams` and in `ckf_indexer_query_streams`,
/// given back when the stream is dropped (answered, refused, cancelled or its connection gone).
struct StreamSlot {
    _permit: OwnedSemaphorePermit,
    open: prometheus::IntGauge,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.open.dec();
    }
}

impl std::fmt::Debug for StreamAnswers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamAnswers")
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl Stream for StreamAnswers {
    type Item = Result<v1::FindMatchesStreamResponse, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        if this.shutdown.as_mut().poll(cx).is_ready() {
            this.ended = true;
            return Poll::Ready(Some(Err(QueryError::Shutdown.into())));
        }
        if this.removed.as_mut().poll(cx).is_ready() {
            this.ended = true;
            let removed = QueryError::Removed {
                domain: this.domain.name().clone(),
            };
            return Poll::Ready(Some(Err(removed.into())));
        }
        let answer = match Pin::new(&mut this.inbound).poll_next(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(None) => None,
            // A transport or decode failure of the request stream ends it with that status.
            Poll::Ready(Some(Err(status))) => Some(Err(status)),
            Poll::Ready(Some(Ok(request))) => Some(
                answer_batch(
                    &this.shared,
                    &this.domain,
                    &request.queries,
                    BatchAt::Stream { id: request.id },
                    QueryMethod::FindMatchesStream,
                )
                .map(|results| v1::FindMatchesStreamResponse {
                    id: request.id,
                    results,
                })
                .map_err(Status::from),
            ),
        };
        this.ended = !matches!(answer, Some(Ok(_)));
        Poll::Ready(answer)
    }
}

/// Occupied fingerprint slots per lane, from the table's bucket words (relaxed reads: an
/// operator figure, not a consistent snapshot).
fn occupied_slots(indexer: &GlobalCkfIndexer) -> Vec<u64> {
    let table = indexer.table();
    let mut counts = vec![0u64; table.lanes()];
    for b in 0..table.bucket_count() {
        for (lane, count) in counts.iter_mut().enumerate() {
            *count += u64::from(bucket::occupied(table.load(b, lane)));
        }
    }
    counts
}

fn lane_info(
    indexer: &GlobalCkfIndexer,
    status: &LaneStatus,
    load_factor: f64,
    block_size: u32,
) -> v1::LaneInfo {
    v1::LaneInfo {
        lane: u32::from(status.lane),
        pool: Some(indexer.pool(status.lane).into()),
        state: v1::LaneState::from(status.state) as i32,
        lease_epoch: status.lease.map_or(0, |l| l.epoch),
        incarnation: status.incarnation.map_or(0, |i| i.0),
        installed_sequence: status.installed_sequence.unwrap_or(0),
        last_update_age_ms: status
            .last_update_age()
            .map(|age| u64::try_from(age.as_millis()).unwrap_or(u64::MAX)),
        load_factor,
        retirements: status.retirements,
        last_retire_reason: status
            .last_retirement
            .as_ref()
            .map_or(v1::RetireReason::Unspecified, wire_reason) as i32,
        last_retire_detail: status
            .last_retirement
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        drained: status.drained,
        drain_grace_remaining_ms: status.drain_grace_deadline.map(|at| {
            let left = at.saturating_duration_since(std::time::Instant::now());
            u64::try_from(left.as_millis()).unwrap_or(u64::MAX)
        }),
        contention_count: status.contention.map_or(0, |c| c.count),
        last_contender_incarnation: status.contention.map_or(0, |c| c.last_contender.0),
        last_contention_age_ms: status
            .contention
            .map(|c| u64::try_from(c.last_at.elapsed().as_millis()).unwrap_or(u64::MAX)),
        last_contention_kind: status
            .contention
            .map_or(v1::ContentionKind::Unspecified, |c| c.last_kind.into())
            as i32,
        last_contention_holder_incarnation: status.contention.map_or(0, |c| c.last_holder.0),
        block_size,
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    /// Results of `n` queries on `lanes` ready lanes with the given depth.
    fn results(n: usize, lanes: u32, depth: u32) -> Vec<v1::QueryResult> {
        let (ready_mask, ready_mask_high) =
            v1::split_ready_mask(u64::MAX.checked_shr(64 - lanes).unwrap_or(0));
        vec![
            v1::QueryResult {
                ready_mask,
                depths: vec![depth; lanes as usize],
                ready_mask_high,
            };
            n
        ]
    }

    #[test]
    fn answer_bytes_are_the_encoded_sizes_and_the_bound_holds() {
        for (n, lanes, depth) in [
            (0, 0, 0),
            (1, 0, 0),
            (3, 1, 0),
            (64, 2, 7),
            (1024, 16, 8192),
            (1024, 64, 8192),
        ] {
            let results = results(n, lanes, depth);
            let batch = v1::FindMatchesBatchResponse {
                results: results.clone(),
            }
            .encoded_len();
            assert_eq!(answer_bytes(&results, BatchAt::Batch), batch);
            for id in [0, 1, u64::MAX] {
                let stream = v1::FindMatchesStreamResponse {
                    id,
                    results: results.clone(),
                }
                .encoded_len();
                assert_eq!(answer_bytes(&results, BatchAt::Stream { id }), stream);
            }
            // The worst answer of these queries (64-bit mask, u32::MAX depths) fits the bound.
            let worst = results_worst(n, lanes);
            let stream = v1::FindMatchesStreamResponse {
                id: u64::MAX,
                results: worst,
            }
            .encoded_len();
            assert!(
                stream as u64 <= answer_bound(n, lanes as usize),
                "{n} {lanes}"
            );
        }
    }

    fn results_worst(n: usize, lanes: u32) -> Vec<v1::QueryResult> {
        let mut worst = results(n, lanes, u32::MAX);
        for r in &mut worst {
            r.ready_mask_high |= 1 << 31;
        }
        worst
    }
}
