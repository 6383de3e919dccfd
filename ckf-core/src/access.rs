//! Who may do what: the identity a request presents, the policies that map identities to what
//! they may touch, and the precise refusals (sans-IO: the services read the token files, the
//! metadata and the peer certificate, and call these rules).
//!
//! ```text
//! request -> Credentials { cert_names (verified client certificate), bearer token }
//!         -> Policy::identify -> Identity::Anonymous | Identity::Known(principal, grant)
//!         -> authorize_attach (pool) | authorize_batch (source id, workers) | QueryGate
//!         -> Ok | AccessError::Unauthenticated | AccessError::PermissionDenied
//! ```
//!
//! Rules of [`Policy::identify`]:
//! * **Off**: a policy that is not `required` and lists no principal checks nothing (every
//!   request is [`Identity::Anonymous`], credentials are ignored).
//! * A bearer token must equal one principal's token (compared in constant time, every
//!   principal's token compared so the time does not say which one matched): otherwise
//!   `Unauthenticated` (an unknown token is never "anonymous").
//! * Certificate names (the names of a client certificate the TLS layer has verified) identify
//!   the principals that list any of them in `cert_names`. Two different principals identified
//!   at once (by two names, or by the certificate and the token) is `Unauthenticated`: the
//!   credentials contradict each other.
//! * A verified certificate that maps to no principal is `PermissionDenied` when the policy is
//!   `required` (the peer is authentic but has no grant), anonymous otherwise.
//! * No credential at all: `Unauthenticated` when `required`, anonymous otherwise.
//!
//! An identified principal is always held to its grants, `required` or not; an anonymous
//! request is allowed everything only while the policy is not `required` (a rollout mode:
//! principals first, then `required = true`).
//!
//! Tokens ([`Secret`]) come from files of one line (surrounding whitespace trimmed), printable
//! ASCII without spaces (they travel in an HTTP/2 header as `authorization: Bearer <token>`),
//! 1..=[`MAX_SECRET_BYTES`] bytes. Their `Debug` shows only their length.

use std::collections::BTreeSet;
use std::fmt;

use subtle::ConstantTimeEq;
use thiserror::Error;

use crate::identity::PoolId;

/// Longest accepted token, in bytes.
pub const MAX_SECRET_BYTES: usize = 4096;

/// A shared secret (bearer token). Compared in constant time; never printed.
#[derive(Clone)]
pub struct Secret(Box<[u8]>);

/// Why a token file's text is not a token.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SecretError {
    /// Nothing but whitespace.
    #[error("the token is empty")]
    Empty,
    /// More than one non-empty line.
    #[error("the token file has {lines} lines; it must hold the token alone on one line")]
    SeveralLines {
        /// Non-empty lines found.
        lines: usize,
    },
    /// A byte that cannot travel in `authorization: Bearer <token>` (space, control, non-ASCII).
    #[error(
        "the token has a byte outside printable ASCII without spaces (0x21..=0x7e) at position {position}"
    )]
    BadByte {
        /// 0-based position in the trimmed token.
        position: usize,
    },
    /// Longer than [`MAX_SECRET_BYTES`].
    #[error("the token is {len} bytes; at most {MAX_SECRET_BYTES} are allowed")]
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
}

impl Secret {
    /// The token of a token file's whole text: one line, surrounding whitespace trimmed.
    ///
    /// # Errors
    /// [`SecretError`] naming the rule the text breaks.
    pub fn from_file_text(text: &str) -> Result<Self, SecretError> {
        let lines = text.lines().filter(|l| !l.trim().is_empty()).count();
        if lines > 1 {
            return Err(SecretError::SeveralLines { lines });
        }
        Self::new(text.trim().as_bytes())
    }

    /// A token as given (no trimming).
    ///
    /// # Errors
    /// [`SecretError::Empty`], [`SecretError::TooLong`], [`SecretError::BadByte`].
    pub fn new(token: &[u8]) -> Result<Self, SecretError> {
        if token.is_empty() {
            return Err(SecretError::Empty);
        }
        if token.len() > MAX_SECRET_BYTES {
            return Err(SecretError::TooLong { len: token.len() });
        }
        if let Some(position) = token.iter().position(|b| !(0x21..=0x7e).contains(b)) {
            return Err(SecretError::BadByte { position });
        }
        Ok(Self(token.into()))
    }

    /// Whether `presented` is this token, in time that depends only on the lengths.
    pub fn matches(&self, presented: &[u8]) -> bool {
        bool::from(self.0.as_ref().ct_eq(presented))
    }

