//! Test kit (feature `testing` only; never in the services): build consumer frames under a
//! lease and install barrier snapshots through the real lease and ingest path, so every test
//! of the consumer, the search and the services starts a lane the same way.
//!
//! ```text
//! indexer(domain, format, lanes, instance) -> GlobalCkfIndexer of pools domain/dc-0..dc-N
//! lane_states(ix) -> every lane's state, lane order
//! TestStream::attach(ix, identity) -> grant_lease -> tag
//!     .snapshot / .chunk / .delta / .drain / .heartbeat -> Frame under that tag
//! activate(ix, lane, incarnation, sequence, words) -> lease + whole snapshot -> Activated
//! install_snapshot(ix, publisher, state, chunk_bytes) -> lease + chunked barrier -> Activated
//! kernel_runs(kernel) -> queries this thread ran with that search kernel
//! block_key(i, salt) -> a well-mixed test block hash
//! producer_state(buckets, seed, max_kicks) -> an empty DcCkfState of that format
//! assert_alternate_involution(addressing, buckets) -> case 2/7 for every fingerprint at those buckets
//! store_until(state, member, count, salt, next) -> store fresh block_keys until count accepted
//! fingerprint_copies(word, fp) -> slots of a bucket word holding fp
//! assert_projection_exact(state, tracked) -> the producer table holds exactly the tracked blocks
//! without_kernels(&[kernels], f) -> f() with those kernels reported unavailable (this thread)
//! place_blocks(addressing, words, blocks) -> each block's fingerprint in its first free candidate slot
//! model_depth(addressing, words, hashes) -> the exact model of one lane's prefix depth
//! ```
//! The helpers panic (with the outcome) when the consumer does not answer as a healthy lane
//! would: they are for setting up a test, not for checking the rule under test.

pub use crate::memory::test_hooks::force_alternate_on_demand;

use crate::addressing::TableFormat;
use crate::dc::DcCkfState;
use crate::frames::Heartbeat;
use crate::frames::{BucketImage, DcCkfDelta, DcCkfSnapshot, DrainMarker, SnapshotChunk};
use crate::global::{GlobalCkfIndexer, Manifest};
use crate::identity::{
    IndexerDomainId, LaneIndex, PoolId, ProducerIdentity, ProducerIncarnation, StreamTag,
};
use crate::lane::{Frame, IngestOutcome, LagPolicy, LaneState};
use crate::publication::DcCkfPublisher;

/// An indexer of `domain` with `lanes` lanes, lane `i` for pool `domain/dc-i`, all in `format`,
/// answering as `consumer_instance`, with [`LagPolicy::DISABLED`] (tests drive time).
///
/// # Panics
/// When `domain` is not a valid id or `lanes` is not in `1..=64`.
pub fn indexer(
    domain: &str,
    format: TableFormat,
    lanes: usize,
    consumer_instance: u64,
) -> GlobalCkfIndexer {
    let manifest = Manifest {
        domain: IndexerDomainId::new(domain).expect("test domain"),
        format,
        lanes: (0..lanes)
            .map(|i| PoolId::new(domain, &format!("dc-{i}")).expect("test pool"))
            .collect(),
    };
    GlobalCkfIndexer::with_policy(manifest, consumer_instance, LagPolicy::DISABLED)
        .expect("test manifest")
}

/// Every lane's state, in lane order (what a refused attach must leave as it was).
pub fn lane_states(ix: &GlobalCkfIndexer) -> Vec<LaneState> {
    ix.lane_statuses().iter().map(|s| s.state).collect()
}

/// The identity of a producer of `lane`'s pool with the manifest's format.
///
/// # Panics
/// When `lane` is not in the manifest.
pub fn identity(ix: &GlobalCkfIndexer, lane: LaneIndex, incarnation: u64) -> ProducerIdentity {
    ProducerIdentity {
        pool: ix.pool(lane).clone(),
        incarnation: ProducerIncarnation(incarnation),
        format: ix.manifest().format,
    }
}

