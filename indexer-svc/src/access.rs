//! Who may attach for which pool, and who may query: the `[auth]` section, the policies built
//! from it (`ckf_core::access`, which owns every rule) and the checks the Relay and Query
//! handlers call.
//!
//! ```toml
//! [auth]
//! required = false                 # true: every Attach must identify a producer principal
//! query_token_file = "/run/secrets/ckf/query.token"   # optional: Query needs this bearer token
//! [[auth.producers]]
//! name = "dc-a"                    # in logs and refusals
//! pools = ["dc-a", "qwen-7b/dc-a"]  # DC ids of the primary domain's lanes, or domain/DC
//! cert_names = ["producer.dc-a.ckf"]   # any name of its verified client certificate
//! token_file = "/run/secrets/ckf/dc-a.token"   # and/or a bearer token (one line)
//! ```
//!
//! The Relay check runs on the decoded `Attach` *before* `GlobalCkfIndexer::attach`, so a
//! refused attachment never gets a lease and cannot supersede the lane's holder. Query is
//! guarded by a tonic interceptor ([`IndexerAccess::query_interceptor`]). Refusals are
//! `UNAUTHENTICATED` / `PERMISSION_DENIED` with the reason, counted in
//! `ckf_indexer_auth_refused_total{service,code}` (`service` = `relay` | `query`). Token files
//! are re-read on SIGHUP (`ckf_svc_kit::access::reload_on_sighup`).

use ckf_svc_kit::throttle::{LogThrottle, REFUSAL_LOG_INTERVAL, peer_addr};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use ckf_core::access::{AccessError, Credentials, Policy, PoolGrant, Principal, TokenGate};
use ckf_core::identity::{DcId, PoolId};
use ckf_proto::{convert, v1};
use ckf_svc_kit::access::{Reloadable, credentials, read_optional_token_file};
use ckf_svc_kit::config::Invalid;
use ckf_svc_kit::metrics::counter_vec;
use prometheus::{IntCounterVec, Registry};
use serde::{Deserialize, Serialize};
use tonic::{Request, Status};

use crate::status::{AdminError, QueryError, RelayError};

/// The `[auth]` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// Every `Attach` must identify one of `producers` (else `UNAUTHENTICATED`).
    pub required: bool,
    /// Query RPCs need `authorization: Bearer <the token in this file>` (one line).
    pub query_token_file: Option<PathBuf>,
    /// Producer principals and the pools each may publish.
    pub producers: Vec<ProducerAuth>,
    /// The `Admin` service (catalog reloads) needs `authorization: Bearer <the token in this
    /// file>`; absent, it refuses every call.
    pub admin_token_file: Option<PathBuf>,
}

/// One `[[auth.producers]]` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProducerAuth {
    /// Name in logs and refusals (unique).
    pub name: String,
    /// Pools it may publish (at least one): a DC id of the primary domain's lanes
    /// (`manifest.lanes`), or `domain/dc` for a lane of any domain served.
    pub pools: Vec<String>,
    /// Names of its client certificate (DNS / URI SAN or subject CN), any of which identifies it.
    pub cert_names: Vec<String>,
    /// File holding its bearer token (one line).
    pub token_file: Option<PathBuf>,
}

/// The policies in force.
#[derive(Debug)]
struct Policies {
    relay: Policy<PoolGrant>,
    query: TokenGate,
    /// `None`: no `auth.admin_token_file`, the Admin service is off.
    admin: Option<TokenGate>,
}

/// One domain's name and lanes, as the access rules see them (the first of a list is the
/// primary: a pool written as a bare DC id is that domain's).
#[derive(Debug, Clone)]
pub struct DomainLanes {
    /// The domain's name.
    pub domain: String,
    /// Its DC ids, in lane order.
    pub lanes: Vec<String>,
}

