//! Which engine events enter the filter.
//!
//! The filter holds what a query can reuse: full-attention blocks of the main KV-cache group
//! on the accelerator, of the indexer's block size. The rule, per event:
//!
//! - **medium**: nil/absent, or one of [`EngineFilters::media`] (default `["GPU"]`; matched
//!   case-sensitively, engines send uppercase), enters; anything else (`"CPU"`, `"DISK"`, ...)
//!   is skipped (`"medium"`).
//! - **group**: `group_idx` nil/absent or equal to [`EngineFilters::main_group`] enters; any
//!   other group is skipped (`"group"`). vLLM and TensorRT-LLM number their KV-cache groups
//!   the same way: only the main full-attention group enters.
//! - **sliding window** (stores only): a store with `kv_cache_spec_sliding_window` set, or a
//!   `kv_cache_spec_kind` naming a sliding-window, chunked-local or mamba kind, is skipped
//!   (`"sliding_window"`): such blocks do not carry the whole prefix.
//! - **block size** (stores only): `block_size` different from [`EngineFilters::block_size`]
//!   is skipped (`"block_size"`): its hashes would not match queries.
//! - **tokens** (stores only): `token_ids.len()` must equal `block_hashes.len() * block_size`
//!   (`"tokens"`), and the extra keys must be absent or one per block (`"extra_keys"`).
//!
//! Checks run in this order; the first failing one is the reason.

use crate::event::{RemovedBlocks, StoredBlocks};

/// The filter rule's configuration (producer: top-level `block_size`, `[engine] media`,
/// `[engine] main_group`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineFilters {
    /// Tokens per KV block that the filter indexes.
    pub block_size: u32,
    /// Media that enter (exact, case-sensitive), besides nil.
    pub media: Vec<String>,
    /// The KV-cache group that enters, besides nil.
    pub main_group: u32,
}

impl Default for EngineFilters {
    /// Block size 16, media `["GPU"]`, main group 0.
    fn default() -> Self {
        Self {
            block_size: 16,
            media: vec!["GPU".to_owned()],
            main_group: 0,
        }
    }
}

/// Why an event does not enter the filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Skip {
    /// The medium is not one of the configured media.
    Medium,
    /// The KV-cache group is not the main group.
    Group,
    /// A sliding-window (or mamba, chunked-local) KV-cache spec.
    SlidingWindow,
    /// The store's block size is not the configured one.
    BlockSize,
    /// `token_ids.len() != block_hashes.len() * block_size`.
    Tokens,
    /// Extra keys present but not one entry per block.
    ExtraKeys,
}

impl Skip {
    /// A short stable label for metrics: `"medium"`, `"group"`, `"sliding_window"`,
    /// `"block_size"`, `"tokens"`, `"extra_keys"`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Medium => "medium",
            Self::Group => "group",
            Self::SlidingWindow => "sliding_window",
            Self::BlockSize => "block_size",
            Self::Tokens => "tokens",
            Self::ExtraKeys => "extra_keys",
        }
    }
}

/// Whether a `kv_cache_spec_kind` names a spec whose blocks do not hold a whole prefix.
/// Matched on lowercase substrings (`sliding`, `chunked`, `local`, `mamba`, `swa`), since
/// vLLM's spec class names vary between releases.
pub fn is_partial_spec_kind(kind: &str) -> bool {
    let kind = kind.to_ascii_lowercase();
    ["sliding", "chunked", "local", "mamba", "swa"]
        .iter()
        .any(|k| kind.contains(k))
}

impl EngineFilters {
    fn admit_medium(&self, medium: Option<&str>) -> Result<(), Skip> {
        match medium {
            None => Ok(()),
            Some(m) if self.media.iter().any(|x| x == m) => Ok(()),
            Some(_) => Err(Skip::Medium),
        }
    }

    fn admit_group(&self, group: Option<u32>) -> Result<(), Skip> {
        match group {
            Some(g) if g != self.main_group => Err(Skip::Group),
            _ => Ok(()),
        }
    }

    /// Whether a store enters (the module rule, in order).
    ///
    /// # Errors
    /// The first [`Skip`] reason that applies.
    pub fn admit_stored(&self, stored: &StoredBlocks) -> Result<(), Skip> {
        self.admit_medium(stored.medium.as_deref())?;
        self.admit_group(stored.group_idx)?;
        if stored.sliding_window.is_some()
            || stored
                .spec_kind
                .as_deref()
                .is_some_and(is_partial_spec_kind)
        {
            return Err(Skip::SlidingWindow);
        }
        if stored.block_size != self.block_size {
            return Err(Skip::BlockSize);
        }
        let expected = (stored.block_hashes.len() as u64) * u64::from(stored.block_size);
        if stored.token_ids.len() as u64 != expected {
            return Err(Skip::Tokens);
        }
        if !stored.block_extras.is_empty() && stored.block_extras.len() != stored.block_hashes.len()
        {
            return Err(Skip::ExtraKeys);
        }
        Ok(())
    }

