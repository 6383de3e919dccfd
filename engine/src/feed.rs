//! What a producer keeps of its engine publishers between batches, with one owner: per
//! member the lineage (engine hash -> canonical hash), the filters, per publisher socket the
//! members it fed and its last applied batch (sequence and identity). The producer's state
//! actor hands each batch in order with its state ([`EngineFeed::apply`]): the batch is
//! translated into [`KvEvent`]s ([`EngineFeed::translate`]) and applied; a clear, a worker's
//! removal and a durability checkpoint go through here too, so no engine rule lives in the
//! actor.
//!
//! A publisher socket is `(worker_id, rank)`; the member a batch feeds is
//! `(worker_id, batch dp_rank or the socket's rank)` ([`EngineFeed::member`]).

use std::collections::{BTreeSet, HashMap};

use ckf_core::dc::{DcCkfState, EventOutcome, KvEvent, MemberId};

use crate::event::EngineBatch;
use crate::filters::EngineFilters;
use crate::lineage::{Lineage, MemberLineageImage, SkipReason};

/// One publisher socket: `(worker_id, rank)`.
pub type PublisherKey = (u64, u32);

/// A publisher socket's last applied batch: its sequence and identity
/// ([`EngineBatch::identity`]; `None` when restored from a checkpoint that did not keep it).
pub type LastApplied = (i64, Option<u64>);

/// What one batch asks of the state, in order.
#[derive(Debug, PartialEq, Eq)]
pub struct Fed {
    /// The member the batch fed.
    pub member: MemberId,
    /// The events to apply to the state, in the batch order.
    pub events: Vec<KvEvent>,
    /// What was skipped, with the number of blocks, reason by reason (each at most once).
    pub skipped: Vec<(SkipReason, u32)>,
}

/// What one batch did to the state ([`EngineFeed::apply`]).
#[derive(Debug, PartialEq, Eq)]
pub struct Applied {
    /// The member the batch fed.
    pub member: MemberId,
    /// Per event applied, in the batch order: its kind ([`KvEventKind::label`](ckf_core::dc::KvEventKind::label)) and outcome.
    pub outcomes: Vec<(&'static str, EventOutcome)>,
    /// What was skipped, with the number of blocks, reason by reason (each at most once).
    pub skipped: Vec<(SkipReason, u32)>,
}

/// Everything a checkpoint records of the feed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct FeedImage {
    /// Every member's lineage ([`Lineage::export`]).
    pub lineage: Vec<MemberLineageImage>,
    /// Per publisher socket: the members it fed.
    pub fed: Vec<(u64, u32, Vec<MemberId>)>,
    /// Per publisher socket: the sequence of its last applied batch.
    pub sequences: Vec<(u64, u32, i64)>,
    /// Per publisher socket: the identity of its last applied batch, where known.
    pub identities: Vec<(u64, u32, u64)>,
}

/// The engine publishers' bookkeeping (see the module docs).
#[derive(Debug, Default)]
pub struct EngineFeed {
    lineage: Lineage,
    filters: EngineFilters,
    fed: HashMap<PublisherKey, BTreeSet<MemberId>>,
    last: HashMap<PublisherKey, LastApplied>,
}

impl EngineFeed {
    /// An empty feed that admits events by `filters`.
    pub fn new(filters: EngineFilters) -> Self {
        Self {
            filters,
            ..Self::default()
        }
    }

    /// The member a batch of `publisher` belongs to: the batch's own dp rank if it names one.
    pub fn member(publisher: PublisherKey, batch: &EngineBatch) -> MemberId {
        MemberId::new(publisher.0, batch.dp_rank.unwrap_or(publisher.1))
    }

    /// Translates `batch` (sequence `sequence` of `publisher`) through its member's lineage:
    /// the events to apply, in order, and what was skipped. The batch becomes the publisher's
    /// last applied one, and its member one the publisher fed.
    pub fn translate(
        &mut self,
        publisher: PublisherKey,
        sequence: i64,
        batch: &EngineBatch,
    ) -> Fed {
        let member = Self::member(publisher, batch);
        self.last
            .insert(publisher, (sequence, Some(batch.identity())));
        self.fed.entry(publisher).or_default().insert(member);
        let mut fed = Fed {
            member,
            events: Vec::new(),
            skipped: Vec::new(),
        };
        for event in &batch.events {
            let t = self.lineage.translate(member, event, &self.filters);
            for (reason, blocks) in t.skipped {
                match fed.skipped.iter_mut().find(|(r, _)| *r == reason) {
                    Some((_, n)) => *n = n.saturating_add(blocks),
                    None => fed.skipped.push((reason, blocks)),
                }
            }
            fed.events.extend(t.kv_event);
        }
        fed
    }