/// A producer-side stream for tests: the envelope (incarnation + lease) its frames carry.
/// Frames are built by hand, so a test can break exactly one rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TestStream {
    /// Incarnation and lease stamped on every frame (edit it to forge foreign traffic).
    pub tag: StreamTag,
}

impl TestStream {
    /// Grants a lease to `identity` and returns its stream.
    ///
    /// # Panics
    /// When the lease is refused.
    pub fn attach(ix: &GlobalCkfIndexer, identity: &ProducerIdentity) -> Self {
        let lease = ix.grant_lease(identity).expect("test attach accepted");
        Self {
            tag: StreamTag {
                incarnation: identity.incarnation,
                lease,
            },
        }
    }

    /// Grants a lease on `lane` to a producer `incarnation` ([`identity`]).
    ///
    /// # Panics
    /// When `lane` is not in the manifest.
    pub fn on_lane(ix: &GlobalCkfIndexer, lane: LaneIndex, incarnation: u64) -> Self {
        Self::attach(ix, &identity(ix, lane, incarnation))
    }

    /// A whole barrier snapshot tagged `sequence` (one word per bucket).
    pub fn snapshot(&self, sequence: u64, buckets: Vec<u64>) -> Frame {
        Frame::Snapshot(DcCkfSnapshot {
            tag: self.tag,
            sequence,
            buckets,
        })
    }

    /// One snapshot chunk of `words` starting at `first_bucket` (little-endian bytes).
    pub fn chunk(&self, sequence: u64, first_bucket: u64, words: &[u64]) -> Frame {
        self.chunk_bytes(
            sequence,
            first_bucket,
            words.iter().flat_map(|w| w.to_le_bytes()).collect(),
        )
    }

    /// One snapshot chunk of raw bytes (which may be broken: empty, not whole words).
    pub fn chunk_bytes(&self, sequence: u64, first_bucket: u64, bytes: Vec<u8>) -> Frame {
        Frame::Chunk(SnapshotChunk {
            tag: self.tag,
            sequence,
            first_bucket,
            words: bytes,
        })
    }

    /// A delta `base -> sequence` of `(bucket, image)` pairs, in order.
    pub fn delta(&self, base: u64, sequence: u64, images: &[(u32, u64)]) -> Frame {
        Frame::Delta(DcCkfDelta {
            tag: self.tag,
            base_sequence: base,
            sequence,
            images: images
                .iter()
                .map(|&(bucket, image)| BucketImage { bucket, image })
                .collect(),
            oldest_change_age_ms: 0,
        })
    }

    /// A drain marker claiming `sequence` as the final one.
    pub fn drain(&self, sequence: u64) -> Frame {
        Frame::Drain(DrainMarker {
            tag: self.tag,
            sequence,
        })
    }

    /// A heartbeat claiming `sequence` as the last one sent.
    pub fn heartbeat(&self, sequence: u64) -> Frame {
        Frame::Heartbeat(Heartbeat {
            tag: self.tag,
            sequence,
        })
    }
}

/// Leases `lane` to `incarnation` and installs `words` as a whole barrier snapshot tagged
/// `sequence`; returns the stream.
///
/// # Panics
/// When the snapshot does not activate the lane.
pub fn activate(
    ix: &GlobalCkfIndexer,
    lane: LaneIndex,
    incarnation: u64,
    sequence: u64,
    words: Vec<u64>,
) -> TestStream {
    let stream = TestStream::on_lane(ix, lane, incarnation);
    let outcome = ix.ingest_now(&stream.snapshot(sequence, words));
    assert_eq!(
        outcome,
        IngestOutcome::Activated {
            installed_sequence: sequence
        },
        "barrier snapshot of lane {lane}"
    );
    stream
}

