//! The Mooncake FAST'25 conversation trace (public, Apache-2.0; not part of this repository),
//! read as each request's `hash_ids` (one id per 512-token block).

use ckf_core::addressing::fmix64;

/// Where the trace is read from: `-- trace PATH` (`args`), else the `CKF_TRACE` environment
/// variable; empty when neither names it (the trace rows are then skipped, saying so).
pub fn path(args: &[String]) -> String {
    args.iter()
        .position(|a| a == "trace")
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| std::env::var("CKF_TRACE").ok())
        .unwrap_or_default()
}

/// Mooncake trace: each request's `hash_ids` (one id per 512-token block).
pub fn load_ids(path: &str) -> Option<Vec<Vec<u64>>> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).ok()?;
            let ids = v.get("hash_ids")?.as_array()?;
            Some(ids.iter().map(|id| id.as_u64().unwrap_or(0)).collect())
        })
        .collect()
}

/// Mooncake trace: chained block hashes per request (`h_i = fmix64(h_{i-1} ^ fmix64(id + 1))`,
/// so equal prefixes give equal hashes), from [`load_ids`].
pub fn load(path: &str) -> Option<Vec<Vec<u64>>> {
    let requests = load_ids(path)?;
    Some(
        requests
            .into_iter()
            .map(|ids| {
                let mut h = 0u64;
                ids.into_iter()
                    .map(|id| {
                        h = fmix64(h ^ fmix64(id + 1));
                        h
                    })
                    .collect()
            })
            .collect(),
    )
}
