//! Helpers of the search bench kept out of its main file: per-query latency (cycle counter,
//! HDR-histogram percentiles) and the Mooncake trace.

pub mod latency;
pub mod trace;