/// The pool an `[[auth.producers]]` entry names: `dc` (the primary domain's) or `domain/dc`.
fn granted_pool(entry: &str, domains: &[DomainLanes]) -> Result<PoolId, String> {
    let (domain, dc) = match entry.split_once('/') {
        Some((domain, dc)) => {
            let served = domains.iter().find(|d| d.domain == domain).ok_or_else(|| {
                let names: Vec<&str> = domains.iter().map(|d| d.domain.as_str()).collect();
                format!(
                    "names domain {domain}, not served here (domains: {})",
                    names.join(", ")
                )
            })?;
            (served, dc)
        }
        None => (&domains[0], entry),
    };
    let dc_id = DcId::new(dc).map_err(|e| e.to_string())?;
    if !domain.lanes.iter().any(|l| l == dc) {
        return Err(format!(
            "is not a lane of domain {} (its lanes: {})",
            domain.domain,
            domain.lanes.join(", ")
        ));
    }
    let domain = ckf_core::identity::IndexerDomainId::new(domain.domain.clone())
        .map_err(|e| e.to_string())?;
    Ok(PoolId { domain, dc: dc_id })
}

/// Builds both policies from `auth`, reading every token file. `domains` are the domains
/// served, the primary first (a granted pool must be one of their lanes).
fn build(auth: &AuthConfig, domains: &[DomainLanes]) -> Result<Policies, Invalid> {
    let mut entries = Vec::with_capacity(auth.producers.len());
    for (i, p) in auth.producers.iter().enumerate() {
        let key = |field: &str| format!("auth.producers[{i}].{field}");
        if p.pools.is_empty() {
            return Err(Invalid::new(
                key("pools"),
                "[]",
                "list at least one pool (DC id, or domain/DC) this producer may publish",
            ));
        }
        let mut pools = BTreeSet::new();
        for (j, entry) in p.pools.iter().enumerate() {
            let pool = granted_pool(entry, domains).map_err(|rule| {
                Invalid::new(format!("auth.producers[{i}].pools[{j}]"), entry, rule)
            })?;
            pools.insert(pool);
        }
        let token = read_optional_token_file(&key("token_file"), p.token_file.as_deref())?;
        entries.push((
            Principal {
                name: p.name.clone(),
                cert_names: p.cert_names.clone(),
                token,
            },
            PoolGrant { pools },
        ));
    }
    let relay = Policy::new(auth.required, entries).map_err(|e| {
        let (key, value) = match e {
            ckf_core::access::PolicyError::RequiredWithoutPrincipals => ("auth.required", "true"),
            _ => ("auth.producers", "[...]"),
        };
        Invalid::new(key, value, e.to_string())
    })?;
    let query = TokenGate::new(read_optional_token_file(
        "auth.query_token_file",
        auth.query_token_file.as_deref(),
    )?);
    let admin =
        read_optional_token_file("auth.admin_token_file", auth.admin_token_file.as_deref())?
            .map(|token| TokenGate::new(Some(token)));
    Ok(Policies {
        relay,
        query,
        admin,
    })
}

/// Checks `auth` (and reads its token files) against the domains served (the primary first).
///
/// # Errors
/// [`Invalid`] naming the key: an unreadable or empty token file (with its path), a pool that is
/// not a lane, a principal without credentials, a shared name / certificate name / token,
/// `required` without producers.
pub fn validate(auth: &AuthConfig, domains: &[DomainLanes]) -> Result<(), Invalid> {
    build(auth, domains).map(|_| ())
}

/// Policies built for a catalog reload, not yet in force ([`IndexerAccess::prepare`]).
#[derive(Debug)]
pub struct PreparedAccess {
    policies: Policies,
    config: (AuthConfig, Vec<DomainLanes>),
}

/// The access checks of one indexer (shared by the Relay, Query and Admin handlers).
#[derive(Debug)]
pub struct IndexerAccess {
    /// Bumped each time a catalog reload puts new policies in force: attached relay streams
    /// check their grant again ([`IndexerAccess::grants_changed`]).
    generation: tokio::sync::watch::Sender<u64>,
    /// The `[auth]` section and the domains its pools are checked against (replaced by a
    /// catalog reload, re-read by a token reload).
    config: std::sync::Mutex<(AuthConfig, Vec<DomainLanes>)>,
    policies: Reloadable<Policies>,
    refused: IntCounterVec,
}

