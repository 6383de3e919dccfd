//! The operator commands: each asks a running service one thing and prints the answer (text
//! or `--json`); `certs` issues development certificates and token files.
//!
//! | module | owns |
//! | --- | --- |
//! | [`args`] | the flags of `query`, `route`, `lanes`, `reload-catalog`, `source-sequence`, `health` |
//! | [`query`] | `ckf query`: `FindMatches` by hashes or ids, `FindMatchesByTokens` by token ids |
//! | [`route`] | `ckf route`: `Route`, the DCs ranked by expected time to first token |
//! | [`lanes`] | `ckf lanes`: `ListLanes` |
//! | [`reload`] | `ckf reload-catalog`: `Admin/ReloadCatalog` (or its dry run) |
//! | [`source_sequence`] | `ckf source-sequence`: `GetSourceSequence` on a producer |
//! | [`health`] | `ckf health`: `grpc.health.v1` check, exit code for scripts |
//! | [`certs`] | `ckf certs`: development CA, indexer / producer / query certificates, token files (rcgen) |

pub mod args;
pub mod certs;
pub mod health;
pub mod lanes;
pub mod query;
pub mod reload;
pub mod route;
pub mod source_sequence;
