//! The domains one indexer serves, and which of them a call is for.
//!
//! An indexer serves one or more domains (one model's KV namespace each), every domain with its
//! own manifest, table and lanes. [`Catalog`] holds one value per domain and owns the two rules
//! that pick one:
//!
//! - a **query** names its domain in its metadata, or names none: then it is for the
//!   *primary* domain (the first one configured), exactly as before an indexer could serve
//!   several, so single-domain clients work unchanged ([`Catalog::for_query`]);
//! - an **attachment** is for the domain of the pool it claims ([`Catalog::for_pool`]); there is
//!   no default, a producer always names its domain.
//!
//! A name that is not a domain name, or a domain not served, is a [`DomainError`] naming the
//! domains that are.
//!
//! The catalog changes at run time by whole domains ([`Catalog::plan`]): a new list of domains
//! adds the names not served, removes the served names it lacks and keeps the others, which
//! must be unchanged: a served domain keeps its definition (lanes, block sizes, table format)
//! for its life, so no lane of a kept domain ever changes under a reload. The primary stays.
//! A change that breaks a rule is refused whole ([`CatalogChangeError`]).

use std::collections::BTreeMap;

use thiserror::Error;

use crate::identity::{IndexerDomainId, NameError, PoolId};

/// Why a call is refused for the domain it names.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DomainError {
    /// The named domain is not a valid domain name.
    #[error("the call's domain: {0}")]
    Invalid(NameError),
    /// The call names several domains (its metadata holds the key more than once).
    #[error("the call names {0} domains (ckf-domain given {0} times); name one")]
    Several(usize),
    /// The named domain is valid but not served here.
    #[error(
        "domain {named} is not served here: this indexer serves {}; send that model's calls to \
         an indexer that serves it",
        join(served)
    )]
    NotServed {
        /// The domain the call named.
        named: IndexerDomainId,
        /// The domains served, in name order.
        served: Vec<IndexerDomainId>,
    },
}

/// Most domain names a refusal lists (a message stays well under gRPC's 16 KiB of metadata
/// with hundreds of domains).
const LISTED: usize = 16;

fn join(domains: &[IndexerDomainId]) -> String {
    let listed = domains
        .iter()
        .take(LISTED)
        .map(IndexerDomainId::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    match domains.len().saturating_sub(LISTED) {
        0 => listed,
        more => format!("{listed} and {more} more"),
    }
}

/// Why a new list of domains cannot replace a catalog's (nothing is changed).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CatalogChangeError {
    /// The new list's primary (its first domain) is another domain.
    #[error(
        "the primary domain is {current} and stays for the indexer's life (the new \
         configuration makes it {next}); change it with a restart"
    )]
    PrimaryChanged {
        /// The primary served.
        current: IndexerDomainId,
        /// The new list's first domain.
        next: IndexerDomainId,
    },
    /// The new list names a domain twice.
    #[error(transparent)]
    Duplicate(#[from] DuplicateDomain),
    /// A served domain's definition differs in the new list.
    #[error(
        "domain {domain} is served and its definition changed ({what}): a served domain keeps \
         its lanes, block sizes and table while it runs; remove it (one reload) and add it \
         back (another), or restart"
    )]
    Changed {
        /// The domain.
        domain: IndexerDomainId,
        /// What differs.
        what: String,
    },
}

/// What a new list of domains changes in a catalog: the domains to add (with their
/// definitions), to change in place (with their changes), to remove and to keep, each in name
/// order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogPlan<D, C> {
    /// Domains not served yet.
    pub added: Vec<(IndexerDomainId, D)>,
    /// Domains served and changed in a way they take while they run.
    pub changed: Vec<(IndexerDomainId, C)>,
    /// Domains served and not in the new list.
    pub removed: Vec<IndexerDomainId>,
    /// Domains served and unchanged.
    pub kept: Vec<IndexerDomainId>,
}

impl<D, C> CatalogPlan<D, C> {
    /// Whether the plan changes nothing.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.changed.is_empty() && self.removed.is_empty()
    }
}

/// One lane slot of a served domain, as [`lane_plan`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneSlot {
    /// The pool it serves or served (`None`: a spare slot never used).
    pub pool: Option<PoolId>,
    /// Whether it was removed.
    pub removed: bool,
}

/// The lane changes that make a domain serve a new list of pools
/// ([`crate::global::GlobalCkfIndexer::add_lane`] / `remove_lane`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LanePlan {
    /// Lanes to remove (served now, not in the new list), in lane order.
    pub remove: Vec<crate::identity::LaneIndex>,
    /// Pools to add, in the new list's order: back on their own lane if they had one, else on a
    /// spare slot.
    pub add: Vec<PoolId>,
}

