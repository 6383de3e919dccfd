//! The live replay: the simulated fleet driving real producers and a real indexer over gRPC.
//!
//! Per request, in trace order: query the indexer (`FindMatches`), judge the answer against the
//! oracle, route by the policy, serve on the fleet, send the rank's KV events to its DC's producer
//! (`PublishBatch`) and, now and then, start a visibility probe. After the last request: a final
//! drain (a sentinel store per DC, waited for until visible), a re-query of every distinct request
//! with nothing in flight, producer statistics, and offline baselines for the other policies.
//!
//! Preconditions: the replay is the only writer for the fleet's members (`worker_id` 0..W, plus
//! the probe member) on every producer; it clears them before starting.

use std::collections::{HashMap, HashSet};
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use ckf_proto::v1::{
    self, EventStatus, FindMatchesByTokensRequest, FindMatchesRequest, FindMatchesResponse,
    GetStatsRequest, KvEventBatch, LaneState, ListLanesRequest, ingest_client::IngestClient,
    kv_event::Kind, query_client::QueryClient,
};
use indicatif::{ProgressBar, ProgressStyle};
use prost::Message;
use tonic::transport::Channel;

use crate::accuracy::Accuracy;
use crate::events::{Sources, event_blocks, serve_events};
use crate::fleet::{Fleet, FleetShape};
use crate::hashing::block_hashes;
use crate::policy::{Policy, Router};
use crate::probe::{Probes, wait_visible};
use crate::report::{Cost, DcCost, FinalCheck, Report, Throughput, WorkloadInfo};
use crate::sim::{HitRate, simulate};
use crate::stats::Summary;
use crate::trace::Request;

/// The member the replay uses for drain sentinels: `(worker_id = u64::MAX, dp_rank = 0)`.
pub const PROBE_WORKER: u64 = u64::MAX;

/// A workload to replay.
#[derive(Debug, Clone)]
pub struct Workload {
    /// `"synthetic"` or the trace path.
    pub source: String,
    /// The requests, in replay order.
    pub requests: Vec<Request>,
}

/// How to run a live replay.
#[derive(Debug, Clone)]
pub struct LiveConfig {
    /// Fleet shape; `dcs` must equal the number of producers.
    pub shape: FleetShape,
    /// Routing policy of the live run.
    pub policy: Policy,
    /// Seed of the random policy.
    pub seed: u64,
    /// Show a progress bar (on stderr).
    pub progress: bool,
    /// How long to wait for every lane to be ready before starting.
    pub ready_timeout: Duration,
    /// How long a visibility probe polls before giving up.
    pub probe_timeout: Duration,
    /// How long the final drain waits for each DC.
    pub settle_timeout: Duration,
}

/// Whether to draw a progress bar: not under `--json`, and only when stdout is a terminal.
pub fn want_progress(json: bool) -> bool {
    !json && std::io::stdout().is_terminal()
}

/// One DC's connection.
#[derive(Debug, Clone)]
pub struct DcTarget {
    /// The DC id, as in the indexer's manifest (`PoolId.dc`).
    pub dc: String,
    /// The DC's producer.
    pub producer: Channel,
    /// The producer's Prometheus endpoint (`host:port`), for the relay wire cost; optional.
    pub metrics: Option<String>,
}

struct Dc {
    name: String,
    lane: u32,
    ingest: IngestClient<Channel>,
    metrics: Option<String>,
}

