//! The state actor: the one task that owns the pool's `DcCkfState`.
//!
//! Every mutation and every publication happens here, one command at a time, so the exact
//! state needs no lock and a batch is only ever sampled between complete commands (a
//! publication never shows half a command). The rules are `ckf-core`'s: the source sequence check
//! ([`SourceSequences`]), the state ([`DcCkfState`]), the fan-out to every attachment
//! ([`Fanout`]) and the publication cadence ([`Cadence`], `ckf_core::cadence`: when a batch is
//! cut, and the backed-up rule that spaces cuts while an indexer's queue is more than half
//! full); the actor keeps the clock (the max-delay deadline, re-armed to the end of a held
//! cut's interval so a held batch goes out even if no command comes), applies the rules in
//! order and turns their reports into metrics and logs (`ckf_producer_batches_cut_total`,
//! `ckf_producer_cuts_held_total`).
//!
//! Ingest handlers and relay-client tasks talk to it through an [`ActorHandle`]: one bounded
//! command channel (when the actor falls behind, senders wait: backpressure, bounded memory) and
//! one [`ActorHandle::ask`] for every request/response round trip.
//!
//! On shutdown the actor closes its channel, finishes the commands already queued, cuts the
//! pending tail, and queues the exact drain marker on every attachment
//! ([`Fanout::drain`](ckf_core::fanout::Fanout::drain)).
//!
//! Long work is cut into slices so no client waits long: a member's clear or a worker's
//! removal is exact at once and swept one slice (`DcCkfState::release_step`) after each
//! command, and back to back while the queue is empty; the slices' changes publish with the
//! cadence above. A durability checkpoint is captured the same way (`DcCkfState::capture_step`,
//! see the `journaling` module; its records are `records`', the rebuild from them `restore`'), and so is a `GetMemberBlocks` answer on a large state
//! (`DcCkfState::member_scan_step`). Every command and slice is timed in
//! `ckf_producer_actor_command_seconds`.

mod journaling;
mod records;
mod restore;
#[cfg(test)]
mod tests;

pub use records::{RECORD_VERSION, RestoreReport, UndecodableRecord};

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ckf_core::dc::MemberId;
use ckf_engine::feed::{EngineFeed, LastApplied, PublisherKey};
use ckf_engine::filters::EngineFilters;
use ckf_engine::sequence::ClearReason;

use ckf_core::dc::{DcCkfState, DcCkfStats, EventOutcome, MemberScan};
use ckf_core::fanout::{
    AttachRefused, DrainMiss, FenceCause, FrameLimits, Outbound, PublishReport,
};
use ckf_core::identity::{LaneLease, ProducerIdentity};
use ckf_core::publication::FenceReason;
use ckf_core::sources::{SequenceCheck, SourceSequences};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, sleep_until};

use ckf_svc_kit::Shutdown;

use journaling::Journaling;

use crate::engines::{EngineStep, PublisherId};
pub use crate::error::ActorGone;
use crate::events::{BatchReport, EventReport, IngestBatch, IngestEvent};
use crate::fanout::{AttachmentQueue, Fanout};
use crate::metrics::Metrics;

/// The sending side of the actor's command channel; cheap to clone.
#[derive(Debug, Clone)]
pub struct ActorHandle {
    commands: mpsc::Sender<Command>,
}

impl ActorHandle {
    /// A handle sending on `commands`.
    pub fn new(commands: mpsc::Sender<Command>) -> Self {
        Self { commands }
    }

