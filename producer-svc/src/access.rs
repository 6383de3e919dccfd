//! Who may call this producer's Ingest, checked against the policy of its `[ingest_auth]`
//! section ([`crate::config::ingest_auth`]: which sources may publish, as which source id,
//! touching which workers), and the bearer token this producer presents to its indexers
//! (`indexer_token_file`). Every rule is `ckf_core::access`'s; this module holds the policy in
//! force, reads the token files and gives the Ingest handlers one check each.
//!
//! `Publish` / `PublishBatch`: the caller is identified once per RPC ([`IngestAccess::caller`],
//! `UNAUTHENTICATED` / `PERMISSION_DENIED` before anything is read), then every batch is
//! checked whole before it reaches the state actor ([`Caller::authorize`]): a source id or a
//! worker outside the grant refuses the batch with `PERMISSION_DENIED` naming the principal and
//! the source or the first refused worker, and nothing of it is applied. `GetStats` and
//! `GetMemberBlocks` need any identified principal when `required`. `GetSourceSequence` reads
//! one source's position: a principal may read only the source ids it may publish as
//! ([`Caller::authorize_source_read`], `PERMISSION_DENIED` naming principal and source).
//! `ReportLoad` is checked like a batch of its source id with one event touching its worker
//! ([`Caller::authorize_load`]): the same check, the same refusals.
//! Engines subscribed over ZMQ (`[[engines]]`) are configured, not authenticated: this section
//! does not apply to them.
//! Refusals are counted in `ckf_producer_auth_refused_total{rpc,code}`. Token files are re-read
//! on SIGHUP.

use std::path::PathBuf;

use ckf_core::access::{AccessError, Identity, Policy, Principal, Secret, SourceGrant};
use ckf_proto::v1;
use ckf_svc_kit::access::{Reloadable, credentials, read_optional_token_file};
use ckf_svc_kit::config::Invalid;
use ckf_svc_kit::metrics::counter_vec;
use prometheus::{IntCounterVec, Registry};
use tonic::{Request, Status};

use crate::config::ingest_auth::{IngestAuthConfig, policy};
use crate::error::RequestError;

/// The token this producer sends to its indexers, re-read on SIGHUP.
#[derive(Debug)]
pub struct IndexerToken {
    file: Option<PathBuf>,
    token: Reloadable<Option<Secret>>,
}

impl IndexerToken {
    /// Reads `indexer_token_file` (none: no token is sent).
    ///
    /// # Errors
    /// [`Invalid`] naming `indexer_token_file` and the path.
    pub fn load(file: Option<PathBuf>) -> Result<Self, Invalid> {
        let token = read_optional_token_file("indexer_token_file", file.as_deref())?;
        Ok(Self {
            file,
            token: Reloadable::new(token),
        })
    }

    /// The token in force.
    pub fn get(&self) -> std::sync::Arc<Option<Secret>> {
        self.token.get()
    }

    /// Re-reads the file (the previous token stays when it fails).
    ///
    /// # Errors
    /// The key, path and reason, as text.
    pub fn reload(&self) -> Result<String, String> {
        let token = read_optional_token_file("indexer_token_file", self.file.as_deref())
            .map_err(|e| e.to_string())?;
        let loaded = if token.is_some() {
            "indexer token reloaded"
        } else {
            "no indexer token"
        };
        self.token.set(token);
        Ok(loaded.into())
    }
}

/// The Ingest access checks of one producer.
#[derive(Debug)]
pub struct IngestAccess {
    config: IngestAuthConfig,
    policy: Reloadable<Policy<SourceGrant>>,
    refused: IntCounterVec,
}

/// The `rpc` label values.
const RPCS: [&str; 6] = [
    "publish",
    "publish_batch",
    "get_stats",
    "get_member_blocks",
    "get_source_sequence",
    "report_load",
];

impl IngestAccess {
    /// Builds the policy (reading the token files) and registers
    /// `ckf_producer_auth_refused_total` in `registry`.
    ///
    /// # Errors
    /// As [`validate`](crate::config::ingest_auth::validate).
    pub fn new(config: &IngestAuthConfig, registry: &Registry) -> Result<Self, Invalid> {
        let policy = policy(config)?;
        let refused = counter_vec(
            registry,
            "ckf_producer_auth_refused_total",
            "Ingest requests and batches refused by [ingest_auth], by RPC and gRPC code \
             (unauthenticated, permission_denied).",
            &["rpc", "code"],
        );
        for rpc in RPCS {
            for code in ["unauthenticated", "permission_denied"] {
                refused.with_label_values(&[rpc, code]);
            }
        }
        Ok(Self {
            config: config.clone(),
            policy: Reloadable::new(policy),
            refused,
        })
    }

