//! `PublisherSequence` against a simulated engine publisher with a bounded replay buffer:
//! random losses and duplicates on the live socket, connection drops and returns, engine
//! restarts (numbering from 0 again, with or without a connection event, whatever sequence the
//! new process's first delivered batch carries), replays that answer in full or time out, and
//! restarts of the consumer itself (resumed after the last batch its journal kept). The model
//! is the engine's own history per process (epoch).
//!
//! Checked: at every step, the batches applied since the last clear are one unbroken run of
//! one process; once things settle (connected, replays answered, one more batch published),
//! that run ends at the engine's newest batch, and it starts at the process's first batch
//! whenever the engine's buffer still holds it and no replay failed in that process.

use ckf_engine::sequence::{Action, PublisherSequence, ReplayFailure, SequenceConfig};
use proptest::prelude::*;

/// One batch as published: (epoch, sequence).
type Id = (u32, i64);

fn identity(id: Id) -> Option<u64> {
    Some((u64::from(id.0) << 40) ^ id.1 as u64)
}

#[derive(Debug, Clone)]
enum Step {
    /// Publish the next batch; `drop` = the SUB socket loses it, `dup` = delivered twice.
    Publish { drop: bool, dup: bool },
    /// The live connection drops (the engine stays up).
    Disconnect,
    /// The live connection comes back.
    Connect,
    /// The caller's idle interval passed with nothing received.
    Idle,
    /// The engine restarts and numbers from 0 again; `noticed`: the live connection drops with
    /// it (a real process restart always does; `false` is a restart the caller does not see).
    Restart { noticed: bool },
    /// The replay socket answers the pending request, if any.
    Answer { timeout: bool },
    /// The consumer restarts: a replay in flight and its buffered batches are lost, and so are
    /// up to `lost` of its last applied batches since its last clear (a journal that had not
    /// committed them); it resumes after the last applied batch it kept.
    ConsumerRestart { lost: usize },
}

fn step(timeouts: bool) -> impl Strategy<Value = Step> {
    let timeout = if timeouts {
        prop::bool::weighted(0.2).boxed()
    } else {
        Just(false).boxed()
    };
    prop_oneof![
        10 => (prop::bool::weighted(0.25), prop::bool::weighted(0.1))
            .prop_map(|(drop, dup)| Step::Publish { drop, dup }),
        1 => Just(Step::Disconnect),
        2 => Just(Step::Connect),
        1 => Just(Step::Idle),
        2 => prop::bool::weighted(0.6).prop_map(|noticed| Step::Restart { noticed }),
        4 => timeout.prop_map(|timeout| Step::Answer { timeout }),
        1 => (0usize..3).prop_map(|lost| Step::ConsumerRestart { lost }),
    ]
}

/// What the consumer did, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Log {
    Applied(Id),
    Cleared,
}

struct Sim {
    config: SequenceConfig,
    machine: PublisherSequence<Id>,
    /// The engine's replay buffer size.
    capacity: usize,
    epoch: u32,
    next: i64,
    buffer: std::collections::VecDeque<Id>,
    /// Whether the buffer dropped a batch of the current epoch.
    evicted: bool,
    /// Whether a replay failed (timed out, overflowed, or died with the engine) since the
    /// current epoch started, or at its start.
    failed: bool,
    connected: bool,
    /// An unnoticed restart whose new process has delivered nothing yet.
    unnoticed: bool,
    /// The replay requested and not yet answered.
    pending: Option<i64>,
    /// Replay requests so far: replies of a replaced request are never delivered.
    requests: u64,
    log: Vec<Log>,
}

impl Sim {
    fn new(config: SequenceConfig, capacity: usize) -> Self {
        let mut sim = Self {
            config,
            machine: PublisherSequence::new(config),
            capacity,
            epoch: 0,
            next: 0,
            buffer: Default::default(),
            evicted: false,
            failed: false,
            connected: true,
            unnoticed: false,
            pending: None,
            requests: 0,
            log: Vec::new(),
        };
        let actions = sim.machine.connected();
        sim.run(actions);
        sim
    }