    /// One request/response round trip: builds the command around a fresh reply channel,
    /// queues it (waiting while the channel is full) and waits for the answer, e.g.
    /// `actor.ask(|reply| Command::Stats { reply })`.
    ///
    /// # Errors
    /// [`ActorGone`] when the actor stopped before taking the command or before answering.
    pub async fn ask<T>(
        &self,
        command: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, ActorGone> {
        let (reply, answer) = oneshot::channel();
        self.tell(command(reply)).await?;
        answer.await.map_err(|_| ActorGone)
    }

    /// Queues a command that has no answer, waiting while the channel is full.
    ///
    /// # Errors
    /// [`ActorGone`] when the actor has stopped.
    pub async fn tell(&self, command: Command) -> Result<(), ActorGone> {
        self.commands.send(command).await.map_err(|_| ActorGone)
    }
}

/// A request to the actor.
#[derive(Debug)]
pub enum Command {
    /// Apply one ingest batch.
    Ingest {
        /// The decoded batch.
        batch: IngestBatch,
        /// Where the per-event results go.
        reply: oneshot::Sender<BatchReport>,
    },
    /// Current statistics (`bytes_used` includes the source sequence tracker) and the number of
    /// tracked sources.
    Stats {
        /// Where they go.
        reply: oneshot::Sender<(DcCkfStats, u64)>,
    },
    /// A copy of the packed table (inspection and tests).
    Table {
        /// Where it goes.
        reply: oneshot::Sender<Vec<u64>>,
    },
    /// Endpoint `endpoint` was granted `lease`: start its barrier snapshot.
    Attach {
        /// Index of the endpoint in the configuration.
        endpoint: usize,
        /// The granted lease.
        lease: LaneLease,
        /// Frame size limits of this attachment.
        limits: FrameLimits,
        /// The attachment's frame queue.
        frames: mpsc::Sender<Outbound>,
        /// The snapshot's sequence, or why the attach was refused.
        reply: oneshot::Sender<Result<u64, AttachRefused>>,
    },
    /// One step of an engine publisher (ZMQ ingest): apply a decoded batch to its member, or
    /// clear the publisher's members.
    Engine {
        /// The publisher socket.
        publisher: Arc<PublisherId>,
        /// What to do.
        step: EngineStep,
    },
    /// The canonical block hashes a member owns, in table order (the caller sorts them).
    MemberBlocks {
        /// The member.
        member: MemberId,
        /// Where they go.
        reply: oneshot::Sender<Vec<u64>>,
    },
    /// The last applied batch sequence of one ingest source, `None` when it is not tracked
    /// (never seen or evicted). Not a use of the source: its eviction order is unchanged.
    SourceSequence {
        /// The (validated) source id.
        source: ckf_core::identity::SourceId,
        /// Where it goes.
        reply: oneshot::Sender<Option<u64>>,
    },
    /// Endpoint `endpoint`'s attachment under `lease` ended (failure or retirement).
    Detach {
        /// Index of the endpoint.
        endpoint: usize,
        /// The lease the attachment held.
        lease: LaneLease,
        /// Why.
        reason: FenceReason,
    },
}

impl Command {
    /// The `command` label of `ckf_producer_actor_command_seconds`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Ingest { .. } => "ingest",
            Self::Stats { .. } => "stats",
            Self::Table { .. } => "table",
            Self::Attach { .. } => "attach",
            Self::Engine {
                step: EngineStep::Apply { .. },
                ..
            } => "engine_apply",
            Self::Engine {
                step: EngineStep::Clear(_),
                ..
            } => "engine_clear",
            Self::MemberBlocks { .. } => "member_blocks",
            Self::SourceSequence { .. } => "source_sequence",
            Self::Detach { .. } => "detach",
        }
    }
}

pub use ckf_core::cadence::{BACKED_UP_INTERVAL, Cadence, CutReason};

/// What the actor did before it stopped.
#[derive(Debug, Clone, Copy)]
pub struct ActorReport {
    /// Drain markers queued (one per attachment that was streaming).
    pub drain_markers: usize,
    /// Final statistics.
    pub stats: DcCkfStats,
}

/// How often state gauges are refreshed while idle.
const GAUGE_REFRESH: Duration = Duration::from_secs(1);

