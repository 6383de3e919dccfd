//! Generated `ckf.v1` messages, enums, clients (`*_client`) and servers (`*_server`).
//!
//! Field-by-field documentation lives in the `.proto` files and is carried into the generated
//! doc comments.
#![allow(missing_docs, clippy::all, clippy::pedantic)]

tonic::include_proto!("ckf.v1");

pub use crate::block_hashes::BlockHashQuery;
