//! `Query/Route` and `Query/RouteBatch` on the wire: each request decoded and checked (a batch
//! whole, before anything is searched or booked), routed by [`crate::router::Router`] (the one
//! path of every Route, an embedded router's too), counted, and its answer translated.

use std::time::{Duration, Instant};

use ckf_core::global::GlobalCkfIndexer;
use ckf_core::identity::LaneIndex;
use ckf_core::route::{LoadState, Reason};
use ckf_core::tokens::{TokenQuery, TokenQueryError};
use ckf_proto::v1::{self, route_request::Query as WireQuery};
use prost::Message;

use crate::metrics::QueryMethod;
use crate::router::{RankedDc, RoutePrefix, RouteQuery, Routed};
use crate::state::{Domain, IndexerState};
use crate::status::{BatchAt, QueryError};

/// Answers one `Route` request.
///
/// # Errors
/// [`QueryError`]: no query, a query over the limits (as `FindMatches` /
/// `FindMatchesByTokens`), a round trip that is not a number of milliseconds >= 0. Counted as
/// refused.
pub fn answer(
    shared: &IndexerState,
    domain: &Domain,
    request: v1::RouteRequest,
) -> Result<v1::RouteResponse, QueryError> {
    let counters = domain.queries.method(QueryMethod::Route);
    let query = decode(shared, domain, request).inspect_err(|_| counters.refused.inc())?;
    let started = Instant::now();
    let routed = domain.router.route(&query).map_err(|e| {
        counters.refused.inc();
        route_tokens(e)
    })?;
    shared
        .metrics
        .query_duration
        .observe(started.elapsed().as_secs_f64());
    counters.answered.inc();
    counters.blocks.inc_by(routed.blocks as u64);
    Ok(wire_answer(&domain.indexer, &routed))
}

