//! [`Router`]: the one path every Route takes: the unary `Query/Route`, each request of a
//! `Query/RouteBatch` (in order, so request k sees the bookings of requests 0..k), and an
//! embedded router's [`crate::EmbeddedQuery::route`]. It searches a request's prefix, then runs
//! `ckf_core::route` over every ready lane with its kept load report, its bookings and its round
//! trip, and books the choice on its lane until that lane's next load report. It owns the
//! lanes' kept load reports and the bookings, so the Relay handler reports loads through it
//! and every caller books on the same queues. No wire types: `crate::route` decodes, checks and
//! translates for the RPCs.

use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use ckf_core::global::GlobalCkfIndexer;
use ckf_core::identity::LaneIndex;
use ckf_core::route::{
    Bookings, DcEstimate, DcInput, LaneLoads, LoadRefused, PoolLoad, Reason, RouteModel, route,
};
use ckf_core::search::PrefixMatches;
use ckf_core::tokens::lanes::LaneBlockSizes;
use ckf_core::tokens::{TokenQuery, TokenQueryError, TokenQueryRules};
use prometheus::IntCounterVec;

use crate::config::RouteConfig;

/// A request's prefix: block hashes, or token ids hashed under the indexer's rules.
#[derive(Debug, Clone, PartialEq)]
pub enum RoutePrefix {
    /// 64-bit sequence block hashes in prefix order.
    Hashes(Vec<u64>),
    /// A request's token ids (hashed as `FindMatchesByTokens` hashes them).
    Tokens(TokenQuery),
}

/// One Route request, decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteQuery {
    /// The request's prefix.
    pub prefix: RoutePrefix,
    /// Tokens the request prefills with nothing cached; 0 = the prefix's own: its token count,
    /// or its blocks x block size for block hashes.
    pub request_tokens: u64,
    /// The router's own round trips, by DC id; a DC not named uses the configured one, a name
    /// that is no DC of this indexer is ignored.
    pub rtt: Vec<(String, Duration)>,
    /// Estimate only: the choice is not booked nor counted as a decision (a diagnostic that must
    /// not move later choices).
    pub dry_run: bool,
}

impl RouteQuery {
    /// A query by block hashes, with the defaults (own token count, configured round trips).
    pub fn by_hashes(block_hashes: Vec<u64>) -> Self {
        Self {
            prefix: RoutePrefix::Hashes(block_hashes),
            request_tokens: 0,
            rtt: Vec::new(),
            dry_run: false,
        }
    }

    /// A query by token ids, with the defaults (own token count, configured round trips).
    pub fn by_tokens(tokens: TokenQuery) -> Self {
        Self {
            prefix: RoutePrefix::Tokens(tokens),
            request_tokens: 0,
            rtt: Vec::new(),
            dry_run: false,
        }
    }
}

/// One ranked DC: the model's estimate and what it was made of.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankedDc {
    /// The estimate.
    pub estimate: DcEstimate,
    /// Its inputs: the depth, the kept load report with its age, the bookings before this
    /// request.
    pub input: DcInput,
}

/// A Route answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Routed {
    /// Every lane ready at capture, fastest first.
    pub ranked: Vec<RankedDc>,
    /// The chosen lane and why; `None` with no ready lane.
    pub choice: Option<(LaneIndex, Reason)>,
    /// The ready lanes captured at the start of the search (bit i = lane i).
    pub ready_mask: u64,
    /// Blocks of the query (the hashes, or the token blocks).
    pub blocks: usize,
}

/// The configured round trip of each lane slot's DC (`None`: not configured, or a spare slot).
fn slot_rtts(indexer: &GlobalCkfIndexer, config: &RouteConfig) -> Arc<[Option<Duration>]> {
    (0..indexer.lane_count())
        .map(|lane| {
            let lane = LaneIndex::try_from(lane).expect("at most 64 lanes");
            indexer
                .slot(lane)
                .and_then(|pool| config.rtt(pool.dc.as_str()))
        })
        .collect()
}

