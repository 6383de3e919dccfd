//! Keeps the lane metrics current: one task per lane follows ckf-core's lane events (counting
//! retirements by reason, whoever caused them: a relay frame, a deadline, the drain grace,
//! saturation; and lane contention by kind) and refreshes the lane gauges on every event and
//! every [`REFRESH`]. A takeover of a live holder is logged at ERROR (two live producers for
//! one pool is a deployment error); an `IF_VACANT` refusal at WARN by the relay handler.

use std::sync::Arc;
use std::time::Duration;

use ckf_core::identity::LaneIndex;
use ckf_core::lane::{ContentionKind, LaneEventKind, RetireReason};
use tokio::task::JoinHandle;

use crate::state::{Domain, IndexerState};

/// Gauge refresh period when no event arrives (a lease grant emits none).
pub const REFRESH: Duration = Duration::from_millis(250);

/// Spawns the watcher of every lane of every domain; they end on shutdown.
pub fn spawn_all(shared: &Arc<IndexerState>) -> Vec<JoinHandle<()>> {
    shared
        .domains()
        .iter()
        .flat_map(|(_, domain)| spawn_domain(shared, domain))
        .collect()
}

/// Spawns the watcher of every lane of `domain`; they end on shutdown or when the domain is
/// removed.
pub fn spawn_domain(shared: &Arc<IndexerState>, domain: &Arc<Domain>) -> Vec<JoinHandle<()>> {
    (0..domain.indexer.lane_count())
        .map(|lane| {
            tokio::spawn(watch(
                Arc::clone(shared),
                Arc::clone(domain),
                lane as LaneIndex,
            ))
        })
        .collect()
}

async fn watch(shared: Arc<IndexerState>, domain: Arc<Domain>, lane: LaneIndex) {
    let Ok(events) = domain.indexer.subscribe(lane) else {
        return;
    };
    let labels = domain.labels(lane).clone();
    for kind in ContentionKind::ALL {
        // Exported from the start, at 0.
        shared.metrics.lane_contention.with_label_values(&[
            &labels.domain,
            &labels.dc,
            kind.as_str(),
        ]);
    }
    let mut tick = tokio::time::interval(REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shared.shutdown.wait() => return,
            () = domain.removed.wait() => return,
            event = events.recv_async() => match event {
                Ok(event) => match &event.kind {
                    LaneEventKind::Retired(reason @ RetireReason::DrainGraceExpired { .. }) => {
                        shared.metrics.retired(&labels, reason);
                        // Expected after a drain nobody followed: not a failure.
                        tracing::info!(domain = %labels.domain, lane, dc = %labels.dc, lease = %event.lease, %reason, "drained lane left the ready set");
                    }
                    LaneEventKind::Retired(reason) => {
                        shared.metrics.retired(&labels, reason);
                        tracing::warn!(domain = %labels.domain, lane, dc = %labels.dc, lease = %event.lease, %reason, "lane retired");
                    }
                    LaneEventKind::Contended { kind, contender } => {
                        shared.metrics.contended(&labels, *kind);
                        if *kind == ContentionKind::Takeover {
                            // The message is matched by the e2e tests (tests/): keep it stable.
                            tracing::error!(domain = %labels.domain, lane, dc = %labels.dc, lease = %event.lease, %contender, "a live attachment was taken over by another producer incarnation: two producers for one pool");
                        }
                    }
                    _ => {}
                },
                Err(_) => return,
            },
            _ = tick.tick() => {}
        }
        if let Ok(status) = domain.indexer.lane_status(lane) {
            shared.metrics.observe_lane(&labels, &status);
        }
    }
}
