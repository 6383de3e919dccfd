//! What every handler of one indexer shares: the catalog of domains served (each a [`Domain`]:
//! its core consumer, ingestion workers, router, labels and counters; replaced whole by a
//! catalog reload, `crate::catalog`), the metrics, the limits and the shutdown signal. Built once
//! by [`crate::serve`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use ckf_core::catalog::{Catalog, DomainError};
use ckf_core::global::GlobalCkfIndexer;
use ckf_core::ingestion::{DeadlineKeeper, IngestionWorkers, IngestionWorkersConfig};
use ckf_core::lane::{LagPolicy, LaneStatus};
use ckf_core::search::SearchKernel;
use ckf_proto::v1::{self, relay_frame::Frame as WireFrame};
use ckf_svc_kit::Shutdown;
use prost::Message;
use tokio::sync::Semaphore;

use crate::config::domains::DomainSpec;
use crate::config::{LimitsConfig, RouteConfig};
use crate::metrics::{IndexerMetrics, LaneLabels, QueryCounters};
use crate::router::Router;
use ckf_core::tokens::lanes::LaneBlockSizes;

/// One domain served: its own table, lanes, workers, router and counters. Nothing in it is
/// shared with another domain, so one domain's faults never reach another's lanes.
///
/// A value describes the domain as one catalog has it: a reload that changes the domain's
/// lanes builds a new value ([`Domain::relaned`]) sharing this one's consumer, workers, load
/// reports, bookings, stream permits and counters, so calls holding the old value finish on
/// the same lanes.
#[derive(Debug)]
pub struct Domain {
    /// Its configuration now (lanes in configured order; a reload compares the next one with
    /// it).
    pub spec: DomainSpec,
    /// Triggered when a catalog reload removes the domain: its relay streams, query streams and
    /// lane watchers end.
    pub removed: Shutdown,
    /// The transposed consumer of this domain (leases, lane state machine, table, search; lane
    /// slots added and removed at run time).
    pub indexer: Arc<GlobalCkfIndexer>,
    /// One serialized ingestor thread per lane slot behind bounded queues.
    pub workers: Arc<IngestionWorkers>,
    /// `Route`: the kept load reports, the bookings, the `[route]` model and round trips, the
    /// lanes' block sizes (shared with every [`crate::EmbeddedQuery`] of this domain).
    pub router: Router,
    /// Permits for open relay streams of this domain (`limits.max_relay_streams` each).
    pub relay_streams: Arc<Semaphore>,
    /// `ckf_indexer_queries_*{domain}` by method.
    pub queries: QueryCounters,
    /// The watcher task of each lane slot that serves a pool (`crate::lane_watch`).
    pub lane_watchers: Arc<Mutex<Vec<Option<tokio::task::AbortHandle>>>>,
}

/// Why a domain could not be built (nothing of it is left running).
#[derive(Debug, thiserror::Error)]
pub enum DomainBuildError {
    /// ckf-core refused its manifest (too many lanes, a table that cannot be allocated).
    #[error("invalid manifest: {0}")]
    Manifest(#[from] ckf_core::global::ManifestError),
    /// The search kernel cannot run on this CPU.
    #[error("search.kernel: {0}")]
    Kernel(String),
    /// A lane's worker could not start (a thread or memory limit).
    #[error("cannot start its lane workers: {0}")]
    Workers(std::io::Error),
}

/// What a domain is built with besides its [`DomainSpec`] (the same for every domain of the
/// process, kept to build the domains a reload adds).
#[derive(Debug, Clone)]
pub struct DomainSettings {
    /// Deadlines of every lane.
    pub lag: LagPolicy,
    /// The search kernel resolved for this CPU.
    pub kernel: SearchKernel,
    /// Lane queues.
    pub workers: IngestionWorkersConfig,
    /// The deadline keeper every domain's lanes are timed by.
    pub keeper: DeadlineKeeper,
    /// The routing model and round trips.
    pub route: RouteConfig,
    /// Resource limits.
    pub limits: LimitsConfig,
}

impl Domain {
    /// Builds one domain: its consumer (sized by its manifest and spare lanes), its lane
    /// workers (started here), its router and its metric children.
    ///
    /// # Errors
    /// [`DomainBuildError`]: ckf-core's refusal of the manifest (a table that cannot be
    /// allocated, too many lanes) or of the search kernel, a lane thread that cannot start.
    pub fn build(
        spec: DomainSpec,
        settings: &DomainSettings,
        metrics: &IndexerMetrics,
    ) -> Result<Self, DomainBuildError> {
        // A consumer instance of its own, fresh per build: the leases of a domain removed and
        // added back are a new consumer's to its producers, which refuse a lease not newer
        // than the one they hold from the same consumer (lease epochs start again).
        let indexer = Arc::new(GlobalCkfIndexer::with_spare_lanes(
            spec.manifest.clone(),
            rand::random::<u64>(),
            settings.lag,
            spec.spare_lanes,
        )?);
        indexer
            .set_search_kernel(settings.kernel)
            .map_err(|e| DomainBuildError::Kernel(e.to_string()))?;
        let workers =
            IngestionWorkers::start_on(Arc::clone(&indexer), settings.workers, &settings.keeper)
                .map_err(DomainBuildError::Workers)?;
        let workers = Arc::new(workers);
        let name = indexer.manifest().domain.to_string();
        metrics
            .table_bytes
            .with_label_values(&[&name])
            .set(i64::try_from(indexer.table().bytes()).unwrap_or(i64::MAX));
        let router = Router::new(
            Arc::clone(&indexer),
            spec.token_rules,
            slot_block_sizes(&spec, &indexer),
            &settings.route,
            metrics.route_decisions.clone(),
        );
        Ok(Self {
            spec,
            removed: Shutdown::new(),
            workers,
            router,
            relay_streams: Arc::new(Semaphore::new(settings.limits.max_relay_streams as usize)),
            queries: metrics.query_methods(&name),
            lane_watchers: Arc::new(Mutex::new(vec![None; indexer.lane_count()])),
            indexer,
        })
    }

