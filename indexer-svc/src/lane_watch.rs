//! Counts the lane events: one task per lane follows ckf-core's lane events, counting
//! retirements by reason, whoever caused them (a relay frame, a deadline, the drain grace,
//! saturation), and lane contention by kind. A lane removed by a catalog reload ends its task
//! after counting its retirement (`removed`) and withdrawing its DC gauges; a lane added gets a
//! task. A takeover of a live holder is logged at ERROR (two live producers for one pool is a
//! deployment error); an `IF_VACANT` refusal at WARN by the relay handler. The lane gauges are
//! read at each scrape (`metrics::LaneGauges`), not here.

use std::sync::Arc;

use ckf_core::identity::LaneIndex;
use ckf_core::lane::{ContentionKind, LaneEvent, LaneEventKind, RetireReason};
use tokio::task::JoinHandle;

use crate::metrics::LaneLabels;
use crate::state::{Domain, IndexerState};

/// Spawns the watcher of every lane of every domain; they end on shutdown.
pub fn spawn_all(shared: &Arc<IndexerState>) -> Vec<JoinHandle<()>> {
    shared
        .domains()
        .iter()
        .flat_map(|(_, domain)| spawn_domain(shared, domain))
        .collect()
}

/// Spawns the watcher of every lane of `domain` serving a pool; they end on shutdown, when the
/// domain is removed, or when their lane is (after counting its retirement and withdrawing its
/// gauges).
pub fn spawn_domain(shared: &Arc<IndexerState>, domain: &Arc<Domain>) -> Vec<JoinHandle<()>> {
    (0..domain.indexer.lane_count() as LaneIndex)
        .filter(|&lane| domain.indexer.slot(lane).is_some() && !domain.indexer.is_removed(lane))
        .map(|lane| spawn_lane(shared, domain, lane))
        .collect()
}

/// Spawns the watcher of `lane` of `domain` (a lane added or added back), replacing any it had.
pub fn spawn_lane(
    shared: &Arc<IndexerState>,
    domain: &Arc<Domain>,
    lane: LaneIndex,
) -> JoinHandle<()> {
    let task = tokio::spawn(watch(Arc::clone(shared), Arc::clone(domain), lane));
    let mut watchers = domain.lane_watchers.lock().expect("lane watchers lock");
    if let Some(old) = watchers[usize::from(lane)].replace(task.abort_handle()) {
        old.abort();
    }
    task
}

/// Counts and logs one lane event.
fn on_event(shared: &IndexerState, labels: &LaneLabels, lane: LaneIndex, event: &LaneEvent) {
    match &event.kind {
        LaneEventKind::Retired(reason @ RetireReason::DrainGraceExpired { .. }) => {
            shared.metrics.retired(labels, reason);
            // Expected after a drain nobody followed: not a failure.
            tracing::info!(domain = %labels.domain, lane, dc = %labels.dc, lease = %event.lease, %reason, "drained lane left the ready set");
        }
        LaneEventKind::Retired(reason @ RetireReason::Removed) => {
            shared.metrics.retired(labels, reason);
            tracing::info!(domain = %labels.domain, lane, dc = %labels.dc, lease = %event.lease, %reason, "lane removed by a catalog reload");
        }
        LaneEventKind::Retired(reason) => {
            shared.metrics.retired(labels, reason);
            tracing::warn!(domain = %labels.domain, lane, dc = %labels.dc, lease = %event.lease, %reason, "lane retired");
        }
        LaneEventKind::Contended { kind, contender } => {
            shared.metrics.contended(labels, *kind);
            if *kind == ContentionKind::Takeover {
                // The message is matched by the e2e tests (tests/): keep it stable.
                tracing::error!(domain = %labels.domain, lane, dc = %labels.dc, lease = %event.lease, %contender, "a live attachment was taken over by another producer incarnation: two producers for one pool");
            }
        }
        _ => {}
    }
}

async fn watch(shared: Arc<IndexerState>, domain: Arc<Domain>, lane: LaneIndex) {
    let Ok(events) = domain.indexer.subscribe(lane) else {
        return;
    };
    let Some(labels) = LaneLabels::of(&domain.indexer, lane) else {
        return;
    };
    for kind in ContentionKind::ALL {
        // Exported from the start, at 0.
        shared.metrics.lane_contention.with_label_values(&[
            &labels.domain,
            &labels.dc,
            kind.as_str(),
        ]);
    }
    loop {
        tokio::select! {
            () = shared.shutdown.wait() => return,
            event = events.recv_async() => match event {
                Ok(event) => on_event(&shared, &labels, lane, &event),
                Err(_) => return,
            },
            // The domain removed: this task may have counted an event after the reload
            // withdrew the domain's series, so it withdraws them once more, last.
            () = domain.removed.wait() => {
                shared.metrics.forget_lanes(std::slice::from_ref(&labels));
                shared.queue_sweep();
                return;
            }
        }
        if domain.indexer.is_removed(lane) {
            // Its retirement (if it had a lease) is counted before the watcher ends.
            while let Ok(event) = events.try_recv() {
                on_event(&shared, &labels, lane, &event);
            }
            shared.metrics.forget_lanes(std::slice::from_ref(&labels));
            return;
        }
        if domain.removed.is_triggered() {
            shared.metrics.forget_lanes(std::slice::from_ref(&labels));
            shared.queue_sweep();
            return;
        }
    }
}
