//! Unit tests of the exact block map.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

/// The exact model: block hash -> set of owner tags.
type Model = HashMap<u64, Vec<Tag>>;

fn acquire(map: &mut BlockMap, key: u64, tag: Tag) -> bool {
    let p = Probe::of(key);
    match map.find(key, p) {
        Some(pos) if map.has_owner(pos, key, tag) => false,
        Some(pos) => {
            map.add_owner(pos, key, tag);
            true
        }
        None => {
            map.insert_new(key, p, tag);
            true
        }
    }
}

fn release(map: &mut BlockMap, key: u64, tag: Tag) -> Option<bool> {
    let pos = map.find(key, Probe::of(key))?;
    map.drop_owner(pos, key, tag)
}

fn assert_equal(map: &BlockMap, model: &Model) {
    map.check();
    assert_eq!(map.len(), model.len());
    for (&k, tags) in model {
        assert_eq!(map.refcount(k), tags.len() as u32, "{k:#x}");
        for &t in tags {
            assert!(map.owns(k, t), "{k:#x} {t}");
        }
    }
    let mut edges: Vec<(u64, Tag)> = Vec::new();
    map.for_each_edge(|k, t| edges.push((k, t)));
    edges.sort_unstable();
    let mut want: Vec<(u64, Tag)> = model
        .iter()
        .flat_map(|(&k, v)| v.iter().map(move |&t| (k, t)))
        .collect();
    want.sort_unstable();
    assert_eq!(edges, want);
}

#[derive(Debug, Clone)]
enum Op {
    Acquire(u64, Tag),
    Release(u64, Tag),
    ReleaseAll(Vec<Tag>),
    Shrink,
    Reserve(usize),
}

/// Keys from a small pool with the edge values, so operations hit the same keys often.
fn key() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), Just(u64::MAX), 0u64..48, any::<u64>(),]
}

fn tag() -> impl Strategy<Value = Tag> {
    prop_oneof![1 as Tag..=6, Just(MAX_TAG), Just(MAX_TAG - 1)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (key(), tag()).prop_map(|(k, t)| Op::Acquire(k, t)),
        3 => (key(), tag()).prop_map(|(k, t)| Op::Release(k, t)),
        1 => proptest::collection::vec(tag(), 1..3).prop_map(Op::ReleaseAll),
        1 => Just(Op::Shrink),
        1 => prop_oneof![Just(0usize), 1usize..600].prop_map(Op::Reserve),
    ]
}

fn run(ops: &[Op], min_entries: usize) {
    let mut map = BlockMap::default();
    let mut model: Model = HashMap::new();
    for op in ops {
        match op {
            Op::Acquire(k, t) => {
                let owners = model.entry(*k).or_default();
                let fresh = !owners.contains(t);
                if fresh {
                    owners.push(*t);
                }
                assert_eq!(acquire(&mut map, *k, *t), fresh);
            }
            Op::Release(k, t) => {
                let want = model.get_mut(k).and_then(|v| {
                    let i = v.iter().position(|x| x == t)?;
                    v.swap_remove(i);
                    Some(v.is_empty())
                });
                if want == Some(true) {
                    model.remove(k);
                }
                assert_eq!(release(&mut map, *k, *t), want);
            }
            Op::ReleaseAll(tags) => {
                let mut want_released = 0u64;
                let mut want_emptied = Vec::new();
                model.retain(|&k, v| {
                    let before = v.len();
                    v.retain(|t| !tags.contains(t));
                    want_released += (before - v.len()) as u64;
                    if v.is_empty() {
                        want_emptied.push(k);
                    }
                    !v.is_empty()
                });
                let mut emptied = Vec::new();
                assert_eq!(map.release_all(tags, |k| emptied.push(k)), want_released);
                emptied.sort_unstable();
                want_emptied.sort_unstable();
                assert_eq!(emptied, want_emptied);
            }
            Op::Shrink => map.shrink(min_entries),
            Op::Reserve(n) => {
                map.reserve(*n);
                assert!(
                    map.grow_at >= *n,
                    "reserve({n}) left room for {}",
                    map.grow_at
                );
            }
        }
    }
    assert_equal(&map, &model);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random acquire / release / release-all / shrink sequences against a `HashMap` of
    /// owner sets: same answers, same contents, invariants kept (line placement, spill
    /// flag, counts), through growth, shrinks to empty and spills past three owners.
    #[test]
    fn matches_a_hash_map(ops in proptest::collection::vec(op(), 1..400)) {
        run(&ops, 0);
    }

    /// The same with many distinct keys, so the table grows through several sizes and
    /// shrinks back.
    #[test]
    fn grows_and_shrinks(
        keys in proptest::collection::vec(any::<u64>(), 100..1500),
        drop_percent in 0usize..=100,
    ) {
        let mut ops: Vec<Op> = keys.iter().map(|&k| Op::Acquire(k, 1)).collect();
        ops.extend(keys.iter().take(keys.len() * drop_percent / 100).map(|&k| Op::Release(k, 1)));
        ops.push(Op::Shrink);
        ops.extend(keys.iter().map(|&k| Op::Acquire(k, 2)));
        run(&ops, 0);
    }
}

