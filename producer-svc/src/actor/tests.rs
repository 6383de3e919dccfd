//! The cadence rule, asserted on what reached the attachment's frame queue (batch counts,
//! sequences) and on the cut reason, never on elapsed time: the delays are either an hour
//! (so a cut seen is not the timer's) or run on tokio's paused clock.
//!
//! Also the actor every unit test of `actor` builds ([`test_actor`]).

use ckf_core::dc::{KvEvent, KvEventKind};
use ckf_core::identity::SourceId;

use super::*;

const HOUR: Duration = Duration::from_secs(3_600);

struct Rig {
    actor: Actor,
    metrics: Metrics,
    frames: mpsc::Receiver<Outbound>,
    snapshot: u64,
}

/// An actor with one attachment that already took its barrier snapshot (so it streams).
fn rig(cadence: Cadence) -> Rig {
    rig_with_queue(cadence, 64)
}

/// [`rig`] with an attachment queue of `capacity` entries.
fn rig_with_queue(cadence: Cadence, capacity: usize) -> Rig {
    let metrics = Metrics::new();
    let mut actor = test_actor(vec!["indexer".into()], metrics.clone(), cadence);
    let (tx, mut frames) = mpsc::channel(capacity);
    let (reply, mut answer) = oneshot::channel();
    actor.handle(Command::Attach {
        endpoint: 0,
        lease: LaneLease {
            consumer_instance: 1,
            lane: 0,
            epoch: 1,
        },
        limits: FrameLimits {
            max_images_per_delta: 1 << 20,
        },
        frames: tx,
        reply,
    });
    let snapshot = answer
        .try_recv()
        .expect("answered")
        .expect("attach granted");
    assert!(matches!(frames.try_recv(), Ok(Outbound::Snapshot(_))));
    Rig {
        actor,
        metrics,
        frames,
        snapshot,
    }
}

fn cadence(batch_threshold: usize, max_delay: Duration, cut_when_idle: bool) -> Cadence {
    Cadence {
        batch_threshold,
        max_delay,
        cut_when_idle,
        backed_up_interval: BACKED_UP_INTERVAL,
    }
}

/// Batch `sequence` of source "src": one store of 4 blocks unique to it.
fn store(sequence: u64) -> (Command, oneshot::Receiver<BatchReport>) {
    let (reply, answer) = oneshot::channel();
    let block_hashes = (0..4).map(|i| (sequence << 8 | i) + 1).collect();
    let batch = IngestBatch {
        source_id: SourceId::new("src".to_owned()).expect("a valid source id"),
        sequence,
        events: vec![Ok(IngestEvent::Kv(KvEvent {
            member: MemberId::new(1, 0),
            kind: KvEventKind::Stored {
                block_hashes,
                parent_hash: None,
            },
        }))],
    };
    (Command::Ingest { batch, reply }, answer)
}

fn cuts(metrics: &Metrics, reason: CutReason) -> u64 {
    metrics
        .batches_cut
        .with_label_values(&[reason.label()])
        .get()
}

/// Every delta queued so far, as `(base_sequence, sequence)` per queue entry.
fn queued(frames: &mut mpsc::Receiver<Outbound>) -> Vec<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    while let Ok(frame) = frames.try_recv() {
        match frame {
            Outbound::Deltas(deltas, _) => out.push(
                deltas
                    .iter()
                    .map(|d| (d.base_sequence, d.sequence))
                    .collect(),
            ),
            other => panic!("unexpected frame {other:?}"),
        }
    }
    out
}

/// Starts the actor on `commands`; returns its handle to stop it.
fn start(
    actor: Actor,
    commands: mpsc::Receiver<Command>,
) -> (Shutdown, tokio::task::JoinHandle<ActorReport>) {
    let shutdown = Shutdown::new();
    let task = tokio::spawn(actor.run(commands, shutdown.clone()));
    (shutdown, task)
}

