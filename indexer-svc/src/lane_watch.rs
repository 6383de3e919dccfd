//! Keeps the lane metrics current: one task per lane follows ckf-core's lane events (counting
//! retirements by reason, whoever caused them: a relay frame, a deadline, saturation) and
//! refreshes the lane gauges on every event and every [`REFRESH`].

use std::sync::Arc;
use std::time::Duration;

use ckf_core::identity::LaneIndex;
use ckf_core::lane::LaneEventKind;
use tokio::task::JoinHandle;

use crate::state::IndexerState;

/// Gauge refresh period when no event arrives (a lease grant emits none).
pub const REFRESH: Duration = Duration::from_millis(250);

/// Spawns the watcher of every lane; they end on shutdown.
pub fn spawn_all(shared: &Arc<IndexerState>) -> Vec<JoinHandle<()>> {
    (0..shared.indexer.lane_count())
        .map(|lane| tokio::spawn(watch(Arc::clone(shared), lane as LaneIndex)))
        .collect()
}

async fn watch(shared: Arc<IndexerState>, lane: LaneIndex) {
    let Ok(events) = shared.indexer.subscribe(lane) else {
        return;
    };
    let labels = shared.labels(lane).clone();
    let mut tick = tokio::time::interval(REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shared.shutdown.wait() => return,
            event = events.recv_async() => match event {
                Ok(event) => {
                    if let LaneEventKind::Retired(reason) = &event.kind {
                        shared.metrics.retired(&labels, reason);
                        tracing::warn!(lane, dc = %labels.dc, lease = %event.lease, %reason, "lane retired");
                    }
                }
                Err(_) => return,
            },
            _ = tick.tick() => {}
        }
        if let Ok(status) = shared.indexer.lane_status(lane) {
            shared.metrics.observe_lane(&labels, &status);
        }
    }
}