    /// A policy that checks nothing (tests, in-process use).
    pub fn off(registry: &Registry) -> Self {
        Self::new(&IngestAuthConfig::default(), registry).expect("the empty policy is valid")
    }

    /// Re-reads every token file; the previous tokens stay in force when one fails.
    ///
    /// # Errors
    /// The refused key, path and reason, as text.
    pub fn reload(&self) -> Result<String, String> {
        let policy = policy(&self.config).map_err(|e| e.to_string())?;
        let n = policy.entries().len();
        self.policy.set(policy);
        Ok(format!("{n} ingest source principal(s) reloaded"))
    }

    /// Who called `rpc` (one of `publish`, `publish_batch`, `get_stats`, `get_member_blocks`,
    /// `get_source_sequence`, `report_load`).
    ///
    /// # Errors
    /// `UNAUTHENTICATED` / `PERMISSION_DENIED` with the reason (counted).
    pub fn caller<T>(&self, rpc: &'static str, request: &Request<T>) -> Result<Caller, Status> {
        let policy = self.policy.get();
        let identified = credentials(request).and_then(|c| {
            policy.identify(&c).map(|identity| match identity {
                Identity::Anonymous => None,
                Identity::Known { principal, grant } => Some((principal.clone(), grant.clone())),
            })
        });
        match identified {
            Ok(known) => Ok(Caller {
                rpc,
                known,
                refused: self.refused.clone(),
            }),
            Err(error) => {
                self.refused
                    .with_label_values(&[rpc, error.code_label()])
                    .inc();
                if let Some(suppressed) = throttle(&error).admit() {
                    let peer = ckf_svc_kit::throttle::peer_addr(request);
                    tracing::warn!(rpc, %error, %peer, suppressed, "ingest request refused");
                }
                Err(Status::from(RequestError::Access(error)))
            }
        }
    }
}

/// An authenticated (or, when not required, anonymous) Ingest caller.
#[derive(Debug, Clone)]
pub struct Caller {
    rpc: &'static str,
    known: Option<(Principal, SourceGrant)>,
    refused: IntCounterVec,
}

impl Caller {
    /// The principal's name, or `anonymous`.
    pub fn name(&self) -> &str {
        self.known.as_ref().map_or("anonymous", |(p, _)| &p.name)
    }

    /// Whether the caller may publish `batch` (its source id and every event's worker).
    ///
    /// # Errors
    /// [`RequestError::Access`] (`PERMISSION_DENIED`) naming the principal and the source id or
    /// the first refused worker (counted).
    pub fn authorize(&self, batch: &v1::KvEventBatch) -> Result<(), RequestError> {
        // Events without a member are rejected by decoding; they touch nobody.
        let workers = batch
            .events
            .iter()
            .filter_map(|e| e.member.as_ref().map(|m| m.worker_id));
        self.authorize_publish(&batch.source_id, workers)
    }

    /// Whether the caller may report `worker_id`'s load as `source_id` (`ReportLoad`): the
    /// batch check, as for one event touching the worker.
    ///
    /// # Errors
    /// As [`Caller::authorize`].
    pub fn authorize_load(&self, source_id: &str, worker_id: u64) -> Result<(), RequestError> {
        self.authorize_with(|identity| identity.authorize_load(source_id, worker_id))
    }

    /// The one publish check: `source_id` and every one of `workers` within the grant.
    fn authorize_publish(
        &self,
        source_id: &str,
        workers: impl IntoIterator<Item = u64>,
    ) -> Result<(), RequestError> {
        self.authorize_with(|identity| identity.authorize_batch(source_id, workers))
    }

