//! Builds the query-side structures from the same lane fill: ckf-core's and dynamo's CKF
//! consumers (each lane filled by its own implementation's producer, then installed through its
//! own lease + barrier-snapshot path), dynamo's two exact radix trees, and the exact
//! `HashMap<u64, u16 lane mask>` baseline.

use std::collections::HashMap;
use std::sync::Arc;

use ckf_core::TableFormat;
use ckf_core::dc::{DcCkfConfig, DcCkfState, FoldHashBuilder, MemberId};
use ckf_core::frames::DcCkfSnapshot;
use ckf_core::global::{GlobalCkfIndexer, Manifest};
use ckf_core::identity::{
    IndexerDomainId, PoolId, ProducerIdentity, ProducerIncarnation, StreamTag,
};
use ckf_core::lane::{Frame, IngestOutcome, LagPolicy};
use ckf_core::publication::DcCkfPublisher;
use dynamo_kv_router::identity::{
    CacheSemanticsId, DcId, IdentitySource, IndexerDomainId as DynDomain, PoolId as DynPool,
    RoutingScopeId,
};
use dynamo_kv_router::indexer::cuckoo::{
    CkfConfig, ConsumerInstanceId, DcCkfState as DynState, GlobalCkfIndexer as DynIndexer,
    GlobalCkfIngestOutcome, GlobalCkfLaneIngestor, GlobalCkfManifest, GlobalCkfSnapshot,
    LaneLease as DynLease, PrefixSearchConfig, ProducerIdentity as DynIdentity,
};
use dynamo_kv_router::indexer::{SyncIndexer, WorkerTask};
use dynamo_kv_router::protocols::{
    ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheStoreData,
    KvCacheStoredBlockData, RouterEvent,
};
use dynamo_kv_router::{ConcurrentRadixTreeCompressed, RadixTree};

use crate::fill::top_up;
use crate::trace::{DYN_MAX_LANES, LaneFill, StoreEvent, Trace};

/// Exact index: chained hash -> lanes holding it.
pub type Exact = HashMap<u64, u64, FoldHashBuilder>;

const OUR_SEED: u64 = 0xC0DE_5EED;
const INSTANCE: u64 = 7;

/// dynamo's `CkfConfig` whose table has exactly `buckets` buckets (its sizing rule is
/// `next_pow2((5 * expected + 15) / 16)`; `buckets` must be a power of two).
pub fn dynamo_config(buckets: u64) -> CkfConfig {
    let config = CkfConfig::new((buckets * 16 / 5) as usize);
    assert_eq!(
        config.bucket_count().expect("valid dynamo config") as u64,
        buckets,
        "dynamo sizing gives another bucket count"
    );
    config
}

/// ckf-core's consumer and what the writer needs for lane 0.
pub struct Ours {
    pub ix: Arc<GlobalCkfIndexer>,
    pub tag0: StreamTag,
    pub omitted: u64,
    pub filler: u64,
}

/// ckf-core: one `DcCkfState` per lane stores the lane's events, a `DcCkfPublisher` takes the
/// barrier snapshot under a lease granted by the consumer, filler tops it up, the consumer
/// ingests it.
pub fn build_ours(trace: &Trace, fill: &LaneFill, buckets: u64, load: f64) -> Ours {
    let format = TableFormat::new(buckets, OUR_SEED).expect("format");
    let manifest = Manifest {
        domain: IndexerDomainId::new("bench").expect("domain"),
        format,
        lanes: (0..fill.lanes())
            .map(|i| PoolId::new("bench", &format!("dc-{i}")).expect("pool"))
            .collect(),
    };
    let ix = GlobalCkfIndexer::with_policy(manifest, INSTANCE, LagPolicy::DISABLED).expect("ix");
    let (mut omitted, mut filler, mut tag0) = (0, 0, None);
    for lane in 0..fill.lanes() {
        let mut state = DcCkfState::new(DcCkfConfig::new(format)).expect("state");
        let member = MemberId::new(lane as u64, 0);
        for ev in &fill.events[lane] {
            let out = state.store(member, &trace.chained[ev.request][ev.start..]);
            omitted += u64::from(out.omitted);
        }
        state.take_batch();
        let identity = ProducerIdentity {
            pool: ix.pool(lane as u8).clone(),
            incarnation: ProducerIncarnation(1),
            format,
        };
        let mut publisher = DcCkfPublisher::new(identity.clone());
        let lease = ix.grant_lease(&identity).expect("lease");
        publisher.install_lease(lease).expect("install lease");
        let mut snap: DcCkfSnapshot = publisher.snapshot(&state).expect("snapshot");
        drop(state);
        filler += top_up(&mut snap.buckets, load, 0xF111 + lane as u64);
        tag0.get_or_insert(snap.tag);
        let out = ix.ingest_now(&Frame::Snapshot(snap));
        assert!(matches!(out, IngestOutcome::Activated { .. }), "{out:?}");
    }
    Ours {
        ix: Arc::new(ix),
        tag0: tag0.expect("lane 0"),
        omitted,
        filler,
    }
}