/// Leases the publisher's lane, installs the lease in `publisher`, folds `state`'s pending
/// changes into the barrier (the publisher must be the state's only one) and sends the snapshot
/// in chunks of at most `chunk_bytes`; returns the installed sequence.
///
/// # Panics
/// When the lease is refused or a chunk is not accepted / the last one does not activate.
pub fn install_snapshot(
    ix: &GlobalCkfIndexer,
    publisher: &mut DcCkfPublisher,
    state: &mut DcCkfState,
    chunk_bytes: usize,
) -> u64 {
    let lease = ix
        .grant_lease(publisher.identity())
        .expect("test attach accepted");
    publisher.install_lease(lease).expect("fresh lease");
    while state.take_batch().is_some() {}
    let snapshot = publisher.snapshot(state).expect("barrier snapshot");
    let chunks: Vec<_> = snapshot.chunks(chunk_bytes).collect();
    let last = chunks.len() - 1;
    for (i, chunk) in chunks.into_iter().enumerate() {
        let outcome = ix.ingest_now(&Frame::Chunk(chunk));
        if i == last {
            assert_eq!(
                outcome,
                IngestOutcome::Activated {
                    installed_sequence: snapshot.sequence
                }
            );
        } else {
            assert!(
                matches!(outcome, IngestOutcome::ChunkAccepted { .. }),
                "chunk {i}: {outcome:?}"
            );
        }
    }
    snapshot.sequence
}

/// Number of prefix queries the calling thread has run with `kernel` (a resolved kernel; `Auto`
/// is never counted): proves which kernel a forced or configured search really used.
pub fn kernel_runs(kernel: crate::search::SearchKernel) -> u64 {
    crate::search::test_hooks::runs(kernel)
}

/// Runs `f` with `kernels` reported unavailable by [`crate::search::SearchKernel::is_available`]
/// on the calling thread (as on a CPU without them), so the refusals of a forced kernel can be
/// tested on any machine. Restored afterwards, also when `f` panics.
pub fn without_kernels<R>(kernels: &[crate::search::SearchKernel], f: impl FnOnce() -> R) -> R {
    crate::search::test_hooks::with_hidden(kernels, f)
}

/// Slots of the bucket `word` holding fingerprint `fp` (0..=4).
pub fn fingerprint_copies(word: u64, fp: u16) -> usize {
    crate::bucket::slots(word)
        .iter()
        .filter(|&&s| s == fp)
        .count()
}

/// Panics unless `state`'s table is the exact projection of `tracked`: every tracked block is
/// found, each distinct `(fingerprint, bucket pair)` has at least as many physical copies in its
/// pair as tracked blocks share it (case 6), each stored pair is two distinct in-range buckets
/// (cases 2 and 7), and the table holds no other fingerprint (resident count == tracked).
pub fn assert_projection_exact(state: &DcCkfState, tracked: &std::collections::BTreeSet<u64>) {
    let a = *state.addressing();
    let mut groups: std::collections::BTreeMap<(u16, u32, u32), usize> = Default::default();
    for &h in tracked {
        let l = a.locate(h);
        assert!(state.may_contain(h), "tracked block {h:#x} not found");
        let k = (
            l.fingerprint,
            l.bucket_a.min(l.bucket_b),
            l.bucket_a.max(l.bucket_b),
        );
        *groups.entry(k).or_default() += 1;
    }
    let b = state.buckets();
    for (&(fp, x, y), &n) in &groups {
        assert!(
            x < y && (y as usize) < b.len(),
            "pair ({x}, {y}) of {}",
            b.len()
        );
        let have = fingerprint_copies(b[x as usize], fp) + fingerprint_copies(b[y as usize], fp);
        assert!(
            have >= n,
            "{n} blocks share fp {fp:#x} in ({x}, {y}), {have} copies"
        );
    }
    assert_eq!(state.count_resident(), tracked.len() as u64);
    assert_eq!(state.stats().resident_fingerprints, tracked.len() as u64);
}

/// A well-mixed test block hash: `fmix64(i * 0x9E37_79B9_7F4A_7C15 ^ salt)`, distinct for
/// distinct `i` under one `salt` (both steps are bijections).
pub fn block_key(i: u64, salt: u64) -> u64 {
    crate::addressing::fmix64(i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt)
}

/// An empty producer state of `bucket_count` buckets, addressing seed `seed` and kick bound
/// `max_kicks`.
///
/// # Panics
/// On an invalid bucket count or kick bound (a test setup error).
pub fn producer_state(bucket_count: u64, seed: u64, max_kicks: u32) -> DcCkfState {
    let format = TableFormat::new(bucket_count, seed).expect("test bucket count");
    DcCkfState::new(crate::dc::DcCkfConfig {
        format,
        max_kicks,
        reserve_blocks: 0,
        slice_lines: 0,
    })
    .expect("test config")
}

