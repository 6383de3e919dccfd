//! Embedded mode: a Rust router process becomes an indexer replica itself.
//!
//! A router that links this crate starts an indexer with [`crate::serve`] inside its own process:
//! the DC producers attach to it over `ckf.v1.Relay` exactly as they attach to a standalone
//! `ckf-indexer` (a producer publishes to every indexer in its `indexers` list, so a router
//! replica is one more entry there, not a new protocol). The router then answers its routing
//! decisions with [`EmbeddedQuery`] in-process: no gRPC, no protobuf, no task hop, the cost of
//! the search itself (`ckf-core`'s [`GlobalCkfIndexer::find_prefix_matches`]).
//!
//! ```no_run
//! # async fn router() -> Result<(), indexer_svc::ServeError> {
//! use indexer_svc::{IndexerConfig, serve};
//! let mut config = IndexerConfig::for_lanes("prod", &["dc-a", "dc-b"]);
//! config.listen = "0.0.0.0:7400".parse().unwrap(); // where the producers attach (set [tls] and [auth] too)
//! let running = serve(config, std::future::pending()).await?;
//! let query = running.query_handle(); // Clone + Send + Sync: hand one to each router thread
//! let matches = query.find_prefix_matches(&[0x1234, 0x5678]);
//! if let Some((lane, depth)) = matches.best() {
//!     println!("longest prefix in {} ({depth} blocks cached)", query.pool(lane));
//! }
//! // Or the Route decision itself (cached prefix, load, round trip), booked like the RPC's.
//! let request = indexer_svc::router::RouteQuery::by_hashes(vec![0x1234, 0x5678]);
//! if let Ok(Some((lane, reason))) = query.route(&request).map(|routed| routed.choice) {
//!     println!("route to {} ({})", query.pool(lane), reason.label());
//! }
//! # Ok(()) }
//! ```
//!
//! What the replica keeps from the standalone service: the same configuration (TOML, figment
//! keys; `[auth]`, `[tls]` and `[transport]` protect the Relay listener as they do in
//! `ckf-indexer`), leases, lane state machine, deadlines, metrics on `metrics_listen`, and the
//! gRPC Query service on its listener for operators (`ckf lanes`, `ckf query`). What differs:
//! - in-process queries are not counted in `ckf_indexer_queries_*` (they never cross the
//!   service), and the `limits.max_query_blocks` bound of the RPC does not apply to block
//!   hashes (it protects the network service from large requests; an in-process caller pays
//!   for its own);
//! - [`EmbeddedQuery::route`] is the `Route` RPC's own path ([`crate::router::Router`]): the
//!   same kept load reports, the same bookings (an in-process choice is booked on the queue
//!   the RPC's next request sees, and the other way round) and the same
//!   `ckf_indexer_route_decisions_total`;
//! - [`EmbeddedQuery`] needs no async runtime: any thread may call it, concurrently with the
//!   lanes' ingestion (the design's weak-read contract: a query may see a delta half-applied
//!   and no query retries).
//!
//! The example `tests/examples/embedded_router.rs` (crate `ckf-e2e`) runs a replica with two
//! in-process producers and prints the in-process query latency next to the gRPC `FindMatches`
//! latency of the same replica.

use std::sync::Arc;

use ckf_core::global::GlobalCkfIndexer;
use ckf_core::identity::{LaneIndex, PoolId};
use ckf_core::lane::LaneStatus;
use ckf_core::search::PrefixMatches;
use ckf_core::tokens::{TokenQuery, TokenQueryError};

use crate::router::{RouteQuery, Routed, Router};

/// An in-process query handle on a running indexer: cheap to clone (one `Arc`), `Send + Sync`,
/// usable from any thread without an async runtime. Obtained with
/// [`crate::RunningIndexer::query_handle`]. It stays valid after the indexer stops, but then
/// answers from the tables as they were last installed (no lane is updated or retired any
/// more): a router stops querying a replica it has stopped.
#[derive(Debug, Clone)]
pub struct EmbeddedQuery {
    indexer: Arc<GlobalCkfIndexer>,
    router: Router,
}

impl EmbeddedQuery {
    /// A handle on `router`'s indexer, answering token queries under its rules (the indexer's
    /// `block_size` and `limits.max_query_blocks`) and routing with its loads and bookings.
    pub fn new(router: Router) -> Self {
        Self {
            indexer: Arc::clone(router.indexer()),
            router,
        }
    }

    /// For every lane ready when the query starts, how many leading blocks of `block_hashes`
    /// (64-bit sequence block hashes, prefix order) the lane holds: the prefix depth, `0..=len`.
    /// The same answer as the `FindMatches` RPC; allocation-free. Never fails.
    pub fn find_prefix_matches(&self, block_hashes: &[u64]) -> PrefixMatches {
        self.indexer.find_prefix_matches(block_hashes)
    }

    /// [`EmbeddedQuery::find_prefix_matches`] on the canonical sequence hashes of a request's
    /// token ids (`proto/TOKEN_HASH.md`), as the `FindMatchesByTokens` RPC computes them.
    ///
    /// Each lane is answered in its own block size (`block_size`, or `manifest.block_sizes`).
    ///
    /// # Errors
    /// [`TokenQueryError`] for a block size none of the lanes uses, more than
    /// `max_query_blocks x block_size` tokens, or a bad multimodal item (the RPC's
    /// `INVALID_ARGUMENT` cases).
    pub fn find_prefix_matches_by_tokens(
        &self,
        query: &TokenQuery,
    ) -> Result<PrefixMatches, TokenQueryError> {
        // A long request is hashed only as far as the search needs.
        self.router.find_by_tokens(query)
    }

    /// Which DC should serve a request, by block hashes or token ids: the `Route` RPC's answer
    /// ([`crate::route::wire_answer`] puts it on the wire), from the same code, load reports
    /// and bookings. The choice is booked until its lane's next load report.
    ///
    /// # Errors
    /// [`TokenQueryError`] for a token query breaking the indexer's rules (as
    /// [`EmbeddedQuery::find_prefix_matches_by_tokens`]); nothing is booked.
    pub fn route(&self, query: &RouteQuery) -> Result<Routed, TokenQueryError> {
        self.router.route(query)
    }

    /// The pool (indexer domain + DC) that `lane` serves, to resolve an answer to an endpoint.
    ///
    /// # Panics
    /// When `lane` is not a lane of the manifest (every lane of a [`PrefixMatches`] is).
    pub fn pool(&self, lane: LaneIndex) -> &PoolId {
        self.indexer.pool(lane)
    }

    /// The lanes that would answer a query now (bit i = lane i).
    pub fn ready_mask(&self) -> u64 {
        self.indexer.ready_mask()
    }

    /// Every configured lane's state (lease, sequence, retirements), as `ListLanes` reports it.
    pub fn lane_statuses(&self) -> Vec<LaneStatus> {
        self.indexer.lane_statuses()
    }

    /// The core consumer itself, for what this handle does not wrap.
    pub fn indexer(&self) -> &Arc<GlobalCkfIndexer> {
        &self.indexer
    }
}
