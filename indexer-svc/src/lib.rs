//! # indexer-svc (`ckf-indexer`)
//!
//! The global transposed CKF consumer (`ckf_core::global::GlobalCkfIndexer`) as a gRPC service:
//! DC producers attach over `ckf.v1.Relay` and stream barrier snapshots, deltas, heartbeats and
//! drain markers into their lanes; routers ask `ckf.v1.Query/FindMatches` for the prefix depth of
//! a block-hash sequence in every ready lane. Every rule (leases, lane states, acceptance,
//! deadlines, search) is ckf-core's; this crate adds transport, configuration, metrics and
//! lifecycle.
//!
//! | module | owns |
//! | --- | --- |
//! | [`embedded`] | [`EmbeddedQuery`]: a router process as an indexer replica, queried in-process |
//! | [`access`] | `[auth]`: producer principals -> pools (checked before `attach`), the Query and Admin tokens, SIGHUP reload |
//! | [`config`] | `IndexerConfig` (the primary domain's manifest, `[[domains]]` in `config::domains`, table format, lag policy, limits, addresses) and the `ckf-indexer` flags |
//! | [`catalog`] | catalog reloads: domains added and removed at run time (SIGHUP, file watch, `Admin/ReloadCatalog`), the others untouched |
//! | [`admin`] | `Admin/ReloadCatalog` behind the admin token |
//! | [`relay`] | `Relay/Publish`: attach -> lease -> frames into the lane's ingestor -> Ack / Retired |
//! | [`query`] | `Query/FindMatches` and `Query/ListLanes` |
//! | [`router`] | [`router::Router`], the one path of every Route (RPC, batch, embedded): the prefix search, each ready lane's kept load report and round trip, `ckf_core::route`'s ranking and choice, bookings |
//! | [`route`] | `Query/Route` and `Query/RouteBatch`: decode and check, count, the answer on the wire |
//! | [`status`] | the one mapping of failures to gRPC statuses and `Retired` replies |
//! | [`metrics`] | Prometheus metrics (`ckf_indexer_*`) |
//! | [`lane_watch`] | lane events -> retirement counters and lane gauges |
//! | [`state`] | [`state::IndexerState`]: what the handlers share; [`state::Domain`]: one domain's consumer, workers, router, counters |
//! | [`server`] | [`serve`] / [`serve_from`] / [`serve_loaded`]: binds, wires health/reflection/metrics, runs until shutdown |
//!
//! ```no_run
//! # async fn demo() -> Result<(), indexer_svc::ServeError> {
//! let config = indexer_svc::IndexerConfig::for_lanes("prod", &["dc-a", "dc-b"]);
//! let running = indexer_svc::serve(config, std::future::pending()).await?;
//! println!("gRPC on {}, metrics on {}", running.grpc_addr, running.metrics_addr);
//! running.stop().await?;
//! # Ok(()) }
//! ```

pub mod access;
pub mod admin;
pub mod catalog;
pub mod config;
pub mod embedded;
pub mod lane_watch;
pub mod metrics;
pub mod query;
pub mod relay;
pub mod route;
pub mod router;
pub mod server;
pub mod state;
pub mod status;

pub use config::{Cli, IndexerConfig};
pub use embedded::EmbeddedQuery;
pub use server::{RunningIndexer, ServeError, serve, serve_from, serve_loaded};