/// One round trip through the actor: every command sent before it has been handled and its
/// cadence decision taken (the test runtime is single-threaded, so the actor goes from a
/// command to its cadence decision without another task running in between).
async fn settle(handle: &ActorHandle) {
    handle
        .ask(|reply| Command::Stats { reply })
        .await
        .expect("actor running");
}

#[tokio::test]
async fn a_queued_burst_coalesces_into_one_delta() {
    let Rig {
        actor,
        metrics,
        mut frames,
        snapshot,
    } = rig(cadence(1 << 20, HOUR, true));
    let (tx, rx) = mpsc::channel(64);
    // Queued before the actor runs: it finds each command with more behind it but the last.
    let mut answers = Vec::new();
    for sequence in 0..10 {
        let (command, answer) = store(sequence);
        tx.try_send(command).expect("room in the queue");
        answers.push(answer);
    }
    let (shutdown, task) = start(actor, rx);
    for answer in answers {
        let report = answer.await.expect("answered");
        assert!(report.check.applies());
    }
    let handle = ActorHandle::new(tx);
    settle(&handle).await;
    assert_eq!(queued(&mut frames), vec![vec![(snapshot, snapshot + 1)]]);
    assert_eq!(cuts(&metrics, CutReason::Idle), 1);
    assert_eq!(cuts(&metrics, CutReason::MaxDelay), 0);
    assert_eq!(metrics.publish_delay_seconds.get_sample_count(), 1);
    shutdown.trigger();
    task.await.expect("actor stops");
}

#[tokio::test]
async fn an_idle_single_event_is_cut_at_once_in_a_delta_of_its_own() {
    let Rig {
        actor,
        metrics,
        mut frames,
        snapshot,
    } = rig(cadence(1 << 20, HOUR, true));
    let (tx, rx) = mpsc::channel(64);
    let handle = ActorHandle::new(tx);
    let (shutdown, task) = start(actor, rx);
    for (i, sequence) in [0u64, 1].into_iter().enumerate() {
        let (command, answer) = store(sequence);
        handle.tell(command).await.expect("actor running");
        answer.await.expect("answered");
        settle(&handle).await;
        // With an hour's delay, only the idle rule can have cut it.
        let base = snapshot + i as u64;
        assert_eq!(queued(&mut frames), vec![vec![(base, base + 1)]]);
    }
    assert_eq!(cuts(&metrics, CutReason::Idle), 2);
    assert_eq!(cuts(&metrics, CutReason::Threshold), 0);
    shutdown.trigger();
    task.await.expect("actor stops");
}

#[tokio::test]
async fn the_threshold_cuts_inside_a_burst() {
    let Rig {
        actor,
        metrics,
        mut frames,
        snapshot,
    } = rig(cadence(1, HOUR, true));
    let (tx, rx) = mpsc::channel(64);
    let mut answers = Vec::new();
    for sequence in 0..3 {
        let (command, answer) = store(sequence);
        tx.try_send(command).expect("room in the queue");
        answers.push(answer);
    }
    let (shutdown, task) = start(actor, rx);
    for answer in answers {
        answer.await.expect("answered");
    }
    settle(&ActorHandle::new(tx)).await;
    let s = snapshot;
    assert_eq!(
        queued(&mut frames),
        vec![vec![(s, s + 1)], vec![(s + 1, s + 2)], vec![(s + 2, s + 3)]]
    );
    // The threshold is the reason counted even for the last one, found with an empty queue.
    assert_eq!(cuts(&metrics, CutReason::Threshold), 3);
    assert_eq!(cuts(&metrics, CutReason::Idle), 0);
    shutdown.trigger();
    task.await.expect("actor stops");
}