/// A map seeded with the table seed probes with the filter's mixed hash (the producer
/// mixes once per block and hands that to both), and `locate_mixed` of it is `locate`.
#[test]
fn table_seeded_probe_is_the_filters_mixed_hash() {
    use crate::addressing::{Addressing, TableFormat};
    for (n, seed) in [(2u64, 0u64), (1_000_002, 0x5eed), (1 << 22, MAP_SEED)] {
        let addressing = Addressing::new(&TableFormat::new(n, seed).unwrap()).unwrap();
        let map = BlockMap::with_seed(seed);
        for i in 0..10_000u64 {
            let key = fmix64(i) ^ i.rotate_left(29);
            let h = addressing.mix(key);
            assert_eq!(map.probe(key).0, Probe::from_mixed(h).0);
            assert_eq!(addressing.locate_mixed(h), addressing.locate(key));
        }
    }
}

#[test]
fn colliding_keys_stay_reachable() {
    // Keys whose two lines coincide in a 4-line table: more than fit in two lines, so the
    // walk fails and the stash (then growth) takes them. Every key stays exact.
    let mut keys = Vec::new();
    let mut k = 0u64;
    while keys.len() < 40 {
        let (a, b) = Probe::of(k).lines(MIN_LINES);
        if a == 0 && b == 0 {
            keys.push(k);
        }
        k += 1;
    }
    let mut map = BlockMap::default();
    let mut model = Model::new();
    for (i, &k) in keys.iter().enumerate() {
        assert!(acquire(&mut map, k, 1 + (i % 5) as Tag));
        model.insert(k, vec![1 + (i % 5) as Tag]);
        assert_equal(&map, &model);
    }
    for &k in &keys[..30] {
        let t = model.remove(&k).unwrap()[0];
        assert_eq!(release(&mut map, k, t), Some(true));
    }
    map.shrink(0);
    assert_equal(&map, &model);
}

