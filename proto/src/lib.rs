//! ckf.v1 wire contract (being written).