impl LanePlan {
    /// Whether the plan changes nothing.
    pub fn is_empty(&self) -> bool {
        self.remove.is_empty() && self.add.is_empty()
    }
}

/// A domain cannot take a new list of lanes while it runs.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "{needed} new lane(s) but {free} spare lane slot(s) left (a lane keeps its pool for the \
     indexer's life; spare slots are reserved at start with spare_lanes)"
)]
pub struct NoSpareLanes {
    /// Pools that need a slot never used.
    pub needed: usize,
    /// Slots never used.
    pub free: usize,
}

/// The lane changes that make a domain whose slots are `slots` serve `next` (in any order): a
/// pool served now keeps its lane, a removed pool comes back on its own lane, a new pool takes
/// a spare slot never used; a lane index never changes pool.
///
/// # Errors
/// [`NoSpareLanes`] when the new pools outnumber the spare slots (nothing is planned).
pub fn lane_plan(slots: &[LaneSlot], next: &[PoolId]) -> Result<LanePlan, NoSpareLanes> {
    let remove = slots
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.removed && s.pool.as_ref().is_some_and(|p| !next.contains(p)))
        .map(|(lane, _)| lane as crate::identity::LaneIndex)
        .collect();
    let mut add = Vec::new();
    let mut needed = 0;
    for pool in next {
        match slots.iter().find(|s| s.pool.as_ref() == Some(pool)) {
            Some(slot) if !slot.removed => {}
            Some(_) => add.push(pool.clone()),
            None => {
                needed += 1;
                add.push(pool.clone());
            }
        }
    }
    let free = slots.iter().filter(|s| s.pool.is_none()).count();
    if needed > free {
        return Err(NoSpareLanes { needed, free });
    }
    Ok(LanePlan { remove, add })
}

/// Two entries of one catalog name the same domain.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("domain {0} is configured twice (every domain once)")]
pub struct DuplicateDomain(pub IndexerDomainId);

/// One value per served domain (kept in name order), one of them the primary.
#[derive(Debug, Clone)]
pub struct Catalog<T> {
    primary: IndexerDomainId,
    domains: BTreeMap<IndexerDomainId, T>,
}

impl<T> Catalog<T> {
    /// A catalog of the primary domain alone.
    pub fn new(primary: IndexerDomainId, value: T) -> Self {
        let mut domains = BTreeMap::new();
        domains.insert(primary.clone(), value);
        Self { primary, domains }
    }

    /// Adds a domain.
    ///
    /// # Errors
    /// [`DuplicateDomain`] when `domain` is served already (the catalog is unchanged).
    pub fn insert(&mut self, domain: IndexerDomainId, value: T) -> Result<(), DuplicateDomain> {
        if self.domains.contains_key(&domain) {
            return Err(DuplicateDomain(domain));
        }
        self.domains.insert(domain, value);
        Ok(())
    }

    /// The primary domain's name: a query naming no domain is for it.
    pub fn primary_id(&self) -> &IndexerDomainId {
        &self.primary
    }

    /// The primary domain's value.
    pub fn primary(&self) -> &T {
        &self.domains[&self.primary]
    }

    /// The value of `domain`, if served.
    pub fn get(&self, domain: &str) -> Option<&T> {
        self.domains.get(domain)
    }

    /// How many domains are served (at least one).
    pub fn len(&self) -> usize {
        self.domains.len()
    }

