//! The live run's questions to the indexer: which lane is each DC's, are the lanes ready and
//! is every DC's load known, and per request its prefix depths (`FindMatches`,
//! `FindMatchesByTokens`) or its routing decision (`Route`).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use ckf_proto::v1::{
    self, FindMatchesRequest, FindMatchesResponse, LaneState, ListLanesRequest,
    ingest_client::IngestClient, query_client::QueryClient,
};
use ckf_svc_kit::access::AuthedChannel;

use super::dcs::{Dc, DcTarget};

/// Maps each DC to its lane in the indexer's manifest.
pub(super) async fn map_lanes(
    query: &mut QueryClient<AuthedChannel>,
    targets: Vec<DcTarget>,
) -> Result<Vec<Dc>> {
    let lanes = query
        .list_lanes(ListLanesRequest {})
        .await
        .context("ListLanes")?
        .into_inner();
    let mut names = HashSet::new();
    if let Some(t) = targets.iter().find(|t| !names.insert(t.dc.as_str())) {
        bail!("DC {} is given twice", t.dc);
    }
    targets
        .into_iter()
        .map(|t| {
            let lane = lanes
                .lanes
                .iter()
                .find(|l| l.pool.as_ref().is_some_and(|p| p.dc == t.dc))
                .map(|l| l.lane)
                .ok_or_else(|| {
                    anyhow!(
                        "DC {} has no lane in the indexer's manifest (domain {})",
                        t.dc,
                        lanes.domain
                    )
                })?;
            Ok(Dc {
                name: t.dc,
                lane,
                ingest: IngestClient::new(t.producer),
                metrics: t.metrics,
            })
        })
        .collect()
}

/// Waits until every DC's lane is active.
pub(super) async fn wait_ready(
    query: &mut QueryClient<AuthedChannel>,
    dcs: &[Dc],
    timeout: Duration,
) -> Result<()> {
    let not_ready = |waiting| anyhow!("lanes not ready after {timeout:?}: {waiting}");
    wait_every_dc(
        dcs,
        timeout,
        Duration::from_millis(20),
        not_ready,
        async || {
            let lanes = query.list_lanes(ListLanesRequest {}).await?.into_inner();
            Ok(lanes
                .lanes
                .iter()
                .filter(|l| l.state == LaneState::Active as i32)
                .map(|l| l.lane)
                .collect())
        },
    )
    .await
}

/// Waits until the indexer knows every DC's load (the producers' first scrapes have been
/// relayed), as it would in a running fleet, asking a dry-run `Route`.
pub(super) async fn wait_load_known(
    query: &mut QueryClient<AuthedChannel>,
    dcs: &[Dc],
    timeout: Duration,
) -> Result<()> {
    let request = v1::RouteRequest {
        query: Some(v1::route_request::Query::Hashes(FindMatchesRequest {
            block_hashes: vec![0],
        })),
        dry_run: true,
        ..Default::default()
    };
    let no_load = |waiting| {
        anyhow!(
            "no load report from {waiting} after {timeout:?} (a producer reports every load \
             interval, the first one an interval after it attaches): is each producer scraping \
             its engines?"
        )
    };
    wait_every_dc(
        dcs,
        timeout,
        Duration::from_millis(50),
        no_load,
        async || {
            let answer = query.route(request.clone()).await.context("Route")?;
            Ok(answer
                .into_inner()
                .ranked
                .iter()
                .filter(|r| r.load_state == v1::LoadState::Known as i32)
                .map(|r| r.lane)
                .collect())
        },
    )
    .await
}

/// Polls `lanes_done` every `every` until it holds every DC's lane. A failed poll is the
/// error; after `timeout`, `on_timeout` of the DCs still missing (comma-separated).
async fn wait_every_dc(
    dcs: &[Dc],
    timeout: Duration,
    every: Duration,
    on_timeout: impl FnOnce(String) -> anyhow::Error,
    mut lanes_done: impl AsyncFnMut() -> Result<HashSet<u32>>,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let done = lanes_done().await?;
        let waiting: Vec<&str> = dcs
            .iter()
            .filter(|d| !done.contains(&d.lane))
            .map(|d| d.name.as_str())
            .collect();
        if waiting.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(on_timeout(waiting.join(", ")));
        }
        tokio::time::sleep(every).await;
    }
}

/// The indexer's answer for a request: by its tokens (`FindMatchesByTokens`, the indexer's
/// block size) when given, else by its block hashes.
///
/// # Errors
/// The failed call's status, with `what` as context.
pub(super) async fn ask(
    query: &mut QueryClient<AuthedChannel>,
    request: &[u64],
    tokens: Option<&Vec<u32>>,
    what: &'static str,
) -> Result<FindMatchesResponse> {
    let Some(tokens) = tokens else {
        return find_matches(query, request, what).await;
    };
    Ok(query
        .find_matches_by_tokens(v1::FindMatchesByTokensRequest {
            token_ids: tokens.clone(),
            ..Default::default()
        })
        .await
        .context(what)?
        .into_inner())
}

/// The indexer's answer for `request` (block hashes, root first); `what` names the call in the
/// error.
///
/// # Errors
/// The failed call's status, with `what` as context.
async fn find_matches(
    query: &mut QueryClient<AuthedChannel>,
    request: &[u64],
    what: &'static str,
) -> Result<FindMatchesResponse> {
    Ok(query
        .find_matches(FindMatchesRequest {
            block_hashes: request.to_vec(),
        })
        .await
        .context(what)?
        .into_inner())
}

/// The depth an answer reports per DC (`None`: no answer for that DC's lane), from its
/// `(lane, depth)` entries.
pub(super) fn reported_depths(
    answer: impl Iterator<Item = (u32, u32)>,
    lane_to_dc: &HashMap<u32, usize>,
    dcs: usize,
) -> Vec<Option<usize>> {
    let mut reported = vec![None; dcs];
    for (lane, depth) in answer {
        if let Some(&dc) = lane_to_dc.get(&lane) {
            reported[dc] = Some(depth as usize);
        }
    }
    reported
}

/// The indexer's `Route` answer for a request (by its tokens when given, else its block
/// hashes), booked: `prompt` tokens in the indexer's unit, the round trips by DC id.
///
/// # Errors
/// The failed call's status.
pub(super) async fn ask_route(
    query: &mut QueryClient<AuthedChannel>,
    request: &[u64],
    tokens: Option<&Vec<u32>>,
    prompt: f64,
    rtt_ms: &HashMap<String, f64>,
) -> Result<v1::RouteResponse> {
    let ask = match tokens {
        Some(tokens) => v1::route_request::Query::Tokens(v1::FindMatchesByTokensRequest {
            token_ids: tokens.clone(),
            ..Default::default()
        }),
        None => v1::route_request::Query::Hashes(FindMatchesRequest {
            block_hashes: request.to_vec(),
        }),
    };
    Ok(query
        .route(v1::RouteRequest {
            query: Some(ask),
            request_tokens: prompt.ceil().max(1.0) as u64,
            rtt_ms: rtt_ms.clone(),
            dry_run: false,
        })
        .await
        .context("Route")?
        .into_inner())
}