    /// Forgets every member `publisher` fed (their lineage with them) and returns them, for
    /// the caller to clear in the state. Its last applied batch is kept: it is still where a
    /// restarted producer verifies and resumes (what follows it is applied onto the cleared
    /// members: a subset of the engine's cache).
    pub fn forget(&mut self, publisher: PublisherKey) -> Vec<MemberId> {
        let members: Vec<MemberId> = self
            .fed
            .remove(&publisher)
            .unwrap_or_default()
            .into_iter()
            .collect();
        for &member in &members {
            self.lineage.clear_member(member);
        }
        members
    }

    /// Translates `batch` ([`Self::translate`]) and applies its events to `state` in order,
    /// each event's first blocks prefetched during the one before
    /// ([`DcCkfState::prefetch_next`]), as the Ingest path does.
    pub fn apply(
        &mut self,
        publisher: PublisherKey,
        sequence: i64,
        batch: &EngineBatch,
        state: &mut DcCkfState,
    ) -> Applied {
        let fed = self.translate(publisher, sequence, batch);
        let mut outcomes = Vec::with_capacity(fed.events.len());
        for (i, event) in fed.events.iter().enumerate() {
            let next = fed
                .events
                .get(i + 1)
                .map_or(&[][..], |e| e.kind.block_hashes());
            state.prefetch_next(next);
            outcomes.push((event.kind.label(), state.apply(event)));
        }
        Applied {
            member: fed.member,
            outcomes,
            skipped: fed.skipped,
        }
    }

    /// Clears in `state` every member `publisher` fed ([`Self::forget`]); their outcomes, in
    /// member order.
    pub fn clear(
        &mut self,
        publisher: PublisherKey,
        state: &mut DcCkfState,
    ) -> Vec<(MemberId, EventOutcome)> {
        self.forget(publisher)
            .into_iter()
            .map(|member| (member, state.clear_member(member)))
            .collect()
    }

    /// A worker removed from the state (`WorkerRemoved`): its members' lineage goes with it.
    pub fn remove_worker(&mut self, worker_id: u64) {
        for member in self.lineage.members() {
            if member.worker_id == worker_id {
                self.lineage.clear_member(member);
            }
        }
    }

    /// Per publisher socket: its last applied batch (where a restarted producer resumes).
    pub fn last_applied(&self) -> HashMap<PublisherKey, LastApplied> {
        self.last.clone()
    }

    /// Estimated heap bytes of the lineage.
    pub fn bytes_used(&self) -> usize {
        self.lineage.bytes_used()
    }

    /// The feed as a checkpoint records it.
    pub fn image(&self) -> FeedImage {
        FeedImage {
            lineage: self.lineage.export(),
            ..self.tables_image()
        }
    }

    /// The feed as it is now, for a checkpoint taken between events: the small tables at
    /// once, the lineage (left empty here) copied by [`image_step`](Self::image_step)s, each
    /// member before its next change ([`Lineage::begin_capture`]), and taken with
    /// [`take_lineage_image`](Self::take_lineage_image).
    pub fn begin_image(&mut self) -> FeedImage {
        self.lineage.begin_capture();
        self.tables_image()
    }

    /// Copies up to `max_blocks` more engine blocks of the lineage image (at least one
    /// member); whether members remain.
    pub fn image_step(&mut self, max_blocks: usize) -> bool {
        self.lineage.capture_step(max_blocks)
    }

    /// The lineage of [`begin_image`](Self::begin_image)'s moment once every member is
    /// copied (each one's blocks in no order), else `None`.
    pub fn take_lineage_image(&mut self) -> Option<Vec<MemberLineageImage>> {
        self.lineage.take_capture()
    }

