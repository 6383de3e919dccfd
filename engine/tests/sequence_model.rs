//! `PublisherSequence` against a simulated publisher: random drops, duplicates, restarts and
//! replays that are full, truncated or time out, and restarts of the consumer itself (resumed
//! with [`PublisherSequence::resume`] after the last sequence its journal kept). The model is
//! the publisher's own history: what was published per epoch (restart), and what the socket
//! delivered.

use ckf_engine::sequence::{Action, ClearReason, PublisherSequence, ReplayFailure, SequenceConfig};
use proptest::prelude::*;

/// One batch as published: (epoch, sequence).
type Id = (u32, i64);

#[derive(Debug, Clone)]
enum Step {
    /// Publish the next batch; `drop` = the SUB socket loses it, `dup` = delivered twice.
    Publish { drop: bool, dup: bool },
    /// The engine restarts and numbers from 0 again (only taken when detectable).
    Restart,
    /// The replay socket answers the pending request, if any.
    Answer(Reply),
    /// The consumer restarts: a replay in flight and the live batches buffered behind it are
    /// lost, and so are up to `lost` of its last applied batches since its last clear, of the
    /// engine's current epoch (a journal that had not committed them); it resumes after the
    /// last applied batch it kept.
    ConsumerRestart {
        /// Applied batches the journal lost.
        lost: usize,
    },
}

#[derive(Debug, Clone, Copy)]
enum Reply {
    /// Everything from the requested sequence on.
    Full,
    /// Only the newest `n` published batches (the engine's buffer is short).
    Truncated(usize),
    /// No answer before the caller's deadline.
    Timeout,
}

fn step(failures: bool) -> impl Strategy<Value = Step> {
    // Losing applied batches at a restart needs replays to recover them; only the soundness
    // property (with failures) allows it.
    let lost = if failures { 0usize..3 } else { 0usize..1 };
    let reply = if failures {
        prop_oneof![
            3 => Just(Reply::Full),
            1 => (0usize..4).prop_map(Reply::Truncated),
            1 => Just(Reply::Timeout),
        ]
        .boxed()
    } else {
        Just(Reply::Full).boxed()
    };
    prop_oneof![
        8 => (prop::bool::weighted(0.25), prop::bool::weighted(0.1))
            .prop_map(|(drop, dup)| Step::Publish { drop, dup }),
        1 => Just(Step::Restart),
        3 => reply.prop_map(Step::Answer),
        1 => lost.prop_map(|lost| Step::ConsumerRestart { lost }),
    ]
}

/// What the consumer did, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Log {
    Applied(Id),
    Cleared(ClearReason),
}

struct Sim {
    config: SequenceConfig,
    machine: PublisherSequence<Id>,
    epoch: u32,
    next: i64,
    /// Every batch published in the current epoch, in order.
    published: Vec<Id>,
    /// Per epoch: all published batches, and the newest sequence delivered (live or replayed).
    history: Vec<(Vec<Id>, Option<i64>)>,
    pending: Option<i64>,
    log: Vec<Log>,
    /// The next publish after a restart must be delivered, so the restart is detectable.
    force_delivery: bool,
}

impl Sim {
    fn new(base: i64, config: SequenceConfig) -> Self {
        Self {
            config,
            machine: PublisherSequence::new(config),
            epoch: 0,
            next: base,
            published: Vec::new(),
            history: vec![(Vec::new(), None)],
            pending: None,
            log: Vec::new(),
            force_delivery: false,
        }
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
                Action::ClearMembers { reason } => self.log.push(Log::Cleared(reason)),
                Action::RequestReplay { from } => {
                    assert!(self.pending.is_none(), "one replay at a time");
                    self.pending = Some(from);
                }
                Action::ReplayFilled { .. } | Action::ReplayFailed { .. } => self.pending = None,
                Action::Duplicate { .. } | Action::Gap { .. } => {}
            }
        }
    }

    fn publish(&mut self, drop: bool, dup: bool) {
        let id = (self.epoch, self.next);
        self.next += 1;
        self.published.push(id);
        self.history[self.epoch as usize].0.push(id);
        if drop && !self.force_delivery {
            return;
        }
        self.force_delivery = false;
        self.history[self.epoch as usize].1 = Some(id.1);
        for _ in 0..if dup { 2 } else { 1 } {
            let actions = self.machine.live(id.1, id);
            self.run(actions);
        }
    }

    fn answer(&mut self, reply: Reply) {
        let Some(from) = self.pending else { return };
        let wanted: Vec<Id> = self
            .published
            .iter()
            .copied()
            .filter(|id| id.1 >= from)
            .collect();
        let sent: Vec<Id> = match reply {
            Reply::Full => wanted,
            Reply::Truncated(n) => wanted[wanted.len().saturating_sub(n)..].to_vec(),
            Reply::Timeout => {
                let actions = self.machine.replay_failed(ReplayFailure::Timeout);
                self.run(actions);
                return;
            }
        };
        for id in sent {
            if self.pending != Some(from) {
                break; // the machine abandoned this replay
            }
            let actions = self.machine.replayed(id.1, id);
            let applied = actions
                .iter()
                .any(|a| matches!(a, Action::Apply { batch, .. } if *batch == id));
            self.run(actions);
            if applied {
                // Known through the replay: the consumer must end caught up with it.
                let newest = &mut self.history[self.epoch as usize].1;
                *newest = Some(newest.map_or(id.1, |n| n.max(id.1)));
            }
        }
        if self.pending == Some(from) {
            let actions = self.machine.replay_end();
            self.run(actions);
        }
    }

    fn restart(&mut self, failures: bool) {
        // Detectable only below the newest delivered sequence; otherwise publish instead.
        let newest = self.history[self.epoch as usize].1;
        if newest.is_none_or(|n| n < 1) {
            self.publish(false, false);
            return;
        }
        if self.pending.is_some() {
            if failures {
                let actions = self.machine.replay_failed(ReplayFailure::Transport);
                self.run(actions);
            } else {
                self.answer(Reply::Full);
            }
        }
        self.epoch += 1;
        self.next = 0;
        self.published.clear();
        self.history.push((Vec::new(), None));
        self.force_delivery = true;
    }

    fn consumer_restart(&mut self, lost: usize) {
        // What the journal kept: the log without its last `lost` applies after the last clear
        // (a clear is always followed by an apply in the same step, so the cut never leaves a
        // log that ends in a clear).
        let floor = self
            .log
            .iter()
            .rposition(|l| matches!(l, Log::Cleared(_)))
            .map_or(0, |i| i + 2);
        // Only batches of the engine's current epoch: once the engine restarted, a consumer
        // that forgot its last batches of the old epoch could take the new epoch's numbers for
        // their continuation (the ambiguity the rule accepts, see `ckf_engine::sequence`).
        for _ in 0..lost {
            match self.log.last() {
                Some(Log::Applied(id)) if self.log.len() > floor && id.0 == self.epoch => {
                    self.log.pop();
                }
                _ => break,
            }
        }
        let last = self.log.iter().rev().find_map(|l| match l {
            Log::Applied(id) => Some(*id),
            Log::Cleared(_) => None,
        });
        self.machine = match last {
            Some(id) => PublisherSequence::resume(self.config, id.1),
            None => PublisherSequence::new(self.config),
        };
        self.pending = None;
        // What the dead consumer had received beyond that is as good as never delivered.
        self.history[self.epoch as usize].1 = last.filter(|id| id.0 == self.epoch).map(|id| id.1);
    }

    fn finish(&mut self) {
        while self.pending.is_some() {
            self.answer(Reply::Full);
        }
    }
}