/// Replays `workload` through the producers and the indexer and builds the report.
///
/// # Errors
/// Connection or RPC failures, a DC missing from the indexer's manifest, lanes not ready within
/// `ready_timeout`, or a producer rejecting an event (a bug: every event the replay sends is
/// well-formed).
pub async fn replay(
    workload: &Workload,
    indexer: Channel,
    targets: Vec<DcTarget>,
    config: &LiveConfig,
) -> Result<Report> {
    let shape = config.shape;
    shape.validate().map_err(|e| anyhow!(e))?;
    if targets.len() != shape.dcs {
        bail!(
            "fleet has {} DCs but {} producers were given",
            shape.dcs,
            targets.len()
        );
    }
    let mut query = QueryClient::new(indexer);
    let mut dcs = map_lanes(&mut query, targets).await?;
    let lane_to_dc: HashMap<u32, usize> =
        dcs.iter().enumerate().map(|(i, d)| (d.lane, i)).collect();
    wait_ready(&mut query, &dcs, config.ready_timeout).await?;

    let hashes: Vec<Vec<u64>> = workload
        .requests
        .iter()
        .map(|r| block_hashes(&r.hash_ids))
        .collect();
    let run = format!("ckf-replay-{:016x}", rand::random::<u64>());
    let mut sources = Sources::new(run.clone());
    clear_members(&mut dcs, &mut sources, shape).await?;
    let probes = Arc::new(Probes::new(shape.dcs));
    // Start from a drained state: whatever an earlier run left must be gone from the index.
    let mut sentinel = Sentinel {
        run_hash: crate::hashing::chain(0x5e17_13e1, rand::random()),
        next: 0,
    };
    sentinel
        .settle(&mut dcs, &mut query, &mut sources, config.settle_timeout)
        .await?;

    let relay_before = relay_bytes(&dcs).await;
    let mut fleet = Fleet::new(shape);
    let mut router = Router::new(config.policy, config.seed);
    let mut accuracy = Accuracy::default();
    let mut latencies_us = Vec::with_capacity(hashes.len());
    let (mut events, mut blocks, mut wire_bytes) = (0u64, 0u64, 0u64);
    let (mut requested, mut reused) = (0u64, 0u64);
    let mut probe_tasks = tokio::task::JoinSet::new();
    let bar = progress_bar(hashes.len() as u64, config.progress);
    let started = Instant::now();
    for request in &hashes {
        // Watermarks before the query: a batch confirmed visible only while the query was in
        // flight may be newer than what the query captured.
        let watermarks = probes.watermarks();
        let asked = Instant::now();
        let answer = find_matches(&mut query, request, "FindMatches").await?;
        latencies_us.push(asked.elapsed().as_secs_f64() * 1e6);
        let reported = record_answer(
            &mut accuracy,
            request,
            &answer,
            &lane_to_dc,
            &fleet,
            &watermarks,
        );
        let dc = router.choose(&reported, fleet.dc_load());
        let served = fleet.serve(dc, request);
        requested += served.requested as u64;
        reused += served.reused as u64;
        let batch_events = serve_events(&served);
        if !batch_events.is_empty() {
            let worker = format!("{}/w{}", dcs[dc].name, served.slot.worker);
            let batch = sources.batch(&worker, batch_events);
            events += batch.events.len() as u64;
            blocks += batch.events.iter().map(event_blocks).sum::<usize>() as u64;
            wire_bytes += batch.encoded_len() as u64;
            let sent = Instant::now();
            let result = publish(&mut dcs[dc], batch.clone()).await?;
            for (event, outcome) in batch.events.iter().zip(&result.events) {
                if let Some(Kind::Stored(stored)) = &event.kind
                    && outcome.omitted_blocks > 0
                {
                    fleet.oracle_mut().on_omission(dc, &stored.block_hashes);
                }
            }
            // Probe the last block this batch made the DC hold (not one another rank had).
            let fresh = served
                .stored
                .iter()
                .flat_map(|r| &r.hashes)
                .rev()
                .find(|&&h| {
                    let t = fleet.oracle().truth(dc, h);
                    t.holders == 1 && t.stored_at == served.dc_seq && !t.omission_suspect
                });
            if let Some(&hash) = fresh
                && probes.try_claim(dc)
            {
                let (mut client, probes, lane) = (query.clone(), probes.clone(), dcs[dc].lane);
                let (seq, deadline) = (served.dc_seq, sent + config.probe_timeout);
                probe_tasks.spawn(async move {
                    let seen = wait_visible(&mut client, lane, hash, deadline).await;
                    probes.finish(dc, seq, seen.ok().flatten().map(|at| at - sent));
                });
            }
        }
        bar.inc(1);
    }
    let seconds = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    while probe_tasks.join_next().await.is_some() {}

    // Final drain: once each DC's sentinel is visible, every batch before it is too.
    let settled = sentinel
        .settle(&mut dcs, &mut query, &mut sources, config.settle_timeout)
        .await
        .is_ok();
    for (dc, &seq) in fleet.dc_seq().iter().enumerate() {
        if settled {
            probes.raise_watermark(dc, seq);
        }
    }
    let relay = match (relay_before, relay_bytes(&dcs).await) {
        (Some(before), Some(after)) => Some(after.saturating_sub(before)),
        _ => None,
    };
    let final_accuracy = final_check(&mut query, &hashes, &fleet, &lane_to_dc, &probes).await?;

    let mut dc_costs = Vec::with_capacity(dcs.len());
    for (i, dc) in dcs.iter_mut().enumerate() {
        let stats = dc
            .ingest
            .get_stats(GetStatsRequest {})
            .await
            .with_context(|| format!("GetStats on {}", dc.name))?
            .into_inner();
        dc_costs.push(DcCost::new(
            dc.name.clone(),
            stats.unique_blocks,
            fleet.oracle().held_blocks(i) as u64,
            stats.omissions_total,
            stats.load_factor,
            stats.format.map_or(0, |f| f.bucket_count),
            stats.bytes_used,
        ));
    }

    let mut routing = vec![HitRate::new(config.policy, "indexer", requested, reused)];
    for policy in Policy::ALL {
        routing.push(simulate(&hashes, shape, policy, config.seed));
    }
    let distinct: HashSet<u64> = hashes.iter().flatten().copied().collect();
    let queries = hashes.len() as u64;
    let rate = |n: u64| n as f64 / seconds.max(1e-9);
    Ok(Report {
        workload: WorkloadInfo {
            source: workload.source.clone(),
            requests: queries,
            blocks: hashes.iter().map(|h| h.len() as u64).sum(),
            distinct_blocks: distinct.len() as u64,
        },
        fleet: shape,
        policy: config.policy,
        seed: config.seed,
        throughput: Throughput {
            seconds,
            queries,
            events,
            blocks,
            events_per_s: rate(events),
            blocks_per_s: rate(blocks),
            queries_per_s: rate(queries),
        },
        query_latency_us: Summary::of(&latencies_us),
        visibility_lag_ms: Summary::of(&probes.lags_ms()),
        visibility_probe_timeouts: probes.timeouts(),
        accuracy,
        final_check: FinalCheck {
            settled,
            accuracy: final_accuracy,
        },
        routing,
        cost: Cost::new(dc_costs, wire_bytes, relay, events),
    })
}