    fn run(&mut self, actions: Vec<Action<Id>>) {
        for action in actions {
            match action {
                Action::Apply {
                    sequence, batch, ..
                } => {
                    assert_eq!(sequence, batch.1, "the batch travels with its sequence");
                    self.log.push(Log::Applied(batch));
                }
                Action::ClearMembers { .. } => self.log.push(Log::Cleared),
                Action::RequestReplay { from, .. } => {
                    self.pending = Some(from);
                    self.requests += 1;
                }
                Action::ReplayFailed { reason, .. } => {
                    // Live batches outran the consumer's buffer during a replay: what the
                    // engine held before them is not re-read.
                    self.failed |= reason == ReplayFailure::Overflow;
                    self.pending = None;
                }
                Action::ReplayFilled { .. } => self.pending = None,
                Action::Duplicate { .. }
                | Action::Foreign { .. }
                | Action::Gap { .. }
                | Action::Uncertain { .. }
                | Action::Verified { .. } => {}
            }
        }
        self.check_run();
    }

    /// The run since the last clear is unbroken and of one process.
    fn check_run(&self) {
        let start = self
            .log
            .iter()
            .rposition(|l| *l == Log::Cleared)
            .map_or(0, |i| i + 1);
        let mut prev: Option<Id> = None;
        for entry in &self.log[start..] {
            let Log::Applied(id) = entry else {
                unreachable!()
            };
            if let Some(p) = prev {
                assert_eq!(*id, (p.0, p.1 + 1), "an unbroken run of one process");
            }
            prev = Some(*id);
        }
    }

    fn publish(&mut self, drop: bool, dup: bool) {
        let id = (self.epoch, self.next);
        self.next += 1;
        self.buffer.push_back(id);
        if self.buffer.len() > self.capacity {
            self.buffer.pop_front();
            self.evicted = true;
        }
        if !self.connected || drop {
            return;
        }
        if self.unnoticed {
            // The one restart nothing can reveal: no connection event, and the new process's
            // first delivered batch exactly continues the old one's.
            if self.machine.replay_in_flight().is_none()
                && self.machine.last_applied() == Some(id.1 - 1)
            {
                return;
            }
            self.unnoticed = false;
        }
        for _ in 0..if dup { 2 } else { 1 } {
            let actions = self.machine.live(id.1, identity(id), id);
            self.run(actions);
        }
    }

    fn disconnect(&mut self) {
        if self.connected {
            self.connected = false;
            let actions = self.machine.disconnected();
            self.run(actions);
        }
    }

    fn connect(&mut self) {
        if !self.connected {
            self.connected = true;
            let actions = self.machine.connected();
            self.run(actions);
        }
    }

    fn restart(&mut self, noticed: bool) {
        // The old process's replay socket dies with it.
        let killed = self.pending.is_some();
        if killed {
            let actions = self.machine.replay_failed(ReplayFailure::Transport);
            self.run(actions);
        }
        self.epoch += 1;
        self.next = 0;
        self.buffer.clear();
        self.evicted = false;
        // A failure before an unnoticed restart still counts: with nothing applied since, the
        // consumer takes the new process's first delivered batch for a first batch.
        self.failed = killed || (!noticed && self.failed);
        if noticed {
            self.disconnect();
        } else {
            self.unnoticed = true;
        }
    }

    fn answer(&mut self, timeout: bool) {
        let Some(from) = self.pending else { return };
        if timeout {
            self.failed = true;
            let actions = self.machine.replay_failed(ReplayFailure::Timeout);
            self.run(actions);
            return;
        }
        let request = self.requests;
        let current = |sim: &Self| sim.pending.is_some() && sim.requests == request;
        let sent: Vec<Id> = self
            .buffer
            .iter()
            .copied()
            .filter(|id| id.1 >= from)
            .collect();
        for id in sent {
            if !current(self) {
                return; // abandoned or replaced
            }
            let actions = self.machine.replayed(id.1, identity(id), id);
            self.run(actions);
        }
        if current(self) {
            let actions = self.machine.replay_end();
            self.run(actions);
        }
    }