/// The walk hint's gates hold exactly on a large, loaded map (checked after every insertion
/// on the way there, so at every size below the size gate), and the hint names exactly the
/// lines the walk's first pass reads, for exactly the probes whose two lines are full.
#[test]
fn walk_hint_names_the_walks_lines_on_large_loaded_maps_only() {
    let loaded = |m: &BlockMap| m.len * WALK_HINT_LOAD.1 >= m.slot_capacity() * WALK_HINT_LOAD.0;
    let full = |m: &BlockMap, l: usize| m.lines[l].0.iter().all(|s| s.owners != 0);
    let mut map = BlockMap::default();
    assert_eq!(map.prefetch_walk(Probe::of(1)), None, "empty map");
    assert!(!map.walk_hint_active());
    let (mut key, mut loaded_small_sizes) = (0u64, std::collections::BTreeSet::new());
    while map.lines.len() < WALK_HINT_MIN_LINES || !loaded(&map) {
        map.insert_new(key, Probe::of(key), 1);
        key += 1;
        let small = map.lines.len() < WALK_HINT_MIN_LINES;
        assert_eq!(
            map.walk_hint_active(),
            !small && loaded(&map),
            "{} lines",
            map.lines.len()
        );
        if small && loaded(&map) {
            loaded_small_sizes.insert(map.lines.len());
        }
    }
    // Up to the largest size below the gate (207,382 lines), each loaded past 75%.
    assert!(loaded_small_sizes.len() > 20, "{loaded_small_sizes:?}");
    assert!(loaded_small_sizes.last().unwrap() * 3 / 2 >= WALK_HINT_MIN_LINES);
    let n = map.lines.len();
    let expected_lines = |m: &BlockMap, a: usize, b: usize| {
        let mut v = Vec::new();
        for l in [a, b] {
            for entry in &m.lines[l].0 {
                let (x, y) = Probe::of(entry.key).lines(n);
                v.push(if x == l { y } else { x });
            }
        }
        v
    };
    let (mut fired, mut quiet) = (0, 0);
    for probe_key in (1u64 << 40)..(1u64 << 40) + 20_000 {
        let p = Probe::of(probe_key);
        let (a, b) = p.lines(n);
        match map.prefetch_walk(p) {
            Some(lines) => {
                assert!(full(&map, a) && full(&map, b), "key {probe_key:#x}");
                assert_eq!(lines.to_vec(), expected_lines(&map, a, b));
                fired += 1;
            }
            None => {
                assert!(!(full(&map, a) && full(&map, b)), "key {probe_key:#x}");
                quiet += 1;
            }
        }
    }
    assert!(fired > 0 && quiet > 0, "fired {fired}, quiet {quiet}");
    // Just below the load gate it is off, though many line pairs are still full.
    let mut key = 0;
    while loaded(&map) {
        let pos = map.find(key, Probe::of(key)).unwrap();
        assert_eq!(map.drop_owner(pos, key, 1), Some(true));
        key += 1;
    }
    assert_eq!(
        map.lines.len(),
        n,
        "the map shrank: the check below needs its size"
    );
    assert!(!map.walk_hint_active());
    let full_pairs = ((1u64 << 40)..(1u64 << 40) + 20_000)
        .filter(|&k| {
            let (a, b) = Probe::of(k).lines(n);
            full(&map, a) && full(&map, b)
        })
        .count();
    assert!(
        full_pairs > 0,
        "no full line pair left to test the load gate with"
    );
}

#[test]
fn owners_word_packs_three_tags_and_the_flag() {
    let w = with_tag(with_tag(with_tag(0, 0, MAX_TAG), 1, 1), 2, MAX_TAG - 1);
    assert_eq!(
        (tag_at(w, 0), tag_at(w, 1), tag_at(w, 2)),
        (MAX_TAG, 1, MAX_TAG - 1)
    );
    assert_eq!(w & SPILL_FLAG, 0);
    assert_eq!(tag_at(w | SPILL_FLAG, 2), MAX_TAG - 1);
    assert_eq!(inline_find(w, 1), Some(1));
    assert_eq!(inline_len(with_tag(w, 1, 0)), 2);
    assert_eq!(std::mem::size_of::<Entry>(), 16);
    assert_eq!(std::mem::size_of::<Line>(), 64);
    assert_eq!(std::mem::align_of::<Line>(), 64);
}