#[tokio::test(start_paused = true)]
async fn the_timer_cadence_waits_for_the_max_delay() {
    let Rig {
        actor,
        metrics,
        mut frames,
        snapshot,
    } = rig(cadence(1 << 20, Duration::from_millis(10), false));
    let (tx, rx) = mpsc::channel(64);
    let handle = ActorHandle::new(tx);
    let (shutdown, task) = start(actor, rx);
    for sequence in 0..2 {
        let (command, answer) = store(sequence);
        handle.tell(command).await.expect("actor running");
        answer.await.expect("answered");
    }
    settle(&handle).await;
    // Idle, yet nothing is cut: the timer cadence holds the batch for the delay.
    assert!(queued(&mut frames).is_empty());
    assert_eq!(cuts(&metrics, CutReason::Idle), 0);
    // The paused clock jumps to the deadline once every task waits.
    let Some(Outbound::Deltas(deltas, _)) = frames.recv().await else {
        panic!("a delta");
    };
    assert_eq!(deltas.len(), 1);
    assert_eq!(
        (deltas[0].base_sequence, deltas[0].sequence),
        (snapshot, snapshot + 1)
    );
    assert_eq!(cuts(&metrics, CutReason::MaxDelay), 1);
    shutdown.trigger();
    task.await.expect("actor stops");
}

/// `commands` commands one at a time (each would be cut on its own), `pace` of paused clock
/// apart, toward an attachment whose reader does not read: the cuts are held, the queue
/// never fills, the attachment is not fenced; once the reader drains, the held changes
/// arrive and the queued deltas rebuild the producer's table.
///
/// The queue holds 32 entries; the flow lasts `commands * pace`, at most 1 s: with the
/// rule, 16 entries and then one per 100 ms. Without it every command is cut (idle, or the
/// 5 ms timer when `pace` is longer than that), far more than the queue holds.
async fn a_reader_that_stops_reading_is_not_fenced(
    cut_when_idle: bool,
    commands: u64,
    pace: Duration,
) {
    const CAPACITY: usize = 32;
    let Rig {
        actor,
        metrics,
        mut frames,
        snapshot,
    } = rig_with_queue(
        cadence(1 << 20, Duration::from_millis(5), cut_when_idle),
        CAPACITY,
    );
    let (tx, rx) = mpsc::channel(64);
    let handle = ActorHandle::new(tx);
    let (shutdown, task) = start(actor, rx);
    // The table the snapshot carried (nothing stored yet).
    let mut table = handle
        .ask(|reply| Command::Table { reply })
        .await
        .expect("actor running");
    for sequence in 0..commands {
        let (command, answer) = store(sequence);
        handle.tell(command).await.expect("actor running");
        assert!(answer.await.expect("answered").check.applies());
        settle(&handle).await;
        tokio::time::sleep(pace).await;
        assert!(!frames.is_closed(), "fenced after command {sequence}");
        assert!(frames.len() < CAPACITY, "the queue filled");
    }
    assert!(metrics.cuts_held.get() > 0);
    let depth = metrics
        .attachment_queue_depth
        .with_label_values(&["indexer"])
        .get();
    assert!(depth > (CAPACITY / 2) as i64, "depth {depth}");
    // The reader drains the queue; the held batch is cut at the end of its interval.
    let mut deltas = Vec::new();
    let mut drain = |frames: &mut mpsc::Receiver<Outbound>| {
        while let Ok(frame) = frames.try_recv() {
            match frame {
                Outbound::Deltas(d, _) => deltas.extend(d),
                other => panic!("unexpected frame {other:?}"),
            }
        }
    };
    drain(&mut frames);
    tokio::time::sleep(BACKED_UP_INTERVAL * 2).await;
    settle(&handle).await;
    drain(&mut frames);
    assert!(!frames.is_closed(), "fenced");
    // Consecutive sequences from the snapshot on, and they rebuild the producer's table.
    let mut sequence = snapshot;
    for delta in &deltas {
        assert_eq!(delta.base_sequence, sequence);
        sequence = delta.sequence;
        for image in &delta.images {
            table[image.bucket as usize] = image.image;
        }
    }
    // Far fewer deltas than commands: the held changes coalesced.
    assert!(
        deltas.len() < commands as usize / 2,
        "{} deltas",
        deltas.len()
    );
    let producer = handle
        .ask(|reply| Command::Table { reply })
        .await
        .expect("actor running");
    assert_eq!(table, producer);
    let (stats, _) = handle
        .ask(|reply| Command::Stats { reply })
        .await
        .expect("actor running");
    assert_eq!(stats.unique_blocks as u64, 4 * commands);
    shutdown.trigger();
    task.await.expect("actor stops");
}