/// Cases 2 and 7 for every fingerprint at each of `buckets`: the alternate is below the bucket
/// count, differs from the bucket, and the alternate of the alternate is the bucket.
///
/// # Panics
/// On the first bucket and fingerprint that break one of the three, naming them.
pub fn assert_alternate_involution(
    addressing: &crate::addressing::Addressing,
    buckets: impl IntoIterator<Item = u32> + Clone,
) {
    let n = addressing.bucket_count();
    for fp in 1..=u16::MAX {
        for b in buckets.clone() {
            let alt = addressing.alternate(b, fp);
            assert!(u64::from(alt) < n, "n={n} fp={fp} bucket {b} -> {alt}");
            assert_ne!(alt, b, "n={n} fp={fp} bucket {b}: its own alternate");
            assert_eq!(addressing.alternate(alt, fp), b, "n={n} fp={fp} bucket {b}");
        }
    }
}

/// Stores fresh blocks `block_key(i, salt)` for `member`, one per event, with
/// `i = *next + 1, *next + 2, ...`, until `count` were accepted (a capacity omission is skipped);
/// returns the accepted ones in order and leaves `*next` at the last `i` used, so a test can go
/// on drawing fresh keys.
pub fn store_until(
    state: &mut DcCkfState,
    member: crate::dc::MemberId,
    count: usize,
    salt: u64,
    next: &mut u64,
) -> Vec<u64> {
    let mut stored = Vec::with_capacity(count);
    while stored.len() < count {
        *next += 1;
        let h = block_key(*next, salt);
        if state.store(member, &[h]).applied == 1 {
            stored.push(h);
        }
    }
    stored
}

/// One step of load-keeping churn: removes `tracked[index]` (swap-remove) for `member`, then
/// stores fresh blocks `block_key(i, salt)` (`i` drawn on from `*next`, as [`store_until`]) one
/// per event until one is accepted (pushed onto `tracked`) or four were omitted, so a table held
/// at high load stays there while its insertions kick. Returns the removal's `applied` count (1
/// when `tracked` matched the state).
pub fn churn_one(
    state: &mut DcCkfState,
    member: crate::dc::MemberId,
    tracked: &mut Vec<u64>,
    index: usize,
    salt: u64,
    next: &mut u64,
) -> u32 {
    let gone = tracked.swap_remove(index);
    let removed = state.remove(member, &[gone]).applied;
    for _ in 0..4 {
        *next += 1;
        let h = block_key(*next, salt);
        if state.store(member, &[h]).applied == 1 {
            tracked.push(h);
            break;
        }
    }
    removed
}

/// Places each of `blocks` in one lane's `words` exactly (its fingerprint in the first free
/// slot of its candidate buckets, the primary bucket first; a block that finds none is skipped).
pub fn place_blocks(
    addressing: &crate::addressing::Addressing,
    words: &mut [u64],
    blocks: impl IntoIterator<Item = u64>,
) {
    for h in blocks {
        let loc = addressing.locate(h);
        for b in [loc.bucket_a, loc.bucket_b] {
            let w = words[b as usize];
            if let Some(s) = crate::bucket::find_empty(w) {
                words[b as usize] = crate::bucket::with_slot(w, s, loc.fingerprint);
                break;
            }
        }
    }
}

/// The exact model of one lane's prefix depth: the leading `hashes` whose fingerprint is in a
/// slot of one of their two candidate buckets of `words` (slot by slot, no word tricks).
pub fn model_depth(
    addressing: &crate::addressing::Addressing,
    words: &[u64],
    hashes: &[u64],
) -> u32 {
    hashes
        .iter()
        .take_while(|&&h| {
            let loc = addressing.locate(h);
            [loc.bucket_a, loc.bucket_b]
                .iter()
                .any(|&b| crate::bucket::slots(words[b as usize]).contains(&loc.fingerprint))
        })
        .count() as u32
}
