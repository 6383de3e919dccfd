//! Per-source batch sequence tracking (issue 3: "a batch carries a per-source sequence number so
//! a gap is detected and reported, not silently absorbed").
//!
//! Each event source (for example one worker's event publisher) numbers its batches. The first
//! batch seen from a source may start anywhere; after that each batch should be the previous
//! one + 1. A larger sequence is a gap: the batches in between never arrived, which the result
//! reports, while the batch itself is still applied (its events are newer than what was lost).
//! A sequence not newer than the last applied one is a replay and is refused whole, so a client
//! that retries a batch after a lost response cannot apply it twice.

use std::collections::HashMap;

/// How a batch's sequence relates to its source's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceCheck {
    /// First batch seen from this source.
    First,
    /// Exactly the previous sequence + 1.
    InOrder,
    /// Batches `expected..received` never arrived; this batch is applied.
    Gap {
        /// The sequence that should have come next.
        expected: u64,
        /// The sequence that arrived.
        received: u64,
    },
    /// Not newer than `last`, the last applied sequence: a replay, refused.
    Duplicate {
        /// The last applied sequence of the source.
        last: u64,
    },
}

impl SequenceCheck {
    /// Whether the batch must be applied.
    pub fn applies(self) -> bool {
        !matches!(self, Self::Duplicate { .. })
    }
}

/// Last applied sequence per source.
#[derive(Debug, Default)]
pub struct SourceSequences {
    last: HashMap<String, u64>,
}

impl SourceSequences {
    /// Classifies `sequence` for `source` and, unless it is a duplicate, records it as the
    /// source's last applied sequence.
    pub fn admit(&mut self, source: &str, sequence: u64) -> SequenceCheck {
        let Some(last) = self.last.get_mut(source) else {
            self.last.insert(source.to_owned(), sequence);
            return SequenceCheck::First;
        };
        if sequence <= *last {
            return SequenceCheck::Duplicate { last: *last };
        }
        let check = if sequence == *last + 1 {
            SequenceCheck::InOrder
        } else {
            SequenceCheck::Gap {
                expected: *last + 1,
                received: sequence,
            }
        };
        *last = sequence;
        check
    }

    /// Sources seen so far.
    pub fn len(&self) -> usize {
        self.last.len()
    }

    /// Whether no source has been seen.
    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_and_replays_are_classified_per_source() {
        let mut s = SourceSequences::default();
        assert_eq!(s.admit("a", 10), SequenceCheck::First);
        assert_eq!(s.admit("a", 11), SequenceCheck::InOrder);
        assert_eq!(s.admit("b", 0), SequenceCheck::First);
        assert_eq!(
            s.admit("a", 14),
            SequenceCheck::Gap {
                expected: 12,
                received: 14
            }
        );
        assert_eq!(s.admit("a", 14), SequenceCheck::Duplicate { last: 14 });
        assert_eq!(s.admit("a", 3), SequenceCheck::Duplicate { last: 14 });
        // A refused replay does not move the source backwards.
        assert_eq!(s.admit("a", 15), SequenceCheck::InOrder);
        assert_eq!(s.admit("b", 1), SequenceCheck::InOrder);
        assert_eq!(s.len(), 2);
        assert_eq!(
            s.admit("b", u64::MAX),
            SequenceCheck::Gap {
                expected: 2,
                received: u64::MAX
            }
        );
        assert_eq!(
            s.admit("b", u64::MAX),
            SequenceCheck::Duplicate { last: u64::MAX }
        );
    }
}
