//! A restart's rebuild of the state actor from what its journal kept (`docs/design.md`, "Lane
//! recovery and failure boundaries": the producer-generation rebuild): the checkpoint's records
//! restored, then the log's replayed through the same code as live input
//! ([`super::records`] says what each holds).

use super::Actor;
use super::records::{CheckpointRecord, LogRecord, RestoreReport, UndecodableRecord};
use crate::engines::PublisherId;
use crate::events::IngestBatch;

impl Actor {
    /// Rebuilds the state from a recovered journal: the checkpoint, then the log replayed
    /// through the same code as live input. Call on a fresh actor, before [`Actor::run`] and
    /// before a journal is attached (nothing replayed is journaled again).
    ///
    /// # Errors
    /// [`UndecodableRecord`]; the actor is then half-built and must be discarded.
    pub fn restore(
        &mut self,
        checkpoint: &[Vec<u8>],
        log: &[Vec<u8>],
    ) -> Result<RestoreReport, UndecodableRecord> {
        debug_assert!(
            !self.journaling.is_on(),
            "restore before attaching the journal"
        );
        let mut report = RestoreReport::default();
        // Every tracked block is an edge of some member, and every edge takes at least one
        // byte of a record: a summary claiming more blocks than the checkpoint has bytes is
        // wrong (a writer bug; the count passed its CRC), and is cut to that before it sizes
        // anything.
        let checkpoint_bytes: u64 = checkpoint.iter().map(|r| r.len() as u64).sum();
        let mut sources = Vec::new();
        for (index, bytes) in checkpoint.iter().enumerate() {
            let record: CheckpointRecord =
                postcard::from_bytes(bytes).map_err(|e| UndecodableRecord {
                    what: "checkpoint",
                    index,
                    why: e.to_string(),
                })?;
            match record {
                CheckpointRecord::Summary { unique_blocks } => {
                    debug_assert_eq!(index, 0, "the summary is the checkpoint's first record");
                    report.summary_blocks = unique_blocks;
                    match self
                        .state
                        .presize_blocks(unique_blocks.min(checkpoint_bytes))
                    {
                        Ok(sized_for) => report.presized_blocks = sized_for,
                        // Not fatal: the map then grows as the blocks arrive.
                        Err(e) => tracing::warn!(
                            error = %e,
                            "block map not presized for the checkpoint; it grows during the restore"
                        ),
                    }
                }
                CheckpointRecord::Members(images) => {
                    for image in images {
                        let outcome = self.state.restore_member(&image);
                        report.members += 1;
                        report.edges += u64::from(outcome.applied);
                        report.omitted += u64::from(outcome.omitted);
                    }
                }
                CheckpointRecord::Lineage(images) => self.feed.restore_lineage(images),
                CheckpointRecord::Fed(fed) => self.feed.restore_fed(fed),
                CheckpointRecord::Sources(entries) => sources.extend(entries),
                CheckpointRecord::EngineSequences(entries) => self.feed.restore_sequences(entries),
                CheckpointRecord::EngineIdentities(entries) => {
                    self.feed.restore_identities(entries);
                }
            }
        }
        self.sources.restore(sources);
        // Replay with the quotas off (see the module docs), metrics into a scratch registry.
        let quotas = self.state.quotas();
        self.state.set_quotas(ckf_core::dc::Quotas::UNLIMITED);
        let live_metrics = std::mem::take(&mut self.metrics);
        let result = self.replay(log, &mut report);
        self.metrics = live_metrics;
        self.state.set_quotas(quotas);
        result?;
        // Clears replayed from the log are swept before the producer serves (nothing waits yet).
        self.state.finish_releases();
        // The restored members were counted per record; a member spanning records once.
        report.members = self.state.members().count() as u64;
        Ok(report)
    }

    fn replay(
        &mut self,
        log: &[Vec<u8>],
        report: &mut RestoreReport,
    ) -> Result<(), UndecodableRecord> {
        for (index, bytes) in log.iter().enumerate() {
            let undecodable = |why: String| UndecodableRecord {
                what: "log",
                index,
                why,
            };
            let record: LogRecord =
                postcard::from_bytes(bytes).map_err(|e| undecodable(e.to_string()))?;
            match record {
                LogRecord::Ingest {
                    source,
                    sequence,
                    events,
                } => {
                    let source_id = ckf_core::identity::SourceId::new(source)
                        .map_err(|e| undecodable(format!("source id: {e}")))?;
                    self.ingest(&IngestBatch {
                        source_id,
                        sequence,
                        events: events.into_iter().map(Ok).collect(),
                    });
                }
                LogRecord::EngineApply {
                    publisher,
                    sequence,
                    batch,
                } => self.engine_batch(&PublisherId::from(publisher), sequence, &batch),
                LogRecord::EngineClear { publisher, reason } => {
                    self.engine_clear(&PublisherId::from(publisher), reason.into())
                }
                LogRecord::Charges(charges) => self.state.restore_charges(&charges),
            }
            report.replayed += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
