use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ckf_core::dc::MemberId;
use ckf_engine::event::{EngineBatch, EngineEvent, StoredBlocks};
use ckf_engine::sequence::ClearReason;

use crate::actor::records::{CheckpointRecord, LogRecord, LogRecordRef, PublisherRecord, encode};
use crate::actor::{Actor, Cadence, Command};
use crate::engines::{EngineStep, PublisherId};

fn fresh() -> Actor {
    crate::actor::tests::test_actor(
        Vec::new(),
        crate::metrics::Metrics::new(),
        Cadence {
            batch_threshold: 64,
            max_delay: Duration::from_millis(5),
            cut_when_idle: true,
            backed_up_interval: crate::actor::BACKED_UP_INTERVAL,
        },
    )
}

fn publisher(worker_id: u64, rank: u32) -> Arc<PublisherId> {
    Arc::new(PublisherId {
        worker_id,
        rank,
        label: format!("{worker_id}/{rank}"),
        endpoint: format!("tcp://127.0.0.1:{}", 5557 + rank),
    })
}

/// Two GPU blocks of 16 tokens (the default block size) under engine hashes 10, 11.
fn store() -> EngineBatch {
    EngineBatch {
        events: vec![EngineEvent::Stored(StoredBlocks {
            block_hashes: vec![10, 11],
            token_ids: (0..32).collect(),
            block_size: 16,
            ..StoredBlocks::default()
        })],
        ..EngineBatch::default()
    }
}

fn step(actor: &mut Actor, p: &Arc<PublisherId>, step: EngineStep) {
    actor.handle(Command::Engine {
        publisher: Arc::clone(p),
        step,
    });
}

#[test]
fn the_last_applied_sequences_survive_a_checkpoint_and_the_log() {
    let (a, b) = (publisher(7, 0), publisher(8, 1));
    let mut live = fresh();
    step(
        &mut live,
        &a,
        EngineStep::Apply {
            sequence: 5,
            batch: store(),
        },
    );
    step(
        &mut live,
        &b,
        EngineStep::Apply {
            sequence: -2,
            batch: EngineBatch::default(),
        },
    );
    assert_eq!(live.state.member_blocks(MemberId::new(7, 0)).len(), 2);
    // A clear keeps the sequence: the next batch after it will move it on.
    step(&mut live, &a, EngineStep::Clear(ClearReason::Gap));
    assert!(live.state.member_blocks(MemberId::new(7, 0)).is_empty());
    let (stored, empty) = (
        Some(store().identity()),
        Some(EngineBatch::default().identity()),
    );
    let expected = HashMap::from([((7, 0), (5, stored)), ((8, 1), (-2, empty))]);
    assert_eq!(live.engine_sequences(), expected);

    // From the checkpoint alone, identities included.
    let checkpoint = live.checkpoint_records();
    let mut restored = fresh();
    restored.restore(&checkpoint, &[]).expect("restores");
    assert_eq!(restored.engine_sequences(), expected);

    // A checkpoint written before identities were kept: the sequences without them.
    let old: Vec<Vec<u8>> = checkpoint
        .iter()
        .filter(|r| {
            !matches!(
                postcard::from_bytes::<CheckpointRecord>(r),
                Ok(CheckpointRecord::EngineIdentities(_))
            )
        })
        .cloned()
        .collect();
    assert_eq!(old.len() + 1, checkpoint.len());
    let mut restored = fresh();
    restored.restore(&old, &[]).expect("restores");
    assert_eq!(
        restored.engine_sequences(),
        HashMap::from([((7, 0), (5, None)), ((8, 1), (-2, None))])
    );

    // Checkpoint then log: the log's applies move the sequences on, in order.
    let log: Vec<Vec<u8>> = [(&a, 6), (&a, 7), (&publisher(9, 0), 100)]
        .into_iter()
        .map(|(p, sequence)| {
            encode(&LogRecordRef::EngineApply {
                publisher: PublisherRecord::from(p.as_ref()),
                sequence,
                batch: &store(),
            })
        })
        .collect();
    let mut restored = fresh();
    let report = restored.restore(&checkpoint, &log).expect("restores");
    assert_eq!(report.replayed, 3);
    assert_eq!(
        restored.engine_sequences(),
        HashMap::from([
            ((7, 0), (7, stored)),
            ((8, 1), (-2, empty)),
            ((9, 0), (100, stored))
        ])
    );
    assert_eq!(restored.state.member_blocks(MemberId::new(7, 0)).len(), 2);

    // A fresh actor resumes nothing.
    assert!(fresh().engine_sequences().is_empty());
}

