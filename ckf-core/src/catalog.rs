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

use std::collections::BTreeMap;

use thiserror::Error;

use crate::identity::{IndexerDomainId, NameError, PoolId};

/// Why a call is refused for the domain it names.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DomainError {
    /// The named domain is not a valid domain name.
    #[error("the call's domain: {0}")]
    Invalid(NameError),
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

fn join(domains: &[IndexerDomainId]) -> String {
    domains
        .iter()
        .map(IndexerDomainId::as_str)
        .collect::<Vec<_>>()
        .join(", ")
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
