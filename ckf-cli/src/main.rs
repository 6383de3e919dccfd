//! ckf (being written).
fn main() {}
