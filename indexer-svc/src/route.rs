//! `Query/Route`: the search of a request's prefix, then `ckf_core::route` over every ready
//! lane with its kept load report and round trip; the choice is booked on its lane until that
//! lane's next load report. This module only gathers the inputs, counts, and translates the
//! answer.

use std::time::{Duration, Instant};

use ckf_core::route::{DcEstimate, DcInput, LoadState, Reason, route};
use ckf_core::tokens::TokenQuery;
use ckf_proto::v1::{self, route_request::Query as RouteQuery};

use crate::metrics::QueryMethod;
use crate::state::IndexerState;
use crate::status::QueryError;

/// Answers one `Route` request.
///
/// # Errors
/// [`QueryError`]: no query, a query over the limits (as `FindMatches` /
/// `FindMatchesByTokens`), a round trip that is not a number of milliseconds >= 0. Counted as
/// refused.
pub fn answer(
    shared: &IndexerState,
    request: v1::RouteRequest,
) -> Result<v1::RouteResponse, QueryError> {
    let counters = shared.metrics.query_method(QueryMethod::Route);
    let refused = |e: QueryError| {
        counters.refused.inc();
        e
    };
    let rtt = request_rtts(&request.rtt_ms).map_err(refused)?;
    let indexer = &shared.indexer;
    let block_size = shared.token_rules.block_size;
    let started = Instant::now();
    let (found, query_tokens, blocks) = match request.query {
        Some(RouteQuery::Hashes(h)) => {
            let limit = shared.limits.max_query_blocks;
            if h.block_hashes.len() > limit as usize {
                return Err(refused(QueryError::TooManyBlocks {
                    blocks: h.block_hashes.len(),
                    limit,
                }));
            }
            let n = h.block_hashes.len();
            let found = indexer.find_prefix_matches(&h.block_hashes);
            (found, n as u64 * u64::from(block_size), n)
        }
        Some(RouteQuery::Tokens(t)) => {
            let tokens = t.token_ids.len() as u64;
            let query = TokenQuery::from(t);
            let hashes = query
                .lazy_sequence_hashes(&shared.token_rules)
                .map_err(|e| refused(QueryError::Tokens(e)))?;
            let n = hashes.len();
            (indexer.find_prefix_matches_by_tokens(hashes), tokens, n)
        }
        None => return Err(refused(QueryError::RouteWithoutQuery)),
    };
    let request_tokens = match request.request_tokens {
        0 => query_tokens,
        n => n,
    };
    let now = Instant::now();
    let dcs: Vec<DcInput> = {
        let loads = shared.loads.lock().expect("lane loads");
        let bookings = shared.bookings.lock().expect("bookings");
        found
            .iter()
            .map(|(lane, depth)| {
                let dc = indexer.pool(lane).dc.as_str();
                DcInput {
                    lane,
                    depth,
                    block_size,
                    rtt: rtt.iter().find(|(d, _)| d == dc).map(|(_, r)| *r),
                    configured_rtt: shared.route.rtt(dc),
                    load: loads.latest(lane, now),
                    booked: bookings.booked(lane),
                }
            })
            .collect()
    };
    let routed = route(&shared.route.model(), request_tokens, &dcs);
    if let Some((lane, reason)) = routed.choice {
        shared.bookings.lock().expect("bookings").book(lane);
        shared
            .metrics
            .route_decisions
            .with_label_values(&[shared.labels(lane).dc.as_str(), reason.label()])
            .inc();
    }
    shared
        .metrics
        .query_duration
        .observe(started.elapsed().as_secs_f64());
    counters.answered.inc();
    counters.blocks.inc_by(blocks as u64);
    let ranked = routed
        .ranked
        .iter()
        .map(|e| {
            let input = dcs.iter().find(|d| d.lane == e.lane).expect("an input");
            dc_route(shared, e, input)
        })
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
    Ok(v1::RouteResponse {
        ranked,
        chosen_lane,
        chosen,
        reason: reason.into(),
        ready_mask: u32::from(found.ready_mask()),
    })
}

/// The request's own round trips, checked.
fn request_rtts(
    rtt_ms: &std::collections::HashMap<String, f64>,
) -> Result<Vec<(String, Duration)>, QueryError> {
    rtt_ms
        .iter()
        .map(|(dc, &ms)| match Duration::try_from_secs_f64(ms / 1e3) {
            Ok(d) => Ok((dc.clone(), d)),
            Err(_) => Err(QueryError::RouteRtt {
                dc: dc.clone(),
                value: ms,
            }),
        })
        .collect()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One ranked DC on the wire.
fn dc_route(shared: &IndexerState, e: &DcEstimate, input: &DcInput) -> v1::DcRoute {
    let (state, age) = match e.load {
        LoadState::Known(age) => (v1::LoadState::Known, ms(age)),
        LoadState::Stale(age) => (v1::LoadState::Stale, ms(age)),
        LoadState::Unknown => (v1::LoadState::Unknown, 0.0),
    };
    let report = input.load.map(|(load, _)| load).unwrap_or_default();
    v1::DcRoute {
        lane: u32::from(e.lane),
        pool: Some(shared.indexer.pool(e.lane).into()),
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