/// The actor's private state.
pub struct Actor {
    state: DcCkfState,
    fanout: Fanout,
    /// Endpoint names, indexed like the fan-out's attachments (for logs).
    endpoints: Vec<String>,
    sources: SourceSequences,
    metrics: Metrics,
    cadence: Cadence,
    /// When the pending dirty buckets must be cut at the latest (or, while a cut is held, when
    /// it may be cut).
    deadline: Option<Instant>,
    /// When the last batch was queued for the attachments (the backed-up rule's reference).
    last_cut: Option<Instant>,
    /// A cut of the pending batch was held by the backed-up rule (counted once per batch).
    held: bool,
    /// When the first command that left buckets dirty since the last cut finished (the start of
    /// the publish delay, `ckf_producer_publish_delay_seconds`).
    first_dirty: Option<Instant>,
    /// The engine publishers' bookkeeping: lineage, filters, members fed and last batch per
    /// publisher socket (journaled and checkpointed).
    feed: EngineFeed,
    /// When to hand freed memory back to the OS.
    trim: crate::trim::Trim,
    /// Where applied inputs are journaled (`[durability]`; none: memory only), and the
    /// checkpoint being captured between commands, if any.
    journaling: Journaling,
    /// `GetMemberBlocks` scans in progress, oldest first (one slice of the first per turn).
    member_scans: std::collections::VecDeque<(MemberScan, oneshot::Sender<Vec<u64>>)>,
}

impl Actor {
    /// An actor over `state`, publishing to one attachment per entry of `endpoints` and
    /// tracking the batch sequences of at most `sources`' capacity of sources.
    pub fn new(
        state: DcCkfState,
        identity: &ProducerIdentity,
        endpoints: Vec<String>,
        sources: SourceSequences,
        metrics: Metrics,
        cadence: Cadence,
        filters: EngineFilters,
    ) -> Self {
        Self {
            feed: EngineFeed::new(filters),
            state,
            fanout: Fanout::new(identity, endpoints.len()),
            endpoints,
            sources,
            metrics,
            cadence,
            deadline: None,
            last_cut: None,
            held: false,
            first_dirty: None,
            trim: crate::trim::Trim::default(),
            journaling: Journaling::default(),
            member_scans: std::collections::VecDeque::new(),
        }
    }

    /// The state's statistics (as `GetStats` reports them).
    pub fn state_stats(&self) -> DcCkfStats {
        self.stats()
    }

    /// Per engine publisher socket `(worker_id, rank)`: the sequence of the last batch it
    /// applied and that batch's identity (`None` from a checkpoint written before identities
    /// were kept), as restored by [`Actor::restore`] (empty for a fresh actor). A clear keeps
    /// the entry: a sequence that outlived its clear is still a valid point to verify and
    /// resume after (what follows it is applied onto the cleared members, a subset of the
    /// engine's cache), and a restarted engine fails its verification.
    pub fn engine_sequences(&self) -> HashMap<PublisherKey, LastApplied> {
        self.feed.last_applied()
    }

    /// From now on every applied input is journaled to `journal`, and checkpoints are
    /// written when it asks for them and on shutdown. Attach after [`Actor::restore`].
    pub fn attach_journal(&mut self, journal: ckf_journal::Journal) {
        self.journaling.attach(journal);
    }