/// dynamo's consumer, its lane ingestors (dropping one retires its lane) and lane 0's stream.
pub struct Dyn {
    pub ix: DynIndexer,
    pub ingestors: Vec<GlobalCkfLaneIngestor>,
    pub identity0: DynIdentity,
    pub lease0: DynLease,
    pub words0: Vec<u64>,
    pub omitted: u64,
    pub filler: u64,
}

fn dyn_domain() -> DynDomain {
    DynDomain::new(
        CacheSemanticsId::new([1; 16], IdentitySource::Explicit),
        RoutingScopeId::new([2; 16], IdentitySource::Explicit),
    )
}

/// The engine event for one lane store: the request's suffix with its parent.
pub fn store_event(trace: &Trace, worker: u64, event_id: u64, ev: &StoreEvent) -> RouterEvent {
    let local = &trace.local[ev.request];
    let chained = &trace.chained[ev.request];
    let blocks = (ev.start..local.len())
        .map(|k| KvCacheStoredBlockData {
            block_hash: ExternalSequenceBlockHash(chained[k]),
            tokens_hash: local[k],
            mm_extra_info: None,
        })
        .collect();
    let data = KvCacheEventData::Stored(KvCacheStoreData {
        parent_hash: (ev.start > 0).then(|| ExternalSequenceBlockHash(chained[ev.start - 1])),
        start_position: Some(ev.start as u32),
        blocks,
    });
    RouterEvent::new(
        worker,
        KvCacheEvent {
            event_id,
            data,
            dp_rank: 0,
        },
    )
}

/// dynamo: one `DcCkfState` per lane applies the lane's engine events, its barrier snapshot is
/// topped up with filler and installed through a claimed lane ingestor under a lease. At most
/// [`DYN_MAX_LANES`] lanes.
pub fn build_dynamo(trace: &Trace, fill: &LaneFill, buckets: u64, load: f64) -> Dyn {
    let config = dynamo_config(buckets);
    let domain = dyn_domain();
    let pools: [Option<DynPool>; DYN_MAX_LANES] = std::array::from_fn(|l| {
        (l < fill.lanes()).then(|| DynPool::new(domain, DcId::new(l as u64)))
    });
    let consumer = ConsumerInstanceId::new(INSTANCE);
    let mut format = None;
    let mut ix: Option<DynIndexer> = None;
    let (mut ingestors, mut omitted, mut filler) = (Vec::new(), 0, 0);
    let mut lane0 = None;
    for lane in 0..fill.lanes() {
        let mut state = DynState::new(config).expect("dynamo state");
        let f = *format.get_or_insert(state.format());
        let ix = ix.get_or_insert_with(|| {
            let manifest = GlobalCkfManifest::new(consumer, domain, f, pools).expect("manifest");
            DynIndexer::new(manifest, PrefixSearchConfig::default()).expect("dynamo indexer")
        });
        for (id, ev) in fill.events[lane].iter().enumerate() {
            let out = state.apply_event(store_event(trace, lane as u64, id as u64, ev));
            if let Some(e) = out.first_error() {
                assert!(
                    matches!(
                        e,
                        dynamo_kv_router::protocols::KvCacheEventError::CapacityExhausted
                    ),
                    "dynamo store failed: {e}"
                );
            }
        }
        omitted += state.lifetime_capacity_omissions();
        let (_, words) = state.barrier_snapshot().expect("dynamo snapshot");
        drop(state);
        let mut words = words.into_vec();
        filler += top_up(&mut words, load, 0xF111 + lane as u64);
        let identity = DynIdentity::new(pools[lane].expect("pool"), 1, 1, f);
        let lease = DynLease::new(consumer, lane as u8, 1);
        let mut ing = ix.claim_lane(lane).expect("claim");
        ing.assign(identity, lease).expect("assign");
        if lane == 0 {
            lane0 = Some((identity, lease, words.clone()));
        }
        let snap = GlobalCkfSnapshot::new(identity, lease, 0, words.into_boxed_slice());
        let out = ing.install_snapshot(&snap);
        assert!(
            matches!(out, GlobalCkfIngestOutcome::SnapshotInstalled { .. }),
            "{out:?}"
        );
        ingestors.push(ing);
    }
    let (identity0, lease0, words0) = lane0.expect("lane 0");
    Dyn {
        ix: ix.expect("indexer"),
        ingestors,
        identity0,
        lease0,
        words0,
        omitted,
        filler,
    }
}

