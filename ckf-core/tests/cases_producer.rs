//! Producer parts of `docs/design.md`, "Cuckoo filter cases": cases 1-8, 11 and 12, each checked for
//! its whole kind (several table sizes, kick bounds, slots or members) rather than one input.
//! The 1,048,576-block false-positive check of case 1 and the 500,000-session kick-cycle check
//! live in `producer_kicks.rs`.

use std::collections::{BTreeSet, HashMap};

use ckf_core::addressing::{FormatError, fmix64};
use ckf_core::bucket;
use ckf_core::dc::{DcCkfConfig, DcCkfError, DcCkfState, KvEvent, KvEventKind, MemberId};
use ckf_core::frames::BucketImage;
use ckf_core::publication::DcCkfPublisher;
use ckf_core::testing::{
    assert_alternate_involution, assert_projection_exact, block_key as key, churn_one,
    fingerprint_copies, producer_state, store_until,
};
use ckf_core::{
    Addressing, LaneLease, Location, PoolId, ProducerIdentity, ProducerIncarnation, TableFormat,
};

const M0: MemberId = MemberId::new(1, 0);
const M1: MemberId = MemberId::new(2, 3);

fn copies_in_pair(buckets: &[u64], loc: Location) -> usize {
    fingerprint_copies(buckets[loc.bucket_a as usize], loc.fingerprint)
        + fingerprint_copies(buckets[loc.bucket_b as usize], loc.fingerprint)
}

fn state(bucket_count: u64, max_kicks: u32) -> DcCkfState {
    producer_state(bucket_count, 42, max_kicks)
}

