//! The producer's ownership workload, generated up front so that the timed loops only write.
//!
//! * Members: `members` pairs of (worker id `u64`, rank `u32`); a member owns block hashes.
//! * Fill: `blocks` ownership edges spread evenly over the members (the steady state).
//! * Op stream: events of 1-64 blocks for one member each, stores of new block hashes and
//!   removals of hashes the member owns, 50/50, until `ops` block ops have been generated.
//!   Removals pick random owned hashes, so the number of tracked edges stays near `blocks`.
//!
//! Block hashes are a bijective mix of a counter, so every stored hash is new (no accidental
//! duplicate edges that would make the exact model ambiguous).

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Blocks per event: uniform in `1..=MAX_EVENT_BLOCKS`.
pub const MAX_EVENT_BLOCKS: usize = 64;

/// One member: worker id and rank (the producer's `MemberId`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Member {
    /// Worker id.
    pub id: u64,
    /// Rank within the worker.
    pub rank: u32,
}

impl Member {
    /// The 12-byte big-endian key prefix `id || rank` used by redb and fjall.
    pub fn prefix(self) -> [u8; 12] {
        let mut p = [0u8; 12];
        p[..8].copy_from_slice(&self.id.to_be_bytes());
        p[8..].copy_from_slice(&self.rank.to_be_bytes());
        p
    }

    /// The 20-byte store key `id || rank || hash` (big-endian, so a member's edges are adjacent).
    pub fn key(self, hash: u64) -> [u8; 20] {
        let mut k = [0u8; 20];
        k[..12].copy_from_slice(&self.prefix());
        k[12..].copy_from_slice(&hash.to_be_bytes());
        k
    }

    /// Inverse of [`Member::key`].
    pub fn from_key(k: &[u8]) -> (Member, u64) {
        let id = u64::from_be_bytes(k[..8].try_into().expect("20-byte key"));
        let rank = u32::from_be_bytes(k[8..12].try_into().expect("20-byte key"));
        let hash = u64::from_be_bytes(k[12..20].try_into().expect("20-byte key"));
        (Member { id, rank }, hash)
    }
}

/// One event of the op stream: `len` hashes at `hashes[start..start + len]`.
#[derive(Debug, Clone, Copy)]
pub struct Event {
    /// Index into [`Workload::members`].
    pub member: u32,
    /// Store (`true`) or removal (`false`).
    pub store: bool,
    /// First hash in [`Workload::hashes`].
    pub start: u32,
    /// Number of blocks, `1..=64`.
    pub len: u32,
}

/// Order-independent digest of a set of ownership edges: edge count and a wrapping sum of a
/// mix of each edge. Two states with equal digests are, for this benchmark, the same state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Digest {
    /// Number of edges.
    pub edges: u64,
    /// Wrapping sum of [`edge_mix`] over the edges.
    pub sum: u64,
}

impl Digest {
    /// Adds one edge.
    pub fn add(&mut self, m: Member, hash: u64) {
        self.edges += 1;
        self.sum = self.sum.wrapping_add(edge_mix(m, hash));
    }

    /// Removes one edge (the inverse of [`Digest::add`]).
    pub fn sub(&mut self, m: Member, hash: u64) {
        self.edges -= 1;
        self.sum = self.sum.wrapping_sub(edge_mix(m, hash));
    }
}