#[tokio::test(start_paused = true)]
async fn idle_cuts_are_held_while_the_queue_is_backed_up() {
    a_reader_that_stops_reading_is_not_fenced(true, 300, Duration::from_millis(1)).await;
}

#[tokio::test(start_paused = true)]
async fn timer_cuts_are_held_while_the_queue_is_backed_up() {
    // Commands farther apart than the delay: the timer branch cuts (and holds) each batch.
    a_reader_that_stops_reading_is_not_fenced(false, 100, Duration::from_millis(10)).await;
}

/// On a large state `GetMemberBlocks` is answered in slices between commands: other
/// commands run before the answer, and the answer is the member's blocks.
#[test]
fn member_blocks_are_read_in_slices_between_commands() {
    use ckf_core::dc::DcCkfConfig;
    let mut actor = test_actor(
        Vec::new(),
        Metrics::new(),
        cadence(64, Duration::from_secs(3600), true),
    );
    actor.state = DcCkfState::new(DcCkfConfig {
        slice_lines: 64,
        ..DcCkfConfig::new(actor.state.format())
    })
    .expect("the default table");
    let hash = |i: u64| (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let a = MemberId::new(1, 0);
    actor
        .state
        .store(a, &(0..20_000).map(hash).collect::<Vec<_>>());
    actor.state.store(
        MemberId::new(2, 0),
        &(10_000..30_000).map(hash).collect::<Vec<_>>(),
    );
    let (reply, mut answer) = oneshot::channel();
    actor.handle(Command::MemberBlocks { member: a, reply });
    assert!(answer.try_recv().is_err(), "not answered in one slice");
    // Another member's store runs before the answer.
    actor.state.store(MemberId::new(3, 0), &[hash(99_999)]);
    let mut slices = 0;
    let blocks = loop {
        actor.slices();
        slices += 1;
        if let Ok(blocks) = answer.try_recv() {
            break blocks;
        }
    };
    assert!(slices > 10, "{slices} slices");
    let mut blocks = blocks;
    blocks.sort_unstable();
    assert_eq!(blocks.len(), 20_000);
    assert_eq!(blocks, actor.state.member_blocks(a));
    assert!(actor.member_scans.is_empty());
}

/// A fresh actor for pool `test/dc-a` on the default table, publishing to `endpoints`
/// (the unit tests of `actor` and of its `restore`).
pub(super) fn test_actor(endpoints: Vec<String>, metrics: Metrics, cadence: Cadence) -> Actor {
    use ckf_core::dc::DcCkfConfig;
    use ckf_core::identity::ProducerIncarnation;
    let config =
        crate::config::ProducerConfig::for_pool("test", "dc-a", vec!["http://127.0.0.1:1".into()]);
    let (pool, format) = config.pool_and_format().expect("the default table");
    let identity = ProducerIdentity {
        pool,
        incarnation: ProducerIncarnation(1),
        format,
    };
    Actor::new(
        DcCkfState::new(DcCkfConfig::new(format)).expect("the default table"),
        &identity,
        endpoints,
        SourceSequences::new(std::num::NonZeroUsize::new(16).expect("nonzero")),
        metrics,
        cadence,
        EngineFilters::default(),
    )
}

impl Actor {
    /// The whole logical state as checkpoint records, captured at once.
    pub(super) fn checkpoint_records(&mut self) -> Vec<Vec<u8>> {
        super::journaling::checkpoint_records(&mut self.state, &mut self.feed, &self.sources)
    }
}
