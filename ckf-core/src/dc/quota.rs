//! Ingest quotas: how much one event, one batch, one member and one source may make the
//! producer do or hold, and the bookkeeping behind the holding limits.
//!
//! | limit | counts | checked | refusal |
//! | --- | --- | --- | --- |
//! | `max_blocks_per_event` | block hashes in one stored / removed event | before the batch is applied ([`Quotas::check_batch`]) and again per event | [`QuotaError::EventTooLarge`] |
//! | `max_blocks_per_batch` | block hashes in all events of one batch | before the batch is applied ([`Quotas::check_batch`]) | [`QuotaError::BatchTooLarge`] |
//! | `max_blocks_per_member` | blocks the member owns after the event | per stored event, before it is applied | [`QuotaError::MemberFull`] |
//! | `max_blocks_per_source` | blocks the source *holds* (below) after the event | per stored event, before it is applied | [`QuotaError::SourceFull`] |
//! | `max_ranks_per_worker` | dp ranks of one worker owning blocks, counting the event's member | per stored event of a member owning nothing yet | [`QuotaError::WorkerRanks`] |
//!
//! `0` means unlimited for every limit. Removals and clears are never refused: they only free.
//!
//! # What a source holds
//! A member is *charged* to the source of the first stored event ([`DcCkfState::apply_from`])
//! that reaches it while it is uncharged, and stays charged to that source until it owns no
//! block again (its last block removed or cleared). A source **holds every block owned by the
//! members charged to it**, whoever stored or removed them since. So one worker's event
//! publisher (one source, its own members) holds exactly the blocks it stored and has not
//! removed; a second source writing into a member charged to another source spends the other
//! source's quota (authorization keeps sources to their own workers). Members fed only by the
//! trusted engine path ([`DcCkfState::apply`]) are charged to nobody; a source that later
//! stores into such a member takes over all its blocks. The charge table has one entry per
//! source holding at least one block, so its size is bounded by the members, not by the
//! number of source ids ever seen.
//!
//! # The check is exact and conservative
//! Before a stored event of `n` blocks is applied, the blocks it would newly add are counted
//! exactly: the distinct hashes of the event the member does not own yet (re-stores of owned
//! blocks are free). The event is refused whole when `owned + new` would exceed the member
//! limit, or `held + new` (plus the member's blocks, when the event is what charges it) the
//! source limit. A block later omitted for filter capacity was still counted, so an event can
//! be refused although it would in fact have stored fewer blocks; it is never let past a limit.
//!
//! [`DcCkfState::apply_from`]: super::DcCkfState::apply_from
//! [`DcCkfState::apply`]: super::DcCkfState::apply

use std::collections::HashMap;

use thiserror::Error;

use super::events::MemberId;
use crate::identity::quoted;

/// Default `max_blocks_per_event`: bounds one event's work in the producer's state actor to
/// about a millisecond (see the README's "Quotas" figures).
pub const DEFAULT_MAX_BLOCKS_PER_EVENT: u32 = 16_384;
/// Default `max_blocks_per_batch`: four maximal events, a few milliseconds of actor work, so
/// one client's batch delays another client's by at most that.
pub const DEFAULT_MAX_BLOCKS_PER_BATCH: u64 = 65_536;
/// Default `max_ranks_per_worker`: far above the data-parallel ranks engines run per worker
/// (tens to a few hundred), far below what it takes to crowd the 2^21 owner tags: ingest
/// authorization grants workers, not ranks, so this bounds what one granted worker can claim.
pub const DEFAULT_MAX_RANKS_PER_WORKER: u32 = 1_024;

/// Ingest limits (see the module docs); `0` = unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quotas {
    /// Largest block count of one stored or removed event.
    pub max_blocks_per_event: u32,
    /// Largest total block count of one batch.
    pub max_blocks_per_batch: u64,
    /// Most blocks one member may own.
    pub max_blocks_per_member: u32,
    /// Most blocks one source may hold (see the module docs).
    pub max_blocks_per_source: u64,
    /// Most dp ranks of one worker owning blocks at once.
    pub max_ranks_per_worker: u32,
}

