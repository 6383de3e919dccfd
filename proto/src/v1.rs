//! Generated `ckf.v1` messages, enums, clients (`*_client`) and servers (`*_server`).
//!
//! Field-by-field documentation lives in the `.proto` files and is carried into the generated
//! doc comments.
#![allow(missing_docs, clippy::all, clippy::pedantic)]

tonic::include_proto!("ckf.v1");

pub use crate::block_hashes::BlockHashQuery;

/// The 64-lane ready mask of an answer, split on the wire into `ready_mask` (lanes 0..31) and
/// `ready_mask_high` (lanes 32..63) so that clients of indexers of at most 32 lanes read the
/// same `uint32` field as ever.
pub fn split_ready_mask(mask: u64) -> (u32, u32) {
    (mask as u32, (mask >> 32) as u32)
}

/// The ready mask of `low` (lanes 0..31) and `high` (lanes 32..63): bit `i` = lane `i`.
pub fn join_ready_mask(low: u32, high: u32) -> u64 {
    u64::from(low) | u64::from(high) << 32
}

macro_rules! ready_lanes {
    ($($message:ty),*) => {$(
        impl $message {
            /// Every ready lane of the answer, bit `i` = lane `i` (`ready_mask` and
            /// `ready_mask_high` joined).
            pub fn ready_lanes(&self) -> u64 {
                join_ready_mask(self.ready_mask, self.ready_mask_high)
            }
        }
    )*};
}
ready_lanes!(QueryResult, FindMatchesResponse, RouteResponse);
