//! `ckf lanes`: the indexer's lanes (`ListLanes`), their states and why each was retired.

use anyhow::{Context, Result};
use ckf_proto::v1::{LaneState, ListLanesRequest, RetireReason};
use serde_json::json;

use crate::operator::args::LanesArgs;

fn state_name(state: i32) -> &'static str {
    match LaneState::try_from(state) {
        Ok(LaneState::Unassigned) => "unassigned",
        Ok(LaneState::AwaitingSnapshot) => "awaiting-snapshot",
        Ok(LaneState::Active) => "active",
        Ok(LaneState::Retired) => "retired",
        _ => "unknown",
    }
}

fn reason_name(reason: i32) -> String {
    match RetireReason::try_from(reason) {
        Ok(RetireReason::Unspecified) => "-".into(),
        Ok(r) => r
            .as_str_name()
            .trim_start_matches("RETIRE_REASON_")
            .to_lowercase(),
        Err(_) => format!("unknown({reason})"),
    }
}

/// `ckf lanes`.
///
/// # Errors
/// An unreachable indexer or a failed call.
pub async fn lanes(args: LanesArgs) -> Result<()> {
    let mut client = args.target.client().await?;
    let answer = client
        .list_lanes(ListLanesRequest {})
        .await
        .context("ListLanes")?
        .into_inner();
    if args.json {
        let lanes: Vec<_> = answer
            .lanes
            .iter()
            .map(|l| {
                let pool = l.pool.clone().unwrap_or_default();
                json!({
                    "lane": l.lane, "dc": pool.dc, "state": state_name(l.state),
                    "block_size": l.block_size,
                    "lease_epoch": l.lease_epoch, "incarnation": l.incarnation,
                    "installed_sequence": l.installed_sequence,
                    "last_update_age_ms": l.last_update_age_ms, "load_factor": l.load_factor,
                    "retirements": l.retirements, "last_retire_reason": reason_name(l.last_retire_reason),
                    "last_retire_detail": l.last_retire_detail, "drained": l.drained,
                    "drain_grace_remaining_ms": l.drain_grace_remaining_ms,
                    "contention_count": l.contention_count,
                    "last_contender_incarnation": l.last_contender_incarnation,
                    "last_contention_holder_incarnation": l.last_contention_holder_incarnation,
                    "last_contention_age_ms": l.last_contention_age_ms,
                    "last_contention_kind": contention_name(l.last_contention_kind),
                })
            })
            .collect();
        let format = answer.format.unwrap_or_default();
        let out = json!({
            "domain": answer.domain, "consumer_instance": answer.consumer_instance,
            "bucket_count": format.bucket_count, "seed": format.seed, "lanes": lanes,
        });
        crate::outln!("{}", serde_json::to_string_pretty(&out)?)?;
        return Ok(());
    }
    let format = answer.format.unwrap_or_default();
    crate::outln!(
        "domain {}  consumer instance {:#x}  format v{} ({} buckets, seed {})",
        answer.domain,
        answer.consumer_instance,
        format.version,
        format.bucket_count,
        format.seed
    )?;
    crate::outln!(
        "{:>4}  {:<12} {:>5} {:<17} {:>5} {:>10} {:>9} {:>7} {:>7}  last reason",
        "lane",
        "dc",
        "block",
        "state",
        "epoch",
        "installed",
        "age ms",
        "load",
        "retired"
    )?;
    for l in &answer.lanes {
        let dc = l.pool.as_ref().map_or("?", |p| p.dc.as_str());
        let age = l
            .last_update_age_ms
            .map_or_else(|| "-".to_string(), |a| a.to_string());
        let mut reason = reason_name(l.last_retire_reason);
        if !l.last_retire_detail.is_empty() {
            reason = format!("{reason}: {}", l.last_retire_detail);
        }
        crate::outln!(
            "{:>4}  {:<12} {:>5} {:<17} {:>5} {:>10} {:>9} {:>6.1}% {:>7}  {}{}",
            l.lane,
            dc,
            l.block_size,
            state_name(l.state),
            l.lease_epoch,
            l.installed_sequence,
            age,
            l.load_factor * 100.0,
            l.retirements,
            reason,
            match (l.drained, l.drain_grace_remaining_ms) {
                (true, Some(ms)) => format!(" (drained, leaves the ready set in {ms} ms)"),
                (true, None) => " (drained)".to_owned(),
                _ => String::new(),
            }
        )?;
        if l.contention_count > 0 {
            crate::outln!(
                "      contention: {} (last {} by incarnation {:#018x} against {:#018x}, {} ms ago)",
                l.contention_count,
                contention_name(l.last_contention_kind),
                l.last_contender_incarnation,
                l.last_contention_holder_incarnation,
                l.last_contention_age_ms
                    .map_or_else(|| "-".to_string(), |a| a.to_string()),
            )?;
        }
    }
    Ok(())
}

/// The lower-case name of a wire contention kind.
fn contention_name(kind: i32) -> &'static str {
    match ckf_proto::v1::ContentionKind::try_from(kind) {
        Ok(ckf_proto::v1::ContentionKind::IfVacantRefused) => "if_vacant_refused",
        Ok(ckf_proto::v1::ContentionKind::Takeover) => "takeover",
        _ => "none",
    }
}