    /// A known caller's `check` (an anonymous one passes), its refusal counted and logged.
    fn authorize_with(
        &self,
        check: impl FnOnce(&Identity<'_, SourceGrant>) -> Result<(), AccessError>,
    ) -> Result<(), RequestError> {
        let Some((principal, grant)) = &self.known else {
            return Ok(());
        };
        let identity = Identity::Known { principal, grant };
        check(&identity).map_err(|error: AccessError| {
                self.refused
                    .with_label_values(&[self.rpc, error.code_label()])
                    .inc();
                if let Some(suppressed) = throttle(&error).admit() {
                    tracing::warn!(rpc = self.rpc, principal = %principal.name, %error, suppressed, "ingest request refused");
                }
                RequestError::Access(error)
            })
    }

    /// Whether the caller may read where `source_id` stands (`GetSourceSequence`): a known
    /// principal only the source ids of its grant, an anonymous caller any.
    ///
    /// # Errors
    /// [`RequestError::Access`] (`PERMISSION_DENIED`) naming the principal and the source id
    /// (counted).
    pub fn authorize_source_read(&self, source_id: &str) -> Result<(), RequestError> {
        let Some((principal, grant)) = &self.known else {
            return Ok(());
        };
        Identity::Known { principal, grant }
            .authorize_source_read(source_id)
            .map_err(|error| {
                self.refused
                    .with_label_values(&[self.rpc, error.code_label()])
                    .inc();
                if let Some(suppressed) = throttle(&error).admit() {
                    tracing::warn!(rpc = self.rpc, principal = %principal.name, %error, suppressed, "source sequence read refused");
                }
                RequestError::Access(error)
            })
    }
}

/// The rate limits of the refusal lines, one per code: anyone who reaches Ingest can trigger
/// them (the metric counts every refusal), and a flood of anonymous calls must not hide a known
/// principal's `PERMISSION_DENIED`.
static UNAUTHENTICATED_LOG: ckf_svc_kit::throttle::LogThrottle =
    ckf_svc_kit::throttle::LogThrottle::new(ckf_svc_kit::throttle::REFUSAL_LOG_INTERVAL);
static DENIED_LOG: ckf_svc_kit::throttle::LogThrottle =
    ckf_svc_kit::throttle::LogThrottle::new(ckf_svc_kit::throttle::REFUSAL_LOG_INTERVAL);

fn throttle(error: &AccessError) -> &'static ckf_svc_kit::throttle::LogThrottle {
    match error {
        AccessError::Unauthenticated(_) => &UNAUTHENTICATED_LOG,
        AccessError::PermissionDenied(_) => &DENIED_LOG,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ingest_auth::{SourceAuth, WorkerEntry};

    fn source(source_ids: &[&str], workers: Vec<WorkerEntry>, token: PathBuf) -> SourceAuth {
        SourceAuth {
            name: "router-1".into(),
            cert_names: vec![],
            token_file: Some(token),
            source_ids: source_ids.iter().map(|&s| s.to_owned()).collect(),
            workers,
        }
    }

    #[test]
    fn callers_are_identified_and_held_to_their_grant() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("r.token");
        std::fs::write(&token, "tok.0123456789abc\n").unwrap();
        let config = IngestAuthConfig {
            required: true,
            sources: vec![source(&["router-1"], vec![WorkerEntry::Id(7)], token)],
        };
        let registry = Registry::new();
        let access = IngestAccess::new(&config, &registry).unwrap();
        let status = access.caller("get_stats", &Request::new(())).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        let mut request = Request::new(());
        request
            .metadata_mut()
            .insert("authorization", "Bearer tok.0123456789abc".parse().unwrap());
        let caller = access.caller("publish_batch", &request).unwrap();
        assert_eq!(caller.name(), "router-1");
        let batch = |source: &str, worker: u64| v1::KvEventBatch {
            source_id: source.into(),
            sequence: 1,
            events: vec![v1::KvEvent {
                member: Some(v1::MemberId {
                    worker_id: worker,
                    dp_rank: 0,
                }),
                kind: None,
            }],
        };
        caller.authorize(&batch("router-1", 7)).unwrap();
        let err = caller.authorize(&batch("router-1", 8)).unwrap_err();
        let status = Status::from(err);
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        assert!(
            status.message().contains("worker 8"),
            "{}",
            status.message()
        );
        assert!(caller.authorize(&batch("router-2", 7)).is_err());
        let reader = access.caller("get_source_sequence", &request).unwrap();
        reader.authorize_source_read("router-1").unwrap();
        let status = Status::from(reader.authorize_source_read("router-2").unwrap_err());
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        assert!(
            status.message().contains("\"router-1\"") && status.message().contains("\"router-2\""),
            "{}",
            status.message()
        );
        let reporter = access.caller("report_load", &request).unwrap();
        reporter.authorize_load("router-1", 7).unwrap();
        let status = Status::from(reporter.authorize_load("router-1", 8).unwrap_err());
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        assert!(
            status.message().contains("worker 8"),
            "{}",
            status.message()
        );
        assert!(reporter.authorize_load("router-2", 7).is_err());
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap();
        assert!(
            text.contains(
                "ckf_producer_auth_refused_total{code=\"permission_denied\",rpc=\"report_load\"} 2"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "ckf_producer_auth_refused_total{code=\"permission_denied\",rpc=\"publish_batch\"} 2"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "ckf_producer_auth_refused_total{code=\"permission_denied\",rpc=\"get_source_sequence\"} 1"
            ),
            "{text}"
        );
    }
}
