//! Layered configuration: **defaults < TOML file < environment < command-line flags**, merged
//! with figment and then checked by the service's own rules.
//!
//! * Defaults are the config type's `Default` value.
//! * The TOML file is the one passed with `--config` (absent file = error, so a typo in the
//!   path is not silently ignored).
//! * Environment variables start with the service's prefix (e.g. `CKF_INDEXER_`); nested keys
//!   are joined with `__`: `CKF_INDEXER_LAG__HEARTBEAT_DEADLINE_MS=5000` sets
//!   `lag.heartbeat_deadline_ms`. Keys are lower-cased. `<PREFIX>CONFIG` is reserved for the
//!   file path and ignored here.
//! * Flags are [`Overrides`]: only flags the user actually gave are merged.
//! * A [`KeyAlias`] is an old spelling of a key, still accepted in every layer. Across layers
//!   the later one wins whichever spelling each uses; both spellings in one layer (the file,
//!   the environment, or the flags) are refused, naming both and where they came from.
//!
//! Every merge is figment's own `merge` (later layer wins, tables merged key by key, lists
//! replaced whole); each given flag is one layer of its own, so two flags may share a table
//! and an error names "command-line flag" as the value's source.
//!
//! Errors name the key, the offending value and the rule, plus where the value came from:
//! type and unknown-key errors come from figment/serde ([`ConfigError::Load`]); semantic rules
//! come from the type's [`Validate`] impl ([`ConfigError::Invalid`]), usually written with the
//! small rule helpers [`at_least`], [`at_most`] and [`in_range`].

use std::{fmt, ops::RangeInclusive, path::PathBuf};

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

/// One given flag as a figment layer: `Serialized::default(key, value)` (figment nests the
/// dotted key), renamed so that an error names "command-line flag" as the value's source
/// instead of the Rust type that held it.
struct Flag<'a> {
    key: &'a str,
    value: &'a Value,
}

impl Provider for Flag<'_> {
    fn metadata(&self) -> Metadata {
        Metadata::named("command-line flag")
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Serialized::default(self.key, self.value).data()
    }
}

/// An old spelling of a configuration key, accepted in the TOML file, the environment and
/// the flags as if it were `key`; across layers the later one wins as for any key. Giving both
/// spellings in one layer is refused with a [`ConfigError::Invalid`] naming both; a rule broken
/// by a value given under the old spelling is reported under the old spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyAlias {
    /// The old dotted key, e.g. `"table.expected_blocks_per_lane"`.
    pub old: &'static str,
    /// The dotted key it stands for, e.g. `"table.expected_blocks"`.
    pub key: &'static str,
}

/// A layer with its aliased keys moved to their current spelling (its metadata unchanged, so
/// errors still name the file or variable the value came from).
struct Renamed<P> {
    layer: P,
    aliases: &'static [KeyAlias],
}

impl<P: Provider> Provider for Renamed<P> {
    fn metadata(&self) -> Metadata {
        self.layer.metadata()
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let mut data = self.layer.data()?;
        for dict in data.values_mut() {
            for alias in self.aliases {
                if let Some(value) = take_path(dict, alias.old) {
                    insert_path(dict, alias.key, value);
                }
            }
        }
        Ok(data)
    }
}

/// Removes and returns the value at dotted `path`.
fn take_path(dict: &mut Dict, path: &str) -> Option<Value> {
    match path.split_once('.') {
        None => dict.remove(path),
        Some((head, rest)) => match dict.get_mut(head)? {
            Value::Dict(_, nested) => take_path(nested, rest),
            _ => None,
        },
    }
}

