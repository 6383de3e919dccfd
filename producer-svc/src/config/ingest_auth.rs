//! The `[ingest_auth]` section: who may publish to Ingest, as which source and touching which
//! workers, and the policy (`ckf_core::access::Policy`) it describes. Checking callers against
//! that policy at run time is [`crate::access`]'s.
//!
//! ```toml
//! indexer_token_file = "/run/secrets/ckf/dc-a.token"   # sent as `authorization: Bearer`
//! [ingest_auth]
//! required = false                 # true: every Ingest RPC must identify a source principal
//! [[ingest_auth.sources]]
//! name = "router-1"                # in logs and refusals
//! cert_names = ["router-1.dc-a.ckf"]   # any name of its verified client certificate
//! token_file = "/run/secrets/ckf/router-1.token"   # and/or a bearer token (one line)
//! source_ids = ["router-1"]        # KvEventBatch.source_id values it may use; ["*"] = any
//! workers = [7, 8]                 # worker ids its events may touch; [] = none, ["*"] = all
//! ```

use std::collections::BTreeSet;
use std::path::PathBuf;

use ckf_core::access::{Policy, PolicyError, Principal, Scope, SourceGrant};
use ckf_core::identity::check_source_id;
use ckf_svc_kit::access::read_optional_token_file;
use ckf_svc_kit::config::Invalid;
use serde::{Deserialize, Serialize};

/// The `[ingest_auth]` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IngestAuthConfig {
    /// Every Ingest RPC must identify one of `sources` (else `UNAUTHENTICATED`).
    pub required: bool,
    /// Source principals and what each may publish.
    pub sources: Vec<SourceAuth>,
}

/// One `[[ingest_auth.sources]]` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SourceAuth {
    /// Name in logs and refusals (unique).
    pub name: String,
    /// Names of its client certificate (DNS / URI SAN or subject CN), any of which identifies it.
    pub cert_names: Vec<String>,
    /// File holding its bearer token (one line).
    pub token_file: Option<PathBuf>,
    /// `KvEventBatch.source_id` values it may use (`["*"]`: any).
    pub source_ids: Vec<String>,
    /// Worker ids its events may touch: integers or decimal strings; `["*"]`: all; empty: none.
    pub workers: Vec<WorkerEntry>,
}

/// One `workers` entry: a worker id, or `"*"` (or a worker id written as a string, for ids
/// beyond TOML's signed 64-bit integers).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum WorkerEntry {
    /// A worker id.
    Id(u64),
    /// `"*"` or a decimal worker id.
    Text(String),
}

fn scope<T: Ord>(
    key: &str,
    entries: impl IntoIterator<Item = Result<Option<T>, String>>,
    shown: String,
) -> Result<Scope<T>, Invalid> {
    let mut set = BTreeSet::new();
    let mut all = false;
    for entry in entries {
        match entry.map_err(|rule| Invalid::new(key, &shown, rule))? {
            None => all = true,
            Some(v) => {
                set.insert(v);
            }
        }
    }
    match (all, set.is_empty()) {
        (true, true) => Ok(Scope::All),
        (true, false) => Err(Invalid::new(key, shown, "\"*\" must stand alone")),
        (false, _) => Ok(Scope::Only(set)),
    }
}

/// The policy `config` describes (reading every token file).
///
/// # Errors
/// As [`validate`].
pub fn policy(config: &IngestAuthConfig) -> Result<Policy<SourceGrant>, Invalid> {
    let mut entries = Vec::with_capacity(config.sources.len());
    for (i, s) in config.sources.iter().enumerate() {
        let key = |field: &str| format!("ingest_auth.sources[{i}].{field}");
        let source_ids = scope(
            &key("source_ids"),
            s.source_ids.iter().map(|id| match id.as_str() {
                "*" => Ok(None),
                // The rule every `KvEventBatch.source_id` is held to (`ckf_core::identity`).
                id => check_source_id(id)
                    .map(|()| Some(id.to_owned()))
                    .map_err(|e| format!("source id {e}")),
            }),
            format!("{:?}", s.source_ids),
        )?;
        let workers = scope(
            &key("workers"),
            s.workers.iter().map(|w| match w {
                WorkerEntry::Id(id) => Ok(Some(*id)),
                WorkerEntry::Text(t) if t == "*" => Ok(None),
                WorkerEntry::Text(t) => t
                    .parse::<u64>()
                    .map(Some)
                    .map_err(|_| format!("{t:?} is neither a worker id (u64) nor \"*\"")),
            }),
            format!("{:?}", s.workers),
        )?;
        let token = read_optional_token_file(&key("token_file"), s.token_file.as_deref())?;
        entries.push((
            Principal {
                name: s.name.clone(),
                cert_names: s.cert_names.clone(),
                token,
            },
            SourceGrant {
                source_ids,
                workers,
            },
        ));
    }
    Policy::new(config.required, entries).map_err(|e| {
        let (key, value) = match e {
            PolicyError::RequiredWithoutPrincipals => ("ingest_auth.required", "true"),
            _ => ("ingest_auth.sources", "[...]"),
        };
        Invalid::new(key, value, e.to_string())
    })
}

/// Checks `[ingest_auth]` and `indexer_token_file` (reading every token file).
///
/// # Errors
/// [`Invalid`] naming the key: an unreadable or empty token file (with its path), a bad
/// source id or worker entry, a principal without credentials, a shared name / certificate
/// name / token, `required` without sources.
pub fn validate(
    config: &IngestAuthConfig,
    indexer_token_file: Option<&std::path::Path>,
) -> Result<(), Invalid> {
    policy(config)?;
    read_optional_token_file("indexer_token_file", indexer_token_file)?;
    Ok(())
}

#[cfg(test)]
mod tests;
