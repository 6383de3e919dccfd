//! The domains one indexer serves: `[manifest]` is the **primary** domain (a query that names
//! no domain is for it, `ckf_core::catalog`), and each `[[domains]]` entry one more, with its
//! own lanes, block size(s) and, optionally, its own `[domains.table]`:
//!
//! ```toml
//! block_size = 16                      # every domain's, unless it sets its own
//! [manifest]
//! domain = "llama-70b"
//! lanes = ["dc-a", "dc-b", "dc-c"]
//! [[domains]]
//! domain = "qwen-7b"
//! lanes = ["dc-a", "dc-b"]             # the same DC names may serve several domains
//! block_size = 32
//! [domains.table]
//! expected_blocks = 500000
//! ```
//!
//! Every key of a domain is validated as the primary's are; a refusal names the entry
//! (`domains[0].lanes[1] = ...`). This module resolves each domain into a [`DomainSpec`], what
//! `crate::serve` builds it from.

use std::collections::BTreeMap;

use ckf_core::addressing::TableFormat;
use ckf_core::global::Manifest;
use ckf_core::identity::{DcId, IndexerDomainId, PoolId};
use ckf_core::tokens::lanes::LaneBlockSizes;
use ckf_core::tokens::{MAX_BLOCK_SIZE, TokenQueryRules};
use ckf_svc_kit::config::{Invalid, in_range};
use ckf_svc_kit::table::TableConfig;
use serde::{Deserialize, Serialize};

/// The primary domain and its lanes, in order (a query naming no domain is for it; more
/// domains: `[[domains]]`, [`DomainConfig`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ManifestConfig {
    /// Indexer domain name (1..=64 bytes of `[A-Za-z0-9._-]`).
    pub domain: String,
    /// DC ids, lane `i` = `lanes[i]`; 1..=64 distinct DCs.
    pub lanes: Vec<String>,
    /// Tokens per KV block of the DCs whose pools do not use `block_size`, by DC id (each a
    /// DC of `lanes`, 1..=65536): a query by token ids is hashed once per distinct block size
    /// and answers each lane in its own blocks.
    pub block_sizes: std::collections::BTreeMap<String, u32>,
    /// Lane slots reserved beyond `lanes` for DCs added while the indexer runs (a catalog
    /// reload), each a table column from the start (`buckets x 8` bytes); lanes + spare <= 64.
    pub spare_lanes: u32,
}

impl Default for ManifestConfig {
    fn default() -> Self {
        Self {
            domain: "default".into(),
            lanes: vec!["dc-a".into(), "dc-b".into(), "dc-c".into()],
            block_sizes: Default::default(),
            spare_lanes: 0,
        }
    }
}

/// One `[[domains]]` entry: a domain served beside `[manifest]`'s.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DomainConfig {
    /// Domain name (1..=64 bytes of `[A-Za-z0-9._-]`), distinct from every other domain's.
    pub domain: String,
    /// DC ids, lane `i` = `lanes[i]`; 1..=64 distinct DCs.
    pub lanes: Vec<String>,
    /// Tokens per KV block of this domain's pools, 1..=65536; absent: the top-level
    /// `block_size`.
    pub block_size: Option<u32>,
    /// Tokens per KV block of the DCs whose pools do not use the domain's block size, by DC id.
    pub block_sizes: BTreeMap<String, u32>,
    /// This domain's table format (its producers' must be equal); absent: the top-level
    /// `[table]`.
    pub table: Option<TableConfig>,
    /// Lane slots reserved beyond `lanes` for DCs added while the indexer runs, as
    /// `manifest.spare_lanes`.
    pub spare_lanes: u32,
}

/// One domain's settings, resolved and validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainSpec {
    /// Domain, lanes and table format.
    pub manifest: Manifest,
    /// Tokens per block of every lane.
    pub block_sizes: LaneBlockSizes,
    /// The rules of a query by token ids (the domain's block size, `limits.max_query_blocks`).
    pub token_rules: TokenQueryRules,
    /// Lane slots beyond `manifest.lanes`.
    pub spare_lanes: usize,
}

impl DomainSpec {
    /// Bytes of this domain's table: buckets x lane slots (spare ones included) x 8.
    pub fn table_bytes(&self) -> u64 {
        let slots = (self.manifest.lanes.len() + self.spare_lanes) as u64;
        self.manifest
            .format
            .bucket_count
            .saturating_mul(slots)
            .saturating_mul(8)
    }
}