    /// The value of this domain after its consumer's lanes changed to serve `spec`'s (the
    /// lanes were added and removed on the shared consumer already): the same consumer,
    /// workers, load reports, bookings, permits and counters; the router's round trips and
    /// block sizes follow the lanes.
    pub fn relaned(&self, spec: DomainSpec, settings: &DomainSettings) -> Self {
        Self {
            router: self
                .router
                .relaned(slot_block_sizes(&spec, &self.indexer), &settings.route),
            spec,
            removed: self.removed.clone(),
            indexer: Arc::clone(&self.indexer),
            workers: Arc::clone(&self.workers),
            relay_streams: Arc::clone(&self.relay_streams),
            queries: self.queries.clone(),
            lane_watchers: Arc::clone(&self.lane_watchers),
        }
    }

    /// The domain's name.
    pub fn name(&self) -> &ckf_core::identity::IndexerDomainId {
        &self.spec.manifest.domain
    }
}

/// Tokens per block of every lane slot: its DC's in `spec`, the domain's block size for a slot
/// `spec` does not list (a removed lane, a spare slot: neither is ever answered).
fn slot_block_sizes(spec: &DomainSpec, indexer: &GlobalCkfIndexer) -> LaneBlockSizes {
    let sizes = (0..indexer.lane_count() as u8)
        .map(|lane| {
            indexer
                .slot(lane)
                .and_then(|pool| spec.manifest.lanes.iter().position(|p| p == pool))
                .map_or(spec.token_rules.block_size, |i| spec.block_sizes.of(i))
        })
        .collect();
    LaneBlockSizes::new(sizes).expect("sizes validated with the configuration")
}

/// The domains served, the primary first.
pub type Domains = Catalog<Arc<Domain>>;

/// The state the Relay and Query handlers share (one `Arc` per server).
#[derive(Debug)]
pub struct IndexerState {
    /// The domains served; a query naming none is for the primary. Replaced whole by a catalog
    /// reload: read it with [`IndexerState::domains`].
    pub catalog: RwLock<Arc<Domains>>,
    /// How domains are built (the ones a reload adds too).
    pub settings: DomainSettings,
    /// The configuration in force (its catalog part replaced by each applied reload).
    pub config: Mutex<crate::config::IndexerConfig>,
    /// Where a reload reads the configuration from (`None`: started in-process with a value).
    pub source: Option<crate::config::Cli>,
    /// Lane watchers of every domain (joined at shutdown).
    pub watchers: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// One reload at a time.
    pub reloading: Mutex<()>,
    /// A sweep of unserved domains' series is queued ([`IndexerState::queue_sweep`]).
    pub sweep_queued: AtomicBool,
    /// Prometheus metrics.
    pub metrics: IndexerMetrics,
    /// Resource limits.
    pub limits: LimitsConfig,
    /// Heartbeat deadline told to producers (0 = none).
    pub heartbeat_deadline_ms: u64,
    /// Permits for open `FindMatchesStream` calls (`limits.max_query_streams`).
    pub query_streams: Arc<Semaphore>,
    /// `[auth]`: who may attach for which pool, and the Query token.
    pub access: Arc<crate::access::IndexerAccess>,
    /// Stops every stream and the servers.
    pub shutdown: Shutdown,
}

impl IndexerState {
    /// The catalog in force now.
    pub fn domains(&self) -> Arc<Domains> {
        // The lock only swaps an `Arc`: a poisoned one still holds a whole catalog.
        let catalog = self
            .catalog
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(&catalog)
    }