/// splitmix64's finaliser: a bijection on `u64`.
pub fn mix64(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The per-edge term of [`Digest`].
pub fn edge_mix(m: Member, hash: u64) -> u64 {
    mix64(mix64(m.id ^ (u64::from(m.rank) << 48)) ^ hash)
}

/// The whole pre-generated workload.
pub struct Workload {
    /// The members, indexed by [`Event::member`].
    pub members: Vec<Member>,
    /// Each member's hashes after the fill (the warm-up state every backend starts from).
    pub fill: Vec<Vec<u64>>,
    /// The op stream.
    pub events: Vec<Event>,
    /// Hashes of all events, back to back.
    pub hashes: Vec<u64>,
    /// Digest of the state after the fill and all events.
    pub final_digest: Digest,
}

impl Workload {
    /// Generates `blocks` fill edges over `members` members and an op stream of at least `ops`
    /// block ops, deterministically from `seed`.
    pub fn generate(blocks: u64, members: u32, ops: u64, seed: u64) -> Workload {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut counter = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut next_hash = || {
            counter = counter.wrapping_add(1);
            mix64(counter)
        };
        let ms: Vec<Member> = (0..members)
            .map(|i| Member {
                id: mix64(0x5eed_0000 + u64::from(i)),
                rank: i % 8,
            })
            .collect();
        let per = blocks / u64::from(members);
        let extra = blocks % u64::from(members);
        let fill: Vec<Vec<u64>> = (0..u64::from(members))
            .map(|i| {
                (0..per + u64::from(i < extra))
                    .map(|_| next_hash())
                    .collect()
            })
            .collect();
        let mut model = fill.clone();
        let mut events = Vec::with_capacity((ops / 30) as usize);
        let mut hashes = Vec::with_capacity(ops as usize + MAX_EVENT_BLOCKS);
        let mut done = 0u64;
        while done < ops {
            let member = rng.random_range(0..members);
            let owned = &mut model[member as usize];
            let want = rng.random_range(1..=MAX_EVENT_BLOCKS);
            let store = rng.random_bool(0.5) || owned.is_empty();
            let start = hashes.len() as u32;
            let len = if store {
                for _ in 0..want {
                    let h = next_hash();
                    owned.push(h);
                    hashes.push(h);
                }
                want
            } else {
                let n = want.min(owned.len());
                for _ in 0..n {
                    let i = rng.random_range(0..owned.len());
                    hashes.push(owned.swap_remove(i));
                }
                n
            };
            events.push(Event {
                member,
                store,
                start,
                len: len as u32,
            });
            done += len as u64;
        }
        let mut final_digest = Digest::default();
        for (m, hs) in ms.iter().zip(&model) {
            for &h in hs {
                final_digest.add(*m, h);
            }
        }
        Workload {
            members: ms,
            fill,
            events,
            hashes,
            final_digest,
        }
    }

    /// Digest of the state after the fill and the first `events` events.
    pub fn digest_after(&self, events: usize) -> Digest {
        let mut d = Digest::default();
        for (m, hs) in self.members.iter().zip(&self.fill) {
            for &h in hs {
                d.add(*m, h);
            }
        }
        for ev in &self.events[..events] {
            let m = self.members[ev.member as usize];
            for &h in self.event_hashes(ev) {
                if ev.store { d.add(m, h) } else { d.sub(m, h) }
            }
        }
        d
    }

    /// Block ops in the op stream.
    pub fn ops(&self) -> u64 {
        self.hashes.len() as u64
    }

    /// Edges after the fill.
    pub fn fill_edges(&self) -> u64 {
        self.fill.iter().map(|v| v.len() as u64).sum()
    }

    /// The hashes of `ev`.
    pub fn event_hashes(&self, ev: &Event) -> &[u64] {
        &self.hashes[ev.start as usize..(ev.start + ev.len) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_is_half_stores_and_keeps_the_edge_count() {
        let w = Workload::generate(100_000, 100, 200_000, 7);
        let stores: u64 = w
            .events
            .iter()
            .filter(|e| e.store)
            .map(|e| u64::from(e.len))
            .sum();
        let frac = stores as f64 / w.ops() as f64;
        assert!((0.45..0.55).contains(&frac), "store fraction {frac}");
        let drift = w.final_digest.edges as i64 - w.fill_edges() as i64;
        assert_eq!(drift, 2 * stores as i64 - w.ops() as i64);
        assert_eq!(w.digest_after(w.events.len()), w.final_digest);
        assert_eq!(w.digest_after(0).edges, w.fill_edges());
    }

    #[test]
    fn key_round_trips() {
        let m = Member {
            id: u64::MAX - 3,
            rank: 7,
        };
        assert_eq!(Member::from_key(&m.key(42)), (m, 42));
    }
}
