//! Ownership images (`DcCkfState::ownership_image` / `restore_member`) against a simple exact
//! model, and `SourceSequences::export` / `restore`.
//!
//! Random ingest (`apply_from` from three sources under small random quotas, so refusals
//! happen), engine-path stores and removals (`apply`, charged to nobody), clears and worker
//! removals over six members and 40 block hashes (so blocks get more than three owners and
//! spill), on a table far larger than the blocks (no capacity omission). Then: the image equals
//! the model (owned sets, charged source), and restoring it, in reverse order, into a fresh
//! state whose quotas would refuse almost everything gives the same image, refcounts, member
//! counts, source holdings, stats and table membership; the same further ingest then gets the
//! same answers from both states. A second test makes the rebuilt table omit blocks and checks
//! the outcome and holdings stay exact.

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroUsize;

use ckf_core::TableFormat;
use ckf_core::dc::{
    BlockError, DcCkfConfig, DcCkfState, KvEvent, KvEventKind, MemberId, MemberImage, Quotas,
};
use ckf_core::sources::SourceSequences;
use proptest::prelude::*;

const SOURCES: [&str; 3] = ["src-a", "src-b", "src-c"];
const MEMBERS: u64 = 6;
const HASHES: u64 = 40;

fn state(bucket_count: u64, max_kicks: u32, quotas: Quotas) -> DcCkfState {
    let format = TableFormat::new(bucket_count, 7).unwrap();
    let mut s = DcCkfState::new(DcCkfConfig {
        format,
        max_kicks,
        reserve_blocks: 0,
        slice_lines: 0,
    })
    .unwrap();
    s.set_quotas(quotas);
    s
}