impl IndexerAccess {
    /// Builds the policies (reading the token files) and registers
    /// `ckf_indexer_auth_refused_total` in `registry`.
    ///
    /// # Errors
    /// As [`validate`].
    pub fn new(
        auth: &AuthConfig,
        domains: &[DomainLanes],
        registry: &Registry,
    ) -> Result<Self, Invalid> {
        let policies = build(auth, domains)?;
        let refused = counter_vec(
            registry,
            "ckf_indexer_auth_refused_total",
            "Requests refused by authorization, by service (relay, query, admin) and gRPC code \
             (unauthenticated, permission_denied).",
            &["service", "code"],
        );
        for service in ["relay", "query", "admin"] {
            for code in ["unauthenticated", "permission_denied"] {
                refused.with_label_values(&[service, code]);
            }
        }
        Ok(Self {
            generation: tokio::sync::watch::Sender::new(0),
            config: std::sync::Mutex::new((auth.clone(), domains.to_vec())),
            policies: Reloadable::new(policies),
            refused,
        })
    }

    /// Re-reads every token file; the previous tokens stay in force when one fails.
    ///
    /// # Errors
    /// The refused key, path and reason, as text.
    pub fn reload(&self) -> Result<String, String> {
        let config = self.config.lock().expect("auth config lock");
        let policies = build(&config.0, &config.1).map_err(|e| e.to_string())?;
        let principals = policies.relay.entries().len();
        self.policies.set(policies);
        Ok(format!(
            "{principals} producer principal(s), query token reloaded"
        ))
    }

    /// Checks `auth` against the domains `domains` (reading its token files): the policies a
    /// catalog reload puts in force with [`IndexerAccess::replace`].
    ///
    /// # Errors
    /// As [`validate`].
    pub fn prepare(auth: &AuthConfig, domains: &[DomainLanes]) -> Result<PreparedAccess, Invalid> {
        Ok(PreparedAccess {
            policies: build(auth, domains)?,
            config: (auth.clone(), domains.to_vec()),
        })
    }

    /// Puts `prepared` in force: the next Attach and call are checked against it, and every
    /// attached relay stream checks its grant again (one that lost it ends).
    pub fn replace(&self, prepared: PreparedAccess) {
        let mut config = self.config.lock().expect("auth config lock");
        self.policies.set(prepared.policies);
        *config = prepared.config;
        self.generation.send_modify(|g| *g += 1);
    }