impl Default for Quotas {
    /// [`DEFAULT_MAX_BLOCKS_PER_EVENT`], [`DEFAULT_MAX_BLOCKS_PER_BATCH`],
    /// [`DEFAULT_MAX_RANKS_PER_WORKER`], holdings unlimited.
    fn default() -> Self {
        Self {
            max_blocks_per_event: DEFAULT_MAX_BLOCKS_PER_EVENT,
            max_blocks_per_batch: DEFAULT_MAX_BLOCKS_PER_BATCH,
            max_blocks_per_member: 0,
            max_blocks_per_source: 0,
            max_ranks_per_worker: DEFAULT_MAX_RANKS_PER_WORKER,
        }
    }
}

impl Quotas {
    /// Every limit off.
    pub const UNLIMITED: Self = Self {
        max_blocks_per_event: 0,
        max_blocks_per_batch: 0,
        max_blocks_per_member: 0,
        max_blocks_per_source: 0,
        max_ranks_per_worker: 0,
    };

    /// Checks the size limits of one batch whose events carry `event_blocks` block hashes
    /// each (0 for a clear), in order. Stateless: done before anything of the batch is applied.
    ///
    /// # Errors
    /// [`QuotaError::EventTooLarge`] for the first event above `max_blocks_per_event`, else
    /// [`QuotaError::BatchTooLarge`] when the sum exceeds `max_blocks_per_batch`.
    pub fn check_batch(
        &self,
        event_blocks: impl IntoIterator<Item = usize>,
    ) -> Result<(), QuotaError> {
        let mut total = 0u64;
        for (index, blocks) in event_blocks.into_iter().enumerate() {
            self.check_event(blocks).map_err(|e| match e {
                QuotaError::EventTooLarge { blocks, max, .. } => QuotaError::EventTooLarge {
                    index: Some(index),
                    blocks,
                    max,
                },
                other => other,
            })?;
            total += blocks as u64;
        }
        if self.max_blocks_per_batch > 0 && total > self.max_blocks_per_batch {
            return Err(QuotaError::BatchTooLarge {
                blocks: total,
                max: self.max_blocks_per_batch,
            });
        }
        Ok(())
    }

    /// Checks `max_blocks_per_event` for one event of `blocks` block hashes.
    ///
    /// # Errors
    /// [`QuotaError::EventTooLarge`] (with no index).
    pub fn check_event(&self, blocks: usize) -> Result<(), QuotaError> {
        let max = self.max_blocks_per_event;
        if max > 0 && blocks > max as usize {
            return Err(QuotaError::EventTooLarge {
                index: None,
                blocks,
                max,
            });
        }
        Ok(())
    }
}

/// Why an event or a batch was refused by a quota. Nothing of it was applied.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum QuotaError {
    /// One event carries more block hashes than `max_blocks_per_event`.
    #[error("{} has {blocks} blocks; limit max_blocks_per_event is {max}", event_name(*index))]
    EventTooLarge {
        /// Position of the event in its batch, when known.
        index: Option<usize>,
        /// Block hashes in the event.
        blocks: usize,
        /// The limit.
        max: u32,
    },
    /// The batch carries more block hashes than `max_blocks_per_batch`.
    #[error("batch has {blocks} blocks in all; limit max_blocks_per_batch is {max}")]
    BatchTooLarge {
        /// Block hashes in the batch.
        blocks: u64,
        /// The limit.
        max: u64,
    },
    /// The member would own more than `max_blocks_per_member` blocks.
    #[error(
        "member {member} owns {held} blocks and the event adds {adding}; limit \
         max_blocks_per_member is {max}"
    )]
    MemberFull {
        /// The member.
        member: MemberId,
        /// Blocks it owns now.
        held: u64,
        /// Blocks the event would newly add.
        adding: u64,
        /// The limit.
        max: u32,
    },
    /// The source would hold more than `max_blocks_per_source` blocks.
    #[error(
        "source {} holds {held} blocks and the event adds {adding}; limit \
         max_blocks_per_source is {max}",
        quoted(source_id)
    )]
    SourceFull {
        /// The source charged (the member's source, see the module docs). Not named `source`:
        /// that name would make it the error's cause.
        source_id: String,
        /// Blocks it holds now.
        held: u64,
        /// Blocks the event would add to it.
        adding: u64,
        /// The limit.
        max: u64,
    },
    /// The event's member would be one dp rank too many for its worker.
    #[error(
        "worker {worker_id} has {ranks} dp ranks owning blocks and the event adds dp rank \
         {dp_rank}; limit max_ranks_per_worker is {max}"
    )]
    WorkerRanks {
        /// The worker.
        worker_id: u64,
        /// The rank the event would add.
        dp_rank: u32,
        /// Ranks of the worker owning blocks now.
        ranks: u32,
        /// The limit.
        max: u32,
    },
}