/// This machine's memory (`MemTotal` of `/proc/meminfo`), `None` where it cannot be read. One
/// line of a kernel file: no library for it.
pub fn machine_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Checks that the tables of `specs` (every domain served) fit `limit` bytes together (0: this
/// machine's memory; no check where it is unknown).
///
/// # Errors
/// [`Invalid`] naming `limits.max_table_bytes`, the total and each domain's share.
pub fn check_table_bytes(specs: &[DomainSpec], limit: u64) -> Result<(), Invalid> {
    let (limit, what) = match limit {
        0 => match machine_memory() {
            Some(memory) => (memory, "this machine's memory"),
            None => return Ok(()),
        },
        limit => (limit, "the limit"),
    };
    let total = specs
        .iter()
        .map(DomainSpec::table_bytes)
        .fold(0u64, u64::saturating_add);
    if total <= limit {
        return Ok(());
    }
    let shares = specs
        .iter()
        .map(|s| format!("{}: {}", s.manifest.domain, mib(s.table_bytes())))
        .collect::<Vec<_>>()
        .join(", ");
    Err(Invalid::new(
        "limits.max_table_bytes",
        limit,
        format!(
            "the tables of the domains served would take {} ({shares}), more than {what} ({}); \
             lower table.expected_blocks or spare_lanes, serve fewer domains here, or raise the \
             limit",
            mib(total),
            mib(limit)
        ),
    ))
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

/// One domain's keys, wherever they are configured, and how a refusal names them.
struct DomainKeys<'a> {
    /// `manifest` or `domains[i]`: the prefix of the domain's own keys.
    at: String,
    /// The prefix of its table keys: `` (the top-level `[table]`) or `domains[i].`.
    table_at: String,
    /// Key of its block size (`block_size` or `domains[i].block_size`).
    block_size_key: String,
    domain: &'a str,
    lanes: &'a [String],
    block_size: u32,
    block_sizes: &'a BTreeMap<String, u32>,
    table: &'a TableConfig,
    spare_lanes: u32,
}

impl DomainKeys<'_> {
    fn format(&self) -> Result<TableFormat, Invalid> {
        let producer_only = [
            ("max_kicks", self.table.max_kicks.map(u64::from)),
            ("reserve_blocks", self.table.reserve_blocks),
        ];
        for (key, value) in producer_only {
            if let Some(value) = value {
                return Err(Invalid::new(
                    format!("{}table.{key}", self.table_at),
                    value,
                    "is a producer setting (the indexer never inserts): remove it",
                ));
            }
        }
        self.table.format().map_err(|e| Invalid {
            key: format!("{}{}", self.table_at, e.key),
            ..e
        })
    }

    fn manifest(&self) -> Result<Manifest, Invalid> {
        let at = &self.at;
        let domain = IndexerDomainId::new(self.domain)
            .map_err(|e| Invalid::new(format!("{at}.domain"), self.domain, e.to_string()))?;
        let lanes = self
            .lanes
            .iter()
            .enumerate()
            .map(|(i, dc)| {
                DcId::new(dc.clone())
                    .map(|dc| PoolId {
                        domain: domain.clone(),
                        dc,
                    })
                    .map_err(|e| Invalid::new(format!("{at}.lanes[{i}]"), dc, e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let manifest = Manifest {
            domain,
            format: self.format()?,
            lanes,
        };
        manifest.validate().map_err(|e| {
            Invalid::new(
                format!("{at}.lanes"),
                format!("{:?}", self.lanes),
                e.to_string(),
            )
        })?;
        Ok(manifest)
    }

    fn block_sizes(&self) -> Result<LaneBlockSizes, Invalid> {
        let at = &self.at;
        in_range(
            &self.block_size_key,
            self.block_size,
            1..=MAX_BLOCK_SIZE,
            "tokens",
        )?;
        for (dc, size) in self.block_sizes {
            let key = format!("{at}.block_sizes.{dc}");
            if !self.lanes.iter().any(|l| l == dc) {
                return Err(Invalid::new(key, size, format!("not a DC of {at}.lanes")));
            }
            in_range(&key, *size, 1..=MAX_BLOCK_SIZE, "tokens")?;
        }
        let sizes = self
            .lanes
            .iter()
            .map(|dc| self.block_sizes.get(dc).copied().unwrap_or(self.block_size))
            .collect();
        LaneBlockSizes::new(sizes).map_err(|e| {
            Invalid::new(
                format!("{at}.lanes"),
                format!("{:?}", self.lanes),
                e.to_string(),
            )
        })
    }
}

/// The catalog part of an indexer configuration, borrowed (`IndexerConfig::catalog`): the
/// primary domain, the `[[domains]]` entries and the top-level keys they default to.
#[derive(Debug, Clone, Copy)]
pub struct CatalogKeys<'a> {
    /// `[manifest]`.
    pub manifest: &'a ManifestConfig,
    /// `[[domains]]`.
    pub domains: &'a [DomainConfig],
    /// The top-level `block_size`.
    pub block_size: u32,
    /// The top-level `[table]`.
    pub table: &'a TableConfig,
    /// `limits.max_query_blocks` (a token query's block limit).
    pub max_query_blocks: u32,
}

impl<'a> CatalogKeys<'a> {
    /// Every domain's keys, the primary (`[manifest]`) first, then `[[domains]]` in order.
    fn domain_keys(&self) -> Vec<DomainKeys<'a>> {
        let m = self.manifest;
        let primary = DomainKeys {
            at: "manifest".into(),
            table_at: String::new(),
            block_size_key: "block_size".into(),
            domain: &m.domain,
            lanes: &m.lanes,
            block_size: self.block_size,
            block_sizes: &m.block_sizes,
            table: self.table,
            spare_lanes: m.spare_lanes,
        };
        let more = self.domains.iter().enumerate().map(|(i, d)| DomainKeys {
            at: format!("domains[{i}]"),
            table_at: format!("domains[{i}]."),
            block_size_key: if d.block_size.is_some() {
                format!("domains[{i}].block_size")
            } else {
                "block_size".into()
            },
            domain: &d.domain,
            lanes: &d.lanes,
            block_size: d.block_size.unwrap_or(self.block_size),
            block_sizes: &d.block_sizes,
            table: d.table.as_ref().unwrap_or(self.table),
            spare_lanes: d.spare_lanes,
        });
        std::iter::once(primary).chain(more).collect()
    }

    /// Every domain served, resolved: the primary first, then `[[domains]]` in order.
    ///
    /// # Errors
    /// [`Invalid`] naming the first offending key: a bad name, lane list, block size or table
    /// key of any domain, or a domain configured twice (`domains[i].domain`).
    pub fn domain_specs(&self) -> Result<Vec<DomainSpec>, Invalid> {
        let mut specs: Vec<DomainSpec> = Vec::with_capacity(1 + self.domains.len());
        for keys in self.domain_keys() {
            let manifest = keys.manifest()?;
            if specs.iter().any(|s| s.manifest.domain == manifest.domain) {
                return Err(Invalid::new(
                    format!("{}.domain", keys.at),
                    keys.domain,
                    "is configured twice (manifest.domain and every domains[].domain differ)",
                ));
            }
            let slots = manifest.lanes.len() + keys.spare_lanes as usize;
            if slots > ckf_core::bucket::MAX_LANES {
                return Err(Invalid::new(
                    format!("{}.spare_lanes", keys.at),
                    keys.spare_lanes,
                    format!(
                        "lanes + spare_lanes = {slots}: at most {} lane slots per domain",
                        ckf_core::bucket::MAX_LANES
                    ),
                ));
            }
            specs.push(DomainSpec {
                spare_lanes: keys.spare_lanes as usize,
                block_sizes: keys.block_sizes()?,
                token_rules: TokenQueryRules {
                    block_size: keys.block_size,
                    max_blocks: self.max_query_blocks,
                },
                manifest,
            });
        }
        Ok(specs)
    }

    /// The primary domain's table format (`[table]`).
    ///
    /// # Errors
    /// [`Invalid`] naming `table.bucket_count` or `table.expected_blocks`, or `table.max_kicks`
    /// or `table.reserve_blocks` when given (producer settings: the indexer never inserts).
    pub fn format(&self) -> Result<TableFormat, Invalid> {
        self.domain_keys()[0].format()
    }

    /// The primary domain's validated manifest (`[manifest]` and `[table]`).
    ///
    /// # Errors
    /// [`Invalid`] naming the first offending key.
    pub fn manifest(&self) -> Result<Manifest, Invalid> {
        self.domain_keys()[0].manifest()
    }

    /// Tokens per block of every lane of the primary domain: `manifest.block_sizes` for the DCs
    /// it names, else `block_size`.
    ///
    /// # Errors
    /// [`Invalid`] naming the key: a DC not in `manifest.lanes`, a size outside 1..=65536.
    pub fn lane_block_sizes(&self) -> Result<LaneBlockSizes, Invalid> {
        self.domain_keys()[0].block_sizes()
    }

    /// The primary domain's rules of a query by token ids: `block_size`, and
    /// `limits.max_query_blocks` blocks at most.
    pub fn token_rules(&self) -> TokenQueryRules {
        TokenQueryRules {
            block_size: self.block_size,
            max_blocks: self.max_query_blocks,
        }
    }

    /// Every domain's name and lanes, the primary first (what `[auth]` grants pools of).
    pub fn domain_lanes(&self) -> Vec<crate::access::DomainLanes> {
        self.domain_keys()
            .iter()
            .map(|k| crate::access::DomainLanes {
                domain: k.domain.to_owned(),
                lanes: k.lanes.to_vec(),
            })
            .collect()
    }

    /// Every DC id of any domain's lanes (each once, sorted).
    pub fn all_dcs(&self) -> Vec<String> {
        let mut dcs: Vec<String> = self
            .domain_keys()
            .iter()
            .flat_map(|k| k.lanes.iter().cloned())
            .collect();
        dcs.sort();
        dcs.dedup();
        dcs
    }

    /// Lanes of the largest domain.
    pub fn most_lanes(&self) -> usize {
        self.domain_keys()
            .iter()
            .map(|k| k.lanes.len())
            .max()
            .unwrap_or(0)
    }
}
