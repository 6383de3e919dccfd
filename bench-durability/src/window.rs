//! The write-path driver shared by the backends: hands out the op stream's events and says when
//! a group commit is due, in two phases on the same store:
//!
//! 1. *paced*: events offered at `offered` block ops/s for `paced_s` seconds (the producer's
//!    load); the store keeps up when it applied what was offered;
//! 2. *saturated*: the rest of the stream as fast as the store takes it, for at most `max_s`
//!    seconds (the store's ceiling).
//!
//! A commit is due once `commit_ms` have passed since the previous one started, so the events
//! lost on kill -9 are bounded by one window plus one commit's latency.

use std::time::{Duration, Instant};

use crate::workload::{Event, Workload};

/// Run parameters of the write path.
#[derive(Debug, Clone, Copy)]
pub struct Run {
    /// Group-commit window, milliseconds.
    pub commit_ms: u64,
    /// Offered block ops/s in the paced phase.
    pub offered: f64,
    /// Seconds of the paced phase.
    pub paced_s: f64,
    /// At most this many seconds of the saturated phase.
    pub max_s: f64,
}

/// What one phase measured.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct PhaseStats {
    /// Block ops applied.
    pub ops: u64,
    /// Wall seconds (saturated: until the last window was durable).
    pub secs: f64,
    /// CPU seconds of the whole process (all threads) in the phase.
    pub cpu_s: f64,
    /// Milliseconds from each window's close to its data being durable.
    pub commit_ms: Vec<f64>,
}

/// What a backend's write run measured.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct WriteStats {
    /// Seconds to load the fill (warm-up) state durably.
    pub fill_s: f64,
    /// Offered block ops/s in the paced phase.
    pub offered: f64,
    /// The paced phase.
    pub paced: PhaseStats,
    /// The saturated phase.
    pub saturated: PhaseStats,
    /// Events applied in both phases (a prefix of the stream).
    pub events: usize,
}

/// The next thing a backend must do.
pub enum Step<'w> {
    /// Apply this event (not yet durable).
    Event(&'w Event),
    /// Make everything applied so far durable.
    Commit,
    /// Make everything applied so far durable, then stop.
    Done,
}

/// Pacing and group-commit timing over the pre-generated stream.
pub struct Driver<'w> {
    w: &'w Workload,
    next: usize,
    window: Duration,
    opened: Instant,
    offered: f64,
    paced_for: Duration,
    max_s: Duration,
    start: Instant,
    cpu0: f64,
    /// Set when the paced phase ended: its instant and stats.
    switch: Option<Instant>,
    stats: WriteStats,
    ops: u64,
    /// `(window close, ms to durable)` for every commit.
    commits: Vec<(Instant, f64)>,
}

impl<'w> Driver<'w> {
    /// Starts the paced phase now.
    pub fn new(w: &'w Workload, run: &Run, fill_s: f64) -> Self {
        let now = Instant::now();
        Driver {
            w,
            next: 0,
            window: Duration::from_millis(run.commit_ms),
            opened: now,
            offered: run.offered,
            paced_for: Duration::from_secs_f64(run.paced_s),
            max_s: Duration::from_secs_f64(run.max_s),
            start: now,
            cpu0: crate::disk::cpu_seconds(),
            switch: None,
            stats: WriteStats {
                fill_s,
                offered: run.offered,
                ..Default::default()
            },
            ops: 0,
            commits: Vec::new(),
        }
    }

    fn end_paced(&mut self, now: Instant) {
        self.stats.paced.ops = self.ops;
        self.stats.paced.secs = now.duration_since(self.start).as_secs_f64();
        let cpu = crate::disk::cpu_seconds();
        self.stats.paced.cpu_s = cpu - self.cpu0;
        self.cpu0 = cpu;
        self.ops = 0;
        self.switch = Some(now);
    }

    /// The next step. In the paced phase this sleeps while the store is ahead of the offered load.
    pub fn step(&mut self) -> Step<'w> {
        loop {
            let now = Instant::now();
            if now.duration_since(self.opened) >= self.window {
                self.opened = now;
                return Step::Commit;
            }
            match self.switch {
                None if now.duration_since(self.start) >= self.paced_for => self.end_paced(now),
                None => {
                    let due = self.start + Duration::from_secs_f64(self.ops as f64 / self.offered);
                    if due > now {
                        let wake = due
                            .min(self.opened + self.window)
                            .min(self.start + self.paced_for);
                        std::thread::sleep(wake - now);
                        continue;
                    }
                }
                Some(t) if now.duration_since(t) >= self.max_s => return Step::Done,
                Some(_) => {}
            }
            let Some(ev) = self.w.events.get(self.next) else {
                return Step::Done;
            };
            self.next += 1;
            self.ops += u64::from(ev.len);
            return Step::Event(ev);
        }
    }

    /// Records a commit of the window closed at `closed` that took `ms` to become durable.
    pub fn committed(&mut self, closed: Instant, ms: f64) {
        self.commits.push((closed, ms));
    }

    /// Ends the run (call after the final commit is durable) and splits commits by phase.
    pub fn finish(mut self) -> WriteStats {
        let now = Instant::now();
        if self.switch.is_none() {
            self.end_paced(now);
        }
        let t = self.switch.expect("paced phase ended");
        self.stats.saturated.ops = self.ops;
        self.stats.saturated.secs = now.duration_since(t).as_secs_f64();
        self.stats.saturated.cpu_s = crate::disk::cpu_seconds() - self.cpu0;
        for (closed, ms) in self.commits {
            let phase = if closed < t {
                &mut self.stats.paced
            } else {
                &mut self.stats.saturated
            };
            phase.commit_ms.push(ms);
        }
        self.stats.events = self.next;
        self.stats
    }
}