impl QuotaError {
    /// The limit's name, as a metric label and in configuration (`quotas.<name>`).
    pub fn limit(&self) -> &'static str {
        match self {
            Self::EventTooLarge { .. } => "max_blocks_per_event",
            Self::BatchTooLarge { .. } => "max_blocks_per_batch",
            Self::MemberFull { .. } => "max_blocks_per_member",
            Self::SourceFull { .. } => "max_blocks_per_source",
            Self::WorkerRanks { .. } => "max_ranks_per_worker",
        }
    }
}

fn event_name(index: Option<usize>) -> String {
    match index {
        Some(i) => format!("event {i}"),
        None => "event".into(),
    }
}

/// A stored event as the quota check sees it ([`Quotas::check_store`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct StoreRequest<'a> {
    /// The ingest source applying the event.
    pub source: &'a str,
    /// The member storing.
    pub member: MemberId,
    /// Block hashes in the event.
    pub blocks: usize,
    /// `(blocks owned, charge index)` of the member (charge index 0: charged to nobody), `None`
    /// when it owns nothing.
    pub holding: Option<(u64, u32)>,
}

impl Quotas {
    /// The quota check of a stored event (see the module docs): `worker_ranks` gives the dp
    /// ranks of the member's worker owning blocks, `fresh` the distinct hashes of the event the
    /// member does not own yet; each is asked for only when a limit needs it. Nothing changes.
    ///
    /// # Errors
    /// [`QuotaError::EventTooLarge`], [`QuotaError::WorkerRanks`], [`QuotaError::MemberFull`]
    /// or [`QuotaError::SourceFull`], the first limit the event would pass.
    pub(crate) fn check_store(
        self,
        charges: &Charges,
        event: StoreRequest<'_>,
        worker_ranks: impl FnOnce() -> u32,
        fresh: impl FnOnce() -> u64,
    ) -> Result<(), QuotaError> {
        let StoreRequest {
            source,
            member,
            blocks,
            holding,
        } = event;
        let q = self;
        q.check_event(blocks)?;
        let max = q.max_ranks_per_worker;
        if max > 0 && holding.is_none() && blocks > 0 {
            let ranks = worker_ranks();
            if ranks >= max {
                return Err(QuotaError::WorkerRanks {
                    worker_id: member.worker_id,
                    dp_rank: member.dp_rank,
                    ranks,
                    max,
                });
            }
        }
        if q.max_blocks_per_member == 0 && q.max_blocks_per_source == 0 {
            return Ok(());
        }
        let (owned, charge) = holding.unwrap_or((0, 0));
        let adding = fresh();
        if adding == 0 {
            return Ok(());
        }
        let max = q.max_blocks_per_member;
        if max > 0 && owned + adding > u64::from(max) {
            return Err(QuotaError::MemberFull {
                member,
                held: owned,
                adding,
                max,
            });
        }
        let max = q.max_blocks_per_source;
        if max > 0 {
            // An uncharged member's blocks become the source's with this event.
            let (charged, held, adding) = if charge != 0 {
                let c = charges.peek(charge);
                (&*c.id, c.held, adding)
            } else {
                let held = charges.index_of(source).map_or(0, |i| charges.peek(i).held);
                (source, held, adding + owned)
            };
            if held + adding > max {
                return Err(QuotaError::SourceFull {
                    source_id: charged.to_owned(),
                    held,
                    adding,
                    max,
                });
            }
        }
        Ok(())
    }
}

/// One source's holding.
#[derive(Debug, Clone, Default)]
pub(crate) struct Charge {
    pub id: Box<str>,
    /// Blocks owned by the members charged to the source.
    pub held: u64,
    /// Members charged to the source (the entry is freed at 0).
    pub members: u32,
}

/// Source id -> holding, for sources holding at least one block.
///
/// Source ids come from clients, so the index uses std's randomly seeded SipHash (a fixed-seed
/// hasher would let a client pick colliding ids).
#[derive(Debug, Clone, Default)]
pub(crate) struct Charges {
    by_source: HashMap<Box<str>, u32>,
    charges: Vec<Charge>,
    free: Vec<u32>,
}

impl Charges {
    /// The charge index (`>= 1`) of `source`, if it holds anything.
    pub fn index_of(&self, source: &str) -> Option<u32> {
        self.by_source.get(source).copied()
    }