    /// Every lane of every domain served that serves a pool (not removed), with its labels and
    /// status now: what the lane gauges export at each scrape.
    pub fn lane_statuses(&self) -> Vec<(LaneLabels, LaneStatus)> {
        let domains = self.domains();
        domains
            .iter()
            .filter(|(_, domain)| !domain.removed.is_triggered())
            .flat_map(|(_, domain)| {
                let indexer = &domain.indexer;
                indexer.lane_statuses().into_iter().filter_map(|status| {
                    let labels = LaneLabels::of(indexer, status.lane)?;
                    (!indexer.is_removed(status.lane)).then_some((labels, status))
                })
            })
            .collect()
    }

    /// Queues a sweep of the metric series of every domain the catalog no longer serves
    /// ([`IndexerMetrics::forget_unserved_domains`]), run on a blocking thread between reloads
    /// (it waits for the one under way, which holds its lock while it wakes a removed domain's
    /// lane watchers and may be building a domain of the same name, whose counters must stay).
    /// For those watchers, which may count a last event after the reload's own sweep: every
    /// event counted before this call is swept; calls while a sweep is queued share it.
    pub fn queue_sweep(self: &Arc<Self>) {
        if self.sweep_queued.swap(true, Ordering::SeqCst) {
            return;
        }
        let shared = Arc::clone(self);
        drop(tokio::task::spawn_blocking(move || {
            // A reload that panicked (a bug) leaves the lock poisoned; it guards no data.
            let _between_reloads = shared
                .reloading
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // Cleared first: a call from now on queues a sweep of its own.
            shared.sweep_queued.store(false, Ordering::SeqCst);
            let catalog = shared.domains();
            shared
                .metrics
                .forget_unserved_domains(|domain| catalog.get(domain).is_some());
        }));
    }

    /// The configuration in force now (a copy).
    pub fn config_now(&self) -> crate::config::IndexerConfig {
        self.config
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The domain a Query call is for: the one its `ckf-domain` metadata names, or the
    /// primary (`ckf_core::catalog`); a refusal is counted.
    ///
    /// # Errors
    /// [`DomainError`]: not a domain name, or a domain not served.
    pub fn domain_of<T>(&self, request: &tonic::Request<T>) -> Result<Arc<Domain>, DomainError> {
        let values = request.metadata().get_all(ckf_proto::metadata::DOMAIN_KEY);
        let chosen = match values.iter().count() {
            0 | 1 => {
                // A value that is not visible ASCII is no domain name: checked as U+FFFD, so
                // the refusal names the character rule.
                let named = values
                    .iter()
                    .next()
                    .map(|v| v.to_str().unwrap_or("\u{fffd}"));
                self.domains().for_query(named).cloned()
            }
            several => Err(DomainError::Several(several)),
        };
        chosen.inspect_err(|_| self.metrics.query_domain_refused.inc())
    }

    /// Counts one received relay frame by kind and encoded size.
    pub fn count_frame(&self, frame: &v1::RelayFrame) {
        let kind = frame.frame.as_ref().map_or("empty", wire_kind);
        self.metrics
            .frames_received
            .with_label_values(&[kind])
            .inc();
        self.metrics
            .bytes_received
            .inc_by(frame.encoded_len() as u64);
    }
}

/// The `kind` label (and `NoAttach` text) of a wire frame.
pub fn wire_kind(frame: &WireFrame) -> &'static str {
    match frame {
        WireFrame::Attach(_) => "attach",
        WireFrame::SnapshotChunk(_) => "snapshot_chunk",
        WireFrame::Delta(_) => "delta",
        WireFrame::Heartbeat(_) => "heartbeat",
        WireFrame::DrainMarker(_) => "drain_marker",
        WireFrame::Load(_) => "load",
    }
}