/// Case 1, whole kind: fingerprint and bucket index must not be drawn from correlated bits, for
/// random keys and for structured ones (sequential, strided, high-bit-only). Chi-square of the
/// joint (bucket mod 64, fingerprint / 4096) histogram over 2^20 keys: 945 degrees of freedom,
/// mean 945, sd 43.5; 1,300 is > 8 sd out.
#[test]
fn case_01_fingerprint_and_bucket_are_independent() {
    let a = Addressing::new(&TableFormat::for_expected_blocks(1 << 20, 42).unwrap()).unwrap();
    type Family = (&'static str, fn(u64) -> u64);
    let families: [Family; 4] = [
        ("random", |i| key(i, 1)),
        ("sequential", |i| i),
        ("stride 2^20", |i| i << 20),
        ("high bits", |i| i << 44),
    ];
    for (name, f) in families {
        let mut hist = vec![0u32; 64 * 16];
        let n = 1u64 << 20;
        for i in 0..n {
            let l = a.locate(f(i));
            hist[(l.bucket_a as usize % 64) * 16 + usize::from(l.fingerprint >> 12)] += 1;
        }
        let expect = n as f64 / hist.len() as f64;
        let chi2: f64 = hist
            .iter()
            .map(|&o| (f64::from(o) - expect).powi(2) / expect)
            .sum();
        assert!(chi2 < 1300.0, "{name}: chi2 {chi2:.0} over 945 dof");
    }
}

/// Case 2: for every fingerprint and every bucket of 2-, 4- and 8-bucket tables the alternate is
/// in range, differs, and is an involution.
#[test]
fn case_02_alternate_is_an_in_range_involution() {
    for bucket_count in [2u64, 4, 8] {
        let a = Addressing::new(&TableFormat::new(bucket_count, 42).unwrap()).unwrap();
        assert_alternate_involution(&a, 0..bucket_count as u32);
    }
}

/// Case 3: 5,000 keys into a table pre-filled to force many kicks; every accepted key is found
/// and has its own copy (the kick path used the same alternate as the insert path).
#[test]
fn case_03_kicked_keys_stay_findable() {
    for max_kicks in [1u32, 20, 500] {
        let mut s = state(2048, max_kicks);
        let mut tracked = BTreeSet::new();
        for i in 0..2_700 {
            let h = key(i, 3);
            if s.store(M0, &[h]).applied == 1 {
                tracked.insert(h);
            }
        }
        let kicks_before = s.stats().kicks_total;
        for i in 0..5_000 {
            let h = key(i, 33);
            if s.store(M1, &[h]).applied == 1 {
                tracked.insert(h);
            }
        }
        let stats = s.stats();
        let floor = if max_kicks == 1 { 100 } else { 1_000 };
        assert!(
            stats.kicks_total - kicks_before > floor,
            "max_kicks {max_kicks}: only {} kicks",
            stats.kicks_total - kicks_before
        );
        assert!(stats.load_factor > 0.85, "load {}", stats.load_factor);
        assert_projection_exact(&s, &tracked);
    }
}

/// Case 4: blocks whose raw fingerprint is 0 (the empty marker) are stored, found and removed,
/// and the table returns to all-empty.
#[test]
fn case_04_zero_fingerprint_is_not_the_empty_marker() {
    let mut s = state(1024, 500);
    let a = *s.addressing();
    let zeros: Vec<u64> = (0u64..)
        .map(|i| key(i, 4))
        .filter(|&h| a.raw_fingerprint(h) == 0)
        .take(20)
        .collect();
    for (i, &h) in zeros.iter().enumerate() {
        assert_ne!(a.locate(h).fingerprint, 0);
        let m = if i % 2 == 0 { M0 } else { M1 };
        assert_eq!(s.store(m, &[h]).applied, 1);
    }
    for &h in &zeros {
        assert!(s.may_contain(h));
    }
    assert_eq!(s.count_resident(), 20);
    for (i, &h) in zeros.iter().enumerate() {
        let m = if i % 2 == 0 { M0 } else { M1 };
        assert_eq!(s.remove(m, &[h]).applied, 1);
    }
    for &h in &zeros {
        assert!(!s.may_contain(h));
    }
    assert!(
        s.buckets().iter().all(|&w| w == 0),
        "table not back to empty"
    );
    assert!(
        s.take_batch().is_none(),
        "net reversion must publish nothing"
    );
}

/// Case 5: filling until the first omission loses no older block and leaves the table bytes,
/// the dirty set and the exact state unchanged; service continues after it.
#[test]
fn case_05_failed_insertion_loses_nothing() {
    for bucket_count in [2u64, 4, 16, 256] {
        for max_kicks in [0u32, 1, 500] {
            let mut s = state(bucket_count, max_kicks);
            let mut tracked = BTreeSet::new();
            let mut i = 0;
            let omitted = loop {
                i += 1;
                let h = key(i, 5 + bucket_count);
                let before = s.buckets().to_vec();
                let pending = s.pending_dirty();
                let out = s.store(M0, &[h]);
                if out.omitted == 1 {
                    assert_eq!(s.buckets(), &before[..], "{bucket_count}/{max_kicks}");
                    assert_eq!(s.pending_dirty(), pending);
                    assert_eq!(s.refcount(h), 0);
                    assert!(!s.owns(M0, h));
                    break h;
                }
                tracked.insert(h);
            };
            assert_projection_exact(&s, &tracked);
            assert_eq!(s.stats().omissions_total, 1);
            // A later remove of the omitted block is an unknown no-op ...
            assert_eq!(s.remove(M0, &[omitted]).unknown, 1);
            // ... and once occupancy drops, a store of it can succeed.
            let victim = *tracked.iter().next().unwrap();
            s.remove(M0, &[victim]);
            tracked.remove(&victim);
            if s.store(M0, &[omitted]).applied == 1 {
                tracked.insert(omitted);
            }
            assert_projection_exact(&s, &tracked);
        }
    }
}

/// Two distinct block hashes with equal fingerprint and bucket pair in `bucket_count` buckets.
fn twins(bucket_count: u64) -> (u64, u64) {
    let a = Addressing::new(&TableFormat::new(bucket_count, 42).unwrap()).unwrap();
    let mut seen: HashMap<(u16, u32, u32), u64> = HashMap::new();
    for i in 0u64.. {
        let h = key(i, 6);
        let l = a.locate(h);
        if let Some(&other) = seen.get(&(l.fingerprint, l.bucket_a, l.bucket_b)) {
            return (other, h);
        }
        seen.insert((l.fingerprint, l.bucket_a, l.bucket_b), h);
    }
    unreachable!()
}

/// Case 6: distinct hashes with the same representation keep separate copies, whether one member
/// or two store them, and in either removal order.
#[test]
fn case_06_same_representation_keeps_two_copies() {
    for bucket_count in [2u64, 64, 4096] {
        let (h1, h2) = twins(bucket_count);
        for (m1, m2) in [(M0, M0), (M0, M1)] {
            for first_removed in [h1, h2] {
                let mut s = state(bucket_count, 500);
                let loc = s.addressing().locate(h1);
                s.store(m1, &[h1]);
                s.store(m2, &[h2]);
                assert_eq!(copies_in_pair(s.buckets(), loc), 2);
                let (remover, keeper) = if first_removed == h1 {
                    (m1, h2)
                } else {
                    (m2, h1)
                };
                assert_eq!(s.remove(remover, &[first_removed]).applied, 1);
                assert!(s.may_contain(keeper));
                assert_eq!(s.refcount(keeper), 1);
                assert_eq!(copies_in_pair(s.buckets(), loc), 1);
                // Removing the already-removed hash again must not delete the twin's copy.
                assert_eq!(s.remove(remover, &[first_removed]).unknown, 1);
                assert_eq!(copies_in_pair(s.buckets(), loc), 1);
            }
        }
    }
}

/// Case 7: candidate buckets always differ (for every table size), so a hash is counted and
/// removed exactly once even in a 2-bucket table where every pair is {0, 1}.
#[test]
fn case_07_candidate_buckets_differ_and_count_once() {
    for shift in 1..=20 {
        let a = Addressing::new(&TableFormat::new(1 << shift, 42).unwrap()).unwrap();
        for i in 0..20_000 {
            let l = a.locate(key(i, 7));
            assert_ne!(l.bucket_a, l.bucket_b, "{} buckets", 1u64 << shift);
        }
    }
    let mut s = state(2, 500);
    for i in 0..1_000 {
        let h = key(i, 77);
        assert_eq!(s.store(M0, &[h]).applied, 1);
        assert_eq!(s.count_resident(), 1);
        assert_eq!(s.stats().resident_fingerprints, 1);
        assert_eq!(s.remove(M0, &[h]).applied, 1);
        assert_eq!(s.count_resident(), 0);
    }
}

/// Case 8: occupied slots are not packed to the left. For each slot position, fill one bucket,
/// remove the block in that slot: the others stay found by lookup, by snapshot and in the
/// published images, and a new block takes the hole without disturbing them.
#[test]
fn case_08_holes_do_not_hide_later_slots() {
    let format = TableFormat::new(64, 42).unwrap();
    let a = Addressing::new(&format).unwrap();
    // Five blocks whose bucket A is 9, with distinct fingerprints.
    let mut same_bucket: Vec<u64> = Vec::new();
    for h in (0u64..).map(|i| key(i, 8)) {
        let l = a.locate(h);
        if l.bucket_a == 9
            && same_bucket
                .iter()
                .all(|&o| a.locate(o).fingerprint != l.fingerprint)
        {
            same_bucket.push(h);
            if same_bucket.len() == 5 {
                break;
            }
        }
    }
    for hole in 0..4 {
        let mut s = DcCkfState::new(DcCkfConfig::new(format)).unwrap();
        s.store(M0, &same_bucket[..4]);
        for (slot, &h) in same_bucket[..4].iter().enumerate() {
            assert_eq!(bucket::slot(s.buckets()[9], slot), a.locate(h).fingerprint);
        }
        s.take_batch();
        s.remove(M0, &[same_bucket[hole]]);
        assert_eq!(bucket::slot(s.buckets()[9], hole), 0);
        let batch = s.take_batch().unwrap();
        assert_eq!(
            batch.images,
            vec![BucketImage {
                bucket: 9,
                image: s.buckets()[9]
            }]
        );
        let mut publisher = DcCkfPublisher::new(ProducerIdentity {
            pool: PoolId::new("d", "dc").unwrap(),
            incarnation: ProducerIncarnation(1),
            format,
        });
        publisher
            .install_lease(LaneLease {
                consumer_instance: 1,
                lane: 0,
                epoch: 1,
            })
            .unwrap();
        let snapshot = publisher.snapshot(&s).unwrap();
        for (slot, &h) in same_bucket[..4].iter().enumerate() {
            if slot == hole {
                continue;
            }
            let fp = a.locate(h).fingerprint;
            assert!(
                s.may_contain(h),
                "slot {slot} lost after removing slot {hole}"
            );
            assert!(bucket::contains(snapshot.buckets[9], fp));
            assert!(bucket::contains(batch.images[0].image, fp));
        }
        s.store(M0, &[same_bucket[4]]);
        assert_eq!(
            bucket::slot(s.buckets()[9], hole),
            a.locate(same_bucket[4]).fingerprint
        );
        let tracked = same_bucket
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != hole)
            .map(|(_, &h)| h)
            .collect();
        assert_projection_exact(&s, &tracked);
    }
}