#[test]
fn load_stays_between_sixty_and_ninety_percent_while_growing() {
    let mut map = BlockMap::default();
    for k in 0..200_000u64 {
        let key = k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        map.insert_new(key, Probe::of(key), 1);
        let load = map.len() as f64 / map.slot_capacity() as f64;
        if map.len() > 64 {
            assert!(
                (0.59..=MAX_LOAD).contains(&load),
                "{} in {}",
                map.len(),
                map.slot_capacity()
            );
        }
    }
    assert_eq!(map.stash_len(), 0);
}

/// A map reserved for N entries takes them with no rebuild past the reservation's own,
/// keeps its lines through removal of every entry and a shrink, and grows only past N;
/// dropping the reservation lets the next shrink of an empty map free everything.
#[test]
fn a_reservation_takes_its_entries_without_growing_and_survives_emptying() {
    for n in [1usize, 5, 1000, 54_321] {
        let mut map = BlockMap::default();
        map.reserve(n);
        assert_eq!(map.rebuild_stats().count, 1);
        let lines = map.lines.len();
        assert_eq!(lines, BlockMap::lines_for(n));
        assert_eq!(map.bytes_used(), BlockMap::reserve_bytes(n));
        assert!(BlockMap::grow_at(lines * LINE_ENTRIES) >= n);
        let key = |k: u64| k.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5555;
        for k in 0..n as u64 {
            map.insert_new(key(k), map.probe(key(k)), 1);
        }
        map.check();
        assert_eq!(map.lines.len(), lines, "grew below the reservation of {n}");
        assert_eq!(map.rebuild_stats().count, 1);
        // One past the reservation's room grows (and counts a rebuild).
        let past = BlockMap::grow_at(lines * LINE_ENTRIES) as u64 + 1 - n as u64;
        for k in n as u64..n as u64 + past {
            map.insert_new(key(k), map.probe(key(k)), 1);
        }
        assert!(map.lines.len() > lines);
        assert_eq!(map.rebuild_stats().count, 2);
        // Emptied and shrunk: back to the reserved lines, not freed.
        assert_eq!(map.release_all(&[1], |_| {}), n as u64 + past);
        map.shrink(0);
        map.check();
        assert_eq!((map.len(), map.lines.len()), (0, lines));
        map.reserve(0);
        map.shrink(0);
        assert_eq!(map.lines.len(), 0);
        assert_eq!(map.bytes_used(), 0);
    }
}

/// Keys crafted to share both lines fill the stash of a reserved map: it keeps them there,
/// exact, and does not grow below its reservation (without the reservation, the same map
/// grows for its stash).
#[test]
fn a_reserved_map_does_not_grow_for_its_stash() {
    let keys: Vec<u64> = (1..=600u64).map(key_with_probe).collect();
    let mut map = BlockMap::default();
    map.reserve(1000);
    let lines = map.lines.len();
    for &k in &keys {
        map.insert_new(k, map.probe(k), 1);
    }
    map.check();
    assert!(
        map.stash_len() > STASH_LIMIT,
        "{} in the stash",
        map.stash_len()
    );
    assert_eq!(map.lines.len(), lines);
    assert_eq!(map.rebuild_stats().count, 1);
    assert!(keys.iter().all(|&k| map.owns(k, 1)));
    // With the reservation dropped, the next crafted key makes the same map grow.
    map.reserve(0);
    let k = key_with_probe(601);
    map.insert_new(k, map.probe(k), 1);
    assert!(map.lines.len() > lines);
    assert_eq!(map.rebuild_stats().count, 2);
    map.check();
}

/// The rebuild counter counts growths and shrinks, and the times add up.
#[test]
fn rebuild_stats_count_every_growth_and_shrink() {
    let mut map = BlockMap::default();
    let mut sizes = vec![0usize];
    for k in 0..10_000u64 {
        map.insert_new(k, map.probe(k), 1);
        if *sizes.last().unwrap() != map.lines.len() {
            sizes.push(map.lines.len());
        }
    }
    let growths = sizes.len() as u64 - 1;
    let stats = map.rebuild_stats();
    assert_eq!(stats.count, growths);
    assert!(stats.longest <= stats.total);
    for k in 0..9_900u64 {
        map.drop_owner(map.find(k, map.probe(k)).unwrap(), k, 1);
    }
    map.shrink(0);
    assert_eq!(map.rebuild_stats().count, growths + 1);
}