    /// The token's bytes (for a client that sends it).
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

/// What a request presents: the names of its verified client certificate (DNS / URI SANs and
/// subject CN; empty without one) and its bearer token, if any.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    /// Names of the verified client certificate.
    pub cert_names: Vec<String>,
    /// The bearer token of `authorization: Bearer <token>`.
    pub bearer: Option<Secret>,
}

impl Credentials {
    /// Credentials from the raw `authorization` value (if any) and the certificate names.
    ///
    /// # Errors
    /// [`AccessError::Unauthenticated`] ([`Unauthenticated::MalformedAuthorization`]) when the
    /// value is not `Bearer <token>` (scheme case-insensitive, RFC 6750) with a valid token.
    pub fn from_parts(
        authorization: Option<&[u8]>,
        cert_names: Vec<String>,
    ) -> Result<Self, AccessError> {
        let bearer = match authorization {
            None => None,
            Some(value) => Some(parse_bearer(value)?),
        };
        Ok(Self { cert_names, bearer })
    }

    /// Whether nothing is presented.
    pub fn is_empty(&self) -> bool {
        self.cert_names.is_empty() && self.bearer.is_none()
    }
}

fn parse_bearer(value: &[u8]) -> Result<Secret, AccessError> {
    let malformed = || AccessError::Unauthenticated(Unauthenticated::MalformedAuthorization);
    let (scheme, token) = value
        .iter()
        .position(|&b| b == b' ')
        .map(|i| (&value[..i], &value[i + 1..]))
        .ok_or_else(malformed)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return Err(malformed());
    }
    Secret::new(token.trim_ascii()).map_err(|_| malformed())
}

/// A configured identity: its name (for logs, metrics and refusals), the certificate names and
/// the token that identify it.
#[derive(Debug, Clone)]
pub struct Principal {
    /// Name shown in logs and refusals.
    pub name: String,
    /// Any of these names in a verified client certificate identifies the principal.
    pub cert_names: Vec<String>,
    /// A bearer token that identifies the principal.
    pub token: Option<Secret>,
}

/// A configuration of principals that cannot be enforced unambiguously.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PolicyError {
    /// A principal without a name.
    #[error("principal #{index} has an empty name")]
    EmptyName {
        /// Its position.
        index: usize,
    },
    /// Two principals with one name.
    #[error("principal name {name:?} is used twice (#{first} and #{second})")]
    DuplicateName {
        /// The name.
        name: String,
        /// First position.
        first: usize,
        /// Second position.
        second: usize,
    },
    /// A principal nothing can identify.
    #[error("principal {name:?} has neither cert_names nor a token: nothing can identify it")]
    NoCredential {
        /// The principal.
        name: String,
    },
    /// An empty certificate name.
    #[error("principal {name:?} lists an empty certificate name")]
    EmptyCertName {
        /// The principal.
        name: String,
    },
    /// One certificate name listed by two principals.
    #[error("certificate name {cert_name:?} is listed by both {first:?} and {second:?}")]
    SharedCertName {
        /// The name.
        cert_name: String,
        /// First principal.
        first: String,
        /// Second principal.
        second: String,
    },
    /// One token given to two principals.
    #[error("principals {first:?} and {second:?} have the same token")]
    SharedToken {
        /// First principal.
        first: String,
        /// Second principal.
        second: String,
    },
    /// `required` with no principal: nothing could ever be allowed.
    #[error(
        "authorization is required but no principal is configured: every request would be refused"
    )]
    RequiredWithoutPrincipals,
}

/// Principals and what each may touch (`G`, the grant: pools for the Relay, sources and
/// workers for Ingest).
#[derive(Debug, Clone)]
pub struct Policy<G> {
    required: bool,
    entries: Vec<(Principal, G)>,
}

/// Who a request is, under a [`Policy`].
#[derive(Debug, Clone, Copy)]
pub enum Identity<'p, G> {
    /// No principal identified, and the policy does not require one.
    Anonymous,
    /// The principal identified and its grant.
    Known {
        /// The principal.
        principal: &'p Principal,
        /// What it may touch.
        grant: &'p G,
    },
}

impl<G> Identity<'_, G> {
    /// The principal's name, or `"anonymous"`.
    pub fn name(&self) -> &str {
        match self {
            Identity::Anonymous => "anonymous",
            Identity::Known { principal, .. } => &principal.name,
        }
    }
}