fn hash(i: u64) -> u64 {
    (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Member `i`: workers 0..3 with two ranks each (so a worker removal clears two members).
fn member(i: u64) -> MemberId {
    MemberId::new(i / 2, (i % 2) as u32)
}

#[derive(Debug, Clone)]
enum Op {
    Store(usize, u64, Vec<u64>),
    Remove(usize, u64, Vec<u64>),
    Clear(usize, u64),
    EngineStore(u64, Vec<u64>),
    EngineRemove(u64, Vec<u64>),
    RemoveWorker(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let hashes = || proptest::collection::vec(0..HASHES, 0..14);
    let src = || 0..SOURCES.len();
    prop_oneof![
        6 => (src(), 0..MEMBERS, hashes()).prop_map(|(s, m, h)| Op::Store(s, m, h)),
        2 => (src(), 0..MEMBERS, hashes()).prop_map(|(s, m, h)| Op::Remove(s, m, h)),
        1 => (src(), 0..MEMBERS).prop_map(|(s, m)| Op::Clear(s, m)),
        2 => (0..MEMBERS, hashes()).prop_map(|(m, h)| Op::EngineStore(m, h)),
        1 => (0..MEMBERS, hashes()).prop_map(|(m, h)| Op::EngineRemove(m, h)),
        1 => (0..MEMBERS / 2).prop_map(Op::RemoveWorker),
    ]
}

fn quotas() -> impl Strategy<Value = Quotas> {
    (
        prop_oneof![Just(0u32), Just(12)],
        prop_oneof![Just(0u32), 4u32..24],
        prop_oneof![Just(0u64), 8u64..60],
    )
        .prop_map(|(event, member, source)| Quotas {
            max_blocks_per_event: event,
            max_blocks_per_member: member,
            max_blocks_per_source: source,
            ..Quotas::UNLIMITED
        })
}

/// The exact model: owned sets and member -> charged source. Quota refusals are taken from the
/// state (their rule has its own model in `producer_quotas.rs`); what an applied event does to
/// ownership and charges is the model's.
#[derive(Debug, Default)]
struct Model {
    owned: BTreeMap<MemberId, BTreeSet<u64>>,
    charge: BTreeMap<MemberId, &'static str>,
}

impl Model {
    fn store(&mut self, m: MemberId, hashes: &[u64]) {
        if !hashes.is_empty() {
            self.owned.entry(m).or_default().extend(hashes);
        }
    }

    fn remove(&mut self, m: MemberId, hashes: &[u64]) {
        if let Some(set) = self.owned.get_mut(&m) {
            for h in hashes {
                set.remove(h);
            }
        }
        self.forget_if_empty(m);
    }

    fn clear(&mut self, m: MemberId) {
        self.owned.remove(&m);
        self.charge.remove(&m);
    }

    fn forget_if_empty(&mut self, m: MemberId) {
        if self.owned.get(&m).is_none_or(BTreeSet::is_empty) {
            self.clear(m);
        }
    }

    fn image(&self) -> Vec<MemberImage> {
        self.owned
            .iter()
            .map(|(&m, set)| MemberImage {
                member: m,
                charged_to: self.charge.get(&m).map(|s| s.to_string()),
                blocks: set.iter().copied().collect(),
            })
            .collect()
    }
}

/// Applies `op` to `s` (and `model`, when given); returns a comparable answer.
fn run(s: &mut DcCkfState, model: Option<&mut Model>, op: &Op) -> String {
    let stored = |m: u64, h: &[u64]| KvEvent {
        member: member(m),
        kind: KvEventKind::Stored {
            block_hashes: h.iter().map(|&i| hash(i)).collect(),
            parent_hash: None,
        },
    };
    let removed = |m: u64, h: &[u64]| KvEvent {
        member: member(m),
        kind: KvEventKind::Removed {
            block_hashes: h.iter().map(|&i| hash(i)).collect(),
        },
    };
    let hashes = |h: &[u64]| h.iter().map(|&i| hash(i)).collect::<Vec<_>>();
    let (answer, applied) = match op {
        Op::Store(src, m, h) => {
            let r = s.apply_from(SOURCES[*src], &stored(*m, h));
            (format!("{r:?}"), r.is_ok())
        }
        Op::Remove(src, m, h) => {
            let r = s.apply_from(SOURCES[*src], &removed(*m, h));
            (format!("{r:?}"), r.is_ok())
        }
        Op::Clear(src, m) => {
            let event = KvEvent {
                member: member(*m),
                kind: KvEventKind::Cleared,
            };
            (format!("{:?}", s.apply_from(SOURCES[*src], &event)), true)
        }
        Op::EngineStore(m, h) => (format!("{:?}", s.apply(&stored(*m, h))), true),
        Op::EngineRemove(m, h) => (format!("{:?}", s.apply(&removed(*m, h))), true),
        Op::RemoveWorker(w) => (format!("{:?}", s.remove_worker(*w)), true),
    };
    if let Some(model) = model
        && applied
    {
        match op {
            Op::Store(src, m, h) => {
                model.store(member(*m), &hashes(h));
                if model.owned.contains_key(&member(*m)) {
                    model.charge.entry(member(*m)).or_insert(SOURCES[*src]);
                }
            }
            Op::EngineStore(m, h) => model.store(member(*m), &hashes(h)),
            Op::Remove(_, m, h) | Op::EngineRemove(m, h) => model.remove(member(*m), &hashes(h)),
            Op::Clear(_, m) => model.clear(member(*m)),
            Op::RemoveWorker(w) => {
                for r in 0..2 {
                    model.clear(MemberId::new(*w, r));
                }
            }
        }
    }
    answer
}

fn holdings(s: &DcCkfState) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = s
        .source_holdings()
        .map(|(id, held)| (id.to_owned(), held))
        .collect();
    v.sort();
    v
}

fn same_state(a: &DcCkfState, b: &DcCkfState) -> Result<(), TestCaseError> {
    prop_assert_eq!(a.ownership_image(), b.ownership_image());
    for i in 0..HASHES {
        prop_assert_eq!(a.refcount(hash(i)), b.refcount(hash(i)), "hash {}", i);
        if b.refcount(hash(i)) > 0 {
            prop_assert!(
                b.may_contain(hash(i)),
                "tracked hash {} not in the table",
                i
            );
        }
    }
    for m in 0..MEMBERS {
        prop_assert_eq!(a.member_owned(member(m)), b.member_owned(member(m)));
    }
    for src in SOURCES {
        prop_assert_eq!(a.source_held(src), b.source_held(src), "source {}", src);
    }
    prop_assert_eq!(holdings(a), holdings(b));
    prop_assert_eq!(a.charged_sources(), b.charged_sources());
    let (sa, sb) = (a.stats(), b.stats());
    prop_assert_eq!(sa.members, sb.members);
    prop_assert_eq!(sa.unique_blocks, sb.unique_blocks);
    prop_assert_eq!(sa.ownership_edges, sb.ownership_edges);
    prop_assert_eq!(sa.resident_fingerprints, sb.resident_fingerprints);
    prop_assert_eq!(b.count_resident(), sb.resident_fingerprints);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn restored_image_is_the_same_state(
        q in quotas(),
        before in proptest::collection::vec(op(), 0..80),
        after in proptest::collection::vec(op(), 0..20),
    ) {
        let mut original = state(1 << 12, 500, q);
        let mut model = Model::default();
        for op in &before {
            run(&mut original, Some(&mut model), op);
        }
        let image = original.ownership_image();
        prop_assert_eq!(&image, &model.image());
        for m in &image {
            prop_assert_eq!(m.blocks.clone(), original.member_blocks(m.member));
        }

        // Quotas that refuse nearly every store: a restore ignores them.
        let tight = Quotas {
            max_blocks_per_event: 1,
            max_blocks_per_batch: 1,
            max_blocks_per_member: 1,
            max_blocks_per_source: 1,
            max_ranks_per_worker: 1,
        };
        let mut restored = state(1 << 12, 500, tight);
        for m in image.iter().rev() {
            let out = restored.restore_member(m);
            prop_assert_eq!((out.applied as usize, out.omitted, out.redundant), (m.blocks.len(), 0, 0));
        }
        same_state(&original, &restored)?;

        // Same quotas from now on: the same ingest gets the same answers.
        restored.set_quotas(q);
        for op in &after {
            prop_assert_eq!(run(&mut original, None, op), run(&mut restored, None, op), "{:?}", op);
        }
        same_state(&original, &restored)?;
    }
}

/// A state whose whole-map work runs in one-line slices, its block map `reserve` blocks
/// large (a reservation keeps it from being rebuilt, so walks move blocks across a capture's
/// cursor; none lets it grow and shrink under the capture).
fn sliced_state(reserve: u64, quotas: Quotas) -> DcCkfState {
    let mut s = DcCkfState::new(DcCkfConfig {
        format: TableFormat::new(1 << 12, 7).unwrap(),
        max_kicks: 500,
        reserve_blocks: reserve,
        slice_lines: 1,
    })
    .unwrap();
    s.set_quotas(quotas);
    s
}

/// What the producer journals after a capture began: the applied ops, and the charges at
/// the capture's end.
#[derive(Debug)]
enum Logged {
    Op(Op),
    Charges(Vec<(String, Vec<MemberId>)>),
}

/// Runs `ops` on `live`, a release step after each (as the producer's actor does), and logs
/// those applied (a refused store or removal changes nothing and is not journaled).
fn run_logged(live: &mut DcCkfState, ops: &[Op], log: &mut Vec<Logged>) {
    for op in ops {
        let answer = run(live, None, op);
        if !answer.starts_with("Err") {
            log.push(Logged::Op(op.clone()));
        }
        live.release_step();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A capture in slices with changes between its steps (see `ckf_core::dc::image`, "An
    /// image in slices"): its images restored, then the changes after its start replayed with
    /// the charges set where its end was logged, give the live state.
    #[test]
    fn an_image_taken_in_slices_plus_the_log_after_its_start_is_the_live_state(
        q in quotas(),
        reserve in prop_oneof![Just(0u64), Just(HASHES)],
        before in proptest::collection::vec(op(), 0..60),
        during in proptest::collection::vec(proptest::collection::vec(op(), 0..4), 0..24),
        after in proptest::collection::vec(op(), 0..10),
    ) {
        let mut live = sliced_state(reserve, q);
        let mut ignored = Vec::new();
        run_logged(&mut live, &before, &mut ignored);

        let mut capture = live.begin_capture();
        let mut log = Vec::new();
        let mut steps = during.iter();
        loop {
            if let Some(ops) = steps.next() {
                run_logged(&mut live, ops, &mut log);
            }
            if !live.capture_step(&mut capture) {
                break;
            }
        }
        log.push(Logged::Charges(live.charge_image()));
        let images = live.capture_images(capture);
        run_logged(&mut live, &after, &mut log);

        let mut restored = sliced_state(reserve, Quotas::UNLIMITED);
        for image in &images {
            restored.restore_member(image);
        }
        for entry in &log {
            match entry {
                Logged::Op(op) => {
                    run(&mut restored, None, op);
                }
                Logged::Charges(charges) => restored.restore_charges(charges),
            }
            restored.release_step();
        }
        restored.set_quotas(q);
        live.finish_releases();
        restored.finish_releases();
        same_state(&live, &restored)?;
    }
}

#[test]
fn blocks_walks_move_behind_a_capture_are_still_in_its_image() {
    // A reserved map (never rebuilt below 4,400 blocks) 80% full, then filled to ~90% half-way
    // through the capture: the stores' walks move old blocks across the capture's cursor.
    let mut live = sliced_state(4_400, Quotas::UNLIMITED);
    let store = |s: &mut DcCkfState, keys: std::ops::Range<u64>| {
        for i in keys {
            s.store(member(i % MEMBERS), &[hash(1_000 + i)]);
        }
    };
    store(&mut live, 0..3_900);
    let mut capture = live.begin_capture();
    for _ in 0..600 {
        assert!(live.capture_step(&mut capture));
    }
    let late = 3_900..4_300;
    store(&mut live, late.clone());
    while live.capture_step(&mut capture) {}
    assert_eq!(
        capture.restarts(),
        0,
        "the reservation keeps the map from being rebuilt"
    );
    let images = live.capture_images(capture);

    let mut restored = sliced_state(4_400, Quotas::UNLIMITED);
    for image in &images {
        restored.restore_member(image);
    }
    store(&mut restored, late);
    assert_eq!(restored.ownership_image(), live.ownership_image());
}

#[test]
fn a_capture_in_one_step_is_the_exact_image() {
    let mut s = state(1 << 12, 500, Quotas::UNLIMITED);
    for i in 0..MEMBERS {
        let hashes: Vec<u64> = (i..i + 10).map(hash).collect();
        s.apply_from(
            SOURCES[(i % 3) as usize],
            &KvEvent {
                member: member(i),
                kind: KvEventKind::Stored {
                    block_hashes: hashes,
                    parent_hash: None,
                },
            },
        )
        .unwrap();
    }
    let mut capture = s.begin_capture();
    assert!(
        !s.capture_step(&mut capture),
        "slice_lines = 0 reads every line at once"
    );
    assert!(capture.is_done());
    let mut images = s.capture_images(capture);
    for image in &mut images {
        image.blocks.sort_unstable();
    }
    images.sort_unstable_by_key(|image| image.member);
    assert_eq!(images, s.ownership_image());
}

#[test]
fn blocks_the_rebuilt_table_cannot_place_are_reported_and_not_charged() {
    // 8 buckets (32 slots), no relocation: the original places what fits.
    let mut original = state(8, 0, Quotas::UNLIMITED);
    let x = MemberId::new(1, 0);
    let hashes: Vec<u64> = (0..64).map(hash).collect();
    let event = KvEvent {
        member: x,
        kind: KvEventKind::Stored {
            block_hashes: hashes,
            parent_hash: None,
        },
    };
    let first = original.apply_from("src-a", &event).unwrap();
    assert!(first.omitted > 0 && first.applied > 0, "{first:?}");
    let image = original.ownership_image();
    assert_eq!(image.len(), 1);
    assert_eq!(image[0].charged_to.as_deref(), Some("src-a"));
    assert_eq!(image[0].blocks.len(), first.applied as usize);

    // The new state's table is partly taken by another member first.
    let mut rebuilt = state(8, 0, Quotas::UNLIMITED);
    let other: Vec<u64> = (100..116).map(hash).collect();
    let taken = rebuilt.store(MemberId::new(2, 0), &other);
    assert!(taken.applied > 0);
    let out = rebuilt.restore_member(&image[0]);
    assert!(out.omitted > 0, "{out:?}");
    assert_eq!((out.applied + out.omitted) as usize, image[0].blocks.len());
    let Some(BlockError::CapacityExhausted { block_hash, .. }) = out.first_error else {
        panic!("{out:?}");
    };
    assert!(!rebuilt.owns(x, block_hash));
    let owned = rebuilt.member_blocks(x);
    assert_eq!(owned.len(), out.applied as usize);
    assert!(owned.iter().all(|h| image[0].blocks.contains(h)));
    assert_eq!(rebuilt.member_owned(x), out.applied);
    assert_eq!(rebuilt.source_held("src-a"), u64::from(out.applied));
    assert!(owned.iter().all(|&h| rebuilt.may_contain(h)));
    assert_eq!(
        rebuilt.count_resident(),
        rebuilt.stats().resident_fingerprints
    );

    // Nothing placed at all: the member is not tracked and no source is charged.
    let mut full = state(8, 0, Quotas::UNLIMITED);
    let filler: Vec<u64> = (200..400).map(hash).collect();
    full.store(MemberId::new(3, 0), &filler);
    let lone = MemberImage {
        member: x,
        charged_to: Some("src-b".into()),
        blocks: (400..420)
            .map(hash)
            .filter(|&h| !full.may_contain(h))
            .collect(),
    };
    let out = full.restore_member(&lone);
    assert_eq!((out.applied, out.omitted as usize), (0, lone.blocks.len()));
    assert_eq!(
        (
            full.member_owned(x),
            full.source_held("src-b"),
            full.charged_sources()
        ),
        (0, 0, 0)
    );
}

#[test]
fn a_restored_member_keeps_an_existing_charge() {
    // Restoring into a non-empty state: a member already charged stays charged where it is
    // (as apply_from never re-charges), re-stored blocks are redundant.
    let mut s = state(1 << 10, 500, Quotas::UNLIMITED);
    let m = MemberId::new(4, 1);
    let event = KvEvent {
        member: m,
        kind: KvEventKind::Stored {
            block_hashes: vec![hash(1), hash(2)],
            parent_hash: None,
        },
    };
    s.apply_from("src-a", &event).unwrap();
    let out = s.restore_member(&MemberImage {
        member: m,
        charged_to: Some("src-b".into()),
        blocks: vec![hash(2), hash(3)],
    });
    assert_eq!((out.applied, out.redundant), (1, 1));
    assert_eq!((s.source_held("src-a"), s.source_held("src-b")), (3, 0));
}

/// A recency-ordered model of the tracker (front = least recently used), as in
/// `producer_sources.rs`, reduced to what export needs.
fn model_admit(order: &mut Vec<(String, u64)>, capacity: usize, source: &str, seq: u64) {
    match order.iter().position(|(s, _)| s == source) {
        Some(i) => {
            let (id, last) = order.remove(i);
            order.push((id, last.max(seq)));
        }
        None => {
            if order.len() == capacity {
                order.remove(0);
            }
            order.push((source.to_owned(), seq));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn restored_sources_answer_the_same(
        capacity in 1usize..6,
        before in proptest::collection::vec((0u8..8, 0u64..12), 0..60),
        after in proptest::collection::vec((0u8..8, 0u64..12), 0..40),
    ) {
        let cap = NonZeroUsize::new(capacity).unwrap();
        let id = |i: u8| format!("source-{i}");
        let mut original = SourceSequences::new(cap);
        let mut order = Vec::new();
        for &(s, seq) in &before {
            original.admit(&id(s), seq);
            model_admit(&mut order, capacity, &id(s), seq);
        }
        let exported = original.export();
        prop_assert_eq!(&exported, &order);
        let mut restored = SourceSequences::new(cap);
        restored.restore(exported.clone());
        prop_assert_eq!(restored.export(), exported);
        prop_assert_eq!(restored.bytes_used(), original.bytes_used());
        for &(s, seq) in &after {
            prop_assert_eq!(original.admit(&id(s), seq), restored.admit(&id(s), seq));
            prop_assert_eq!(original.export(), restored.export());
        }
    }
}