/// Answers one `RouteBatch` request: checks the whole batch (its size, the bound of its answer
/// against `limits.max_message_bytes`, every request as a unary Route checks it) before
/// anything is searched or booked, then routes each request in order.
///
/// # Errors
/// [`QueryError::TooManyQueries`], [`QueryError::RouteAnswerTooLarge`],
/// [`QueryError::BatchQueryTooLong`] or [`QueryError::BatchQuery`] (naming the first offending
/// request's index): nothing is answered or booked, and every request counts as refused.
pub fn answer_batch(
    shared: &IndexerState,
    domain: &Domain,
    requests: Vec<v1::RouteRequest>,
) -> Result<Vec<v1::RouteResponse>, QueryError> {
    let at = BatchAt::RouteBatch;
    let counters = domain.queries.method(QueryMethod::RouteBatch);
    let limits = &shared.limits;
    let n = requests.len();
    let refuse = |error: QueryError| {
        counters.refused.inc_by(n as u64);
        error
    };
    if n > limits.max_query_batch as usize {
        return Err(refuse(QueryError::TooManyQueries {
            at,
            queries: n,
            limit: limits.max_query_batch,
        }));
    }
    let bound = answer_bound(&domain.indexer, n);
    if bound > limits.max_message_bytes {
        return Err(refuse(QueryError::RouteAnswerTooLarge {
            requests: n,
            bytes: bound,
            limit: limits.max_message_bytes,
        }));
    }
    let queries = requests
        .into_iter()
        .enumerate()
        .map(|(index, request)| decode(shared, domain, request).map_err(|e| in_batch(at, index, e)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(refuse)?;
    // As FindMatchesBatch: the per-request times go to an unshared copy of the histogram,
    // added to the shared one once per message.
    let duration = shared.metrics.query_duration.local();
    let mut answers = Vec::with_capacity(n);
    let mut blocks = 0u64;
    for (index, query) in queries.iter().enumerate() {
        let started = Instant::now();
        // `decode` checked the token rules: not refused here.
        let routed = domain.router.route(query).map_err(|e| {
            counters.refused.inc_by((n - index) as u64);
            in_batch(at, index, route_tokens(e))
        })?;
        duration.observe(started.elapsed().as_secs_f64());
        counters.answered.inc();
        blocks += routed.blocks as u64;
        answers.push(wire_answer(&domain.indexer, &routed));
    }
    duration.flush();
    counters.blocks.inc_by(blocks);
    Ok(answers)
}

/// The error of request `index` of a batch: a too-long query as `FindMatchesBatch` names it,
/// anything else wrapped with the index.
fn in_batch(at: BatchAt, index: usize, error: QueryError) -> QueryError {
    match error {
        QueryError::TooManyBlocks { blocks, limit, .. } => QueryError::BatchQueryTooLong {
            at,
            index,
            blocks,
            limit,
        },
        error => QueryError::BatchQuery {
            at,
            index,
            error: Box::new(error),
        },
    }
}

/// A wire request checked as the RPC checks it: a query present, at most
/// `limits.max_query_blocks` hashes (the token rules for token ids), round trips that are
/// numbers of milliseconds >= 0.
fn decode(
    shared: &IndexerState,
    domain: &Domain,
    request: v1::RouteRequest,
) -> Result<RouteQuery, QueryError> {
    let rtt = request_rtts(&request.rtt_ms)?;
    let prefix = match request.query {
        Some(WireQuery::Hashes(h)) => {
            let limit = shared.limits.max_query_blocks;
            if h.block_hashes.len() > limit as usize {
                return Err(QueryError::TooManyBlocks {
                    rpc: "Route",
                    blocks: h.block_hashes.len(),
                    limit,
                });
            }
            RoutePrefix::Hashes(h.block_hashes)
        }
        Some(WireQuery::Tokens(t)) => RoutePrefix::Tokens(TokenQuery::from(t)),
        None => return Err(QueryError::RouteWithoutQuery),
    };
    let query = RouteQuery {
        prefix,
        request_tokens: request.request_tokens,
        rtt,
        dry_run: request.dry_run,
    };
    domain.router.check(&query).map_err(route_tokens)?;
    Ok(query)
}

/// A `Route` refused for its token query.
fn route_tokens(error: TokenQueryError) -> QueryError {
    QueryError::Tokens {
        rpc: "Route",
        error,
    }
}

/// The request's own round trips, checked.
/// The longest round trip a request may give, ms (an hour, as `route.rtt_ms`).
const MAX_RTT_MS: f64 = 3.6e6;

fn request_rtts(
    rtt_ms: &std::collections::HashMap<String, f64>,
) -> Result<Vec<(String, Duration)>, QueryError> {
    rtt_ms
        .iter()
        .map(|(dc, &ms)| {
            if (0.0..=MAX_RTT_MS).contains(&ms) {
                Ok((dc.clone(), Duration::from_secs_f64(ms / 1e3)))
            } else {
                Err(QueryError::RouteRtt {
                    dc: dc.clone(),
                    value: ms,
                })
            }
        })
        .collect()
}

/// Most bytes a `RouteBatchResponse` of `requests` answers can take on `indexer`'s lanes: each
/// answer ranking every lane with the largest value in every field. Depends on the manifest
/// only, so a batch is refused or not before anything is routed.
fn answer_bound(indexer: &GlobalCkfIndexer, requests: usize) -> u64 {
    let lanes = (0..indexer.lane_count()).map(|l| LaneIndex::try_from(l).expect("a manifest lane"));
    let pool = |lane| Some(v1::PoolId::from(indexer.pool(lane)));
    let worst = v1::RouteResponse {
        ranked: lanes
            .clone()
            .map(|lane| v1::DcRoute {
                lane: u32::MAX,
                pool: pool(lane),
                depth: u32::MAX,
                cached_tokens: u64::MAX,
                uncached_tokens: u64::MAX,
                rtt_ms: 1.0,
                rtt_from_request: true,
                load_state: i32::MAX,
                load_age_ms: 1.0,
                running: u32::MAX,
                waiting: u32::MAX,
                kv_usage: 1.0,
                booked: u32::MAX,
                prefill_tokens_per_s: 1.0,
                queue_ms: 1.0,
                prefill_ms: 1.0,
                ttft_ms: 1.0,
            })
            .collect(),
        chosen_lane: u32::MAX,
        chosen: lanes
            .map(pool)
            .max_by_key(|p| p.as_ref().map_or(0, Message::encoded_len))
            .flatten(),
        reason: i32::MAX,
        ready_mask: u32::MAX,
        ready_mask_high: u32::MAX,
    }
    .encoded_len() as u64;
    requests as u64 * (1 + prost::encoding::encoded_len_varint(worst) as u64 + worst)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A Route answer on the wire.
pub fn wire_answer(indexer: &GlobalCkfIndexer, routed: &Routed) -> v1::RouteResponse {
    let ranked = routed
        .ranked
        .iter()
        .map(|dc| dc_route(indexer, dc))
        .collect();
    let (chosen_lane, chosen, reason) = match routed.choice {
        Some((lane, reason)) => (
            u32::from(lane),
            Some(indexer.pool(lane).into()),
            match reason {
                Reason::Fastest => v1::RouteReason::Fastest,
                Reason::DeepestOfEqual => v1::RouteReason::DeepestOfEqual,
            },
        ),
        None => (0, None, v1::RouteReason::NoReadyDc),
    };
    let (ready_mask, ready_mask_high) = v1::split_ready_mask(routed.ready_mask);
    v1::RouteResponse {
        ranked,
        chosen_lane,
        chosen,
        reason: reason.into(),
        ready_mask,
        ready_mask_high,
    }
}

/// One ranked DC on the wire.
fn dc_route(indexer: &GlobalCkfIndexer, dc: &RankedDc) -> v1::DcRoute {
    let RankedDc { estimate: e, input } = dc;
    let (state, age) = match e.load {
        LoadState::Known(age) => (v1::LoadState::Known, ms(age)),
        LoadState::Stale(age) => (v1::LoadState::Stale, ms(age)),
        LoadState::Unknown => (v1::LoadState::Unknown, 0.0),
    };
    let report = input.load.map(|(load, _)| load).unwrap_or_default();
    v1::DcRoute {
        lane: u32::from(e.lane),
        pool: Some(indexer.pool(e.lane).into()),
        depth: input.depth,
        cached_tokens: e.cached_tokens,
        uncached_tokens: e.uncached_tokens,
        rtt_ms: ms(e.rtt),
        rtt_from_request: e.rtt_from_request,
        load_state: state.into(),
        load_age_ms: age,
        running: report.running,
        waiting: report.waiting,
        kv_usage: report.kv_usage,
        booked: input.booked,
        prefill_tokens_per_s: e.capacity,
        queue_ms: ms(e.queue),
        prefill_ms: ms(e.prefill),
        ttft_ms: ms(e.ttft),
    }
}

#[cfg(test)]
mod tests {
    use ckf_core::route::{DcEstimate, DcInput, PoolLoad};

    use super::*;

    fn indexer(lanes: usize) -> GlobalCkfIndexer {
        let names: Vec<String> = (0..lanes).map(|i| format!("dc-{i:x}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let config = crate::IndexerConfig::for_lanes("prod", &names);
        GlobalCkfIndexer::with_policy(config.manifest().unwrap(), 1, config.lag_policy()).unwrap()
    }

    /// Every field of a ranked DC at its largest.
    fn largest(lane: LaneIndex) -> RankedDc {
        RankedDc {
            estimate: DcEstimate {
                lane,
                cached_tokens: u64::MAX,
                uncached_tokens: u64::MAX,
                rtt: Duration::MAX,
                rtt_from_request: true,
                load: LoadState::Stale(Duration::MAX),
                capacity: f64::MAX,
                queue: Duration::MAX,
                prefill: Duration::MAX,
                ttft: Duration::MAX,
            },
            input: DcInput {
                lane,
                depth: u32::MAX,
                block_size: 16,
                rtt: None,
                configured_rtt: None,
                load: Some((
                    PoolLoad {
                        engines_reporting: u32::MAX,
                        engines_configured: u32::MAX,
                        running: u32::MAX,
                        waiting: u32::MAX,
                        kv_usage: 1.0,
                        prefill_tokens_per_s: f64::MAX,
                    },
                    Duration::MAX,
                )),
                booked: u32::MAX,
            },
        }
    }

    #[test]
    fn the_answer_bound_holds_the_largest_answers_and_a_full_batch_fits_4_mib() {
        for lanes in [1, 2, 16, 64] {
            let ix = indexer(lanes);
            let routed = Routed {
                ranked: (0..lanes as LaneIndex).map(largest).collect(),
                choice: Some((lanes as LaneIndex - 1, Reason::DeepestOfEqual)),
                ready_mask: u64::MAX,
                blocks: 0,
            };
            for n in [0, 1, 3, 100] {
                let answer = v1::RouteBatchResponse {
                    responses: vec![wire_answer(&ix, &routed); n],
                };
                assert!(
                    answer.encoded_len() as u64 <= answer_bound(&ix, n),
                    "{lanes} lanes, {n} answers"
                );
            }
        }
        // 16 lanes named like prod/dc-a: a full default batch within the default message size.
        assert!(answer_bound(&indexer(16), 1024) <= 4 << 20);
    }
}