    /// The index of `source`, creating its entry if needed.
    pub fn index_or_insert(&mut self, source: &str) -> u32 {
        if let Some(index) = self.index_of(source) {
            return index;
        }
        let charge = Charge {
            id: source.into(),
            held: 0,
            members: 0,
        };
        let index = match self.free.pop() {
            Some(index) => {
                self.charges[index as usize - 1] = charge;
                index
            }
            None => {
                self.charges.push(charge);
                self.charges.len() as u32
            }
        };
        self.by_source.insert(source.into(), index);
        index
    }

    /// The holding in `index`.
    pub fn get(&mut self, index: u32) -> &mut Charge {
        &mut self.charges[index as usize - 1]
    }

    /// The holding in `index`, read-only.
    pub fn peek(&self, index: u32) -> &Charge {
        &self.charges[index as usize - 1]
    }

    /// One member of `index` is no longer charged; frees the entry when it was the last.
    pub fn release_member(&mut self, index: u32) {
        let charge = &mut self.charges[index as usize - 1];
        charge.members -= 1;
        if charge.members == 0 {
            debug_assert_eq!(charge.held, 0, "a source with no member holds blocks");
            let id = std::mem::take(&mut charge.id);
            self.by_source.remove(&id);
            self.free.push(index);
            super::maps::shrink_map(&mut self.by_source);
            if self.by_source.is_empty() {
                // Nothing is charged: give every table back, however small.
                self.by_source = HashMap::new();
                self.charges = Vec::new();
                self.free = Vec::new();
            }
        }
    }

    /// Sources holding at least one block.
    pub fn len(&self) -> usize {
        self.by_source.len()
    }

    /// `(source, held)` of every source holding blocks, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        self.by_source
            .iter()
            .map(|(id, &index)| (&**id, self.peek(index).held))
    }

    /// Heap bytes (capacity-based estimate plus the ids' bytes, twice: map key and charge).
    pub fn bytes_used(&self) -> usize {
        let ids: usize = self.by_source.keys().map(|k| k.len()).sum();
        super::stats::hash_table_bytes(
            self.by_source.capacity(),
            std::mem::size_of::<(Box<str>, u32)>(),
        ) + self.charges.capacity() * std::mem::size_of::<Charge>()
            + self.free.capacity() * 4
            + 2 * ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_limits_refuse_the_first_offender_and_the_total() {
        let q = Quotas {
            max_blocks_per_event: 4,
            max_blocks_per_batch: 10,
            ..Quotas::UNLIMITED
        };
        assert_eq!(q.check_batch([4, 4, 0, 2]), Ok(()));
        let e = q.check_batch([1, 5, 9]).unwrap_err();
        assert_eq!(
            e,
            QuotaError::EventTooLarge {
                index: Some(1),
                blocks: 5,
                max: 4
            }
        );
        assert_eq!(
            e.to_string(),
            "event 1 has 5 blocks; limit max_blocks_per_event is 4"
        );
        assert_eq!(e.limit(), "max_blocks_per_event");
        let e = q.check_batch([4, 4, 3]).unwrap_err();
        assert_eq!(
            e,
            QuotaError::BatchTooLarge {
                blocks: 11,
                max: 10
            }
        );
        assert!(e.to_string().contains("max_blocks_per_batch is 10"), "{e}");
        assert_eq!(Quotas::UNLIMITED.check_batch([usize::MAX / 4; 3]), Ok(()));
        assert_eq!(Quotas::default().check_event(16_384), Ok(()));
        assert!(Quotas::default().check_event(16_385).is_err());
    }

    #[test]
    fn holding_refusals_name_the_member_or_the_escaped_source() {
        let e = QuotaError::SourceFull {
            source_id: "evil\n".into(),
            held: 7,
            adding: 2,
            max: 8,
        };
        assert_eq!(
            e.to_string(),
            "source \"evil\\n\" holds 7 blocks and the event adds 2; limit max_blocks_per_source is 8"
        );
        let e = QuotaError::MemberFull {
            member: MemberId::new(3, 1),
            held: 1,
            adding: 1,
            max: 1,
        };
        assert!(
            e.to_string().starts_with("member worker 3 rank 1 owns 1"),
            "{e}"
        );
        assert_eq!(e.limit(), "max_blocks_per_member");
    }
}