    /// Runs until `shutdown` fires (or every sender is gone), then drains: see the module docs.
    pub async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        shutdown: Shutdown,
    ) -> ActorReport {
        let stopped = shutdown.wait();
        tokio::pin!(stopped);
        let mut gauges = tokio::time::interval(GAUGE_REFRESH);
        gauges.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let deadline = self.deadline;
            let slicing = self.slicing();
            tokio::select! {
                biased;
                () = &mut stopped => break,
                cmd = commands.recv() => match cmd {
                    Some(cmd) => {
                        let label = cmd.label();
                        self.timed(label, |actor| actor.handle(cmd));
                        self.slices();
                    }
                    None => break,
                },
                () = std::future::ready(()), if slicing => self.slices(),
                () = sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                    self.cut(CutReason::MaxDelay);
                }
                _ = gauges.tick() => self.refresh_gauges(),
            }
            // Read after the command: a command queued while this one was applied joins the
            // batch instead of following it in a delta of its own.
            self.after_command(commands.is_empty());
        }
        // Stop ingest: nothing new gets in, what is already queued was accepted and is applied
        // (an attach still queued is refused: the fan-out is closed).
        self.fanout.close();
        commands.close();
        while let Some(cmd) = commands.recv().await {
            self.handle(cmd);
        }
        // The drain marker promises the indexers the final state: the clears swept whole.
        self.state.finish_releases();
        while !self.member_scans.is_empty() {
            self.member_scan_slice();
        }
        self.publish(CutReason::Shutdown);
        let drained = self.fanout.drain();
        for (index, miss) in &drained.missed {
            let indexer = &self.endpoints[*index];
            match miss {
                DrainMiss::Sink(_) => {
                    tracing::warn!(%indexer, "attachment queue full at shutdown; no drain marker")
                }
                DrainMiss::NoMarker(e) => tracing::warn!(%indexer, error = %e, "no drain marker"),
            }
        }
        let drain_markers = drained.queued;
        // A final checkpoint: the next start reads it alone, whatever the log held.
        if self.journaling.is_on() {
            // The capture in progress (if any) first: its checkpoint's thread waits for it.
            self.finish_checkpoint();
            self.begin_checkpoint();
            self.finish_checkpoint();
            self.journaling.close();
        }
        self.refresh_gauges();
        tracing::info!(drain_markers, "state actor stopped; drain markers queued");
        ActorReport {
            drain_markers,
            stats: self.stats(),
        }
    }

    /// Runs `work` and records its duration under `label`.
    fn timed(&mut self, label: &'static str, work: impl FnOnce(&mut Self)) {
        let started = std::time::Instant::now();
        work(self);
        self.metrics
            .actor_command_seconds
            .with_label_values(&[label])
            .observe(started.elapsed().as_secs_f64());
    }

    /// Whether long work is in progress ([`slices`](Self::slices) has some).
    fn slicing(&self) -> bool {
        self.state.releasing() || self.journaling.capturing() || !self.member_scans.is_empty()
    }

    /// One slice of each kind of long work in progress: the clears' sweep, a checkpoint's
    /// capture, the oldest `GetMemberBlocks` scan.
    fn slices(&mut self) {
        if self.state.releasing() {
            self.timed("release", |actor| {
                actor.state.release_step();
            });
        }
        if self.journaling.capturing() {
            self.timed("checkpoint", Self::capture_slice);
        }
        if !self.member_scans.is_empty() {
            self.timed("member_blocks", Self::member_scan_slice);
        }
    }

    /// Begins a checkpoint of the current state ([`Journaling::begin_checkpoint`]).
    fn begin_checkpoint(&mut self) {
        self.journaling
            .begin_checkpoint(&mut self.state, &mut self.feed, &self.sources);
    }

    /// One slice of the checkpoint being captured, if any ([`Journaling::capture_slice`]).
    fn capture_slice(&mut self) {
        self.journaling
            .capture_slice(&mut self.state, &mut self.feed, &self.metrics.journal);
    }

    /// Captures the checkpoint in progress to its end, at once.
    fn finish_checkpoint(&mut self) {
        while self.journaling.capturing() {
            self.capture_slice();
        }
    }

    /// One slice of the oldest `GetMemberBlocks` scan; answers it when the map is read.
    fn member_scan_slice(&mut self) {
        let Some((scan, _)) = self.member_scans.front_mut() else {
            return;
        };
        if let Some(blocks) = self.state.member_scan_step(scan)
            && let Some((_, reply)) = self.member_scans.pop_front()
        {
            let _ = reply.send(blocks);
        }
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Ingest { batch, reply } => {
                // Journaling needs the batch after it was applied; the report says what was.
                let report = self.ingest(&batch);
                if self.journaling.is_on() && report.check.applies() {
                    let applied: Vec<bool> = report
                        .events
                        .iter()
                        .map(|e| matches!(e, EventReport::Applied(_)))
                        .collect();
                    self.journaling.log_ingest(&batch, &applied);
                }
                let _ = reply.send(report);
            }
            Command::Stats { reply } => {
                let stats = self.stats();
                self.metrics.observe_stats(&stats);
                self.metrics
                    .observe_rebuilds(&self.state.block_map_rebuilds());
                self.trim.observe(stats.bytes_used);
                let _ = reply.send((stats, self.sources.len() as u64));
            }
            Command::Table { reply } => {
                let _ = reply.send(self.state.buckets().to_vec());
            }
            Command::Engine { publisher, step } => {
                self.journaling.log_engine(&publisher, &step);
                match step {
                    EngineStep::Apply { sequence, batch } => {
                        self.engine_batch(&publisher, sequence, &batch)
                    }
                    EngineStep::Clear(reason) => self.engine_clear(&publisher, reason),
                }
            }
            Command::MemberBlocks { member, reply } => {
                // A scan of the whole block map: a first slice now (a small state answers at
                // once), the rest between commands (`slices`).
                let mut scan = self.state.begin_member_scan(member);
                match self.state.member_scan_step(&mut scan) {
                    Some(blocks) => {
                        let _ = reply.send(blocks);
                    }
                    None => self.member_scans.push_back((scan, reply)),
                }
            }
            Command::SourceSequence { source, reply } => {
                let _ = reply.send(self.sources.last(source.as_str()));
            }
            Command::Attach {
                endpoint,
                lease,
                limits,
                frames,
                reply,
            } => {
                let report = self.fanout.attach(
                    &mut self.state,
                    endpoint,
                    lease,
                    limits,
                    AttachmentQueue(frames),
                );
                if let Some(barrier) = &report.barrier {
                    self.record(barrier, CutReason::Barrier);
                    self.last_cut = Some(Instant::now());
                }
                self.deadline = None;
                self.first_dirty = None;
                self.held = false;
                self.refresh_queue_depths();
                let _ = reply.send(report.result);
            }
            Command::Detach {
                endpoint,
                lease,
                reason,
            } => {
                // A stale detach (the endpoint re-attached since) changes nothing.
                let _ = self.fanout.detach(endpoint, lease, reason);
            }
        }
    }

    fn ingest(&mut self, batch: &IngestBatch) -> BatchReport {
        let evictions = self.sources.evictions();
        let check = self.sources.admit(batch.source_id.as_str(), batch.sequence);
        self.metrics
            .source_evictions
            .inc_by(self.sources.evictions() - evictions);
        self.metrics
            .observe_sources(self.sources.len(), self.sources.bytes_used());
        let mut events = Vec::new();
        if check.applies() {
            if matches!(check, SequenceCheck::Gap { .. }) {
                self.metrics.source_gaps.inc();
            }
            events.reserve(batch.events.len());
            let source = batch.source_id.as_str();
            for (i, event) in batch.events.iter().enumerate() {
                // The next event's first blocks are prefetched during this one's last: a
                // batch's misses overlap across its events (a hint; large tables only).
                let next = match batch.events.get(i + 1) {
                    Some(Ok(IngestEvent::Kv(next))) => next.kind.block_hashes(),
                    // None to give: withdraw any hint an unapplied event left.
                    _ => &[],
                };
                self.state.prefetch_next(next);
                events.push(match event {
                    Ok(event) => match self.apply_from(source, event) {
                        Ok(outcome) => EventReport::Applied(outcome),
                        Err(e) => {
                            self.metrics
                                .quota_refusals
                                .with_label_values(&[e.limit()])
                                .inc();
                            tracing::debug!(source, error = %e, "event refused by a quota");
                            EventReport::Refused(e)
                        }
                    },
                    Err(e) => {
                        self.metrics.events_rejected.inc();
                        EventReport::Rejected(*e)
                    }
                });
            }
        } else {
            self.metrics.duplicate_batches.inc();
        }
        BatchReport {
            source_id: batch.source_id.as_str().to_owned(),
            sequence: batch.sequence,
            check,
            events,
        }
    }

    /// Applies an engine batch: the feed translates it and applies it to the state
    /// ([`EngineFeed::apply`]); the outcomes and skips are counted.
    fn engine_batch(
        &mut self,
        publisher: &PublisherId,
        sequence: i64,
        batch: &ckf_engine::event::EngineBatch,
    ) {
        let applied = self
            .feed
            .apply(publisher.key(), sequence, batch, &mut self.state);
        let [p, e] = publisher.labels();
        for (reason, blocks) in &applied.skipped {
            self.metrics
                .engine
                .skipped_events
                .with_label_values(&[p, e, reason.label()])
                .inc_by(u64::from(*blocks));
        }
        for (kind, outcome) in &applied.outcomes {
            self.count(kind, outcome);
        }
    }

    /// Clears every member `publisher` fed ([`EngineFeed::clear`] drops their lineage), so a
    /// later store re-adds exactly what the engine really caches.
    fn engine_clear(&mut self, publisher: &PublisherId, reason: ClearReason) {
        let [p, e] = publisher.labels();
        for (_, outcome) in self.feed.clear(publisher.key(), &mut self.state) {
            self.count("cleared", &outcome);
            self.metrics
                .engine
                .members_cleared
                .with_label_values(&[p, e, reason.label()])
                .inc();
        }
    }

    /// [`Self::apply`] for an ingest source: the holding quotas apply (`DcCkfState::apply_from`).
    fn apply_from(
        &mut self,
        source: &str,
        event: &IngestEvent,
    ) -> Result<EventOutcome, ckf_core::dc::QuotaError> {
        match event {
            IngestEvent::Kv(kv) => {
                let outcome = self.state.apply_from(source, kv)?;
                self.count(event.kind_label(), &outcome);
                Ok(outcome)
            }
            IngestEvent::WorkerRemoved { .. } => Ok(self.apply(event)),
        }
    }

    fn apply(&mut self, event: &IngestEvent) -> EventOutcome {
        let outcome = match event {
            IngestEvent::Kv(kv) => self.state.apply(kv),
            IngestEvent::WorkerRemoved { worker_id } => {
                // The worker's engine lineage goes with its state.
                self.feed.remove_worker(*worker_id);
                self.state.remove_worker(*worker_id)
            }
        };
        self.count(event.kind_label(), &outcome);
        outcome
    }

    /// Metrics of one applied event of `kind` ([`IngestEvent::kind_label`]).
    fn count(&self, kind: &str, outcome: &EventOutcome) {
        let m = &self.metrics;
        m.events.with_label_values(&[kind]).inc();
        let blocks = outcome.applied + outcome.omitted + outcome.unknown + outcome.redundant;
        m.blocks
            .with_label_values(&[if kind == "worker_removed" {
                "cleared"
            } else {
                kind
            }])
            .inc_by(u64::from(blocks));
        m.omissions.inc_by(u64::from(outcome.omitted));
        m.unknown_removals.inc_by(u64::from(outcome.unknown));
    }

    /// The cadence rule, after every complete command (and timer or gauge tick):
    /// [`Self::cut_reason`] decides, then the batch is cut or the max-delay deadline armed.
    /// `queue_empty`: no command is waiting. Writes a checkpoint when the journal asks for one.
    fn after_command(&mut self, queue_empty: bool) {
        if self.journaling.wants_checkpoint() {
            self.timed("checkpoint", Self::begin_checkpoint);
        }
        let pending = self.state.pending_dirty();
        if pending == 0 {
            self.deadline = None;
            self.first_dirty = None;
            self.held = false;
            return;
        }
        let now = Instant::now();
        if self.deadline.is_none() {
            self.deadline = Some(now + self.cadence.max_delay);
            self.first_dirty = Some(now);
        }
        if let Some(reason) = self
            .cadence
            .cut_reason(pending, queue_empty, self.deadline, now)
        {
            self.cut(reason);
        }
    }

    /// A cut that is due for `reason` (threshold, idle, max delay): the batch is cut now, or
    /// held by the backed-up rule ([`Cadence::hold_until`]), the deadline then re-armed to when it may be
    /// cut. Barrier and shutdown cuts do not come here: they are never held.
    fn cut(&mut self, reason: CutReason) {
        let hold = self
            .cadence
            .hold_until(Instant::now(), self.last_cut, self.fanout.backed_up());
        match hold {
            Some(until) => {
                if !std::mem::replace(&mut self.held, true) {
                    self.metrics.cuts_held.inc();
                }
                self.deadline = Some(until);
            }
            None => self.timed("publish", |actor| actor.publish(reason)),
        }
    }

    fn publish(&mut self, reason: CutReason) {
        self.deadline = None;
        self.held = false;
        let first_dirty = self.first_dirty.take();
        if let Some(report) = self.fanout.publish(&mut self.state) {
            self.last_cut = Some(Instant::now());
            if let Some(first) = first_dirty {
                self.metrics
                    .publish_delay_seconds
                    .observe(first.elapsed().as_secs_f64());
            }
            self.record(&report, reason);
            self.refresh_gauges();
        }
    }

    /// Metrics and logs of one publication.
    fn record(&self, report: &PublishReport, reason: CutReason) {
        let m = &self.metrics;
        m.batches.inc();
        m.batches_cut.with_label_values(&[reason.label()]).inc();
        m.batch_images.observe(report.batch_images as f64);
        m.cycles_broken.inc_by(u64::from(report.cycles_broken));
        for fenced in &report.fenced {
            let indexer = &self.endpoints[fenced.attachment];
            match &fenced.cause {
                FenceCause::Refused(e) => {
                    tracing::warn!(%indexer, error = %e, "publisher refused a delta; re-attaching")
                }
                FenceCause::Sink(why) => tracing::warn!(
                    %indexer,
                    %why,
                    "fencing the attachment; it will re-attach with a new snapshot"
                ),
            }
        }
    }

    /// The state's statistics with `bytes_used` covering the per-source sequence tracker too
    /// (what `GetStats` and `ckf_producer_state_bytes` report).
    fn stats(&self) -> DcCkfStats {
        let mut stats = self.state.stats();
        stats.bytes_used += self.sources.bytes_used() as u64;
        stats
    }

    /// `ckf_producer_attachment_queue_depth`: entries queued toward each indexer (0 while it
    /// is not attached).
    fn refresh_queue_depths(&self) {
        for (index, indexer) in self.endpoints.iter().enumerate() {
            let depth = self.fanout.sink(index).map_or(0, AttachmentQueue::depth);
            self.metrics
                .attachment_queue_depth
                .with_label_values(&[indexer])
                .set(i64::try_from(depth).unwrap_or(i64::MAX));
        }
    }

    fn refresh_gauges(&mut self) {
        self.refresh_queue_depths();
        if let Some(stats) = self.journaling.stats() {
            self.metrics.journal.observe(&stats);
        }
        self.metrics
            .releasing_edges
            .set(i64::try_from(self.state.releasing_edges()).unwrap_or(i64::MAX));
        self.metrics
            .engine
            .lineage_bytes
            .set(i64::try_from(self.feed.bytes_used()).unwrap_or(i64::MAX));
        let stats = self.stats();
        self.metrics.observe_stats(&stats);
        self.metrics
            .observe_rebuilds(&self.state.block_map_rebuilds());
        self.metrics
            .observe_sources(self.sources.len(), self.sources.bytes_used());
        self.metrics
            .charged_sources
            .set(i64::try_from(self.state.charged_sources()).unwrap_or(i64::MAX));
        self.trim.observe(stats.bytes_used);
    }
}