/// Relay bytes all producers have sent so far, when every DC has a metrics endpoint.
async fn relay_bytes(dcs: &[Dc]) -> Option<u64> {
    let mut total = 0.0;
    for dc in dcs {
        total += crate::scrape::scrape_sum(dc.metrics.as_deref()?, crate::scrape::RELAY_BYTES)
            .await
            .ok()?;
    }
    Some(total as u64)
}

/// Maps each DC to its lane in the indexer's manifest.
async fn map_lanes(query: &mut QueryClient<Channel>, targets: Vec<DcTarget>) -> Result<Vec<Dc>> {
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
async fn wait_ready(query: &mut QueryClient<Channel>, dcs: &[Dc], timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let lanes = query.list_lanes(ListLanesRequest {}).await?.into_inner();
        let waiting: Vec<&str> = dcs
            .iter()
            .filter(|d| {
                !lanes
                    .lanes
                    .iter()
                    .any(|l| l.lane == d.lane && l.state == LaneState::Active as i32)
            })
            .map(|d| d.name.as_str())
            .collect();
        if waiting.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "lanes not ready after {:?}: {}",
                timeout,
                waiting.join(", ")
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends one batch and checks the producer's answer.
async fn publish(dc: &mut Dc, batch: KvEventBatch) -> Result<v1::KvEventBatchResult> {
    let source = batch.source_id.clone();
    let result = dc
        .ingest
        .publish_batch(batch)
        .await
        .with_context(|| format!("PublishBatch to {}", dc.name))?
        .into_inner();
    if result.duplicate || result.gap.is_some() {
        bail!(
            "producer {} saw source {source} out of order (duplicate {}, gap {:?})",
            dc.name,
            result.duplicate,
            result.gap
        );
    }
    if let Some(bad) = result
        .events
        .iter()
        .find(|e| e.status == EventStatus::Rejected as i32)
    {
        bail!("producer {} rejected an event: {}", dc.name, bad.error);
    }
    Ok(result)
}

/// Removes every fleet worker (and the probe member) from every producer.
async fn clear_members(dcs: &mut [Dc], sources: &mut Sources, shape: FleetShape) -> Result<()> {
    for dc in dcs.iter_mut() {
        let events = (0..shape.workers_per_dc as u64)
            .chain([PROBE_WORKER])
            .map(|worker_id| v1::KvEvent {
                member: Some(v1::MemberId {
                    worker_id,
                    dp_rank: 0,
                }),
                kind: Some(Kind::WorkerRemoved(v1::WorkerRemoved {})),
            })
            .collect();
        let batch = sources.batch(&format!("{}/control", dc.name), events);
        publish(dc, batch).await?;
    }
    Ok(())
}

/// Drain sentinels: a fresh block stored by the probe member, waited for, then removed.
struct Sentinel {
    run_hash: u64,
    next: u64,
}

impl Sentinel {
    async fn settle(
        &mut self,
        dcs: &mut [Dc],
        query: &mut QueryClient<Channel>,
        sources: &mut Sources,
        timeout: Duration,
    ) -> Result<()> {
        for dc in dcs.iter_mut() {
            self.next += 1;
            let hash = crate::hashing::chain(self.run_hash, self.next);
            let member = Some(v1::MemberId {
                worker_id: PROBE_WORKER,
                dp_rank: 0,
            });
            let store = v1::KvEvent {
                member,
                kind: Some(Kind::Stored(v1::Stored {
                    block_hashes: vec![hash],
                    parent_hash: None,
                })),
            };
            let source = format!("{}/probe", dc.name);
            publish(dc, sources.batch(&source, vec![store])).await?;
            let seen = wait_visible(query, dc.lane, hash, Instant::now() + timeout).await?;
            let remove = v1::KvEvent {
                member,
                kind: Some(Kind::Removed(v1::Removed {
                    block_hashes: vec![hash],
                })),
            };
            publish(dc, sources.batch(&source, vec![remove])).await?;
            if seen.is_none() {
                bail!("DC {} did not drain within {:?}", dc.name, timeout);
            }
        }
        Ok(())
    }
}

/// Re-queries every distinct request against the final oracle.
async fn final_check(
    query: &mut QueryClient<Channel>,
    hashes: &[Vec<u64>],
    fleet: &Fleet,
    lane_to_dc: &HashMap<u32, usize>,
    probes: &Probes,
) -> Result<Accuracy> {
    let mut accuracy = Accuracy::default();
    let mut seen = HashSet::new();
    let watermarks = probes.watermarks();
    for request in hashes {
        if request.last().is_none_or(|last| !seen.insert(*last)) {
            continue;
        }
        let answer = find_matches(query, request, "FindMatches (final check)").await?;
        record_answer(
            &mut accuracy,
            request,
            &answer,
            lane_to_dc,
            fleet,
            &watermarks,
        );
    }
    Ok(accuracy)
}

fn progress_bar(len: u64, show: bool) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(len), indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(
        "{spinner} replay [{elapsed_precise}] {wide_bar} {pos}/{len} requests ({per_sec}, eta {eta})",
    ) {
        bar.set_style(style);
    }
    bar
}

/// Depth per DC index (`dcs` long) from a `FindMatches` answer: `None` for a DC whose lane was
/// not ready at capture.
/// The indexer's answer for `request` (block hashes, root first); `what` names the call in the
/// error.
///
/// # Errors
/// The failed call's status, with `what` as context.
pub async fn find_matches(
    query: &mut QueryClient<Channel>,
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

/// The indexer's answer for a query by token ids (`FindMatchesByTokens`); `what` names the call
/// in the error.
///
/// # Errors
/// The failed call's status (e.g. `INVALID_ARGUMENT` naming a block-size mismatch), with
/// `what` as context.
pub async fn find_matches_by_tokens(
    query: &mut QueryClient<Channel>,
    request: FindMatchesByTokensRequest,
    what: &'static str,
) -> Result<FindMatchesResponse> {
    Ok(query
        .find_matches_by_tokens(request)
        .await
        .context(what)?
        .into_inner())
}

/// Judges `answer` to `request` against the fleet's oracle (visibility per DC from
/// `watermarks`) into `accuracy`; returns the depth reported per DC (`None`: no answer for
/// that DC's lane).
fn record_answer(
    accuracy: &mut Accuracy,
    request: &[u64],
    answer: &FindMatchesResponse,
    lane_to_dc: &HashMap<u32, usize>,
    fleet: &Fleet,
    watermarks: &[u64],
) -> Vec<Option<usize>> {
    let reported = reported_depths(answer, lane_to_dc, fleet.shape().dcs);
    accuracy.record(
        request,
        &reported,
        fleet.oracle(),
        watermarks,
        fleet.dc_load(),
    );
    reported
}

fn reported_depths(
    answer: &ckf_proto::v1::FindMatchesResponse,
    lane_to_dc: &HashMap<u32, usize>,
    dcs: usize,
) -> Vec<Option<usize>> {
    let mut reported = vec![None; dcs];
    for m in &answer.matches {
        if let Some(&dc) = lane_to_dc.get(&m.lane) {
            reported[dc] = Some(m.depth as usize);
        }
    }
    reported
}