    /// Everything but the lineage.
    fn tables_image(&self) -> FeedImage {
        FeedImage {
            lineage: Vec::new(),
            fed: self
                .fed
                .iter()
                .map(|(&(w, r), members)| (w, r, members.iter().copied().collect()))
                .collect(),
            sequences: self
                .last
                .iter()
                .map(|(&(w, r), &(s, _))| (w, r, s))
                .collect(),
            identities: self
                .last
                .iter()
                .filter_map(|(&(w, r), &(_, identity))| Some((w, r, identity?)))
                .collect(),
        }
    }

    /// Restores lineage images ([`Lineage::restore`]).
    pub fn restore_lineage(&mut self, images: impl IntoIterator<Item = MemberLineageImage>) {
        self.lineage.restore(images);
    }

    /// Restores which members publisher sockets fed.
    pub fn restore_fed(&mut self, fed: impl IntoIterator<Item = (u64, u32, Vec<MemberId>)>) {
        for (w, r, members) in fed {
            self.fed.entry((w, r)).or_default().extend(members);
        }
    }

    /// Restores last applied sequences (identities unknown until
    /// [`restore_identities`](Self::restore_identities)).
    pub fn restore_sequences(&mut self, sequences: impl IntoIterator<Item = (u64, u32, i64)>) {
        for (w, r, s) in sequences {
            self.last.insert((w, r), (s, None));
        }
    }