/// Inverse of `fmix64`: the key whose probe is `mixed`.
fn key_with_probe(mixed: u64) -> u64 {
    let inv = |c: u64| {
        let mut x = c;
        for _ in 0..6 {
            x = x.wrapping_mul(2u64.wrapping_sub(c.wrapping_mul(x)));
        }
        x
    };
    let mut k = mixed;
    k ^= k >> 33;
    k = k.wrapping_mul(inv(0xc4ce_b9fe_1a85_ec53));
    k ^= k >> 33;
    k = k.wrapping_mul(inv(0xff51_afd7_ed55_8ccd));
    k ^= k >> 33;
    k ^ MAP_SEED
}

/// Crafted keys whose probe has small high *and* low halves, so both candidate lines are
/// line 0 at every table size up to ~2^26 lines (the multiply-shift index collides at
/// every size), mixed with ordinary keys and with 0 / `u64::MAX`; five owners on some
/// (spill), releases in every order, the real shrink threshold (1,024 entries), shrink then
/// regrowth. Every answer stays exact and memory stays proportional to the entries.
#[test]
fn keys_colliding_at_every_size_stay_exact_through_shrink_and_regrowth() {
    let crafted: Vec<u64> = (0..40u64)
        .flat_map(|hi| (0..40u64).map(move |lo| key_with_probe(hi << 32 | lo)))
        .collect();
    for &k in &crafted[..5] {
        assert_eq!(Probe::of(k).lines(1 << 20), (0, 0));
    }
    let mut keys = crafted.clone();
    keys.extend((0..6000u64).map(|i| fmix64(i ^ 0x77)));
    keys.extend([0, u64::MAX]);
    let mut map = BlockMap::default();
    let mut model = Model::new();
    for round in 0..3u64 {
        for (i, &k) in keys.iter().enumerate() {
            let owners = 1 + (i as u64 ^ round) % 5;
            for t in 1..=owners as Tag {
                let fresh = !model.get(&k).is_some_and(|v| v.contains(&t));
                assert_eq!(acquire(&mut map, k, t), fresh);
                if fresh {
                    model.entry(k).or_default().push(t);
                }
            }
        }
        assert_equal(&map, &model);
        let peak_capacity = map.slot_capacity();
        assert!(
            map.bytes_used() < 200 * keys.len() + 40 * map.len(),
            "{} bytes for {} keys",
            map.bytes_used(),
            map.len()
        );
        // Release 97% of the keys, owners in a key-dependent order.
        for (i, &k) in keys.iter().enumerate() {
            if i % 33 == 0 {
                continue;
            }
            let mut tags = model.remove(&k).unwrap_or_default();
            let turn = i % tags.len().max(1);
            tags.rotate_left(turn);
            if i % 2 == 1 {
                tags.reverse();
            }
            let last = tags.len().saturating_sub(1);
            for (j, t) in tags.into_iter().enumerate() {
                assert_eq!(release(&mut map, k, t), Some(j == last), "{k:#x} {t}");
            }
            if i % 97 == 0 {
                map.shrink(1024);
                map.check();
            }
        }
        map.shrink(1024);
        assert_equal(&map, &model);
        assert!(
            map.slot_capacity() < peak_capacity / 4,
            "{} entries after shrink (peak {peak_capacity})",
            map.slot_capacity()
        );
    }
}

