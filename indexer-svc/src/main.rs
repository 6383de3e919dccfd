//! ckf-indexer (being written).
fn main() {}