/// The routing side of one domain: the search, the kept load reports, the bookings and the
/// model. Cheap to clone (shared state behind `Arc`s); every clone books on the same queues.
#[derive(Debug, Clone)]
pub struct Router {
    indexer: Arc<GlobalCkfIndexer>,
    token_rules: TokenQueryRules,
    /// Tokens per block of each lane (`block_size`, or `manifest.block_sizes`).
    block_sizes: Arc<LaneBlockSizes>,
    model: RouteModel,
    /// The configured round trip of each lane's DC (`route.rtt_ms`), by lane.
    rtts: Arc<[Option<Duration>]>,
    loads: Arc<Mutex<LaneLoads>>,
    bookings: Arc<Mutex<Bookings>>,
    /// `ckf_indexer_route_decisions_total`; `None` once the domain is removed
    /// ([`Router::retire`]).
    decisions: Arc<RwLock<Option<IntCounterVec>>>,
}

impl Router {
    /// A router over `indexer`'s lanes of `block_sizes`, token queries under `token_rules`
    /// (its block size counts the tokens of a query by hashes), the model and round trips of
    /// `config`, choices counted in `decisions` (by `domain`, `dc` and `reason`).
    ///
    /// # Panics
    /// When `block_sizes` does not have the indexer's lane count.
    pub fn new(
        indexer: Arc<GlobalCkfIndexer>,
        token_rules: TokenQueryRules,
        block_sizes: LaneBlockSizes,
        config: &RouteConfig,
        decisions: IntCounterVec,
    ) -> Self {
        let rtts = slot_rtts(&indexer, config);
        assert_eq!(
            block_sizes.lanes(),
            indexer.lane_count(),
            "a block size per lane"
        );
        Self {
            indexer,
            token_rules,
            block_sizes: Arc::new(block_sizes),
            model: config.model(),
            rtts,
            loads: Arc::default(),
            bookings: Arc::default(),
            decisions: Arc::new(RwLock::new(Some(decisions))),
        }
    }

    /// This router after its consumer's lanes changed: block sizes and round trips of the lane
    /// slots now, the same load reports, bookings and counters.
    ///
    /// # Panics
    /// When `block_sizes` does not have the indexer's lane count.
    pub fn relaned(&self, block_sizes: LaneBlockSizes, config: &RouteConfig) -> Self {
        assert_eq!(block_sizes.lanes(), self.indexer.lane_count());
        Self {
            block_sizes: Arc::new(block_sizes),
            rtts: slot_rtts(&self.indexer, config),
            ..self.clone()
        }
    }