fn simulate(base: i64, steps: &[Step], failures: bool, buffer: usize) -> Sim {
    let mut sim = Sim::new(
        base,
        SequenceConfig {
            max_buffered_batches: buffer,
            replay_available: true,
        },
    );
    for s in steps {
        match s {
            Step::Publish { drop, dup } => sim.publish(*drop, *dup),
            Step::Restart => sim.restart(failures),
            Step::Answer(reply) => sim.answer(*reply),
            Step::ConsumerRestart { lost } => sim.consumer_restart(*lost),
        }
    }
    sim.finish();
    sim
}

/// Invariants that hold whatever the replays do.
fn check_sound(sim: &Sim) {
    let mut seen = std::collections::HashSet::new();
    let mut prev: Option<Id> = None;
    let mut after_clear: Option<ClearReason> = None;
    for entry in &sim.log {
        match entry {
            Log::Cleared(reason) => {
                after_clear = Some(*reason);
                // After a clear the oldest buffered live batch is applied again if the failed
                // replay had already applied it: the state it was applied to is gone.
                seen.clear();
            }
            Log::Applied(id) => {
                assert!(seen.insert(*id), "{id:?} applied twice");
                if let Some(p) = prev {
                    match after_clear {
                        None => assert_eq!(
                            *id,
                            (p.0, p.1 + 1),
                            "without a clear, batches apply consecutively"
                        ),
                        Some(ClearReason::Restart) => {
                            assert!(id.0 > p.0, "a restart clear starts a new epoch")
                        }
                        Some(ClearReason::Gap) => {
                            assert_eq!(id.0, p.0, "a gap clear stays in the epoch")
                        }
                    }
                }
                prev = Some(*id);
                after_clear = None;
            }
        }
    }
    // Caught up: the newest delivered batch of the last epoch was applied last.
    let (_, newest) = sim.history.last().expect("one epoch");
    if let Some(n) = newest {
        assert_eq!(prev, Some((sim.epoch, *n)));
    }
    assert_eq!(sim.machine.replay_in_flight(), None);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn sound_under_drops_duplicates_restarts_and_failed_replays(
        base in prop_oneof![Just(0i64), 0i64..1_000_000, Just(i64::MAX / 2)],
        steps in prop::collection::vec(step(true), 0..80),
        buffer in 1usize..6,
    ) {
        let sim = simulate(base, &steps, true, buffer);
        check_sound(&sim);
    }

    #[test]
    fn full_replays_track_every_epoch_exactly(
        base in 0i64..1_000,
        steps in prop::collection::vec(step(false), 0..80),
    ) {
        let sim = simulate(base, &steps, false, 1_000);
        check_sound(&sim);
        prop_assert!(!sim.log.contains(&Log::Cleared(ClearReason::Gap)));
        // Per epoch: every batch from the first delivered one up to the newest delivered one,
        // in order, each once.
        let applied: Vec<Id> = sim.log.iter().filter_map(|l| match l {
            Log::Applied(id) => Some(*id),
            Log::Cleared(_) => None,
        }).collect();
        let mut expected = Vec::new();
        for (published, newest) in &sim.history {
            let Some(newest) = newest else { continue };
            // Losses before the first delivered batch of an epoch cannot be seen.
            let first = published.iter().position(|id| applied.contains(id));
            if let Some(first) = first {
                expected.extend(published[first..].iter().copied().filter(|id| id.1 <= *newest));
            }
        }
        prop_assert_eq!(applied, expected);
        let restarts = sim.log.iter().filter(|l| **l == Log::Cleared(ClearReason::Restart)).count();
        let epochs_seen = sim.history.iter().filter(|(_, n)| n.is_some()).count();
        prop_assert_eq!(restarts, epochs_seen.saturating_sub(1));
    }
}
