//! # ckf-testkit
//!
//! Test support shared by `indexer-svc`'s tests and the end-to-end tests in `tests/`
//! (`publish = false`; never a dependency of a service). The core-level helpers (frames under a
//! lease, installing a snapshot in-process) are `ckf_core::testing`, behind ckf-core's `testing`
//! feature; this crate holds what needs gRPC.
//!
//! | module | owns |
//! | --- | --- |
//! | [`relay`] | the one raw `ckf.v1.Relay` client (hand-built, possibly broken frames; replies and the terminal status) and a hand-packed table |

pub mod relay;
