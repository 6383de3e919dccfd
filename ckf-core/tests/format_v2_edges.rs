//! Format v2 at its edges: the cuckoo cases (`docs/design.md`, "Cuckoo filter cases",
//! cases 2, 3, 5, 7, 11, 12) re-run on small tables whose bucket count is *not* a power of two (where the alternate is
//! a modular subtraction that wraps, not an XOR), and sizing right at the `MAX_BUCKETS`
//! boundary.

use std::collections::BTreeSet;

use ckf_core::addressing::{
    self, Addressing, FormatError, MAX_BUCKETS, SizingError, TableFormat, TableSizing, fmix64,
};
use ckf_core::bucket;
use ckf_core::dc::{DcCkfConfig, DcCkfState, MemberId};
use ckf_core::testing::{
    assert_alternate_involution, assert_projection_exact, block_key as key, churn_one,
    fingerprint_copies, producer_state, store_until,
};

const M0: MemberId = MemberId::new(1, 0);
const M1: MemberId = MemberId::new(2, 1);

/// Even bucket counts that are not powers of two (2 and 4 for the minimum), including counts
/// just below and just above a power of two.
const SMALL: [u64; 12] = [2, 4, 6, 10, 12, 14, 18, 22, 30, 34, 62, 66];

fn state(bucket_count: u64, max_kicks: u32) -> DcCkfState {
    producer_state(bucket_count, 0xE1, max_kicks)
}

/// Cases 3 and 5 on every small table: fill until the first omission with each kick bound;
/// every accepted block stays found with its own copy, the failed attempt left the table bytes
/// and the dirty set untouched, and kicks did happen. Then churn at full load (remove one,
/// store until one fits) and check again.
#[test]
fn kicks_and_omissions_on_non_power_of_two_tables() {
    for n in SMALL {
        for max_kicks in [0u32, 1, 7, 500] {
            let mut s = state(n, max_kicks);
            let mut tracked = BTreeSet::new();
            let mut i = 0;
            let mut omissions = 0;
            while omissions < 3 {
                i += 1;
                let h = key(i, n ^ u64::from(max_kicks) << 8);
                let before = s.buckets().to_vec();
                let pending = s.pending_dirty();
                let member = if i % 3 == 0 { M1 } else { M0 };
                let out = s.store(member, &[h]);
                if out.omitted == 1 {
                    omissions += 1;
                    assert_eq!(s.buckets(), &before[..], "n={n} kicks={max_kicks}");
                    assert_eq!(s.pending_dirty(), pending);
                    assert_eq!(s.refcount(h), 0);
                    let l = s.addressing().locate(h);
                    assert_eq!(bucket::occupied(before[l.bucket_a as usize]), 4);
                    assert_eq!(bucket::occupied(before[l.bucket_b as usize]), 4);
                } else {
                    assert_eq!(out.applied, 1);
                    tracked.insert(h);
                }
                assert_projection_exact(&s, &tracked);
            }
            if max_kicks >= 7 && n >= 6 {
                assert!(s.stats().kicks_total > 0, "n={n}: no kicks");
            }
            // Churn at full load.
            for round in 0..200u64 {
                let victim = *tracked
                    .iter()
                    .nth((fmix64(round) % tracked.len() as u64) as usize)
                    .unwrap();
                let out = s.remove(M0, &[victim]);
                if out.applied == 0 {
                    assert_eq!(s.remove(M1, &[victim]).applied, 1);
                }
                tracked.remove(&victim);
                for _ in 0..4 {
                    i += 1;
                    let h = key(i, n ^ 0xC0DE);
                    if s.store(M0, &[h]).applied == 1 {
                        tracked.insert(h);
                        break;
                    }
                }
                assert_projection_exact(&s, &tracked);
            }
            // Clearing both members empties the table.
            s.clear_member(M0);
            s.clear_member(M1);
            assert!(s.buckets().iter().all(|&w| w == 0), "n={n}");
            assert_eq!(s.stats().unique_blocks, 0);
        }
    }
}

/// Cases 2 and 7 with every fingerprint on every bucket of the small tables, and on the edge
/// buckets (0, 1, n/2, n-2, n-1) of large counts just below / above powers of two.
#[test]
fn alternate_is_an_involution_at_every_size_edge() {
    let large = [
        MAX_BUCKETS,
        MAX_BUCKETS - 2,
        (1 << 31) + 2,
        (1 << 31) - 2,
        (1 << 20) - 2,
        (1 << 20) + 2,
        3_000_002,
    ];
    for n in SMALL.into_iter().chain(large) {
        let a = Addressing::new(&TableFormat::new(n, 0xE1).unwrap()).unwrap();
        let buckets: Vec<u32> = if n <= 66 {
            (0..n as u32).collect()
        } else {
            [0, 1, n / 2, n - 2, n - 1].map(|b| b as u32).to_vec()
        };
        assert_alternate_involution(&a, buckets.iter().copied());
    }
}