    /// Restores the identities of restored last applied batches.
    pub fn restore_identities(&mut self, identities: impl IntoIterator<Item = (u64, u32, u64)>) {
        for (w, r, identity) in identities {
            if let Some(last) = self.last.get_mut(&(w, r)) {
                last.1 = Some(identity);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{EngineEvent, RemovedBlocks};
    use crate::lineage::tests::store;
    use ckf_core::dc::KvEventKind;

    fn batch(dp_rank: Option<u32>, events: Vec<EngineEvent>) -> EngineBatch {
        EngineBatch {
            ts: 1.0,
            dp_rank,
            events,
            ..EngineBatch::default()
        }
    }

    fn feed() -> EngineFeed {
        EngineFeed::new(EngineFilters {
            block_size: 2,
            ..EngineFilters::default()
        })
    }

    #[test]
    fn a_batch_feeds_its_member_and_becomes_the_last_applied() {
        let mut f = feed();
        let b = batch(Some(3), vec![store(&[10, 11], None, &[1, 2, 3, 4])]);
        let fed = f.translate((7, 0), 5, &b);
        assert_eq!(fed.member, MemberId::new(7, 3), "the batch's own rank");
        assert_eq!(fed.events.len(), 1);
        assert!(matches!(
            &fed.events[0].kind,
            KvEventKind::Stored { block_hashes, .. } if block_hashes.len() == 2
        ));
        assert_eq!(
            f.last_applied(),
            HashMap::from([((7, 0), (5, Some(b.identity())))])
        );
        // Without a rank, the socket's.
        let fed = f.translate((7, 1), 0, &batch(None, vec![]));
        assert_eq!(fed.member, MemberId::new(7, 1));
    }

    #[test]
    fn skips_are_counted_per_reason_across_the_batch() {
        let mut f = feed();
        let removed = |h: u64| {
            EngineEvent::Removed(RemovedBlocks {
                block_hashes: vec![h],
                ..RemovedBlocks::default()
            })
        };
        let fed = f.translate((7, 0), 0, &batch(None, vec![removed(1), removed(2)]));
        assert!(fed.events.is_empty());
        assert_eq!(fed.skipped, vec![(SkipReason::UnknownRemoval, 2)]);
    }

    #[test]
    fn a_clear_returns_the_publishers_members_and_drops_their_lineage_only() {
        let mut f = feed();
        f.translate(
            (7, 0),
            0,
            &batch(Some(0), vec![store(&[10], None, &[1, 2])]),
        );
        f.translate(
            (7, 0),
            1,
            &batch(Some(1), vec![store(&[20], None, &[1, 2])]),
        );
        f.translate((8, 0), 0, &batch(None, vec![store(&[30], None, &[1, 2])]));
        let mut cleared = f.forget((7, 0));
        cleared.sort();
        assert_eq!(cleared, vec![MemberId::new(7, 0), MemberId::new(7, 1)]);
        assert_eq!(f.forget((7, 0)), vec![], "nothing fed since");
        // A child of a cleared block is an orphan now; the other publisher's is not.
        let orphan = f.translate(
            (7, 0),
            2,
            &batch(Some(0), vec![store(&[11], Some(10), &[3, 4])]),
        );
        assert_eq!(orphan.skipped, vec![(SkipReason::Orphan, 1)]);
        let child = f.translate(
            (8, 0),
            1,
            &batch(None, vec![store(&[31], Some(30), &[3, 4])]),
        );
        assert_eq!(child.events.len(), 1);
        assert_eq!(
            f.last_applied()[&(7, 0)].0,
            2,
            "the last applied batch is kept"
        );
    }

    #[test]
    fn applying_a_batch_is_applying_its_translation_and_a_clear_clears_the_members_fed() {
        use ckf_core::TableFormat;
        use ckf_core::dc::{DcCkfConfig, DcCkfState};
        let new_state =
            || DcCkfState::new(DcCkfConfig::new(TableFormat::new(1024, 3).unwrap())).unwrap();
        let batches = [
            batch(Some(0), vec![store(&[10, 11], None, &[1, 2, 3, 4])]),
            batch(
                Some(1),
                vec![store(&[20], None, &[1, 2]), store(&[21], Some(20), &[5, 6])],
            ),
            batch(
                Some(0),
                vec![EngineEvent::Removed(RemovedBlocks {
                    block_hashes: vec![11],
                    ..RemovedBlocks::default()
                })],
            ),
        ];
        let (mut f, mut applied) = (feed(), new_state());
        let (mut g, mut model) = (feed(), new_state());
        for (i, b) in batches.iter().enumerate() {
            let sequence = i64::try_from(i).unwrap();
            let report = f.apply((7, 0), sequence, b, &mut applied);
            let fed = g.translate((7, 0), sequence, b);
            let outcomes: Vec<_> = fed
                .events
                .iter()
                .map(|e| (e.kind.label(), model.apply(e)))
                .collect();
            assert_eq!(report.member, fed.member);
            assert_eq!(report.outcomes, outcomes);
            assert_eq!(report.skipped, fed.skipped);
        }
        assert_eq!(applied.buckets(), model.buckets());
        assert_eq!(applied.stats(), model.stats());
        assert!(applied.stats().unique_blocks > 0, "something was stored");
        // A clear empties both members of the publisher, in the state as in the model.
        let cleared = f.clear((7, 0), &mut applied);
        let mut members: Vec<MemberId> = cleared.iter().map(|(m, _)| *m).collect();
        members.sort();
        assert_eq!(members, vec![MemberId::new(7, 0), MemberId::new(7, 1)]);
        for member in g.forget((7, 0)) {
            model.clear_member(member);
        }
        assert_eq!(applied.buckets(), model.buckets());
        assert_eq!(applied.stats().unique_blocks, 0);
    }

    #[test]
    fn removing_a_worker_drops_its_lineage() {
        let mut f = feed();
        f.translate((7, 0), 0, &batch(None, vec![store(&[10], None, &[1, 2])]));
        f.remove_worker(7);
        let orphan = f.translate(
            (7, 0),
            1,
            &batch(None, vec![store(&[11], Some(10), &[3, 4])]),
        );
        assert_eq!(orphan.skipped, vec![(SkipReason::Orphan, 1)]);
    }

    #[test]
    fn an_image_restores_the_same_feed() {
        let mut f = feed();
        f.translate((7, 0), 4, &batch(None, vec![store(&[10], None, &[1, 2])]));
        f.translate((8, 1), -2, &batch(None, vec![]));
        let image = f.image();
        let mut g = feed();
        g.restore_lineage(image.lineage.clone());
        g.restore_fed(image.fed.clone());
        g.restore_sequences(image.sequences.clone());
        g.restore_identities(image.identities.clone());
        assert_eq!(g.last_applied(), f.last_applied());
        assert_eq!(g.forget((7, 0)), f.forget((7, 0)));
        // Without identities (an older checkpoint): the sequences alone.
        let mut h = feed();
        h.restore_sequences(image.sequences);
        assert_eq!(h.last_applied()[&(7, 0)], (4, None));
    }
}
