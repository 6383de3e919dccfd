//! `SourceSequences` against an exact model: a recency-ordered `Vec` of (source, last applied
//! sequence) with explicit least-recently-used eviction.

use std::num::NonZeroUsize;

use ckf_core::sources::{SequenceCheck, SourceSequences};
use proptest::prelude::*;

/// The model: front = least recently used.
struct Model {
    capacity: usize,
    order: Vec<(String, u64)>,
    evictions: u64,
}

impl Model {
    fn admit(&mut self, source: &str, sequence: u64) -> SequenceCheck {
        match self.order.iter().position(|(s, _)| s == source) {
            None => {
                if self.order.len() == self.capacity {
                    self.order.remove(0);
                    self.evictions += 1;
                }
                self.order.push((source.to_owned(), sequence));
                SequenceCheck::First
            }
            Some(i) => {
                let (id, last) = self.order.remove(i);
                let check = if sequence <= last {
                    SequenceCheck::Duplicate { last }
                } else if sequence == last + 1 {
                    SequenceCheck::InOrder
                } else {
                    SequenceCheck::Gap {
                        expected: last + 1,
                        received: sequence,
                    }
                };
                let kept = if check.applies() { sequence } else { last };
                self.order.push((id, kept));
                check
            }
        }
    }
}

fn step() -> impl Strategy<Value = (usize, u64)> {
    // 8 sources, sequences in a small range so in-order, gaps and replays all occur; u64::MAX
    // edges now and then.
    (
        0..8usize,
        prop_oneof![8 => 0..12u64, 1 => Just(u64::MAX - 1), 1 => Just(u64::MAX)],
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn bounded_tracker_matches_the_lru_model(
        capacity in 1..6usize,
        steps in prop::collection::vec(step(), 0..200),
    ) {
        let mut real = SourceSequences::new(NonZeroUsize::new(capacity).unwrap());
        let mut model = Model { capacity, order: Vec::new(), evictions: 0 };
        for (source, sequence) in steps {
            let source = format!("source-{source}");
            let expected = model.admit(&source, sequence);
            prop_assert_eq!(real.admit(&source, sequence), expected, "{} {}", source, sequence);
            prop_assert_eq!(real.len(), model.order.len());
            prop_assert!(real.len() <= capacity);
            prop_assert_eq!(real.evictions(), model.evictions);
            for (id, last) in &model.order {
                prop_assert_eq!(real.last(id), Some(*last));
            }
            let id_bytes: usize = model.order.iter().map(|(s, _)| s.len()).sum();
            prop_assert!(real.bytes_used() > id_bytes || real.is_empty());
        }
    }
}