/// Case 12 on tables just below a power of two (4094 buckets), of 3002 and of 6-30 buckets
/// (where kick cycles are common) at ~93% load with kick-heavy
/// churn: after every installed image of a batch without a broken cycle, every block tracked
/// before and after the batch is still in one of its buckets.
#[test]
fn relocation_order_holds_below_a_power_of_two() {
    for n in [4094u64, 3002, 30, 14, 10, 6] {
        let mut s = state(n, 500);
        let a = *s.addressing();
        let target = (n * 4 * 93 / 100) as usize;
        let mut next = 0u64;
        let mut tracked = store_until(&mut s, M0, target, 12, &mut next);
        s.take_batch();
        let mut consumer = s.buckets().to_vec();
        let mut kicked = 0;
        for round in 0..300u64 {
            let before: BTreeSet<u64> = tracked.iter().copied().collect();
            let kicks_before = s.stats().kicks_total;
            for c in 0..1 + round % 8 {
                let i = (fmix64(round << 8 | c) % tracked.len() as u64) as usize;
                assert_eq!(churn_one(&mut s, M0, &mut tracked, i, 12, &mut next), 1);
            }
            kicked += u32::from(s.stats().kicks_total > kicks_before);
            let Some(batch) = s.take_batch() else {
                continue;
            };
            let stable: Vec<u64> = tracked
                .iter()
                .copied()
                .filter(|h| before.contains(h))
                .collect();
            for image in &batch.images {
                consumer[image.bucket as usize] = image.image;
                if batch.cycles_broken == 0 {
                    for &h in &stable {
                        let l = a.locate(h);
                        if l.bucket_a == image.bucket || l.bucket_b == image.bucket {
                            let have =
                                fingerprint_copies(consumer[l.bucket_a as usize], l.fingerprint)
                                    + fingerprint_copies(
                                        consumer[l.bucket_b as usize],
                                        l.fingerprint,
                                    );
                            assert!(have > 0, "n={n} round {round}: transient miss");
                        }
                    }
                }
            }
            assert_eq!(consumer, s.buckets(), "n={n} round {round}");
        }
        if n > 1000 {
            assert!(kicked > 100, "n={n}: churn was not kick-heavy ({kicked})");
            assert!(s.stats().load_factor > 0.90);
        }
    }
}

/// Case 11 at the `MAX_BUCKETS` boundary: the last expected size that fits gives exactly
/// `MAX_BUCKETS`, the next one a typed error; explicit counts around `2^32` are typed errors;
/// nothing panics or overflows.
#[test]
fn sizing_at_the_max_buckets_boundary() {
    // MAX_BUCKETS * 3.68 = 15,805,479,641.92.
    let last = 15_805_479_641u64;
    assert_eq!(addressing::buckets_for_blocks(last), Ok(MAX_BUCKETS));
    assert_eq!(
        addressing::buckets_for_blocks(last + 1),
        Err(FormatError::TooManyBlocks(last + 1))
    );
    // Needs MAX_BUCKETS - 1 buckets (odd): rounded up to MAX_BUCKETS, still accepted.
    let odd_need = 15_805_479_638u64;
    assert_eq!(addressing::buckets_for_blocks(odd_need), Ok(MAX_BUCKETS));
    // The whole stretch around the boundary is monotone and never panics.
    let mut prev = 0;
    for e in last - 100..last + 100 {
        match addressing::buckets_for_blocks(e) {
            Ok(b) => {
                assert!(b >= prev && b <= MAX_BUCKETS && b % 2 == 0, "{e}: {b}");
                prev = b;
            }
            Err(err) => {
                assert!(e > last, "{e}: {err}");
                assert_eq!(err, FormatError::TooManyBlocks(e));
            }
        }
    }
    for e in [u64::MAX, u64::MAX - 1, 1 << 63, 1 << 53, (1 << 53) + 1] {
        assert_eq!(
            addressing::buckets_for_blocks(e),
            Err(FormatError::TooManyBlocks(e))
        );
        let sizing = TableSizing {
            expected_blocks: e,
            bucket_count: 0,
            seed: 1,
        };
        assert_eq!(
            sizing.format(),
            Err(SizingError::ExpectedBlocks(FormatError::TooManyBlocks(e)))
        );
    }
    let explicit = |bucket_count| {
        TableSizing {
            expected_blocks: 0,
            bucket_count,
            seed: 1,
        }
        .format()
    };
    assert_eq!(explicit(MAX_BUCKETS).unwrap().bucket_count, MAX_BUCKETS);
    assert_eq!(
        explicit(MAX_BUCKETS - 1),
        Err(SizingError::BucketCount(FormatError::Odd(MAX_BUCKETS - 1)))
    );
    for bad in [
        MAX_BUCKETS + 1,
        MAX_BUCKETS + 2,
        1 << 32,
        u64::MAX - 1,
        u64::MAX,
    ] {
        assert_eq!(
            explicit(bad),
            Err(SizingError::BucketCount(
                FormatError::BucketCountOutOfRange(bad)
            ))
        );
    }
    assert_eq!(
        explicit(1),
        Err(SizingError::BucketCount(
            FormatError::BucketCountOutOfRange(1)
        ))
    );
    let last_sized = TableSizing {
        expected_blocks: last,
        bucket_count: 0,
        seed: 1,
    }
    .format()
    .unwrap();
    assert_eq!(last_sized.bucket_count, MAX_BUCKETS);
    assert_eq!(last_sized.slot_count(), MAX_BUCKETS * 4);
    assert_eq!(last_sized.table_bytes(), MAX_BUCKETS * 8);
}