    /// Changes when new policies are put in force ([`IndexerAccess::replace`]).
    pub fn grants_changed(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Whether `credentials` may still publish `pool` under the policies in force (an attached
    /// stream after a reload); the principal's name.
    ///
    /// # Errors
    /// The refusal (counted), as at attach.
    pub fn recheck(
        &self,
        credentials: &Result<Credentials, AccessError>,
        pool: &PoolId,
    ) -> Result<String, AccessError> {
        let policies = self.policies.get();
        let decision = credentials.clone().and_then(|c| {
            policies
                .relay
                .authorize_attach(&c, pool)
                .map(|i| i.name().to_owned())
        });
        decision.inspect_err(|error| self.count("relay", error))
    }

    /// The interceptor guarding Admin: `PERMISSION_DENIED` without `auth.admin_token_file`,
    /// else the bearer token (`UNAUTHENTICATED` without it); refusals counted under `admin`.
    pub fn admin_interceptor(
        self: &Arc<Self>,
    ) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone + Send + Sync + 'static
    {
        let access = Arc::clone(self);
        move |request: Request<()>| {
            let policies = access.policies.get();
            let Some(gate) = &policies.admin else {
                access
                    .refused
                    .with_label_values(&["admin", "permission_denied"])
                    .inc();
                return Err(AdminError::Off.into());
            };
            match credentials(&request).and_then(|c| gate.check(&c)) {
                Ok(()) => Ok(request),
                Err(error) => {
                    access.count("admin", &error);
                    Err(AdminError::Unauthenticated(error).into())
                }
            }
        }
    }

    /// A one-line summary for the start log; `client_certificates`: the listeners require a
    /// client certificate (`tls.client_auth = "required"`), which guards Query without a token.
    pub fn summary(&self, client_certificates: bool) -> String {
        let p = self.policies.get();
        format!(
            "relay: {}; query: {}",
            if p.relay.is_off() {
                "open (no [auth] principals)".to_owned()
            } else {
                format!(
                    "{} principal(s), {}",
                    p.relay.entries().len(),
                    if p.relay.required() {
                        "required"
                    } else {
                        "anonymous allowed"
                    }
                )
            },
            match (p.query.is_open(), client_certificates) {
                (false, _) => "bearer token",
                (true, true) => "client certificate required (no token)",
                (true, false) => "open",
            }
        )
    }

    fn count(&self, service: &str, error: &AccessError) {
        self.refused
            .with_label_values(&[service, error.code_label()])
            .inc();
    }

    /// Whether the stream whose request presented `credentials` may attach as `attach` says;
    /// returns the principal's name (`anonymous` when none is required). Runs before
    /// `GlobalCkfIndexer::attach`.
    ///
    /// # Errors
    /// [`RelayError::BadAttach`] for an undecodable pool, [`RelayError::Access`] for a refusal
    /// (counted).
    pub fn authorize_attach(
        &self,
        credentials: &Result<Credentials, AccessError>,
        attach: &v1::Attach,
    ) -> Result<String, RelayError> {
        let pool = convert::attach_pool(attach).map_err(RelayError::BadAttach)?;
        let policies = self.policies.get();
        let decision = credentials.clone().and_then(|c| {
            policies
                .relay
                .authorize_attach(&c, &pool)
                .map(|i| i.name().to_owned())
        });
        decision.map_err(|error| {
            self.count("relay", &error);
            RelayError::Access(error)
        })
    }

    /// The interceptor guarding Query: passes when no query token is configured or the request
    /// carries it; else `UNAUTHENTICATED` (counted).
    pub fn query_interceptor(
        self: &Arc<Self>,
    ) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone + Send + Sync + 'static
    {
        let access = Arc::clone(self);
        move |request: Request<()>| {
            let checked = credentials(&request).and_then(|c| access.policies.get().query.check(&c));
            match checked {
                Ok(()) => Ok(request),
                Err(error) => {
                    access.count("query", &error);
                    if let Some(suppressed) = QUERY_REFUSAL_LOG.admit() {
                        let peer = peer_addr(&request);
                        tracing::warn!(%error, %peer, suppressed, "query refused");
                    }
                    Err(QueryError::Unauthenticated(error).into())
                }
            }
        }
    }
}

/// The rate limit of "query refused" lines (any router can trigger them).
static QUERY_REFUSAL_LOG: LogThrottle = LogThrottle::new(REFUSAL_LOG_INTERVAL);

#[cfg(test)]
mod tests {
    use super::*;

    /// Domain `d` (primary: dc-a, dc-b) and domain `q` (dc-a, dc-c).
    fn lanes() -> Vec<DomainLanes> {
        vec![
            DomainLanes {
                domain: "d".into(),
                lanes: vec!["dc-a".into(), "dc-b".into()],
            },
            DomainLanes {
                domain: "q".into(),
                lanes: vec!["dc-a".into(), "dc-c".into()],
            },
        ]
    }

    #[test]
    fn invalid_sections_name_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("a.token");
        std::fs::write(&token, "tok-a.0123456789\n").unwrap();
        let producer = |pools: &[&str], token_file: Option<PathBuf>| ProducerAuth {
            name: "dc-a".into(),
            pools: pools.iter().map(|&p| p.to_owned()).collect(),
            cert_names: vec![],
            token_file,
        };
        let auth = |p: ProducerAuth| AuthConfig {
            required: true,
            producers: vec![p],
            ..AuthConfig::default()
        };
        validate(&auth(producer(&["dc-a"], Some(token.clone()))), &lanes()).unwrap();

        let err = validate(&auth(producer(&["dc-z"], Some(token.clone()))), &lanes()).unwrap_err();
        assert_eq!(err.key, "auth.producers[0].pools[0]");
        assert!(err.rule.contains("not a lane of domain d"), "{err}");
        // Another domain's lane, named as domain/DC: dc-c is q's, not the primary's.
        let other = |pool: &str| validate(&auth(producer(&[pool], Some(token.clone()))), &lanes());
        other("q/dc-c").unwrap();
        other("d/dc-a").unwrap();
        let err = other("dc-c").unwrap_err();
        assert!(
            err.rule
                .contains("not a lane of domain d (its lanes: dc-a, dc-b)"),
            "{err}"
        );
        let err = other("d/dc-c").unwrap_err();
        assert!(err.rule.contains("not a lane of domain d"), "{err}");
        let err = other("m/dc-a").unwrap_err();
        assert!(
            err.rule
                .contains("names domain m, not served here (domains: d, q)"),
            "{err}"
        );
        let err = other("q/bad dc").unwrap_err();
        assert_eq!(err.value, "q/bad dc");

        let missing = dir.path().join("missing.token");
        let err = validate(&auth(producer(&["dc-a"], Some(missing))), &lanes()).unwrap_err();
        assert_eq!(err.key, "auth.producers[0].token_file");
        assert!(err.value.contains("missing.token"), "{err}");

        let err = validate(&auth(producer(&["dc-a"], None)), &lanes()).unwrap_err();
        assert!(err.rule.contains("neither cert_names nor a token"), "{err}");

        let err = validate(&auth(producer(&[], Some(token))), &lanes()).unwrap_err();
        assert_eq!(err.key, "auth.producers[0].pools");

        let required_alone = AuthConfig {
            required: true,
            ..AuthConfig::default()
        };
        let err = validate(&required_alone, &lanes()).unwrap_err();
        assert_eq!(err.key, "auth.required");
        validate(&AuthConfig::default(), &lanes()).unwrap();
    }

    #[test]
    fn the_section_loads_from_toml_and_flags() {
        use clap::Parser;
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("a.token");
        std::fs::write(&token, "tok-a.0123456789\n").unwrap();
        let file = dir.path().join("i.toml");
        std::fs::write(
            &file,
            format!(
                "[auth]\nrequired = true\n[[auth.producers]]\nname = \"dc-a\"\n\
                 pools = [\"dc-a\"]\ncert_names = [\"producer.dc-a.ckf\"]\ntoken_file = {token:?}\n"
            ),
        )
        .unwrap();
        let config = crate::config::Cli::parse_from([
            "ckf-indexer",
            "--config",
            file.to_str().unwrap(),
            "--query-listen",
            "127.0.0.1:7401",
            "--query-token-file",
            token.to_str().unwrap(),
        ])
        .load()
        .unwrap();
        assert!(config.auth.required);
        assert_eq!(config.auth.producers[0].cert_names, ["producer.dc-a.ckf"]);
        assert_eq!(
            config.auth.query_token_file.as_deref(),
            Some(token.as_path())
        );
        assert_eq!(config.query_listen, Some("127.0.0.1:7401".parse().unwrap()));
        let text =
            crate::config::Cli::parse_from(["ckf-indexer", "--query-listen", "127.0.0.1:7400"])
                .load()
                .unwrap_err()
                .to_string();
        assert!(text.contains("query_listen = 127.0.0.1:7400"), "{text}");
        let text =
            crate::config::Cli::parse_from(["ckf-indexer", "--query-token-file", "/nonexistent/q"])
                .load()
                .unwrap_err()
                .to_string();
        assert!(
            text.contains("auth.query_token_file = /nonexistent/q"),
            "{text}"
        );
    }

    #[test]
    fn tokens_are_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("q.token");
        std::fs::write(&token, "old.0123456789abc\n").unwrap();
        let auth = AuthConfig {
            query_token_file: Some(token.clone()),
            ..AuthConfig::default()
        };
        let access = Arc::new(IndexerAccess::new(&auth, &lanes(), &Registry::new()).unwrap());
        let mut gate = access.query_interceptor();
        let with = |t: &str| {
            let mut r = Request::new(());
            r.metadata_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
            r
        };
        assert!(gate(with("old.0123456789abc")).is_ok());
        assert_eq!(
            gate(Request::new(())).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        std::fs::write(&token, "new.0123456789abc\n").unwrap();
        access.reload().unwrap();
        assert!(gate(with("old.0123456789abc")).is_err());
        assert!(gate(with("new.0123456789abc")).is_ok());
        // A broken file keeps the tokens in force.
        std::fs::write(&token, "").unwrap();
        assert!(access.reload().is_err());
        assert!(gate(with("new.0123456789abc")).is_ok());
    }
}
