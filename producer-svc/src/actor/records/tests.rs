use super::*;
use crate::events::IngestBatch;
use ckf_core::dc::{KvEvent, KvEventKind};
use ckf_engine::event::{EngineEvent, StoredBlocks};

#[test]
fn borrowed_log_records_decode_as_owned_ones() {
    let source = ckf_core::identity::SourceId::new("router-1").unwrap();
    let kv = IngestEvent::Kv(KvEvent {
        member: MemberId::new(7, 1),
        kind: KvEventKind::Stored {
            block_hashes: vec![1, u64::MAX, 3],
            parent_hash: Some(9),
        },
    });
    let gone = IngestEvent::WorkerRemoved { worker_id: 4 };
    let batch = IngestBatch {
        source_id: source,
        sequence: 42,
        events: vec![
            Ok(kv.clone()),
            Err(crate::events::EventError::MissingKind { index: 1 }),
            Ok(gone.clone()),
            Ok(kv.clone()),
        ],
    };
    // Event 3 was refused (say by a quota): neither it nor the malformed one is journaled.
    let applied = [true, false, true, false];
    let events: Vec<&IngestEvent> = batch
        .events
        .iter()
        .zip(applied)
        .filter_map(|(e, ok)| if ok { e.as_ref().ok() } else { None })
        .collect();
    let bytes = encode(&LogRecordRef::Ingest {
        source: batch.source_id.as_str(),
        sequence: 42,
        events,
    });
    assert_eq!(
        postcard::from_bytes::<LogRecord>(&bytes).unwrap(),
        LogRecord::Ingest {
            source: "router-1".into(),
            sequence: 42,
            events: vec![kv, gone],
        }
    );

    let publisher = PublisherRecord {
        worker_id: 3,
        rank: 2,
        label: "3/2".into(),
        endpoint: "tcp://e:5557".into(),
    };
    let engine = EngineBatch {
        ts: 1.5,
        dp_rank: Some(2),
        events: vec![EngineEvent::Stored(StoredBlocks {
            block_hashes: vec![10, 11],
            token_ids: (0..32).collect(),
            block_size: 16,
            ..StoredBlocks::default()
        })],
        ..EngineBatch::default()
    };
    let bytes = encode(&LogRecordRef::EngineApply {
        publisher: publisher.clone(),
        sequence: -3,
        batch: &engine,
    });
    assert_eq!(
        postcard::from_bytes::<LogRecord>(&bytes).unwrap(),
        LogRecord::EngineApply {
            publisher: publisher.clone(),
            sequence: -3,
            batch: engine,
        }
    );
    let bytes = encode(&LogRecordRef::EngineClear {
        publisher: publisher.clone(),
        reason: ClearRecord::Restart,
    });
    assert_eq!(
        postcard::from_bytes::<LogRecord>(&bytes).unwrap(),
        LogRecord::EngineClear {
            publisher,
            reason: ClearRecord::Restart,
        }
    );
    // A truncated record does not decode (it is refused, never half-applied).
    assert!(postcard::from_bytes::<LogRecord>(&bytes[..bytes.len() - 1]).is_err());
}