impl<G> Policy<G> {
    /// A policy over `entries`; `required`: every request must identify a principal.
    ///
    /// # Errors
    /// [`PolicyError`] for a principal without name or credential, a name, certificate name
    /// or token shared by two principals, or `required` without principals.
    pub fn new(required: bool, entries: Vec<(Principal, G)>) -> Result<Self, PolicyError> {
        if required && entries.is_empty() {
            return Err(PolicyError::RequiredWithoutPrincipals);
        }
        for (i, (p, _)) in entries.iter().enumerate() {
            if p.name.is_empty() {
                return Err(PolicyError::EmptyName { index: i });
            }
            if p.cert_names.is_empty() && p.token.is_none() {
                return Err(PolicyError::NoCredential {
                    name: p.name.clone(),
                });
            }
            if p.cert_names.iter().any(String::is_empty) {
                return Err(PolicyError::EmptyCertName {
                    name: p.name.clone(),
                });
            }
            for (j, (q, _)) in entries[..i].iter().enumerate() {
                if q.name == p.name {
                    return Err(PolicyError::DuplicateName {
                        name: p.name.clone(),
                        first: j,
                        second: i,
                    });
                }
                if let Some(cert_name) = p.cert_names.iter().find(|n| q.cert_names.contains(n)) {
                    return Err(PolicyError::SharedCertName {
                        cert_name: cert_name.clone(),
                        first: q.name.clone(),
                        second: p.name.clone(),
                    });
                }
                if let (Some(a), Some(b)) = (&p.token, &q.token)
                    && a.matches(b.expose())
                {
                    return Err(PolicyError::SharedToken {
                        first: q.name.clone(),
                        second: p.name.clone(),
                    });
                }
            }
        }
        Ok(Self { required, entries })
    }

    /// A policy that checks nothing (not required, no principal).
    pub fn off() -> Self {
        Self {
            required: false,
            entries: Vec::new(),
        }
    }

    /// Whether the policy checks nothing.
    pub fn is_off(&self) -> bool {
        !self.required && self.entries.is_empty()
    }

    /// Whether every request must identify a principal.
    pub fn required(&self) -> bool {
        self.required
    }

    /// The principals and their grants.
    pub fn entries(&self) -> &[(Principal, G)] {
        &self.entries
    }

    /// Who `credentials` identify (the rules are in the [module docs](self)).
    ///
    /// # Errors
    /// [`AccessError::Unauthenticated`] for no credential under `required`, an unknown token,
    /// or credentials naming two principals; [`AccessError::PermissionDenied`] for a verified
    /// certificate that maps to no principal under `required`.
    pub fn identify(&self, credentials: &Credentials) -> Result<Identity<'_, G>, AccessError> {
        if self.is_off() {
            return Ok(Identity::Anonymous);
        }
        let mut by_token = None;
        if let Some(bearer) = &credentials.bearer {
            // Every token is compared (no early exit), so timing does not tell which matched.
            for (i, (p, _)) in self.entries.iter().enumerate() {
                let hit = p.token.as_ref().is_some_and(|t| t.matches(bearer.expose()));
                if hit {
                    by_token = Some(i);
                }
            }
            if by_token.is_none() {
                return Err(AccessError::Unauthenticated(Unauthenticated::UnknownToken));
            }
        }
        let mut by_cert = None::<usize>;
        for (i, (p, _)) in self.entries.iter().enumerate() {
            if p.cert_names
                .iter()
                .any(|n| credentials.cert_names.contains(n))
            {
                if let Some(first) = by_cert {
                    return Err(conflict(&self.entries[first].0, p, "certificate"));
                }
                by_cert = Some(i);
            }
        }
        let index = match (by_token, by_cert) {
            (Some(t), Some(c)) if t != c => {
                return Err(conflict(&self.entries[c].0, &self.entries[t].0, "token"));
            }
            (Some(i), _) | (None, Some(i)) => i,
            (None, None) if !credentials.cert_names.is_empty() => {
                return if self.required {
                    Err(AccessError::PermissionDenied(Denied::UnmappedCertificate {
                        names: credentials.cert_names.clone(),
                    }))
                } else {
                    Ok(Identity::Anonymous)
                };
            }
            (None, None) => {
                return if self.required {
                    Err(AccessError::Unauthenticated(Unauthenticated::NoCredentials))
                } else {
                    Ok(Identity::Anonymous)
                };
            }
        };
        let (principal, grant) = &self.entries[index];
        Ok(Identity::Known { principal, grant })
    }
}

fn conflict(first: &Principal, second: &Principal, second_by: &'static str) -> AccessError {
    AccessError::Unauthenticated(Unauthenticated::Conflict {
        first: first.name.clone(),
        second: second.name.clone(),
        second_by,
    })
}

/// The pools a Relay principal may publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolGrant {
    /// Pools (this indexer's domain + a DC id) it may attach for.
    pub pools: BTreeSet<PoolId>,
}