    /// Stops counting this router's choices (every clone's): its domain was removed from the
    /// catalog, and its series are about to be swept. A call in flight that chose before
    /// counts before this returns; one that chooses after (a request that resolved the domain
    /// before its removal, an in-process handle kept past it) still answers and books, but
    /// is not counted, so the removed domain's `route_decisions` series do not come back.
    pub fn retire(&self) {
        *self
            .decisions
            .write()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// The core consumer it searches.
    pub fn indexer(&self) -> &Arc<GlobalCkfIndexer> {
        &self.indexer
    }

    /// The block size and block limit of its token queries.
    pub fn token_rules(&self) -> &TokenQueryRules {
        &self.token_rules
    }

    /// Tokens per block of every lane.
    pub fn block_sizes(&self) -> &LaneBlockSizes {
        &self.block_sizes
    }

    /// Tokens per block of `lane`.
    ///
    /// # Panics
    /// When `lane` is not a lane of the manifest.
    pub fn block_size(&self, lane: LaneIndex) -> u32 {
        self.block_sizes.of(usize::from(lane))
    }

    /// Checks a query by token ids against every lane's block size (`ckf_core`'s
    /// [`LaneBlockSizes::check`]); its full blocks in the smallest block size.
    ///
    /// # Errors
    /// [`TokenQueryError`]: the first rule the query breaks.
    pub fn check_tokens(&self, query: &TokenQuery) -> Result<usize, TokenQueryError> {
        self.block_sizes.check(query, self.token_rules.max_blocks)
    }

    /// The prefix depth of a query by token ids in every lane ready at capture, each lane in
    /// its own block size.
    ///
    /// # Errors
    /// As [`Router::check_tokens`]; nothing is searched.
    pub fn find_by_tokens(&self, query: &TokenQuery) -> Result<PrefixMatches, TokenQueryError> {
        self.indexer.find_prefix_matches_by_token_query(
            query,
            &self.block_sizes,
            self.token_rules.max_blocks,
        )
    }

    /// Checks `query` as [`Router::route`] will (the token rules), without searching.
    ///
    /// # Errors
    /// [`TokenQueryError`], as [`Router::route`].
    pub fn check(&self, query: &RouteQuery) -> Result<(), TokenQueryError> {
        match &query.prefix {
            RoutePrefix::Hashes(_) => Ok(()),
            RoutePrefix::Tokens(t) => self.check_tokens(t).map(drop),
        }
    }

    /// Routes one request: searches its prefix, estimates every lane ready at capture with its
    /// kept load report, its bookings and its round trip, ranks them, books the choice and
    /// counts it in `ckf_indexer_route_decisions_total`. Reading the bookings, choosing and
    /// booking hold one lock: concurrent requests each see the others' earlier choices.
    ///
    /// # Errors
    /// [`TokenQueryError`] for a token query breaking the indexer's rules (another block size,
    /// too many tokens, a bad multimodal item); nothing is booked.
    pub fn route(&self, query: &RouteQuery) -> Result<Routed, TokenQueryError> {
        let indexer = &self.indexer;
        let (found, query_tokens, blocks) = match &query.prefix {
            RoutePrefix::Hashes(h) => (
                indexer.find_prefix_matches(h),
                h.len() as u64 * u64::from(self.token_rules.block_size),
                h.len(),
            ),
            RoutePrefix::Tokens(t) => {
                let blocks = self.check_tokens(t)?;
                (self.find_by_tokens(t)?, t.token_ids.len() as u64, blocks)
            }
        };
        let request_tokens = match query.request_tokens {
            0 => query_tokens,
            n => n,
        };
        let now = Instant::now();
        let loads: Vec<_> = {
            let loads = self.loads.lock().expect("lane loads");
            found
                .iter()
                .map(|(lane, _)| loads.latest(lane, now))
                .collect()
        };
        let mut bookings = self.bookings.lock().expect("bookings");
        let dcs: Vec<DcInput> = found
            .iter()
            .zip(loads)
            .map(|((lane, depth), load)| {
                let dc = indexer.pool(lane).dc.as_str();
                DcInput {
                    lane,
                    depth,
                    block_size: self.block_size(lane),
                    rtt: query.rtt.iter().find(|(d, _)| d == dc).map(|(_, r)| *r),
                    configured_rtt: self.rtts[usize::from(lane)],
                    load,
                    booked: bookings.booked(lane),
                }
            })
            .collect();
        let routed = route(&self.model, request_tokens, &dcs);
        if let Some((lane, _)) = routed.choice.filter(|_| !query.dry_run) {
            bookings.book(lane, now);
        }
        drop(bookings);
        if let Some((lane, reason)) = routed.choice.filter(|_| !query.dry_run) {
            // Counted under the read lock: once `retire` returns, no choice of this domain
            // creates a series again, so the sweep that follows a removal leaves none behind.
            let decisions = self
                .decisions
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(decisions) = decisions.as_ref() {
                let pool = indexer.pool(lane);
                decisions
                    .with_label_values(&[pool.domain.as_str(), pool.dc.as_str(), reason.label()])
                    .inc();
            }
        }
        let ranked = routed
            .ranked
            .into_iter()
            .map(|estimate| RankedDc {
                estimate,
                input: *dcs
                    .iter()
                    .find(|d| d.lane == estimate.lane)
                    .expect("an input"),
            })
            .collect();
        Ok(Routed {
            ranked,
            choice: routed.choice,
            ready_mask: found.ready_mask(),
            blocks,
        })
    }

    /// A lease of `epoch` took `lane` ([`LaneLoads::lease_started`]): the previous lease's
    /// load report is dropped, and reports of older leases are refused.
    pub fn lease_started(&self, lane: LaneIndex, epoch: u64) {
        self.loads
            .lock()
            .expect("lane loads")
            .lease_started(lane, epoch);
    }

    /// Keeps a lane's load report (Relay `LoadReport`, [`LaneLoads::report`]); a kept report
    /// counts the choices booked on the lane up to its observation (received `now` minus its
    /// age): those leave the lane's bookings, later ones stay.
    ///
    /// # Errors
    /// [`LoadRefused`]: an older or invalid report; nothing changes.
    pub fn report_load(
        &self,
        lane: LaneIndex,
        epoch: u64,
        sequence: u64,
        load: PoolLoad,
        age: Duration,
        now: Instant,
    ) -> Result<(), LoadRefused> {
        self.loads
            .lock()
            .expect("lane loads")
            .report(lane, epoch, sequence, load, age, now)?;
        // An observation older than this process's clock can count no booking of it.
        if let Some(observed_at) = now.checked_sub(age) {
            self.bookings
                .lock()
                .expect("bookings")
                .reported(lane, observed_at);
        }
        Ok(())
    }
}