    fn consumer_restart(&mut self, lost: usize) {
        // What the journal kept: the log without up to `lost` of its last applies since the
        // last clear (never the clear itself).
        for _ in 0..lost {
            match self.log.last() {
                Some(Log::Applied(_)) => {
                    self.log.pop();
                }
                _ => break,
            }
        }
        let last = match self.log.last() {
            Some(Log::Applied(id)) => Some(*id),
            _ => None,
        };
        self.machine = match last {
            Some(id) => PublisherSequence::resume(self.config, id.1, identity(id)),
            None => PublisherSequence::new(self.config),
        };
        self.pending = None;
        if self.connected {
            let actions = self.machine.connected();
            self.run(actions);
        }
    }

    /// The connection drops and comes back, every replay is answered in full: an idle engine
    /// (nothing published since) is caught up with; then one more batch is delivered.
    fn settle(&mut self) {
        self.disconnect();
        self.connect();
        // The reconnection reveals an unnoticed restart.
        self.unnoticed = false;
        while self.pending.is_some() {
            self.answer(false);
        }
        if self.next > 0 && self.config.replay_available {
            assert_eq!(
                self.run_since_clear().last(),
                Some(&(self.epoch, self.next - 1)),
                "an idle engine is caught up with after a reconnection"
            );
        }
        for _ in 0..2 {
            while self.pending.is_some() {
                self.answer(false);
            }
            // Publish until a batch is delivered (an unnoticed restart may hold the first).
            self.publish(false, false);
            while self.unnoticed {
                self.publish(false, false);
            }
        }
        while self.pending.is_some() {
            self.answer(false);
        }
    }

    /// The run since the last clear, once settled.
    fn run_since_clear(&self) -> Vec<Id> {
        let start = self
            .log
            .iter()
            .rposition(|l| *l == Log::Cleared)
            .map_or(0, |i| i + 1);
        self.log[start..]
            .iter()
            .map(|l| match l {
                Log::Applied(id) => *id,
                Log::Cleared => unreachable!(),
            })
            .collect()
    }
}

fn simulate(config: SequenceConfig, capacity: usize, steps: &[Step]) -> Sim {
    let mut sim = Sim::new(config, capacity);
    for s in steps {
        match s {
            Step::Publish { drop, dup } => sim.publish(*drop, *dup),
            Step::Disconnect => sim.disconnect(),
            Step::Connect => sim.connect(),
            Step::Idle => {
                let actions = sim.machine.idle();
                sim.run(actions);
            }
            Step::Restart { noticed } => sim.restart(*noticed),
            Step::Answer { timeout } => sim.answer(*timeout),
            Step::ConsumerRestart { lost } => sim.consumer_restart(*lost),
        }
    }
    sim.settle();
    sim
}

const REPLAY: SequenceConfig = SequenceConfig {
    max_buffered_batches: 8,
    replay_available: true,
};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// With a replay socket: the run ends at the newest batch, and holds the whole process
    /// when the engine's buffer does and no replay timed out.
    #[test]
    fn converges_on_the_engines_current_process(
        steps in prop::collection::vec(step(true), 0..100),
        capacity in prop_oneof![Just(1_000usize), 2usize..12],
        buffered in 1usize..10,
    ) {
        let config = SequenceConfig { max_buffered_batches: buffered, ..REPLAY };
        let sim = simulate(config, capacity, &steps);
        let run = sim.run_since_clear();
        let newest = (sim.epoch, sim.next - 1);
        prop_assert_eq!(run.last().copied(), Some(newest), "caught up");
        prop_assert_eq!(sim.machine.replay_in_flight(), None);
        if !sim.evicted && !sim.failed {
            prop_assert_eq!(run.first().copied(), Some((sim.epoch, 0)), "complete: {:?}", run);
        }
    }

    /// Without a replay socket nothing is verified, but what is applied is still one unbroken
    /// run of one process, caught up once settled.
    #[test]
    fn without_a_replay_socket_what_is_applied_stays_sound(
        steps in prop::collection::vec(step(false), 0..100),
    ) {
        let config = SequenceConfig { replay_available: false, ..REPLAY };
        let sim = simulate(config, 1_000, &steps);
        let run = sim.run_since_clear();
        prop_assert_eq!(run.last().copied(), Some((sim.epoch, sim.next - 1)));
    }
}