impl Policy<PoolGrant> {
    /// Whether `credentials` may attach for `pool`; returns the identity admitted.
    ///
    /// # Errors
    /// As [`Policy::identify`], and [`Denied::Pool`] for a principal without `pool`.
    pub fn authorize_attach(
        &self,
        credentials: &Credentials,
        pool: &PoolId,
    ) -> Result<Identity<'_, PoolGrant>, AccessError> {
        let identity = self.identify(credentials)?;
        if let Identity::Known { principal, grant } = identity
            && !grant.pools.contains(pool)
        {
            return Err(AccessError::PermissionDenied(Denied::Pool {
                principal: principal.name.clone(),
                pool: pool.to_string(),
                allowed: grant.pools.iter().map(ToString::to_string).collect(),
            }));
        }
        Ok(identity)
    }
}

/// A set of allowed values: all of them (`"*"`) or exactly these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope<T> {
    /// Every value.
    All,
    /// Exactly these values (empty: none).
    Only(BTreeSet<T>),
}

impl<T: Ord> Scope<T> {
    /// Whether `value` is allowed.
    pub fn allows(&self, value: &T) -> bool {
        match self {
            Scope::All => true,
            Scope::Only(set) => set.contains(value),
        }
    }
}

/// What an Ingest principal may publish: its batches' source ids and the workers their events
/// touch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceGrant {
    /// `KvEventBatch.source_id` values it may use.
    pub source_ids: Scope<String>,
    /// Worker ids its events may touch (store, remove, clear, worker removed).
    pub workers: Scope<u64>,
}

impl Identity<'_, SourceGrant> {
    /// Whether this identity may publish a batch of `source_id` whose events touch `workers`
    /// (in event order); anonymous identities may publish anything.
    ///
    /// # Errors
    /// [`Denied::Source`] for a source id outside the grant, else [`Denied::Worker`] naming the
    /// first event whose worker is outside it.
    pub fn authorize_batch(
        &self,
        source_id: &str,
        workers: impl IntoIterator<Item = u64>,
    ) -> Result<(), AccessError> {
        let Identity::Known { principal, grant } = self else {
            return Ok(());
        };
        if !grant.source_ids.allows(&source_id.to_owned()) {
            return Err(AccessError::PermissionDenied(Denied::Source {
                principal: principal.name.clone(),
                source_id: source_id.to_owned(),
            }));
        }
        if let Some((event, worker_id)) = workers
            .into_iter()
            .enumerate()
            .find(|(_, w)| !grant.workers.allows(w))
        {
            return Err(AccessError::PermissionDenied(Denied::Worker {
                principal: principal.name.clone(),
                source_id: source_id.to_owned(),
                event,
                worker_id,
            }));
        }
        Ok(())
    }

    /// Whether this identity may report `worker_id`'s load as `source_id` (`Ingest.ReportLoad`):
    /// the batch rule for one event touching the worker, refused in the load's own words.
    ///
    /// # Errors
    /// [`Denied::Source`] for a source id outside the grant, else [`Denied::LoadWorker`].
    pub fn authorize_load(&self, source_id: &str, worker_id: u64) -> Result<(), AccessError> {
        match self.authorize_batch(source_id, [worker_id]) {
            Err(AccessError::PermissionDenied(Denied::Worker {
                principal,
                source_id,
                worker_id,
                ..
            })) => Err(AccessError::PermissionDenied(Denied::LoadWorker {
                principal,
                source_id,
                worker_id,
            })),
            other => other,
        }
    }

    /// Whether this identity may read where `source_id` stands (`Ingest.GetSourceSequence`):
    /// the source ids it may publish as, since a source's position tells what it sent (and
    /// only the source itself needs it); anonymous identities may read any.
    ///
    /// # Errors
    /// [`Denied::SourceRead`] for a source id outside the grant.
    pub fn authorize_source_read(&self, source_id: &str) -> Result<(), AccessError> {
        let Identity::Known { principal, grant } = self else {
            return Ok(());
        };
        if grant.source_ids.allows(&source_id.to_owned()) {
            Ok(())
        } else {
            Err(AccessError::PermissionDenied(Denied::SourceRead {
                principal: principal.name.clone(),
                source_id: source_id.to_owned(),
            }))
        }
    }
}

/// The optional bearer token of a read-only API (the indexer's Query).
#[derive(Debug, Clone, Default)]
pub struct TokenGate {
    token: Option<Secret>,
}

impl TokenGate {
    /// A gate requiring `token` (`None`: open).
    pub fn new(token: Option<Secret>) -> Self {
        Self { token }
    }

