//! The Mooncake workload: per-request local block hashes, their chained sequence hashes, and the
//! assignment of requests to the lanes (DCs; 16 unless `--lanes N`).
//!
//! Hash rule (both implementations see the same prefix structure):
//! * local (token) hash of a block: `LocalBlockHash(fmix64(hash_id ^ LOCAL_SALT))`. Mooncake's
//!   `hash_ids` stand for 512-token blocks; this stands for the per-block token hash an engine
//!   computes.
//! * chained sequence hash: dynamo's own rule, `compute_seq_hash_for_block` (first block = its
//!   local hash; then xxh3 over (parent sequence hash, local hash)). ckf-core is fed these
//!   `u64`s; dynamo's CKF and radix trees are fed the local hashes and chain (CKF) or walk by
//!   local hash (radix trees) themselves. Equal prefixes give equal hashes on every side.

use std::collections::HashSet;

use ckf_core::addressing::fmix64;
use ckf_core::dc::FoldHashBuilder;
use dynamo_kv_router::protocols::{LocalBlockHash, compute_seq_hash_for_block};

/// Lanes (DCs) in every table unless `--lanes N` says otherwise.
pub const DEFAULT_LANES: usize = 16;
/// dynamo's CKF consumer holds at most 16 lanes (`u16` ready masks).
pub const DYN_MAX_LANES: usize = 16;
const LOCAL_SALT: u64 = 0x6D6F_6F6E_6361_6B65;
const LANE_SALT: u64 = 0x1A2B_3C4D_5E6F_7081;
/// Besides its home lane, a request is stored in each other lane with probability 1/SHARE_ONE_IN.
const SHARE_ONE_IN: u64 = 8;

/// The trace as both kinds of input.
pub struct Trace {
    /// Per request: local (token) block hashes, dynamo's query input.
    pub local: Vec<Vec<LocalBlockHash>>,
    /// Per request: chained sequence hashes, ckf-core's and the HashMap's query input.
    pub chained: Vec<Vec<u64>>,
}

/// Reads the JSONL trace; errors name the path and the line.
pub fn load(path: &str) -> Result<Trace, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "cannot read the Mooncake trace at {path}: {e}\n\
             (the public Mooncake FAST'25 conversation trace: pass `--trace PATH` or set \
             CKF_TRACE)"
        )
    })?;
    let mut local = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("{path}:{}: {e}", n + 1))?;
        let ids = v
            .get("hash_ids")
            .and_then(|h| h.as_array())
            .ok_or_else(|| format!("{path}:{}: no hash_ids array", n + 1))?;
        let mut blocks = Vec::with_capacity(ids.len());
        for id in ids {
            let id = id
                .as_u64()
                .ok_or_else(|| format!("{path}:{}: hash id {id} is not a u64", n + 1))?;
            blocks.push(LocalBlockHash(fmix64(id ^ LOCAL_SALT)));
        }
        local.push(blocks);
    }
    if local.is_empty() {
        return Err(format!("{path}: no requests"));
    }
    let chained = local
        .iter()
        .map(|l| compute_seq_hash_for_block(l))
        .collect();
    Ok(Trace { local, chained })
}

/// Lane mask of request `i` over `lanes` lanes: its home lane `fmix64(i) % lanes`, plus each
/// other lane with probability 1/8 (sharing; ~2.9 lanes per request at 16 lanes, ~8.9 at 64).
pub fn lanes_of(i: usize, lanes: usize) -> u64 {
    let home = (fmix64(i as u64 ^ LANE_SALT) % lanes as u64) as usize;
    let mut mask = 1u64 << home;
    for lane in 0..lanes {
        if fmix64((i * lanes + lane) as u64 ^ !LANE_SALT).is_multiple_of(SHARE_ONE_IN) {
            mask |= 1 << lane;
        }
    }
    mask
}

/// One engine store event for a lane: the request's blocks the lane does not hold yet.
pub struct StoreEvent {
    /// Request index in the trace.
    pub request: usize,
    /// First stored position; the parent is position `start - 1` (none when 0).
    pub start: usize,
}

/// Per lane: the store events (in trace order) and the set of chained hashes it holds.
pub struct LaneFill {
    pub events: Vec<Vec<StoreEvent>>,
    pub held: Vec<HashSet<u64, FoldHashBuilder>>,
}

impl LaneFill {
    /// Number of lanes.
    pub fn lanes(&self) -> usize {
        self.events.len()
    }
}

/// Stores every request in the lanes of [`lanes_of`]. Each lane's block set is prefix-closed,
/// so a store event carries only the suffix the lane lacks, with its parent: what an engine
/// emits.
pub fn fill_lanes(trace: &Trace, lanes: usize) -> LaneFill {
    let mut events: Vec<Vec<StoreEvent>> = (0..lanes).map(|_| Vec::new()).collect();
    let mut held: Vec<HashSet<u64, FoldHashBuilder>> =
        (0..lanes).map(|_| HashSet::default()).collect();
    for (i, q) in trace.chained.iter().enumerate() {
        let mask = lanes_of(i, lanes);
        for lane in (0..lanes).filter(|l| mask & (1 << l) != 0) {
            let start = q.iter().take_while(|h| held[lane].contains(h)).count();
            if start == q.len() {
                continue;
            }
            held[lane].extend(q[start..].iter().copied());
            events[lane].push(StoreEvent { request: i, start });
        }
    }
    LaneFill { events, held }
}