/// A checkpoint captured in slices while ingest goes on between them, written through a
/// real journal: what a restart recovers (that checkpoint, then the log after its start,
/// `Charges` record included) is the live state, every member's blocks and charge.
#[test]
fn a_checkpoint_captured_between_commands_recovers_the_live_state() {
    use crate::events::{IngestBatch, IngestEvent};
    use ckf_core::dc::{DcCkfConfig, DcCkfState, KvEvent, KvEventKind};
    use ckf_core::identity::SourceId;

    let dir = tempfile::tempdir().expect("tempdir");
    let identity = ckf_journal::StateIdentity {
        pool: "test/dc-a".into(),
        format: "slices test".into(),
    };
    let open = || {
        let metrics = crate::metrics::Metrics::new();
        ckf_journal::Journal::open(
            dir.path(),
            identity.clone(),
            ckf_journal::JournalConfig::default(),
            std::sync::Arc::new(metrics.journal.clone()),
        )
        .expect("journal opens")
    };
    let mut live = fresh();
    // Slices of 64 lines: the 30,000 blocks below take ~130 steps.
    live.state = DcCkfState::new(DcCkfConfig {
        slice_lines: 64,
        ..DcCkfConfig::new(live.state.format())
    })
    .expect("the default table");
    live.attach_journal(open().0);

    let hash = |i: u64| (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut sequences = HashMap::new();
    let mut send = |live: &mut Actor, source: &str, events: Vec<IngestEvent>| {
        let sequence = sequences.entry(source.to_owned()).or_insert(0u64);
        *sequence += 1;
        let batch = IngestBatch {
            source_id: SourceId::new(source).unwrap(),
            sequence: *sequence,
            events: events.into_iter().map(Ok).collect(),
        };
        live.journaling
            .log_ingest(&batch, &vec![true; batch.events.len()]);
        live.ingest(&batch);
    };
    let kv = |worker: u64, kind: KvEventKind| {
        IngestEvent::Kv(KvEvent {
            member: MemberId::new(worker, 0),
            kind,
        })
    };
    let stored = |worker: u64, keys: std::ops::Range<u64>| {
        kv(
            worker,
            KvEventKind::Stored {
                block_hashes: keys.map(hash).collect(),
                parent_hash: None,
            },
        )
    };
    for w in 0..6 {
        let source = if w % 2 == 0 { "src-a" } else { "src-b" };
        send(
            &mut live,
            source,
            vec![stored(w, w * 5_000..(w + 1) * 5_000)],
        );
    }

    // An engine publisher's member, 7/0: engine blocks 10, 11, then children of them.
    let engine = publisher(7, 0);
    let child = |sequence: i64, hash: u64, parent: u64| EngineStep::Apply {
        sequence,
        batch: EngineBatch {
            events: vec![EngineEvent::Stored(StoredBlocks {
                block_hashes: vec![hash],
                parent: Some(parent),
                token_ids: (0..16).map(|t| t + hash as u32).collect(),
                block_size: 16,
                ..StoredBlocks::default()
            })],
            ..EngineBatch::default()
        },
    };
    step(
        &mut live,
        &engine,
        EngineStep::Apply {
            sequence: 1,
            batch: store(),
        },
    );

    live.begin_checkpoint();
    let mut steps = 0;
    while live.journaling.capturing() {
        // Between slices: stores, removals, a clear and a worker's removal, and worker 0
        // cleared then taken over by the other source (its charge moves); the engine
        // member gets a child of its block 11.
        match steps {
            5 => step(&mut live, &engine, child(2, 12, 11)),
            3 => send(&mut live, "src-a", vec![kv(0, KvEventKind::Cleared)]),
            4 => send(&mut live, "src-b", vec![stored(0, 40_000..40_100)]),
            9 => send(
                &mut live,
                "src-b",
                vec![IngestEvent::WorkerRemoved { worker_id: 3 }],
            ),
            n => send(
                &mut live,
                "src-a",
                vec![
                    stored(2, 30_000 + n * 10..30_000 + n * 10 + 10),
                    kv(
                        4,
                        KvEventKind::Removed {
                            block_hashes: (n * 7..n * 7 + 5).map(|i| hash(20_000 + i)).collect(),
                        },
                    ),
                ],
            ),
        }
        live.slices();
        steps += 1;
    }
    assert!(steps > 20, "the capture took {steps} steps");
    send(&mut live, "src-a", vec![stored(5, 50_000..50_010)]);
    // After the capture: a grandchild, which translates only through block 12's lineage.
    step(&mut live, &engine, child(3, 13, 12));
    assert_eq!(live.state.member_blocks(MemberId::new(7, 0)).len(), 4);
    live.state.finish_releases();
    let expected = live.state.ownership_image();
    assert_eq!(
        expected
            .iter()
            .find(|m| m.member == MemberId::new(0, 0))
            .and_then(|m| m.charged_to.as_deref()),
        Some("src-b")
    );
    let journal = live.journaling.take_journal().expect("journal");
    journal.sync().expect("synced");
    journal.close().expect("closed");

    let (journal, recovered) = open();
    drop(journal);
    assert!(
        recovered.checkpoint_number.is_some(),
        "the checkpoint was written"
    );
    assert!(
        recovered.records.iter().any(|r| matches!(
            postcard::from_bytes::<LogRecord>(r),
            Ok(LogRecord::Charges(_))
        )),
        "the capture's end is logged"
    );
    let mut restored = fresh();
    restored
        .restore(&recovered.checkpoint, &recovered.records)
        .expect("restores");
    assert_eq!(restored.state.ownership_image(), expected);
    assert_eq!(
        restored.state.stats().unique_blocks,
        live.state.stats().unique_blocks
    );
    assert_eq!(restored.engine_sequences(), live.engine_sequences());
    assert_eq!(restored.feed.image(), live.feed.image(), "the same lineage");
    for source in ["src-a", "src-b"] {
        assert_eq!(
            restored.state.source_held(source),
            live.state.source_held(source),
            "{source}"
        );
    }
}

/// A checkpoint starts with the state's size, and a restore sizes the block map from it
/// before storing: 30,000 blocks (a fifth of them owned by two members) restore with one
/// rebuild of an empty map. A checkpoint written before the summary existed (the same
/// records without it) still restores the same ownership, growing the map on the way.
#[test]
fn a_restore_sizes_the_block_map_from_the_checkpoint_summary() {
    let mut live = fresh();
    let hashes: Vec<u64> = (1..=30_000u64)
        .map(|h| h.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    for (i, blocks) in hashes.chunks(1_000).enumerate() {
        live.state.store(MemberId::new(i as u64 % 8, 0), blocks);
    }
    live.state.store(MemberId::new(100, 0), &hashes[..6_000]);
    let unique = live.state.stats().unique_blocks;
    assert_eq!(unique, 30_000);
    let expected = live.state.ownership_image();

    let checkpoint = live.checkpoint_records();
    assert_eq!(
        postcard::from_bytes::<CheckpointRecord>(&checkpoint[0]).unwrap(),
        CheckpointRecord::Summary {
            unique_blocks: 30_000
        }
    );
    let mut restored = fresh();
    let report = restored.restore(&checkpoint, &[]).expect("restores");
    assert_eq!(report.summary_blocks, 30_000);
    assert_eq!(report.presized_blocks, 36_000);
    assert_eq!(report.edges, 36_000);
    assert_eq!(restored.state.ownership_image(), expected);
    assert_eq!(
        restored.state.stats().block_map_rebuilds,
        1,
        "the map grew during a presized restore"
    );

    let mut old = fresh();
    let report = old.restore(&checkpoint[1..], &[]).expect("restores");
    assert_eq!((report.summary_blocks, report.presized_blocks), (0, 0));
    assert_eq!(old.state.ownership_image(), expected);
    assert!(old.state.stats().block_map_rebuilds > 5);

    // A summary claiming more blocks than the checkpoint has bytes (a writer bug) sizes
    // the map for the bytes at most, and the ownership is restored all the same.
    let mut crafted = checkpoint.clone();
    crafted[0] = encode(&CheckpointRecord::Summary {
        unique_blocks: u64::MAX,
    });
    let bytes: u64 = crafted.iter().map(|r| r.len() as u64).sum();
    let mut restored = fresh();
    let report = restored.restore(&crafted, &[]).expect("restores");
    assert_eq!(report.summary_blocks, u64::MAX);
    assert_eq!(
        report.presized_blocks,
        (bytes + bytes / 5).min(restored.state.format().slot_count())
    );
    assert_eq!(restored.state.ownership_image(), expected);
}