/// Case 10 on tables whose bucket count is not a multiple of the chunk size (and on the
/// 2-bucket minimum, with a chunk larger than the table): a real producer state through the
/// real publisher and chunking, installed chunk by chunk; identical bytes, every block found.
#[test]
fn chunked_snapshots_of_any_size_round_trip() {
    use ckf_core::publication::DcCkfPublisher;
    use ckf_core::testing;
    for n in [2u64, 6, 1002, 4094] {
        for chunk_bytes in [1usize, 8, 24, 1000, 1 << 20] {
            let format = TableFormat::new(n, 0xC4).unwrap();
            let ix = testing::indexer("d", format, 2, 1);
            let mut s = DcCkfState::new(DcCkfConfig::new(format)).unwrap();
            let blocks: Vec<u64> = (0..n * 3).map(|i| key(i, n)).collect();
            s.store(M0, &blocks);
            let mut publisher = DcCkfPublisher::new(testing::identity(&ix, 1, 9));
            testing::install_snapshot(&ix, &mut publisher, &mut s, chunk_bytes);
            assert_eq!(
                ix.table().lane_words(1),
                s.buckets(),
                "n={n} chunk={chunk_bytes}"
            );
            for &h in blocks.iter().filter(|&&h| s.refcount(h) > 0) {
                assert_eq!(ix.find_prefix_matches(&[h]).depth(1), Some(1), "n={n}");
            }
        }
    }
}

/// Case 11 for the largest formats: a producer state and a consumer table of `MAX_BUCKETS`
/// buckets are either built or refused with a typed allocation error (which one depends on the
/// machine's memory and overcommit policy), never a panic or an abort.
#[test]
fn largest_tables_are_built_or_refused_with_a_typed_error() {
    use ckf_core::dc::DcCkfError;
    use ckf_core::global::ManifestError;
    let format = TableFormat::new(MAX_BUCKETS, 1).unwrap();
    match DcCkfState::new(DcCkfConfig::new(format)) {
        Ok(s) => assert_eq!(s.buckets().len() as u64, MAX_BUCKETS),
        Err(e) => assert!(
            matches!(e, DcCkfError::Allocation { bucket_count, .. } if bucket_count == MAX_BUCKETS),
            "{e}"
        ),
    }
    let built = std::panic::catch_unwind(|| {
        ckf_core::global::GlobalCkfIndexer::new(
            ckf_core::global::Manifest {
                domain: ckf_core::identity::IndexerDomainId::new("d").unwrap(),
                format,
                lanes: (0..16)
                    .map(|i| ckf_core::identity::PoolId::new("d", &format!("p{i}")).unwrap())
                    .collect(),
            },
            1,
        )
        .map(|ix| ix.table().bucket_count())
    });
    match built.expect("no panic") {
        Ok(n) => assert_eq!(n as u64, MAX_BUCKETS),
        Err(e) => assert!(matches!(e, ManifestError::Table(_)), "{e:?}"),
    }
}