    /// Never true: a catalog serves its primary domain at least.
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// Every domain with its value, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&IndexerDomainId, &T)> {
        self.domains.iter()
    }

    /// The domains served, in name order.
    pub fn names(&self) -> Vec<IndexerDomainId> {
        self.domains.keys().cloned().collect()
    }

    /// The same domains, each value mapped by `f`.
    pub fn map<U>(&self, mut f: impl FnMut(&T) -> U) -> Catalog<U> {
        Catalog {
            primary: self.primary.clone(),
            domains: self
                .domains
                .iter()
                .map(|(d, v)| (d.clone(), f(v)))
                .collect(),
        }
    }

    /// What replacing this catalog's domains by `next` (the primary first, then the others)
    /// changes. `change` compares a served value with its next definition: `Ok(None)`
    /// unchanged, `Ok(Some(c))` changed in a way it can take while it runs (its lanes,
    /// [`lane_plan`]), `Err(what)` a change it cannot take (refused, naming `what`).
    ///
    /// # Errors
    /// [`CatalogChangeError`]: another primary, a domain twice, a served domain changed in a
    /// way it cannot take.
    pub fn plan<D, C>(
        &self,
        next: Vec<(IndexerDomainId, D)>,
        change: impl Fn(&T, &D) -> Result<Option<C>, String>,
    ) -> Result<CatalogPlan<D, C>, CatalogChangeError> {
        if let Some((first, _)) = next.first()
            && first != &self.primary
        {
            return Err(CatalogChangeError::PrimaryChanged {
                current: self.primary.clone(),
                next: first.clone(),
            });
        }
        let mut seen = std::collections::BTreeSet::new();
        let mut added = Vec::new();
        let mut changed = Vec::new();
        let mut kept = Vec::new();
        for (domain, next) in next {
            if !seen.insert(domain.clone()) {
                return Err(DuplicateDomain(domain).into());
            }
            match self.domains.get(&domain) {
                None => added.push((domain, next)),
                Some(served) => match change(served, &next) {
                    Ok(None) => kept.push(domain),
                    Ok(Some(c)) => changed.push((domain, c)),
                    Err(what) => return Err(CatalogChangeError::Changed { domain, what }),
                },
            }
        }
        if !seen.contains(&self.primary) {
            return Err(CatalogChangeError::PrimaryChanged {
                current: self.primary.clone(),
                next: added
                    .first()
                    .map_or_else(|| self.primary.clone(), |(d, _)| d.clone()),
            });
        }
        added.sort_by(|a, b| a.0.cmp(&b.0));
        changed.sort_by(|a, b| a.0.cmp(&b.0));
        kept.sort();
        let removed = self
            .domains
            .keys()
            .filter(|d| !seen.contains(*d))
            .cloned()
            .collect();
        Ok(CatalogPlan {
            added,
            changed,
            removed,
            kept,
        })
    }

    /// The catalog after `plan` (made by [`Catalog::plan`] on this catalog): the kept values
    /// cloned, each added one built by `build`, then each changed one replaced by `rebuild` of
    /// its served value (the first failure is returned; a failing `build` comes before any
    /// `rebuild`), the removed ones returned apart.
    ///
    /// # Errors
    /// `build`'s or `rebuild`'s error.
    pub fn apply<D, C, E>(
        &self,
        plan: CatalogPlan<D, C>,
        mut build: impl FnMut(&IndexerDomainId, D) -> Result<T, E>,
        mut rebuild: impl FnMut(&T, C) -> Result<T, E>,
    ) -> Result<(Catalog<T>, Vec<T>), E>
    where
        T: Clone,
    {
        let mut domains: BTreeMap<IndexerDomainId, T> = BTreeMap::new();
        for domain in plan.kept {
            let value = self.domains[&domain].clone();
            domains.insert(domain, value);
        }
        // Added domains first: a failure to build one then leaves the served ones unchanged.
        for (domain, definition) in plan.added {
            let value = build(&domain, definition)?;
            domains.insert(domain, value);
        }
        for (domain, change) in plan.changed {
            let value = rebuild(&self.domains[&domain], change)?;
            domains.insert(domain, value);
        }
        let removed = plan
            .removed
            .iter()
            .map(|d| self.domains[d].clone())
            .collect();
        Ok((
            Catalog {
                primary: self.primary.clone(),
                domains,
            },
            removed,
        ))
    }

    /// The domain a query is for: the one it names (`None`: it names none, so the primary).
    ///
    /// # Errors
    /// [`DomainError`]: not a domain name, or a domain not served.
    pub fn for_query(&self, named: Option<&str>) -> Result<&T, DomainError> {
        let Some(named) = named else {
            return Ok(self.primary());
        };
        // The common case, a served domain, allocates nothing.
        if let Some(value) = self.domains.get(named) {
            return Ok(value);
        }
        let named = IndexerDomainId::new(named).map_err(DomainError::Invalid)?;
        Err(self.not_served(named))
    }

    /// The domain an attachment for `pool` is for.
    ///
    /// # Errors
    /// [`DomainError::NotServed`] when the pool's domain is not served.
    pub fn for_pool(&self, pool: &PoolId) -> Result<&T, DomainError> {
        self.domains
            .get(&pool.domain)
            .ok_or_else(|| self.not_served(pool.domain.clone()))
    }

    fn not_served(&self, named: IndexerDomainId) -> DomainError {
        DomainError::NotServed {
            named,
            served: self.names(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str) -> IndexerDomainId {
        IndexerDomainId::new(name).unwrap()
    }

    fn two() -> Catalog<u32> {
        let mut catalog = Catalog::new(id("llama-70b"), 1);
        catalog.insert(id("qwen-7b"), 2).unwrap();
        catalog
    }

    #[test]
    fn a_query_is_for_the_domain_it_names_or_the_primary() {
        let catalog = two();
        assert_eq!(catalog.for_query(None), Ok(&1));
        assert_eq!(catalog.for_query(Some("llama-70b")), Ok(&1));
        assert_eq!(catalog.for_query(Some("qwen-7b")), Ok(&2));
        let other = catalog.for_query(Some("mistral")).unwrap_err();
        assert_eq!(
            other,
            DomainError::NotServed {
                named: id("mistral"),
                served: vec![id("llama-70b"), id("qwen-7b")],
            }
        );
        assert!(
            other.to_string().contains(
                "domain mistral is not served here: this indexer serves llama-70b, qwen-7b"
            ),
            "{other}"
        );
        // Names compare exactly (no case folding), and a bad name is named as such.
        assert!(catalog.for_query(Some("QWEN-7B")).is_err());
        assert_eq!(
            catalog.for_query(Some("")),
            Err(DomainError::Invalid(NameError::Empty { kind: "domain" }))
        );
        assert!(matches!(
            catalog.for_query(Some("a/b")),
            Err(DomainError::Invalid(NameError::BadCharacter { .. }))
        ));
    }

    #[test]
    fn a_refusal_lists_at_most_sixteen_domains() {
        let mut catalog = Catalog::new(id("d-00"), 0);
        for i in 1..40 {
            catalog.insert(id(&format!("d-{i:02}")), i).unwrap();
        }
        let text = catalog.for_query(Some("x")).unwrap_err().to_string();
        assert!(text.contains("d-00, d-01"), "{text}");
        assert!(text.contains("d-15 and 24 more;"), "{text}");
        assert!(!text.contains("d-16"), "{text}");
    }

    #[test]
    fn the_primary_is_the_first_domain_not_the_first_name() {
        let mut catalog = Catalog::new(id("zeta"), 26);
        catalog.insert(id("alpha"), 1).unwrap();
        assert_eq!(catalog.primary_id(), &id("zeta"));
        assert_eq!(catalog.for_query(None), Ok(&26));
        assert_eq!(catalog.names(), vec![id("alpha"), id("zeta")]);
        assert_eq!(catalog.len(), 2);
        let doubled = catalog.map(|v| v * 2);
        assert_eq!(doubled.for_query(None), Ok(&52));
        assert_eq!(doubled.get("alpha"), Some(&2));
    }

    #[test]
    fn an_attachment_is_for_its_pools_domain_with_no_default() {
        let catalog = two();
        let pool = |d: &str| PoolId::new(d, "dc-a").unwrap();
        assert_eq!(catalog.for_pool(&pool("qwen-7b")), Ok(&2));
        assert_eq!(catalog.for_pool(&pool("llama-70b")), Ok(&1));
        assert!(matches!(
            catalog.for_pool(&pool("mistral")),
            Err(DomainError::NotServed { named, .. }) if named == id("mistral")
        ));
    }

    /// A value changes in place by less than 10 (the change is the new value), else it is
    /// refused.
    fn plan(
        catalog: &Catalog<u32>,
        next: &[(&str, u32)],
    ) -> Result<CatalogPlan<u32, u32>, CatalogChangeError> {
        let next = next.iter().map(|(d, v)| (id(d), *v)).collect();
        catalog.plan(next, |served, next| match served.abs_diff(*next) {
            0 => Ok(None),
            1..10 => Ok(Some(*next)),
            _ => Err(format!("{served} -> {next}")),
        })
    }

    #[test]
    fn a_new_list_adds_removes_and_keeps_whole_domains() {
        let catalog = two();
        // Same list: nothing changes.
        let same = plan(&catalog, &[("llama-70b", 1), ("qwen-7b", 2)]).unwrap();
        assert!(same.is_empty());
        assert_eq!(same.kept, [id("llama-70b"), id("qwen-7b")]);
        // qwen out, mistral and gemma in (in name order).
        let change = plan(&catalog, &[("llama-70b", 1), ("mistral", 3), ("gemma", 4)]).unwrap();
        assert_eq!(change.added, [(id("gemma"), 4), (id("mistral"), 3)]);
        assert_eq!(change.removed, [id("qwen-7b")]);
        assert_eq!(change.kept, [id("llama-70b")]);
        let (next, removed) = catalog
            .apply(change, |_, v| Ok::<_, ()>(v * 10), |_, c| Ok(c))
            .unwrap();
        assert_eq!(removed, [2]);
        assert_eq!(next.names(), [id("gemma"), id("llama-70b"), id("mistral")]);
        assert_eq!(
            next.for_query(None),
            Ok(&1),
            "the primary is kept, not rebuilt"
        );
        assert_eq!(next.get("mistral"), Some(&30));
        assert!(next.get("qwen-7b").is_none());
        // A failing build leaves the catalog as it was.
        let change = plan(&catalog, &[("llama-70b", 1), ("mistral", 3)]).unwrap();
        assert_eq!(
            catalog
                .apply(change, |_, _| Err::<u32, _>("no memory"), |_, c| Ok(c))
                .unwrap_err(),
            "no memory"
        );
        // Changed in place: rebuilt from the served value, the others kept.
        let change = plan(&catalog, &[("llama-70b", 1), ("qwen-7b", 5)]).unwrap();
        assert_eq!(change.changed, [(id("qwen-7b"), 5)]);
        assert!(change.added.is_empty() && !change.is_empty());
        let (next, _) = catalog
            .apply(
                change,
                |_, v| Ok::<_, ()>(v),
                |served, c| Ok(served * 100 + c),
            )
            .unwrap();
        assert_eq!(next.get("qwen-7b"), Some(&205));
        assert_eq!(catalog.names(), [id("llama-70b"), id("qwen-7b")]);
    }

    #[test]
    fn a_change_breaking_a_rule_is_refused_whole() {
        let catalog = two();
        // A served domain's definition stays.
        let changed = plan(&catalog, &[("llama-70b", 1), ("qwen-7b", 90), ("new", 5)]);
        assert_eq!(
            changed,
            Err(CatalogChangeError::Changed {
                domain: id("qwen-7b"),
                what: "2 -> 90".into()
            })
        );
        assert!(
            changed
                .unwrap_err()
                .to_string()
                .contains("remove it (one reload)")
        );
        // The primary stays: neither replaced, nor removed, nor moved behind another.
        assert!(matches!(
            plan(&catalog, &[("qwen-7b", 2), ("llama-70b", 1)]),
            Err(CatalogChangeError::PrimaryChanged { next, .. }) if next == id("qwen-7b")
        ));
        assert!(matches!(
            plan(&catalog, &[("qwen-7b", 2)]),
            Err(CatalogChangeError::PrimaryChanged { .. })
        ));
        assert!(matches!(
            plan(&catalog, &[]),
            Err(CatalogChangeError::PrimaryChanged { .. })
        ));
        assert_eq!(
            plan(&catalog, &[("llama-70b", 1), ("x", 1), ("x", 1)]),
            Err(CatalogChangeError::Duplicate(DuplicateDomain(id("x"))))
        );
    }

    #[test]
    fn lanes_keep_their_pool_come_back_on_their_own_lane_and_new_ones_need_a_spare_slot() {
        let p = |dc: &str| PoolId::new("prod", dc).unwrap();
        let slot = |dc: Option<&str>, removed| LaneSlot {
            pool: dc.map(p),
            removed,
        };
        // a, b served; c removed; one spare slot.
        let slots = [
            slot(Some("a"), false),
            slot(Some("b"), false),
            slot(Some("c"), true),
            slot(None, false),
        ];
        assert!(lane_plan(&slots, &[p("b"), p("a")]).unwrap().is_empty());
        let plan = lane_plan(&slots, &[p("a"), p("c"), p("d")]).unwrap();
        assert_eq!(plan.remove, [1]);
        assert_eq!(plan.add, [p("c"), p("d")]);
        // Two new pools, one spare slot: refused, naming both counts.
        let refused = lane_plan(&slots, &[p("a"), p("b"), p("d"), p("e")]).unwrap_err();
        assert_eq!(refused, NoSpareLanes { needed: 2, free: 1 });
        assert!(refused.to_string().contains("spare_lanes"), "{refused}");
        // Removing everything is a plan too (the domain then answers no lane).
        assert_eq!(lane_plan(&slots, &[]).unwrap().remove, [0, 1]);
    }

    #[test]
    fn a_domain_is_served_once() {
        let mut catalog = two();
        assert_eq!(
            catalog.insert(id("qwen-7b"), 3),
            Err(DuplicateDomain(id("qwen-7b")))
        );
        assert_eq!(catalog.for_query(Some("qwen-7b")), Ok(&2));
    }
}