/// Case 11: degenerate parameters get a typed error or a documented clamp, never a panic or a
/// zero-bucket table.
#[test]
fn case_11_degenerate_parameters() {
    for expected in [0u64, 1, 3] {
        let format = TableFormat::for_expected_blocks(expected, 0).unwrap();
        assert_eq!(
            format.bucket_count, 2,
            "{expected} expected blocks clamp to 2 buckets"
        );
        let mut s = DcCkfState::new(DcCkfConfig::new(format)).unwrap();
        let hashes: Vec<u64> = (0..3).map(|i| key(i, 11)).collect();
        assert_eq!(s.store(M0, &hashes).applied, 3);
        assert_eq!(s.buckets().len(), 2);
    }
    assert!(matches!(
        TableFormat::for_expected_blocks(u64::MAX, 0),
        Err(FormatError::TooManyBlocks(u64::MAX))
    ));
    // A format built by hand (as from a config file) is validated by the state: odd counts
    // (format v2 needs an even count so no bucket is its own alternate) and counts out of
    // range are refused; any even count in range is a table (48 was refused by format v1).
    let mut format = TableFormat::new(2, 0).unwrap();
    format.bucket_count = 48;
    assert_eq!(
        DcCkfState::new(DcCkfConfig::new(format))
            .unwrap()
            .buckets()
            .len(),
        48
    );
    for bad in [0u64, 1, 3, 49, 1 << 32, 1 << 33] {
        let mut format = TableFormat::new(2, 0).unwrap();
        format.bucket_count = bad;
        assert!(matches!(
            DcCkfState::new(DcCkfConfig::new(format)),
            Err(DcCkfError::Format(_))
        ));
    }
    let format = TableFormat::new(16, 0).unwrap();
    assert_eq!(
        DcCkfState::new(DcCkfConfig {
            format,
            max_kicks: u32::MAX,
            reserve_blocks: 0,
            slice_lines: 0,
        })
        .unwrap_err(),
        DcCkfError::MaxKicksTooLarge(u32::MAX)
    );
    // A reservation past the table's slots could never be used: refused, not allocated.
    assert_eq!(
        DcCkfState::new(DcCkfConfig {
            reserve_blocks: format.slot_count() + 1,
            ..DcCkfConfig::new(format)
        })
        .unwrap_err(),
        DcCkfError::ReserveTooLarge {
            reserve_blocks: format.slot_count() + 1,
            slot_count: format.slot_count(),
        }
    );
    // max_kicks 0: no relocation, omissions only when both buckets are full.
    let mut s = state(16, 0);
    let a = *s.addressing();
    for i in 0..200 {
        let h = key(i, 111);
        let l = a.locate(h);
        let full = bucket::occupied(s.buckets()[l.bucket_a as usize]) == 4
            && bucket::occupied(s.buckets()[l.bucket_b as usize]) == 4;
        let out = s.store(M0, &[h]);
        assert_eq!(out.omitted == 1, full, "block {i}");
    }
    assert_eq!(s.stats().kicks_total, 0);
    // Empty events and unknown members are no-ops.
    let mut s = state(16, 500);
    assert_eq!(s.store(M0, &[]), Default::default());
    assert_eq!(s.stats().members, 0);
    assert_eq!(s.remove(M1, &[1, 2]).unknown, 2);
    assert_eq!(s.clear_member(M1).applied, 0);
    assert_eq!(s.remove_worker(99).applied, 0);
    let cleared = KvEvent {
        member: M0,
        kind: KvEventKind::Cleared,
    };
    assert_eq!(s.apply(&cleared), Default::default());
    assert!(s.take_batch().is_none());
}

