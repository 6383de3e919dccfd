//! Catalog reloads: the domains served, and each domain's lanes, change while the indexer runs.
//!
//! A reload re-reads the configuration from where the process read it (`--config`, the
//! environment, the flags; [`crate::serve_from`]) on SIGHUP, when the configuration file
//! changes (`config_watch_interval_ms`) or on `Admin/ReloadCatalog`, and:
//!
//! 1. validates it whole (every key, as at start);
//! 2. refuses it if a key outside the catalog changed (listeners, limits, lag, route, search,
//!    transport, TLS, logging): those take a restart;
//! 3. plans the change with ckf-core's rules ([`ckf_core::catalog::Catalog::plan`],
//!    [`ckf_core::catalog::lane_plan`]): domains added, removed and kept; in a kept domain,
//!    lanes removed (DCs no longer listed) and added (new DCs on spare lane slots, reserved at
//!    start with `spare_lanes`; a removed DC back on its own lane). A kept domain's table, block
//!    size, spare slots and kept DCs' block sizes stay; the primary stays;
//! 4. builds every added domain and the `[auth]` policies of the new catalog; any failure
//!    leaves everything as it was;
//! 5. removes and adds the kept domains' lanes on their consumers (a removed lane retires as
//!    `REMOVED`: its stream ends `NOT_FOUND`; an added one waits for its producer's snapshot)
//!    and swaps the catalog in one step: calls already holding a domain finish on it, later
//!    calls see the new catalog. A removed domain's relay streams end with `Retired(REMOVED)` +
//!    `NOT_FOUND`, its query streams with `NOT_FOUND`; removed lanes' and domains' gauges are
//!    withdrawn.
//!
//! Lanes not named by a change keep their lease, readiness and answers: they are never
//! touched. Each outcome is logged and counted in `ckf_indexer_catalog_reloads_total{result}`
//! (`applied`, `unchanged`, `refused`, `dry_run`), and `ckf_indexer_domains` is the number of
//! domains served.

use std::sync::Arc;

use ckf_core::catalog::{LanePlan, LaneSlot, lane_plan};
use ckf_core::identity::IndexerDomainId;
use ckf_svc_kit::config::Validate;

use crate::access::IndexerAccess;
use crate::config::IndexerConfig;
use crate::config::domains::DomainSpec;
use crate::lane_watch;
use crate::state::{Domain, IndexerState};
pub use crate::status::ReloadError;

/// What a reload changed (or, for a dry run, would change).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reloaded {
    /// Domains added.
    pub added: Vec<IndexerDomainId>,
    /// Domains removed.
    pub removed: Vec<IndexerDomainId>,
    /// Domains kept (their lanes may have changed).
    pub kept: Vec<IndexerDomainId>,
    /// Lanes added to kept domains (new pools, or pools added back).
    pub lanes_added: Vec<ckf_core::identity::PoolId>,
    /// Lanes removed from kept domains.
    pub lanes_removed: Vec<ckf_core::identity::PoolId>,
    /// Whether a change was applied.
    pub applied: bool,
}

