//! ckf-producer (being written).
fn main() {}
