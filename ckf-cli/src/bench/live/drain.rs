//! Drains of the live run: a fresh block per publisher (or per DC, for the gRPC feed) stored,
//! waited for until the indexer shows it, then removed. Once it is visible, everything sent
//! before it on that path has been applied: the replay starts from, and ends with, a settled
//! index.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ckf_proto::v1::{self, kv_event::Kind, query_client::QueryClient};
use ckf_svc_kit::access::AuthedChannel;

use super::dcs::{Dc, PROBE_WORKER, ZmqFeed, publish, unix_seconds};
use crate::bench::events::Sources;
use crate::bench::fleet::FleetShape;
use crate::bench::probe::wait_visible;

/// Removes every fleet worker (and the probe member) from every producer.
pub(super) async fn clear_members(
    dcs: &mut [Dc],
    sources: &mut Sources,
    shape: FleetShape,
) -> Result<()> {
    for dc in dcs.iter_mut() {
        let events = (0..shape.workers_per_dc as u64)
            .chain([PROBE_WORKER])
            .map(|worker_id| v1::KvEvent {
                member: Some(v1::MemberId {
                    worker_id,
                    dp_rank: 0,
                }),
                kind: Some(Kind::WorkerRemoved(v1::WorkerRemoved {})),
            })
            .collect();
        let batch = sources.batch(&format!("{}/control", dc.name), events);
        publish(dc, batch).await?;
    }
    Ok(())
}

/// The ZMQ drain: every publisher stores a fresh block (a root of tokens nothing else has) and
/// it is waited for until the indexer shows it, then removed. Visible means the producer has
/// applied everything that publisher sent before; it also proves the subscription is live, so
/// the store is sent again each attempt that sees nothing (a PUB socket drops what it sends
/// before its subscriber has joined).
pub(super) async fn zmq_settle(
    z: &mut ZmqFeed,
    dcs: &[Dc],
    query: &mut QueryClient<AuthedChannel>,
    ranks: usize,
    timeout: Duration,
) -> Result<()> {
    use ckf_engine::encode::{Batch, BlockRemoved, BlockStored, Event};
    const ATTEMPT: Duration = Duration::from_millis(200);
    let run: u64 = rand::random::<u64>() | (1 << 63);
    for (dc, publishers) in z.publishers.iter_mut().enumerate() {
        for (rank_id, publisher) in publishers.iter_mut().enumerate() {
            z.next_sentinel += 1;
            let id = run ^ z.next_sentinel;
            let canonical = z.tokens.request(&[id])?.canonical[0];
            let engine = z
                .tokens
                .engine_of(canonical)
                .context("sentinel engine hash")?;
            let block_size = z.tokens.block_size();
            let rank = Some((rank_id % ranks) as i64);
            let store = Batch {
                ts: unix_seconds(),
                events: vec![Event::Stored(BlockStored {
                    block_hashes: vec![engine],
                    token_ids: crate::bench::feed::block_tokens(id, block_size),
                    block_size,
                    medium: Some(crate::bench::feed::MEDIUM.into()),
                    ..BlockStored::default()
                })],
                data_parallel_rank: rank,
            };
            let deadline = Instant::now() + timeout;
            let mut seen = None;
            while seen.is_none() && Instant::now() < deadline {
                publisher.publish(&store).await?;
                seen =
                    wait_visible(query, dcs[dc].lane, canonical, Instant::now() + ATTEMPT).await?;
            }
            let remove = Batch {
                ts: unix_seconds(),
                events: vec![Event::Removed(BlockRemoved {
                    block_hashes: vec![engine],
                    medium: Some(crate::bench::feed::MEDIUM.into()),
                    ..BlockRemoved::default()
                })],
                data_parallel_rank: rank,
            };
            publisher.publish(&remove).await?;
            if seen.is_none() {
                bail!(
                    "DC {} publisher {} did not drain within {:?}",
                    dcs[dc].name,
                    publisher.endpoint(),
                    timeout
                );
            }
        }
    }
    Ok(())
}

/// Drain sentinels: a fresh block stored by the probe member, waited for, then removed.
pub(super) struct Sentinel {
    pub(super) run_hash: u64,
    pub(super) next: u64,
}

impl Sentinel {
    pub(super) async fn settle(
        &mut self,
        dcs: &mut [Dc],
        query: &mut QueryClient<AuthedChannel>,
        sources: &mut Sources,
        timeout: Duration,
    ) -> Result<()> {
        for dc in dcs.iter_mut() {
            self.next += 1;
            let hash = crate::hashing::chain(self.run_hash, self.next);
            let member = Some(v1::MemberId {
                worker_id: PROBE_WORKER,
                dp_rank: 0,
            });
            let store = v1::KvEvent {
                member,
                kind: Some(Kind::Stored(v1::Stored {
                    block_hashes: vec![hash],
                    parent_hash: None,
                })),
            };
            let source = format!("{}/probe", dc.name);
            publish(dc, sources.batch(&source, vec![store])).await?;
            let seen = wait_visible(query, dc.lane, hash, Instant::now() + timeout).await?;
            let remove = v1::KvEvent {
                member,
                kind: Some(Kind::Removed(v1::Removed {
                    block_hashes: vec![hash],
                })),
            };
            publish(dc, sources.batch(&source, vec![remove])).await?;
            if seen.is_none() {
                bail!("DC {} did not drain within {:?}", dc.name, timeout);
            }
        }
        Ok(())
    }
}