impl std::fmt::Display for Reloaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names = |d: &[IndexerDomainId]| {
            d.iter()
                .map(IndexerDomainId::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let pools = |p: &[ckf_core::identity::PoolId]| {
            p.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        write!(
            f,
            "domains added [{}], removed [{}], kept [{}]; lanes added [{}], removed [{}]",
            names(&self.added),
            names(&self.removed),
            names(&self.kept),
            pools(&self.lanes_added),
            pools(&self.lanes_removed)
        )
    }
}

/// Re-reads the configuration source and applies its catalog (`dry_run`: plans only). `why`
/// names the trigger in the log (`SIGHUP`, `file change`, `Admin/ReloadCatalog`).
///
/// # Errors
/// [`ReloadError`]; nothing changed.
pub fn reload(
    shared: &Arc<IndexerState>,
    dry_run: bool,
    why: &str,
) -> Result<Reloaded, ReloadError> {
    let outcome = shared
        .source
        .as_ref()
        .ok_or(ReloadError::NoSource)
        .and_then(|source| Ok(source.load()?))
        .and_then(|next| apply(shared, next, dry_run));
    let result = match &outcome {
        Ok(r) if dry_run => {
            tracing::info!(trigger = why, plan = %r, "catalog reload planned (dry run)");
            "dry_run"
        }
        Ok(r) if r.applied => {
            tracing::info!(trigger = why, change = %r, "catalog reloaded");
            "applied"
        }
        Ok(_) => {
            tracing::info!(trigger = why, "catalog reload: nothing changed");
            "unchanged"
        }
        Err(error) => {
            tracing::error!(trigger = why, %error, "catalog reload refused");
            "refused"
        }
    };
    shared
        .metrics
        .catalog_reloads
        .with_label_values(&[result])
        .inc();
    outcome
}

/// Applies the catalog of `next` (a whole configuration) to the running indexer.
///
/// # Errors
/// [`ReloadError`]; nothing changed.
pub fn apply(
    shared: &Arc<IndexerState>,
    next: IndexerConfig,
    dry_run: bool,
) -> Result<Reloaded, ReloadError> {
    // A reload that panicked (a bug) must not block every later one: the lock guards no data.
    let _one_at_a_time = shared
        .reloading
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    next.validate()?;
    let current_config = shared.config_now();
    if let Some(key) = restart_key(&current_config, &next) {
        return Err(ReloadError::NeedsRestart { key });
    }
    let specs = next
        .domain_specs()?
        .into_iter()
        .map(|spec| (spec.manifest.domain.clone(), spec))
        .collect();
    let current = shared.domains();
    let plan = current.plan(specs, change)?;
    let mut reloaded = Reloaded {
        added: plan.added.iter().map(|(d, _)| d.clone()).collect(),
        removed: plan.removed.clone(),
        kept: plan
            .kept
            .iter()
            .chain(plan.changed.iter().map(|(d, _)| d))
            .cloned()
            .collect(),
        lanes_added: Vec::new(),
        lanes_removed: Vec::new(),
        applied: false,
    };
    reloaded.kept.sort();
    for (domain, change) in &plan.changed {
        let indexer = &current.get(domain.as_str()).expect("served").indexer;
        reloaded
            .lanes_added
            .extend(change.lanes.add.iter().cloned());
        reloaded
            .lanes_removed
            .extend(change.lanes.remove.iter().map(|&l| indexer.pool(l).clone()));
    }
    let auth_changed = current_config.auth != next.auth;
    if dry_run || (plan.is_empty() && !auth_changed) {
        return Ok(reloaded);
    }
    let access = IndexerAccess::prepare(&next.auth, &next.domain_lanes())?;
    let added_domains = reloaded.added.clone();
    // Lanes changed on served consumers: (domain, lane, added?).
    let mut lane_changes = Vec::new();
    let applied = current.apply(
        plan,
        |domain, spec| {
            Domain::build(spec, &shared.settings, &shared.metrics)
                .map(Arc::new)
                .map_err(|error| ReloadError::Build {
                    domain: domain.clone(),
                    error: error.to_string(),
                })
        },
        |served, change| {
            let indexer = &served.indexer;
            for &lane in &change.lanes.remove {
                indexer.remove_lane(lane)?;
                lane_changes.push((served.name().clone(), lane, false));
            }
            for pool in change.lanes.add {
                let lane = indexer.add_lane(pool)?;
                lane_changes.push((served.name().clone(), lane, true));
            }
            Ok(Arc::new(served.relaned(change.spec, &shared.settings)))
        },
    );
    let (catalog, removed) = match applied {
        Ok(applied) => applied,
        Err(error) => {
            // The domains built before the refusal exported their series as they were built;
            // nothing changed, so none of them may stay.
            shared
                .metrics
                .forget_unserved_domains(|domain| current.get(domain).is_some());
            return Err(error);
        }
    };
    // The swap: every later call, attachment and reload sees the new catalog.
    let catalog = Arc::new(catalog);
    *shared
        .catalog
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::clone(&catalog);
    shared.access.replace(access);
    {
        let mut config = shared
            .config
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        config.manifest = next.manifest;
        config.domains = next.domains;
        config.table = next.table;
        config.block_size = next.block_size;
        config.auth = next.auth;
    }
    for domain in &removed {
        domain.router.retire();
        domain.removed.trigger();
    }
    if !removed.is_empty() {
        // Every series of the removed domains: gauges, counters, histograms (the reload lock is
        // held: no domain is being built).
        shared
            .metrics
            .forget_unserved_domains(|domain| catalog.get(domain).is_some());
    }
    let mut watchers: Vec<_> = added_domains
        .iter()
        .filter_map(|d| catalog.get(d.as_str()))
        .flat_map(|domain| lane_watch::spawn_domain(shared, domain))
        .collect();
    // A removed lane's watcher counts its retirement, withdraws its gauges and ends by itself.
    for (name, lane, added) in lane_changes {
        let domain = catalog
            .get(name.as_str())
            .expect("a changed domain is served");
        if added {
            watchers.push(lane_watch::spawn_lane(shared, domain, lane));
        }
    }
    shared
        .watchers
        .lock()
        .expect("watchers lock")
        .extend(watchers);
    shared
        .metrics
        .domains
        .set(i64::try_from(catalog.len()).unwrap_or(i64::MAX));
    // A removed domain's lane workers are joined by whoever drops it last; when that is this
    // reload, off the async workers.
    if tokio::runtime::Handle::try_current().is_ok() {
        tokio::task::spawn_blocking(move || drop(removed));
    }
    reloaded.applied = true;
    Ok(reloaded)
}

/// A served domain's change it takes while it runs: its next configuration and the lanes to
/// remove and add.
#[derive(Debug)]
struct LaneChange {
    spec: DomainSpec,
    lanes: LanePlan,
}

/// How a served domain compares with its next definition ([`ckf_core::catalog::Catalog::plan`]):
/// unchanged, its lanes changed ([`ckf_core::catalog::lane_plan`] on its consumer's slots), or
/// a change it cannot take while it runs (its table, block size, spare slots, a kept DC's block
/// size, more new DCs than spare slots).
fn change(served: &Arc<Domain>, next: &DomainSpec) -> Result<Option<LaneChange>, String> {
    let current = &served.spec;
    if current == next {
        return Ok(None);
    }
    let (a, b) = (&current.manifest, &next.manifest);
    if a.format != b.format {
        return Err(format!("table [{}] -> [{}]", a.format, b.format));
    }
    if current.token_rules != next.token_rules {
        return Err(format!(
            "block_size {} -> {}",
            current.token_rules.block_size, next.token_rules.block_size
        ));
    }
    if current.spare_lanes != next.spare_lanes {
        return Err(format!(
            "spare_lanes {} -> {} (lane slots are reserved at start)",
            current.spare_lanes, next.spare_lanes
        ));
    }
    for (i, pool) in b.lanes.iter().enumerate() {
        if let Some(j) = a.lanes.iter().position(|p| p == pool)
            && current.block_sizes.of(j) != next.block_sizes.of(i)
        {
            return Err(format!(
                "the block size of {}: {} -> {}",
                pool.dc,
                current.block_sizes.of(j),
                next.block_sizes.of(i)
            ));
        }
    }
    let indexer = &served.indexer;
    let slots: Vec<LaneSlot> = (0..indexer.lane_count() as u8)
        .map(|lane| LaneSlot {
            pool: indexer.slot(lane).cloned(),
            removed: indexer.is_removed(lane),
        })
        .collect();
    let lanes = lane_plan(&slots, &b.lanes).map_err(|e| {
        let dcs = |m: &ckf_core::global::Manifest| {
            m.lanes
                .iter()
                .map(|p| p.dc.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!("lanes [{}] -> [{}]: {e}", dcs(a), dcs(b))
    })?;
    Ok(Some(LaneChange {
        spec: next.clone(),
        lanes,
    }))
}

/// The first top-level key outside the catalog whose value differs (those take a restart).
/// The destructuring names every key, so a new key must be sorted here to compile.
fn restart_key(current: &IndexerConfig, next: &IndexerConfig) -> Option<&'static str> {
    let IndexerConfig {
        // The catalog and [auth]: a reload's business.
        manifest: _,
        domains: _,
        table: _,
        block_size: _,
        auth: _,
        lag,
        limits,
        search,
        route,
        transport,
        listen,
        query_listen,
        metrics_listen,
        log_format,
        worker_threads,
        tls,
        config_watch_interval_ms,
        insecure,
    } = next;
    [
        ("lag", &current.lag == lag),
        ("limits", &current.limits == limits),
        ("search", &current.search == search),
        ("route", &current.route == route),
        ("transport", &current.transport == transport),
        ("listen", &current.listen == listen),
        ("query_listen", &current.query_listen == query_listen),
        ("metrics_listen", &current.metrics_listen == metrics_listen),
        ("log_format", &current.log_format == log_format),
        ("worker_threads", &current.worker_threads == worker_threads),
        ("tls", &current.tls == tls),
        (
            "config_watch_interval_ms",
            &current.config_watch_interval_ms == config_watch_interval_ms,
        ),
        ("insecure", &current.insecure == insecure),
    ]
    .into_iter()
    .find(|(_, same)| !same)
    .map(|(key, _)| key)
}

/// Reloads on SIGHUP and, when the configuration names a file and
/// `config_watch_interval_ms` is not 0, when that file changes (checked by its size, time and
/// inode, as the TLS files are) and two checks in a row see the same change. Ends on shutdown.
pub fn spawn_triggers(shared: &Arc<IndexerState>) -> std::io::Result<()> {
    let Some(source) = &shared.source else {
        return Ok(());
    };
    let on_hangup = Arc::clone(shared);
    ckf_svc_kit::access::reload_on_sighup("catalog", shared.shutdown.clone(), move || {
        let shared = Arc::clone(&on_hangup);
        // Building a domain allocates its table: off the async workers.
        tokio::task::spawn_blocking(move || reload(&shared, false, "SIGHUP"));
        Ok("catalog reload started".into())
    })?;
    let interval = shared.config_now().config_watch_interval_ms;
    let Some(file) = source.config.clone().filter(|_| interval > 0) else {
        return Ok(());
    };
    let watched = Arc::clone(shared);
    tokio::spawn(async move {
        let stamp = |path: &std::path::Path| {
            std::fs::metadata(path).ok().map(|m| {
                #[cfg(unix)]
                let inode = std::os::unix::fs::MetadataExt::ino(&m);
                #[cfg(not(unix))]
                let inode = 0;
                (m.len(), m.modified().ok(), inode)
            })
        };
        let mut seen = stamp(&file);
        let mut settling = None;
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(interval));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = watched.shutdown.wait() => return,
                _ = tick.tick() => {}
            }
            let now = stamp(&file);
            if now == seen {
                settling = None;
                continue;
            }
            // A changed stamp is read only when the next check sees it again: a file still
            // being written (several writes, not one rename) is not read half way.
            if settling.as_ref() != Some(&now) {
                settling = Some(now);
                continue;
            }
            // Stamped before reading: a change while reading triggers another attempt.
            seen = now;
            settling = None;
            let shared = Arc::clone(&watched);
            let _ =
                tokio::task::spawn_blocking(move || reload(&shared, false, "file change")).await;
        }
    });
    Ok(())
}