    /// Whether the gate is open (no token configured).
    pub fn is_open(&self) -> bool {
        self.token.is_none()
    }

    /// Whether `credentials` pass.
    ///
    /// # Errors
    /// [`Unauthenticated::NoBearerToken`] without a bearer token (a client certificate does not
    /// count here), [`Unauthenticated::UnknownToken`]
    /// for another token.
    pub fn check(&self, credentials: &Credentials) -> Result<(), AccessError> {
        let Some(token) = &self.token else {
            return Ok(());
        };
        match &credentials.bearer {
            None => Err(AccessError::Unauthenticated(Unauthenticated::NoBearerToken)),
            Some(b) if token.matches(b.expose()) => Ok(()),
            Some(_) => Err(AccessError::Unauthenticated(Unauthenticated::UnknownToken)),
        }
    }
}

/// Why a request could not be authenticated.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Unauthenticated {
    /// No certificate and no bearer token, where one is required.
    #[error("no credentials: present a client certificate or `authorization: Bearer <token>`")]
    NoCredentials,
    /// No bearer token where only a token is accepted (the Query token gate).
    #[error(
        "no credentials: present `authorization: Bearer <token>` (this service accepts only its token; a client certificate does not identify the caller here)"
    )]
    NoBearerToken,
    /// The `authorization` value is not `Bearer <token>`.
    #[error("the authorization metadata is not `Bearer <token>` with a printable ASCII token")]
    MalformedAuthorization,
    /// The bearer token is nobody's.
    #[error("the bearer token matches no configured principal")]
    UnknownToken,
    /// The credentials identify two principals.
    #[error("the credentials identify two principals: {first:?} and {second:?} (by {second_by})")]
    Conflict {
        /// One principal.
        first: String,
        /// The other.
        second: String,
        /// What identified the other (`certificate` or `token`).
        second_by: &'static str,
    },
}

/// Why an authenticated (or anonymous) request may not do what it asks.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Denied {
    /// A verified certificate whose names map to no principal, where one is required.
    #[error("client certificate names {names:?} map to no configured principal")]
    UnmappedCertificate {
        /// The certificate's names.
        names: Vec<String>,
    },
    /// A Relay principal attaching for a pool outside its grant.
    #[error("principal {principal:?} may not publish pool {pool} (it may publish: {})", list(.allowed))]
    Pool {
        /// The principal.
        principal: String,
        /// The pool asked for.
        pool: String,
        /// The pools it may publish.
        allowed: Vec<String>,
    },
    /// An Ingest principal using a source id outside its grant.
    #[error("principal {principal:?} may not publish as source {source_id:?}")]
    Source {
        /// The principal.
        principal: String,
        /// The batch's source id.
        source_id: String,
    },
    /// An Ingest principal asking where a source outside its grant stands.
    #[error(
        "principal {principal:?} may not read the sequence of source {source_id:?} (not among its source_ids)"
    )]
    SourceRead {
        /// The principal.
        principal: String,
        /// The source id asked for.
        source_id: String,
    },
    /// An Ingest principal touching a worker outside its grant.
    #[error(
        "principal {principal:?} may not touch worker {worker_id} (source {source_id:?}, event {event}); nothing of the batch was applied"
    )]
    Worker {
        /// The principal.
        principal: String,
        /// The batch's source id.
        source_id: String,
        /// Position of the first refused event.
        event: usize,
        /// Its worker.
        worker_id: u64,
    },
    /// An Ingest principal reporting the load of a worker outside its grant.
    #[error(
        "principal {principal:?} may not report the load of worker {worker_id} (source {source_id:?}); the pool's load is unchanged"
    )]
    LoadWorker {
        /// The principal.
        principal: String,
        /// The report's source id.
        source_id: String,
        /// The worker.
        worker_id: u64,
    },
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        "nothing".into()
    } else {
        items.join(", ")
    }
}

/// A refused request (gRPC `UNAUTHENTICATED` / `PERMISSION_DENIED`).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AccessError {
    /// The request could not be authenticated.
    #[error("unauthenticated: {0}")]
    Unauthenticated(Unauthenticated),
    /// The request is authenticated (or anonymous) but not allowed.
    #[error("permission denied: {0}")]
    PermissionDenied(Denied),
}

impl AccessError {
    /// `"unauthenticated"` or `"permission_denied"` (metric label values).
    pub fn code_label(&self) -> &'static str {
        match self {
            AccessError::Unauthenticated(_) => "unauthenticated",
            AccessError::PermissionDenied(_) => "permission_denied",
        }
    }
}

#[cfg(test)]
mod tests;