/// dynamo's `RadixTree`, worker id = lane.
pub fn build_radix(trace: &Trace, fill: &LaneFill) -> RadixTree {
    let mut tree = RadixTree::new();
    for lane in 0..fill.lanes() {
        for (id, ev) in fill.events[lane].iter().enumerate() {
            tree.apply_event(store_event(trace, lane as u64, id as u64, ev))
                .expect("radix store");
        }
    }
    tree
}

/// dynamo's `ConcurrentRadixTreeCompressed` with its event worker thread (which owns the
/// per-worker lookup; it stays alive, idle, until `sender` is dropped).
pub struct Crtc {
    pub tree: Arc<ConcurrentRadixTreeCompressed>,
    pub sender: Option<flume::Sender<WorkerTask>>,
    pub worker: Option<std::thread::JoinHandle<()>>,
}

impl Crtc {
    /// Stops the event worker.
    pub fn stop(&mut self) {
        self.sender.take();
        if let Some(w) = self.worker.take() {
            w.join().expect("crtc worker");
        }
    }
}

/// Fills the CRTC through its public event path (`SyncIndexer::worker` on a thread), waiting
/// for the acknowledgement of the last event.
pub fn build_crtc(trace: &Trace, fill: &LaneFill) -> Crtc {
    let tree = Arc::new(ConcurrentRadixTreeCompressed::new());
    let (tx, rx) = flume::bounded(4096);
    let worker = {
        let tree = tree.clone();
        std::thread::spawn(move || tree.worker(rx, None).expect("crtc worker"))
    };
    let mut last = None;
    for lane in 0..fill.lanes() {
        for (id, ev) in fill.events[lane].iter().enumerate() {
            if let Some(e) = last.replace(store_event(trace, lane as u64, id as u64, ev)) {
                tx.send(WorkerTask::Event(e)).expect("crtc send");
            }
        }
    }
    let (ack_tx, ack_rx) = tokio::sync::oneshot::channel();
    tx.send(WorkerTask::EventWithAck {
        event: last.expect("at least one event"),
        resp: ack_tx,
    })
    .expect("crtc send");
    assert!(
        ack_rx.blocking_recv().expect("crtc ack"),
        "crtc store failed"
    );
    Crtc {
        tree,
        sender: Some(tx),
        worker: Some(worker),
    }
}

/// The exact baseline from the lanes' block sets.
pub fn build_exact(fill: &LaneFill) -> Exact {
    let mut m = Exact::default();
    for (lane, held) in fill.held.iter().enumerate() {
        for &h in held {
            *m.entry(h).or_default() |= 1u64 << lane;
        }
    }
    m
}