    /// Whether a removal enters: medium and group only (a removal names engine hashes, and
    /// only those the lineage knows have any effect).
    ///
    /// # Errors
    /// [`Skip::Medium`] or [`Skip::Group`].
    pub fn admit_removed(&self, removed: &RemovedBlocks) -> Result<(), Skip> {
        self.admit_medium(removed.medium.as_deref())?;
        self.admit_group(removed.group_idx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::BlockExtras;

    fn store() -> StoredBlocks {
        StoredBlocks {
            block_hashes: vec![1, 2],
            token_ids: (0..32).collect(),
            block_size: 16,
            medium: Some("GPU".into()),
            ..StoredBlocks::default()
        }
    }

    #[test]
    fn the_rule_in_order() {
        let f = EngineFilters::default();
        assert_eq!(f.admit_stored(&store()), Ok(()));
        let with = |edit: fn(&mut StoredBlocks)| {
            let mut s = store();
            edit(&mut s);
            f.admit_stored(&s)
        };
        assert_eq!(with(|s| s.medium = None), Ok(()));
        assert_eq!(with(|s| s.medium = Some("CPU".into())), Err(Skip::Medium));
        assert_eq!(with(|s| s.medium = Some("gpu".into())), Err(Skip::Medium));
        assert_eq!(with(|s| s.group_idx = Some(0)), Ok(()));
        assert_eq!(with(|s| s.group_idx = Some(1)), Err(Skip::Group));
        assert_eq!(
            with(|s| s.sliding_window = Some(4096)),
            Err(Skip::SlidingWindow)
        );
        for kind in [
            "sliding_window",
            "SlidingWindowSpec",
            "MambaSpec",
            "chunked_local_attention",
        ] {
            let mut s = store();
            s.spec_kind = Some(kind.into());
            assert_eq!(f.admit_stored(&s), Err(Skip::SlidingWindow), "{kind}");
        }
        assert_eq!(
            with(|s| s.spec_kind = Some("full_attention".into())),
            Ok(())
        );
        assert_eq!(with(|s| s.block_size = 32), Err(Skip::BlockSize));
        assert_eq!(
            with(|s| s.token_ids.pop().map(drop).unwrap()),
            Err(Skip::Tokens)
        );
        assert_eq!(with(|s| s.token_ids.push(0)), Err(Skip::Tokens));
        assert_eq!(
            with(|s| s.block_extras = vec![BlockExtras::default()]),
            Err(Skip::ExtraKeys)
        );
        assert_eq!(
            with(|s| s.block_extras = vec![BlockExtras::default(); 2]),
            Ok(())
        );
        // first failing check wins
        assert_eq!(
            with(|s| {
                s.medium = Some("CPU".into());
                s.block_size = 3;
            }),
            Err(Skip::Medium)
        );
    }

    #[test]
    fn removals_and_configured_media() {
        let f = EngineFilters {
            media: vec!["GPU".into(), "CPU_PINNED".into()],
            main_group: 2,
            ..EngineFilters::default()
        };
        let r = |medium: Option<&str>, group| RemovedBlocks {
            block_hashes: vec![1],
            medium: medium.map(Into::into),
            group_idx: group,
        };
        assert_eq!(f.admit_removed(&r(None, None)), Ok(()));
        assert_eq!(f.admit_removed(&r(Some("CPU_PINNED"), Some(2))), Ok(()));
        assert_eq!(f.admit_removed(&r(Some("DISK"), None)), Err(Skip::Medium));
        assert_eq!(f.admit_removed(&r(None, Some(0))), Err(Skip::Group));
        let labels: Vec<_> = [
            Skip::Medium,
            Skip::Group,
            Skip::SlidingWindow,
            Skip::BlockSize,
            Skip::Tokens,
            Skip::ExtraKeys,
        ]
        .iter()
        .map(Skip::label)
        .collect();
        assert_eq!(
            labels,
            [
                "medium",
                "group",
                "sliding_window",
                "block_size",
                "tokens",
                "extra_keys"
            ]
        );
    }
}
