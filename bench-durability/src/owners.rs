//! The in-memory structure every backend recovers into: the producer's exact block map shape,
//! block hash -> refcount + three inline owner tags (16 bytes), with a spill list for further
//! owners, and a tag table mapping tags back to members. All backends pay the same cost here.

use std::collections::HashMap;

use crate::workload::{Digest, Member};

/// Refcount and up to three inline owner tags (`0` = empty), as in the producer.
#[derive(Debug, Clone, Copy, Default)]
pub struct Owners {
    refcount: u32,
    inline: [u32; 3],
}

/// Block hash -> owners, plus member tags.
pub struct OwnersMap {
    map: HashMap<u64, Owners, foldhash::fast::FixedState>,
    spill: Vec<(u64, u32)>,
    tags: HashMap<Member, u32, foldhash::fast::FixedState>,
    members: Vec<Member>,
}

impl OwnersMap {
    /// An empty map with room for `edges` blocks.
    pub fn with_capacity(edges: usize) -> Self {
        OwnersMap {
            map: HashMap::with_capacity_and_hasher(edges, Default::default()),
            spill: Vec::new(),
            tags: HashMap::default(),
            members: vec![Member { id: 0, rank: 0 }],
        }
    }

    /// The tag of `m`, assigning the next one on first sight.
    pub fn tag(&mut self, m: Member) -> u32 {
        let next = self.members.len() as u32;
        let t = *self.tags.entry(m).or_insert(next);
        if t == next {
            self.members.push(m);
        }
        t
    }

    /// Adds `tag` as an owner of `hash`.
    #[inline]
    pub fn store(&mut self, hash: u64, tag: u32) {
        let o = self.map.entry(hash).or_default();
        match o.inline.iter_mut().find(|t| **t == 0) {
            Some(slot) => *slot = tag,
            None => self.spill.push((hash, tag)),
        }
        o.refcount += 1;
    }

    /// Drops `tag` as an owner of `hash`; `false` when it was not one.
    #[inline]
    pub fn remove(&mut self, hash: u64, tag: u32) -> bool {
        let Some(o) = self.map.get_mut(&hash) else {
            return false;
        };
        if let Some(t) = o.inline.iter_mut().find(|t| **t == tag) {
            *t = 0;
        } else if let Some(i) = self.spill.iter().position(|&e| e == (hash, tag)) {
            self.spill.swap_remove(i);
        } else {
            return false;
        }
        o.refcount -= 1;
        if o.refcount == 0 {
            self.map.remove(&hash);
        }
        true
    }

    /// Digest of the edges held (not timed: the check that recovery was complete and exact).
    pub fn digest(&self) -> Digest {
        let mut d = Digest::default();
        for (&h, o) in &self.map {
            for &t in o.inline.iter().filter(|&&t| t != 0) {
                d.add(self.members[t as usize], h);
            }
        }
        for &(h, t) in &self.spill {
            d.add(self.members[t as usize], h);
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_remove_and_digest_match_a_set_model() {
        let a = Member { id: 1, rank: 0 };
        let b = Member { id: 2, rank: 1 };
        let mut m = OwnersMap::with_capacity(4);
        let (ta, tb) = (m.tag(a), m.tag(b));
        assert_eq!(m.tag(a), ta);
        for t in [ta, tb] {
            m.store(10, t);
        }
        m.store(11, ta);
        assert!(m.remove(10, ta));
        assert!(!m.remove(10, ta));
        let mut want = Digest::default();
        want.add(b, 10);
        want.add(a, 11);
        assert_eq!(m.digest(), want);
    }
}
