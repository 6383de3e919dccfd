//! Layered configuration: **defaults < TOML file < environment < command-line flags**
//! (DESIGN.md section 5), merged with figment and then checked by the service's own rules.
//!
//! * Defaults are the config type's `Default` value.
//! * The TOML file is the one passed with `--config` (absent file = error, so a typo in the
//!   path is not silently ignored).
//! * Environment variables start with the service's prefix (e.g. `CKF_INDEXER_`); nested keys
//!   are joined with `__`: `CKF_INDEXER_LAG__HEARTBEAT_DEADLINE_MS=5000` sets
//!   `lag.heartbeat_deadline_ms`. Keys are lower-cased. `<PREFIX>CONFIG` is reserved for the
//!   file path and ignored here.
//! * Flags are [`Overrides`]: only flags the user actually gave are merged.
//!
//! Errors name the key, the offending value and the rule, plus where the value came from:
//! type and unknown-key errors come from figment/serde ([`ConfigError::Load`]); semantic rules
//! come from the type's [`Validate`] impl ([`ConfigError::Invalid`]).

use std::{fmt, path::PathBuf};

use figment::{
    Figment, Metadata, Profile, Provider,
    providers::{Env, Format, Serialized, Toml},
    value::{Dict, Map, Value},
};
use serde::{Serialize, de::DeserializeOwned};

/// A configuration value that breaks a rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key} = {value}: {rule}")]
pub struct Invalid {
    /// Dotted key, e.g. `"limits.max_message_bytes"`.
    pub key: String,
    /// The offending value as the user would write it.
    pub value: String,
    /// The rule it breaks, e.g. `"must be at least 4096"`.
    pub rule: String,
}

impl Invalid {
    /// Builds an error for `key = value` breaking `rule`.
    pub fn new(key: impl Into<String>, value: impl fmt::Display, rule: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            value: value.to_string(),
            rule: rule.into(),
        }
    }
}

/// Semantic checks run after the layers are merged.
pub trait Validate {
    /// Checks every rule.
    ///
    /// # Errors
    /// The first [`Invalid`] value found.
    fn validate(&self) -> Result<(), Invalid>;
}

/// Why a configuration was refused at start.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A layer could not be read or a value has the wrong type / an unknown key (figment's
    /// message names the key, the value, and the file or environment variable it came from).
    #[error("invalid configuration: {0}")]
    Load(String),
    /// A value breaks a rule of the service.
    #[error("invalid configuration: {invalid}{}", source_note(.source_name))]
    Invalid {
        /// Key, value and rule.
        invalid: Invalid,
        /// Where the value came from (file path, environment variable, flag), when known.
        source_name: Option<String>,
    },
}

fn source_note(source: &Option<String>) -> String {
    source
        .as_ref()
        .map(|s| format!(" (from {s})"))
        .unwrap_or_default()
}

/// Flag values that override every other layer. Only flags that were given are recorded.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    values: Vec<(String, Value)>,
}

impl Overrides {
    /// No overrides.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `key` (dotted path) = `value` when the flag was given.
    ///
    /// # Panics
    /// When `value` cannot be represented as a configuration value (a programming error, e.g.
    /// a map with non-string keys).
    pub fn set<T: Serialize>(mut self, key: &str, value: Option<T>) -> Self {
        if let Some(value) = value {
            let value = Value::serialize(value).expect("flag values serialize to config values");
            self.values.push((key.to_owned(), value));
        }
        self
    }
}

/// Flags are one provider, so an error names "command-line flag" as the value's source.
impl Provider for Overrides {
    fn metadata(&self) -> Metadata {
        Metadata::named("command-line flag")
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let mut flags = Dict::new();
        for (key, value) in &self.values {
            for (_, dict) in Serialized::default(key, value.clone()).data()? {
                deep_merge(&mut flags, dict);
            }
        }
        Ok(Map::from([(Profile::Default, flags)]))
    }
}

/// Merges nested `from` into `into`, later keys winning (two flags may share a table).
fn deep_merge(into: &mut Dict, from: Dict) {
    for (key, value) in from {
        match (into.get_mut(&key), value) {
            (Some(Value::Dict(_, existing)), Value::Dict(_, nested)) => {
                deep_merge(existing, nested)
            }
            (_, value) => {
                into.insert(key, value);
            }
        }
    }
}

/// Where to read the non-default layers from.
#[derive(Debug, Clone)]
pub struct Layers {
    /// Environment prefix including the trailing underscore, e.g. `"CKF_INDEXER_"`.
    pub env_prefix: &'static str,
    /// The `--config` TOML file, if any.
    pub file: Option<PathBuf>,
    /// Flags given on the command line.
    pub overrides: Overrides,
}

impl Layers {
    /// Layers with an environment prefix, no file and no flags.
    pub fn new(env_prefix: &'static str) -> Self {
        Self {
            env_prefix,
            file: None,
            overrides: Overrides::new(),
        }
    }