/// Case 12 at the batch level: under kick-heavy churn at ~93% load, install each batch's images
/// one at a time into a copy of the previously published table and check, after every single
/// image, that every block tracked both before and after the batch is still in one of its
/// buckets. Batches coalesce 1 to 16 commands. Only a batch with a broken cycle may show a
/// transient miss (documented in `ckf_core::dirty`); such batches must be rare.
#[test]
fn case_12_relocations_reach_their_target_first() {
    let mut s = state(4096, 500);
    let a = *s.addressing();
    let slots = 4096 * 4;
    let target = slots * 93 / 100;
    let mut next = 0u64;
    let mut tracked = store_until(&mut s, M0, target, 12, &mut next);
    s.take_batch();
    let mut consumer = s.buckets().to_vec();
    let mut rng = 0x1234_5678u64;
    let mut rand = move |n: usize| {
        rng = fmix64(rng.wrapping_add(0x9E37_79B9_7F4A_7C15));
        (rng % n as u64) as usize
    };
    let (mut batches, mut images, mut cycles, mut misses, mut kicked_batches) = (0, 0, 0, 0, 0);
    let kicks_start = s.stats().kicks_total;
    let mut single_command_cycles = 0;
    for round in 0..600 {
        let before: BTreeSet<u64> = tracked.iter().copied().collect();
        let kicks_before = s.stats().kicks_total;
        let commands = 1 + round % 16;
        for _ in 0..commands {
            // Remove one random block, then store fresh ones until one is accepted (at 93% load
            // most insertions kick), so the load stays put.
            let i = rand(tracked.len());
            assert_eq!(churn_one(&mut s, M0, &mut tracked, i, 12, &mut next), 1);
        }
        let Some(batch) = s.take_batch() else {
            continue;
        };
        batches += 1;
        if s.stats().kicks_total > kicks_before {
            kicked_batches += 1;
        }
        cycles += batch.cycles_broken;
        if commands == 1 {
            single_command_cycles += batch.cycles_broken;
        }
        let stable: Vec<u64> = tracked
            .iter()
            .copied()
            .filter(|h| before.contains(h))
            .collect();
        let mut by_bucket: HashMap<u32, Vec<Location>> = HashMap::new();
        for &h in &stable {
            let l = a.locate(h);
            by_bucket.entry(l.bucket_a).or_default().push(l);
            by_bucket.entry(l.bucket_b).or_default().push(l);
        }
        let mut batch_misses = 0;
        for image in &batch.images {
            images += 1;
            consumer[image.bucket as usize] = image.image;
            for l in by_bucket.get(&image.bucket).into_iter().flatten() {
                if copies_in_pair(&consumer, *l) == 0 {
                    batch_misses += 1;
                }
            }
        }
        if batch.cycles_broken == 0 {
            assert_eq!(
                batch_misses, 0,
                "transient miss without a cycle in round {round}"
            );
        }
        misses += batch_misses;
        assert_eq!(consumer, s.buckets(), "round {round}");
    }
    let kicks = s.stats().kicks_total - kicks_start;
    println!(
        "case 12: {batches} batches ({kicked_batches} with kicks, {kicks} kicks), {images} images, \
         {cycles} cycles broken ({single_command_cycles} in single-command batches), \
         {misses} transient misses, load {:.3}",
        s.stats().load_factor
    );
    assert!(kicked_batches > batches / 2, "churn was not kick-heavy");
    assert!(s.stats().load_factor > 0.90);
    assert_eq!(u64::from(cycles), s.stats().cycles_broken_total);
    // Measured: about 1% of batches break one cycle, each costing about one transient miss
    // (0.02% of images); single-command batches none. The bounds leave 3x-5x headroom.
    assert!(
        cycles * 25 <= batches,
        "{cycles} cycles in {batches} batches"
    );
    assert!(
        misses * 1000 <= images,
        "{misses} transient misses in {images} images"
    );
}