/// Sets dotted `path` to `value`, creating tables on the way (the caller has checked that the
/// path is free).
fn insert_path(dict: &mut Dict, path: &str, value: Value) {
    match path.split_once('.') {
        None => {
            dict.insert(path.to_owned(), value);
        }
        Some((head, rest)) => {
            let entry = dict
                .entry(head.to_owned())
                .or_insert_with(|| Value::Dict(figment::value::Tag::Default, Dict::new()));
            if let Value::Dict(_, nested) = entry {
                insert_path(nested, rest, value);
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
    /// Old key spellings still accepted (none for most services).
    pub aliases: &'static [KeyAlias],
}

impl Layers {
    /// Layers with an environment prefix, no file and no flags.
    pub fn new(env_prefix: &'static str) -> Self {
        Self {
            env_prefix,
            file: None,
            overrides: Overrides::new(),
            aliases: &[],
        }
    }

    /// The merged figment (defaults < file < environment < flags, aliases renamed), before
    /// extraction.
    pub fn figment<C: Serialize + Default>(&self) -> Figment {
        self.user_layers(
            Figment::from(Serialized::defaults(C::default())),
            self.aliases,
        )
    }

    /// `base` < file < environment < flags, each layer with `aliases` renamed.
    fn user_layers(&self, base: Figment, aliases: &'static [KeyAlias]) -> Figment {
        self.layer_list(aliases)
            .into_iter()
            .fold(base, |figment, layer| figment.merge(layer))
    }

    /// The user's layers in merge order (file, environment, then one per flag: two flags may
    /// share a table), each on its own and with `aliases` renamed.
    fn layer_list(&self, aliases: &'static [KeyAlias]) -> Vec<Figment> {
        let mut layers = Vec::with_capacity(2 + self.overrides.values.len());
        if let Some(file) = &self.file {
            layers.push(Figment::from(Renamed {
                layer: Toml::file_exact(file),
                aliases,
            }));
        }
        layers.push(Figment::from(Renamed {
            layer: Env::prefixed(self.env_prefix)
                .ignore(&["config"])
                .split("__"),
            aliases,
        }));
        for (key, value) in &self.overrides.values {
            layers.push(Figment::from(Renamed {
                layer: Flag { key, value },
                aliases,
            }));
        }
        layers
    }

    /// Refuses a key given under both its spellings in one layer (the file, the environment or
    /// the flags; across layers the later one wins, as for any key); returns the aliases whose winning layer used the old spelling.
    fn check_aliases(&self) -> Result<Vec<KeyAlias>, ConfigError> {
        if self.aliases.is_empty() {
            return Ok(Vec::new());
        }
        // The user's layers as written (nothing renamed), in merge order; every flag counts as
        // one layer here, so an old and a new flag given together are refused too (their
        // order on the command line is not what decides the merge order).
        let mut layers = self.layer_list(&[]);
        let first_flag = layers.len() - self.overrides.values.len();
        let flags = layers
            .split_off(first_flag)
            .into_iter()
            .reduce(|all, flag| all.merge(flag));
        layers.extend(flags);
        let mut old_spelling = Vec::new();
        for alias in self.aliases {
            let mut winner_is_old = false;
            for layer in &layers {
                let old = layer.find_value(alias.old);
                let current = layer.find_value(alias.key).is_ok();
                match old {
                    Ok(old_value) if current => {
                        return Err(ConfigError::Invalid {
                            invalid: Invalid::new(
                                alias.old,
                                display_value(&old_value),
                                format!(
                                    "is the old name of {}, which the same layer also gives: \
                                     give only {}",
                                    alias.key, alias.key
                                ),
                            ),
                            source_name: source_name(layer.find_metadata(alias.old)),
                        });
                    }
                    Ok(_) => winner_is_old = true,
                    Err(_) if current => winner_is_old = false,
                    Err(_) => {}
                }
            }
            if winner_is_old {
                old_spelling.push(*alias);
            }
        }
        Ok(old_spelling)
    }

    /// Merges the layers, extracts `C` and validates it.
    ///
    /// # Errors
    /// [`ConfigError::Load`] for unreadable files, wrong types and unknown keys;
    /// [`ConfigError::Invalid`] for values breaking `C`'s rules, and for a key given under
    /// both spellings of a [`KeyAlias`] in one layer.
    pub fn load<C>(&self) -> Result<C, ConfigError>
    where
        C: Serialize + DeserializeOwned + Default + Validate,
    {
        let old_spelling = self.check_aliases()?;
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
        config.validate().map_err(|mut invalid| {
            let source_name = source_name(figment.find_metadata(&invalid.key));
            if let Some(alias) = old_spelling.iter().find(|a| a.key == invalid.key) {
                invalid.key = alias.old.to_owned();
            }
            ConfigError::Invalid {
                invalid,
                source_name,
            }
        })?;
        Ok(config)
    }
}

/// Where a value came from, as an error message says it.
fn source_name(metadata: Option<&Metadata>) -> Option<String> {
    metadata.map(|m| match &m.source {
        // The defaults layer is code: say so instead of a type name and line.
        Some(figment::Source::Code(_)) => "the default".to_owned(),
        Some(source) => format!("{} {source}", m.name),
        None => m.name.to_string(),
    })
}

/// A scalar as the user would write it (strings unquoted); other values in figment's form.
fn display_value(value: &Value) -> String {
    match value {
        Value::String(_, s) => s.clone(),
        Value::Bool(_, b) => b.to_string(),
        other => other
            .to_u128()
            .map(|u| u.to_string())
            .or_else(|| other.to_i128().map(|i| i.to_string()))
            .or_else(|| other.to_f64().map(|f| f.to_string()))
            .unwrap_or_else(|| format!("{other:?}")),
    }
}

/// `value >= min`, else [`Invalid`] "must be at least `min` `unit`" (`unit` may be empty).
///
/// # Errors
/// The [`Invalid`] for `key = value`.
pub fn at_least<T: PartialOrd + fmt::Display>(
    key: &str,
    value: T,
    min: T,
    unit: &str,
) -> Result<(), Invalid> {
    let holds = value >= min;
    rule(key, value, holds, format_args!("at least {min}"), unit)
}

/// `value <= max`, else [`Invalid`] "must be at most `max` `unit`" (`unit` may be empty).
///
/// # Errors
/// The [`Invalid`] for `key = value`.
pub fn at_most<T: PartialOrd + fmt::Display>(
    key: &str,
    value: T,
    max: T,
    unit: &str,
) -> Result<(), Invalid> {
    let holds = value <= max;
    rule(key, value, holds, format_args!("at most {max}"), unit)
}

/// `value` in `range`, else [`Invalid`] "must be in `lo..=hi` `unit`" (`unit` may be empty).
///
/// # Errors
/// The [`Invalid`] for `key = value`.
pub fn in_range<T: PartialOrd + fmt::Display>(
    key: &str,
    value: T,
    range: RangeInclusive<T>,
    unit: &str,
) -> Result<(), Invalid> {
    let holds = range.contains(&value);
    let (lo, hi) = range.into_inner();
    rule(key, value, holds, format_args!("in {lo}..={hi}"), unit)
}

/// `Ok` when `holds`, else the [`Invalid`] for `key = value` "must be `bound` `unit`" (`unit`
/// may be empty): the one shape of [`at_least`], [`at_most`] and [`in_range`].
fn rule<T: fmt::Display>(
    key: &str,
    value: T,
    holds: bool,
    bound: fmt::Arguments<'_>,
    unit: &str,
) -> Result<(), Invalid> {
    if holds {
        return Ok(());
    }
    let unit = if unit.is_empty() {
        String::new()
    } else {
        format!(" {unit}")
    };
    Err(Invalid::new(key, value, format!("must be {bound}{unit}")))
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

    /// Runs `test` with `vars` set inside a `figment::Jail`: tests that touch the environment
    /// run one at a time and it is restored after (each test also keeps its own prefix).
    #[allow(clippy::result_large_err)] // the closure's error type is figment's, fixed by `Jail`
    fn with_env(vars: &[(&str, &str)], test: impl FnOnce()) {
        figment::Jail::expect_with(|jail| {
            for (key, value) in vars {
                jail.set_env(key, value);
            }
            test();
            Ok(())
        });
    }

    #[test]
    fn layers_apply_in_order() {
        with_env(
            &[("CKF_T1_LIMITS__STREAMS", "5"), ("CKF_T1_LISTEN", "env:1")],
            || {
                let dir = tempfile::tempdir().unwrap();
                let file = dir.path().join("c.toml");
                std::fs::write(
                    &file,
                    "listen = \"file:1\"\n[limits]\nmax_bytes = 2048\nstreams = 3\n",
                )
                .unwrap();
                let layers = Layers {
                    env_prefix: "CKF_T1_",
                    file: Some(file),
                    overrides: Overrides::new()
                        .set("listen", Some("flag:1"))
                        .set::<u64>("limits.max_bytes", None),
                    aliases: &[],
                };
                let config: Sample = layers.load().unwrap();
                assert_eq!(config.listen, "flag:1"); // flag beats env and file
                assert_eq!(config.limits.streams, 5); // env beats file
                assert_eq!(config.limits.max_bytes, 2048); // file beats default; absent flag ignored
            },
        );
    }

    #[test]
    fn defaults_alone() {
        let config: Sample = Layers::new("CKF_T2_").load().unwrap();
        assert_eq!(config, Sample::default());
    }

    #[test]
    fn rule_violation_names_key_value_rule_and_source() {
        with_env(&[("CKF_T3_LIMITS__MAX_BYTES", "12")], || {
            let err = Layers::new("CKF_T3_").load::<Sample>().unwrap_err();
            let text = err.to_string();
            assert!(matches!(err, ConfigError::Invalid { .. }), "{text}");
            assert!(text.contains("limits.max_bytes = 12"), "{text}");
            assert!(text.contains("must be at least 1024"), "{text}");
            assert!(text.contains("CKF_T3_"), "{text}");
        });
    }

    #[test]
    fn wrong_type_and_unknown_key_are_refused() {
        with_env(&[("CKF_T4_LIMITS__STREAMS", "many")], || {
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
        });
    }

    #[test]
    fn flags_sharing_a_table_are_all_applied() {
        let layers = Layers {
            overrides: Overrides::new()
                .set("limits.max_bytes", Some(2048u64))
                .set("limits.streams", Some(9u32)),
            ..Layers::new("CKF_T8_")
        };
        let config: Sample = layers.load().unwrap();
        assert_eq!(config.limits.max_bytes, 2048);
        assert_eq!(config.limits.streams, 9);
        assert_eq!(config.listen, Sample::default().listen);
    }

    const ALIASES: &[KeyAlias] = &[KeyAlias {
        old: "limits.bytes_max",
        key: "limits.max_bytes",
    }];

    #[test]
    fn an_old_key_spelling_is_accepted_in_every_layer() {
        with_env(&[("CKF_T10_LIMITS__BYTES_MAX", "3000")], || {
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("c.toml");
            std::fs::write(&file, "[limits]\nbytes_max = 2000\nstreams = 3\n").unwrap();
            let layers = Layers {
                file: Some(file),
                aliases: ALIASES,
                ..Layers::new("CKF_T9_")
            };
            let config: Sample = layers.load().unwrap();
            assert_eq!((config.limits.max_bytes, config.limits.streams), (2000, 3));
            let layers = Layers {
                aliases: ALIASES,
                ..Layers::new("CKF_T10_")
            };
            assert_eq!(layers.load::<Sample>().unwrap().limits.max_bytes, 3000);

            let layers = Layers {
                overrides: Overrides::new().set("limits.bytes_max", Some(4000u64)),
                aliases: ALIASES,
                ..Layers::new("CKF_T11_")
            };
            assert_eq!(layers.load::<Sample>().unwrap().limits.max_bytes, 4000);

            // Without the alias the old spelling is an unknown key.
            let layers = Layers {
                overrides: Overrides::new().set("limits.bytes_max", Some(4000u64)),
                ..Layers::new("CKF_T11_")
            };
            assert!(matches!(layers.load::<Sample>(), Err(ConfigError::Load(_))));
        });
    }

    #[test]
    fn across_layers_the_later_spelling_wins() {
        with_env(
            &[
                ("CKF_T12_LIMITS__BYTES_MAX", "3000"),
                ("CKF_T14_LIMITS__BYTES_MAX", "12"),
            ],
            || {
                // Old spelling in the environment, new one on the command line: the flag wins.
                let layers = Layers {
                    overrides: Overrides::new().set("limits.max_bytes", Some(4000u64)),
                    aliases: ALIASES,
                    ..Layers::new("CKF_T12_")
                };
                assert_eq!(layers.load::<Sample>().unwrap().limits.max_bytes, 4000);
                // New spelling in the file, old one in the environment: the environment wins, and a
                // rule it breaks is reported under the old spelling it used.
                let dir = tempfile::tempdir().unwrap();
                let file = dir.path().join("c.toml");
                std::fs::write(&file, "[limits]\nmax_bytes = 2000\n").unwrap();
                let layers = Layers {
                    file: Some(file.clone()),
                    aliases: ALIASES,
                    ..Layers::new("CKF_T12_")
                };
                assert_eq!(layers.load::<Sample>().unwrap().limits.max_bytes, 3000);
                let layers = Layers {
                    file: Some(file),
                    aliases: ALIASES,
                    ..Layers::new("CKF_T14_")
                };
                let text = layers.load::<Sample>().unwrap_err().to_string();
                assert!(text.contains("limits.bytes_max = 12"), "{text}");
            },
        );
    }

    #[test]
    fn both_spellings_in_one_layer_are_refused_naming_both_and_the_source() {
        with_env(
            &[
                ("CKF_T17_LIMITS__BYTES_MAX", "3000"),
                ("CKF_T17_LIMITS__MAX_BYTES", "3500"),
            ],
            || {
                let dir = tempfile::tempdir().unwrap();
                let file = dir.path().join("c.toml");
                std::fs::write(&file, "[limits]\nbytes_max = 2000\nmax_bytes = 2500\n").unwrap();
                let layers = Layers {
                    file: Some(file.clone()),
                    aliases: ALIASES,
                    ..Layers::new("CKF_T15_")
                };
                let err = layers.load::<Sample>().unwrap_err();
                let text = err.to_string();
                assert!(matches!(err, ConfigError::Invalid { .. }), "{text}");
                assert!(text.contains("limits.bytes_max = 2000"), "{text}");
                assert!(text.contains("limits.max_bytes"), "{text}");
                // The file is named (figment shows it relative to the jail's working directory).
                let dir_name = dir.path().file_name().unwrap().to_str().unwrap();
                assert!(text.contains(&format!("{dir_name}/c.toml")), "{text}");

                let layers = Layers {
                    overrides: Overrides::new()
                        .set("limits.max_bytes", Some(4000u64))
                        .set("limits.bytes_max", Some(5000u64)),
                    aliases: ALIASES,
                    ..Layers::new("CKF_T16_")
                };
                let text = layers.load::<Sample>().unwrap_err().to_string();
                assert!(text.contains("limits.bytes_max = 5000"), "{text}");
                assert!(text.contains("command-line flag"), "{text}");
                let layers = Layers {
                    aliases: ALIASES,
                    ..Layers::new("CKF_T17_")
                };
                let text = layers.load::<Sample>().unwrap_err().to_string();
                assert!(text.contains("limits.bytes_max = 3000"), "{text}");
                assert!(text.contains("CKF_T17_"), "{text}");
            },
        );
    }

    #[test]
    fn a_rule_broken_under_the_old_spelling_names_the_old_spelling() {
        with_env(&[("CKF_T13_LIMITS__BYTES_MAX", "12")], || {
            let layers = Layers {
                aliases: ALIASES,
                ..Layers::new("CKF_T13_")
            };
            let text = layers.load::<Sample>().unwrap_err().to_string();
            assert!(text.contains("limits.bytes_max = 12"), "{text}");
            assert!(text.contains("must be at least 1024"), "{text}");
            assert!(text.contains("CKF_T13_"), "{text}");
        });
    }

    #[test]
    fn rule_helpers_say_the_bound_and_the_unit() {
        assert_eq!(at_least("k", 3u32, 1, "bucket"), Ok(()));
        assert_eq!(
            at_least("k", 0u32, 1, "bucket").unwrap_err().to_string(),
            "k = 0: must be at least 1 bucket"
        );
        assert_eq!(
            at_least("k", 0u32, 1, "").unwrap_err().to_string(),
            "k = 0: must be at least 1"
        );
        assert_eq!(at_most("k", 5u32, 5, ""), Ok(()));
        assert_eq!(
            at_most("k", 6u32, 5, "").unwrap_err().to_string(),
            "k = 6: must be at most 5"
        );
        assert_eq!(in_range("k", 1u64, 1..=3, "ms"), Ok(()));
        assert_eq!(in_range("k", 3u64, 1..=3, "ms"), Ok(()));
        assert_eq!(
            in_range("k", 0u64, 1..=3, "milliseconds")
                .unwrap_err()
                .to_string(),
            "k = 0: must be in 1..=3 milliseconds"
        );
        assert!(in_range("k", 4u64, 1..=3, "").is_err());
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