    /// The merged figment (defaults < file < environment < flags), before extraction.
    pub fn figment<C: Serialize + Default>(&self) -> Figment {
        let mut figment = Figment::from(Serialized::defaults(C::default()));
        if let Some(file) = &self.file {
            figment = figment.merge(Toml::file_exact(file));
        }
        figment = figment.merge(
            Env::prefixed(self.env_prefix)
                .ignore(&["config"])
                .split("__"),
        );
        figment.merge(&self.overrides)
    }

    /// Merges the layers, extracts `C` and validates it.
    ///
    /// # Errors
    /// [`ConfigError::Load`] for unreadable files, wrong types and unknown keys;
    /// [`ConfigError::Invalid`] for values breaking `C`'s rules.
    pub fn load<C>(&self) -> Result<C, ConfigError>
    where
        C: Serialize + DeserializeOwned + Default + Validate,
    {
        let figment = self.figment::<C>();
        let config: C = figment.extract().map_err(|error| {
            ConfigError::Load(
                error
                    .into_iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("; "),
            )
        })?;
        config.validate().map_err(|invalid| {
            let source_name = figment
                .find_metadata(&invalid.key)
                .map(|m| match &m.source {
                    // The defaults layer is code: say so instead of a type name and line.
                    Some(figment::Source::Code(_)) => "the default".to_owned(),
                    Some(source) => format!("{} {source}", m.name),
                    None => m.name.to_string(),
                });
            ConfigError::Invalid {
                invalid,
                source_name,
            }
        })?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    struct Sample {
        listen: String,
        limits: Limits,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    struct Limits {
        max_bytes: u64,
        streams: u32,
    }

    impl Default for Sample {
        fn default() -> Self {
            Self {
                listen: "127.0.0.1:1".into(),
                limits: Limits::default(),
            }
        }
    }

    impl Default for Limits {
        fn default() -> Self {
            Self {
                max_bytes: 4096,
                streams: 16,
            }
        }
    }

    impl Validate for Sample {
        fn validate(&self) -> Result<(), Invalid> {
            if self.limits.max_bytes < 1024 {
                return Err(Invalid::new(
                    "limits.max_bytes",
                    self.limits.max_bytes,
                    "must be at least 1024",
                ));
            }
            Ok(())
        }
    }

    // figment::Jail serialises environment changes, but it is behind a feature; these tests use
    // unique prefixes instead so they never see each other's variables.

    #[test]
    fn layers_apply_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "listen = \"file:1\"\n[limits]\nmax_bytes = 2048\nstreams = 3\n",
        )
        .unwrap();
        // SAFETY (of intent): unique variable names; no other test reads them.
        unsafe {
            std::env::set_var("CKF_T1_LIMITS__STREAMS", "5");
            std::env::set_var("CKF_T1_LISTEN", "env:1");
        }
        let layers = Layers {
            env_prefix: "CKF_T1_",
            file: Some(file),
            overrides: Overrides::new()
                .set("listen", Some("flag:1"))
                .set::<u64>("limits.max_bytes", None),
        };
        let config: Sample = layers.load().unwrap();
        assert_eq!(config.listen, "flag:1"); // flag beats env and file
        assert_eq!(config.limits.streams, 5); // env beats file
        assert_eq!(config.limits.max_bytes, 2048); // file beats default; absent flag ignored
    }

    #[test]
    fn defaults_alone() {
        let config: Sample = Layers::new("CKF_T2_").load().unwrap();
        assert_eq!(config, Sample::default());
    }

    #[test]
    fn rule_violation_names_key_value_rule_and_source() {
        unsafe { std::env::set_var("CKF_T3_LIMITS__MAX_BYTES", "12") };
        let err = Layers::new("CKF_T3_").load::<Sample>().unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, ConfigError::Invalid { .. }), "{text}");
        assert!(text.contains("limits.max_bytes = 12"), "{text}");
        assert!(text.contains("must be at least 1024"), "{text}");
        assert!(text.contains("CKF_T3_"), "{text}");
    }

    #[test]
    fn wrong_type_and_unknown_key_are_refused() {
        unsafe { std::env::set_var("CKF_T4_LIMITS__STREAMS", "many") };
        let text = Layers::new("CKF_T4_")
            .load::<Sample>()
            .unwrap_err()
            .to_string();
        // figment names environment keys as spelled in the variable.
        assert!(text.to_lowercase().contains("limits.streams"), "{text}");
        assert!(text.contains("many"), "{text}");

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "lissten = \"x\"\n").unwrap();
        let layers = Layers {
            file: Some(file),
            ..Layers::new("CKF_T5_")
        };
        let text = layers.load::<Sample>().unwrap_err().to_string();
        assert!(text.contains("lissten"), "{text}");

        let layers = Layers {
            overrides: Overrides::new().set("limits.max_bytes", Some(5u64)),
            ..Layers::new("CKF_T7_")
        };
        let text = layers.load::<Sample>().unwrap_err().to_string();
        assert!(text.contains("limits.max_bytes = 5"), "{text}");
        assert!(text.contains("command-line flag"), "{text}");
    }

    #[test]
    fn missing_file_is_an_error() {
        let layers = Layers {
            file: Some("/nonexistent/ckf.toml".into()),
            ..Layers::new("CKF_T6_")
        };
        assert!(matches!(layers.load::<Sample>(), Err(ConfigError::Load(_))));
    }
}
