//! `ckf route`: one `Query/Route` by block hashes (or trace `--ids`) or by token ids, the DCs
//! ranked by expected time to first token with every term, and the choice with its reason.

use anyhow::{Context, Result};
use ckf_proto::v1::{RouteRequest, route_request};
use serde_json::json;

use crate::operator::args::RouteArgs;
use crate::operator::query::Ask;

/// `ckf route`.
///
/// # Errors
/// An unreadable or malformed tokens file, an unreachable indexer or a failed call (the
/// indexer's `INVALID_ARGUMENT` message names a refused request's fault).
pub async fn route(args: RouteArgs) -> Result<()> {
    let q = &args.query;
    let ask = Ask::of(q)?;
    let mut client = q.target.client().await?;
    let (count, unit) = (ask.count(), ask.unit());
    let request = RouteRequest {
        query: Some(match ask {
            Ask::Hashes(h) => route_request::Query::Hashes(h),
            Ask::Tokens(t) => route_request::Query::Tokens(t),
        }),
        request_tokens: args.request_tokens.unwrap_or(0),
        rtt_ms: args.rtt_ms.iter().cloned().collect(),
        dry_run: !args.book,
    };
    let answer = client.route(request).await.context("Route")?.into_inner();
    let dc_of = |pool: &Option<ckf_proto::v1::PoolId>| {
        pool.as_ref()
            .map_or_else(|| "?".to_owned(), |p| p.dc.clone())
    };
    let chosen = answer.chosen.as_ref().map(|p| p.dc.clone());
    if q.json {
        let ranked: Vec<_> = answer
            .ranked
            .iter()
            .map(|d| {
                json!({
                    "lane": d.lane, "dc": dc_of(&d.pool), "depth": d.depth,
                    "cached_tokens": d.cached_tokens, "uncached_tokens": d.uncached_tokens,
                    "rtt_ms": d.rtt_ms, "rtt_from_request": d.rtt_from_request,
                    "load": d.load_state().as_str_name(), "load_age_ms": d.load_age_ms,
                    "running": d.running, "waiting": d.waiting, "kv_usage": d.kv_usage,
                    "booked": d.booked,
                    "prefill_tokens_per_s": d.prefill_tokens_per_s,
                    "queue_ms": d.queue_ms, "prefill_ms": d.prefill_ms, "ttft_ms": d.ttft_ms,
                })
            })
            .collect();
        let ready = answer.ready_lanes();
        let out = json!({
            unit: count, "ready_mask": ready,
            "ready_lanes": crate::operator::ready_lane_list(ready), "ranked": ranked,
            "chosen": chosen, "chosen_lane": answer.chosen_lane,
            "reason": answer.reason().as_str_name(),
        });
        crate::outln!("{}", serde_json::to_string_pretty(&out)?)?;
        return Ok(());
    }
    match &chosen {
        Some(dc) => crate::outln!(
            "{count} {unit}: route to {dc} (lane {}, {})",
            answer.chosen_lane,
            answer.reason().as_str_name()
        )?,
        None => crate::outln!("{count} {unit}: no ready DC")?,
    }
    crate::outln!(
        "{:>4}  {:<12} {:>5} {:>8} {:>9} {:>8}  {:<8} {:>4} {:>4} {:>4} {:>9} {:>9} {:>9}",
        "lane",
        "dc",
        "depth",
        "cached",
        "uncached",
        "rtt ms",
        "load",
        "run",
        "wait",
        "book",
        "queue ms",
        "prefill",
        "ttft ms"
    )?;
    for d in &answer.ranked {
        let load = match d.load_state().as_str_name() {
            "LOAD_STATE_KNOWN" => "known",
            "LOAD_STATE_STALE" => "stale",
            _ => "unknown",
        };
        crate::outln!(
            "{:>4}  {:<12} {:>5} {:>8} {:>9} {:>8.1}{} {:<8} {:>4} {:>4} {:>4} {:>9.1} {:>9.1} {:>9.1}",
            d.lane,
            dc_of(&d.pool),
            d.depth,
            d.cached_tokens,
            d.uncached_tokens,
            d.rtt_ms,
            if d.rtt_from_request { "*" } else { " " },
            load,
            d.running,
            d.waiting,
            d.booked,
            d.queue_ms,
            d.prefill_ms,
            d.ttft_ms
        )?;
    }
    Ok(())
}
