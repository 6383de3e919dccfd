//! Visibility probes: when does a store sent to a producer become visible in `FindMatches`?
//!
//! A probe polls the indexer with a one-block query until the block's DC lane reports depth 1.
//! Its result is both a lag sample (send -> visible) and a *watermark*: each DC's events travel
//! in order (one batch at a time to the producer, sequenced deltas to the indexer), so once a
//! block stored in DC batch `s` is visible, every batch `<= s` of that DC is visible too.
//! [`Accuracy`](crate::bench::accuracy::Accuracy) uses the watermark to tell in-flight updates
//! from lost ones.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ckf_proto::v1::FindMatchesRequest;
use ckf_proto::v1::query_client::QueryClient;
use ckf_svc_kit::access::AuthedChannel;

/// How often a probe re-queries.
pub const POLL_INTERVAL: Duration = Duration::from_micros(250);

/// Polls until `lane` reports `hash` present (depth >= 1). Returns when it became visible, or
/// `None` at `deadline`.
///
/// # Errors
/// The gRPC status of a failed query.
pub async fn wait_visible(
    client: &mut QueryClient<AuthedChannel>,
    lane: u32,
    hash: u64,
    deadline: Instant,
) -> Result<Option<Instant>, tonic::Status> {
    loop {
        let answer = client
            .find_matches(FindMatchesRequest {
                block_hashes: vec![hash],
            })
            .await?
            .into_inner();
        let now = Instant::now();
        if answer
            .matches
            .iter()
            .any(|m| m.lane == lane && m.depth >= 1)
        {
            return Ok(Some(now));
        }
        if now >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Shared probe state: per-DC watermarks and busy flags, lag samples.
#[derive(Debug)]
pub struct Probes {
    watermarks: Vec<AtomicU64>,
    busy: Vec<AtomicBool>,
    lags_ms: Mutex<Vec<f64>>,
    timeouts: AtomicU64,
}

impl Probes {
    /// State for `dcs` DCs, every watermark 0.
    pub fn new(dcs: usize) -> Self {
        Self {
            watermarks: (0..dcs).map(|_| AtomicU64::new(0)).collect(),
            busy: (0..dcs).map(|_| AtomicBool::new(false)).collect(),
            lags_ms: Mutex::new(Vec::new()),
            timeouts: AtomicU64::new(0),
        }
    }

    /// Claims the DC's single probe rank_id; `false` when a probe is already running there.
    pub fn try_claim(&self, dc: usize) -> bool {
        !self.busy[dc].swap(true, Ordering::AcqRel)
    }

    /// Ends a probe claimed with [`Probes::try_claim`]: `visible_after` is the send-to-visible
    /// time, `None` for a timeout; `seq` the DC batch it confirms.
    pub fn finish(&self, dc: usize, seq: u64, visible_after: Option<Duration>) {
        match visible_after {
            Some(lag) => {
                self.raise_watermark(dc, seq);
                self.lags_ms
                    .lock()
                    .expect("lag samples lock")
                    .push(lag.as_secs_f64() * 1e3);
            }
            None => {
                self.timeouts.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.busy[dc].store(false, Ordering::Release);
    }

    /// Every batch `<= seq` of `dc` is known visible.
    pub fn raise_watermark(&self, dc: usize, seq: u64) {
        self.watermarks[dc].fetch_max(seq, Ordering::AcqRel);
    }

    /// Current watermarks, by DC.
    pub fn watermarks(&self) -> Vec<u64> {
        self.watermarks
            .iter()
            .map(|w| w.load(Ordering::Acquire))
            .collect()
    }

    /// Lag samples so far, in milliseconds.
    pub fn lags_ms(&self) -> Vec<f64> {
        self.lags_ms.lock().expect("lag samples lock").clone()
    }

    /// Probes that gave up.
    pub fn timeouts(&self) -> u64 {
        self.timeouts.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_probe_per_dc_and_watermarks_only_rise() {
        let p = Probes::new(2);
        assert!(p.try_claim(0));
        assert!(!p.try_claim(0));
        assert!(p.try_claim(1));
        p.finish(0, 5, Some(Duration::from_millis(3)));
        p.finish(1, 4, None);
        assert!(p.try_claim(0));
        p.finish(0, 2, Some(Duration::from_millis(1)));
        assert_eq!(p.watermarks(), vec![5, 0]);
        assert_eq!(p.lags_ms().len(), 2);
        assert_eq!(p.timeouts(), 1);
    }
}