/// A clone answers like the original and keeps its own spill accounting: spill vectors
/// whose capacity exceeds their length (freed owners) are cloned to their length, and
/// `check` sums the clone's capacities.
#[test]
fn a_clone_keeps_owners_and_its_own_spill_accounting() {
    let mut map = BlockMap::default();
    let mut model = Model::new();
    for k in 0..300u64 {
        let key = fmix64(k);
        let owners = 1 + (k % 9) as Tag;
        for t in 1..=owners {
            assert!(acquire(&mut map, key, t));
        }
        // Drop the last owners of some blocks: their spill vectors keep the capacity.
        let kept = if k % 2 == 0 { owners.min(4) } else { owners };
        for t in kept + 1..=owners {
            assert_eq!(release(&mut map, key, t), Some(false));
        }
        model.insert(key, (1..=kept).collect());
    }
    let clone = map.clone();
    assert_equal(&clone, &model);
    assert_equal(&map, &model);
    assert!(clone.spill_tags <= map.spill_tags);
}

/// The rebuild before it was pipelined, kept as the oracle: every entry placed one after
/// the other, old lines in order, then the stash.
fn rebuild_one_at_a_time(map: &mut BlockMap, lines: usize) {
    let old = std::mem::replace(&mut map.lines, vec![Line::default(); lines]);
    map.grow_at = BlockMap::grow_at(lines * LINE_ENTRIES);
    let stash = std::mem::take(&mut map.stash);
    for entry in old
        .iter()
        .flat_map(|l| l.0.iter())
        .filter(|s| s.owners != 0)
    {
        map.place(entry.key, map.probe(entry.key), entry.owners);
    }
    for (key, owners) in stash {
        map.place(key, map.probe(key), owners);
    }
}

/// The pipelined rebuild leaves the map exactly as placing one entry after the other does
/// (every entry of every line, the stash, the walk counter), for entry counts below, at and
/// above the prefetch distance, with walks and a stash (keys colliding at every size), into
/// a larger, an equal and a smaller table; and every block keeps its owners.
#[test]
fn pipelined_rebuild_places_every_entry_as_one_at_a_time_would() {
    let distance = REBUILD_PREFETCH_DISTANCE;
    let crafted: Vec<u64> = (0..6u64)
        .flat_map(|hi| (0..6u64).map(move |lo| key_with_probe(hi << 32 | lo)))
        .collect();
    let mut stashed = 0;
    for n in [
        0,
        1,
        distance - 1,
        distance,
        distance + 1,
        2 * distance + 3,
        1_000,
        20_000,
    ] {
        for with_crafted in [false, true] {
            let mut map = BlockMap::default();
            let mut model = Model::new();
            let mut keys: Vec<u64> = (0..n as u64).map(|i| fmix64(i ^ 0xB10C)).collect();
            if with_crafted {
                keys.extend(&crafted);
            }
            for (i, &k) in keys.iter().enumerate() {
                // One to five owners: the fourth and fifth spill.
                let tags: Vec<Tag> = (1..=1 + (i % 5) as Tag).collect();
                for &t in &tags {
                    assert!(acquire(&mut map, k, t));
                }
                model.insert(k, tags);
            }
            stashed += map.stash_len();
            let lines = map.lines.len();
            let needed = (map.len().div_ceil(LINE_ENTRIES) * 10 / 9).max(MIN_LINES);
            for target in [lines * 3 / 2 + 1, lines.max(MIN_LINES), needed] {
                let mut want = map.clone();
                rebuild_one_at_a_time(&mut want, target);
                let mut got = map.clone();
                got.rebuild(target);
                assert_eq!(got.lines.len(), target);
                for (l, (g, w)) in got.lines.iter().zip(&want.lines).enumerate() {
                    assert_eq!(g.0, w.0, "{n} keys, crafted {with_crafted}, line {l}");
                }
                assert_eq!(got.stash, want.stash, "{n} keys, {target} lines");
                assert_eq!(
                    (got.counter, got.grow_at, got.len),
                    (want.counter, want.grow_at, want.len)
                );
                assert_equal(&got, &model);
            }
        }
    }
    assert!(stashed > 0, "no rebuild had a stash to re-place");
}
