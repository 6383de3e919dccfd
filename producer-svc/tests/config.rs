//! Configuration: layer order, refusal of invalid values (key, value, rule), the shipped
//! example file, and `--help` documenting every key with its default.

use std::io::Write;

use ckf_svc_kit::config::{ConfigError, Layers};
use clap::{CommandFactory, Parser};
use producer_svc::{Cli, ProducerConfig};

fn cli(args: &[&str]) -> Cli {
    Cli::try_parse_from(std::iter::once("ckf-producer").chain(args.iter().copied())).unwrap()
}

/// `cli`'s layers with a test-private environment prefix (tests run in parallel and share the
/// process environment).
fn load(cli: &Cli, prefix: &'static str) -> Result<ProducerConfig, ConfigError> {
    Layers {
        env_prefix: prefix,
        ..cli.layers()
    }
    .load()
}

/// Runs `test` with the environment variables `vars` set for it alone: inside a
/// `figment::Jail`, which restores the environment afterwards and runs one jail at a time.
#[allow(clippy::result_large_err)] // the closure's error type is figment's, fixed by `Jail`
fn with_env(vars: &[(&str, &str)], test: impl FnOnce()) {
    figment::Jail::expect_with(|jail| {
        for (name, value) in vars {
            jail.set_env(name, value);
        }
        test();
        Ok(())
    });
}

fn toml_file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

#[test]
fn defaults_file_environment_flags_in_that_order() {
    let file = toml_file(
        r#"
indexers = ["http://file:1"]
[pool]
domain = "from-file"
dc = "dc-file"
[publication]
max_delay_ms = 7
batch_threshold = 11
heartbeat_interval_ms = 300
"#,
    );
    with_env(
        &[
            ("CKF_PT1_PUBLICATION__MAX_DELAY_MS", "9"),
            ("CKF_PT1_PUBLICATION__BATCH_THRESHOLD", "12"),
            ("CKF_PT1_INDEXERS", r#"["http://env:1", "http://env:2"]"#),
        ],
        || {
            let path = file.path().to_str().unwrap();
            let c = load(
                &cli(&[
                    "--config",
                    path,
                    "--batch-threshold",
                    "13",
                    "--dc",
                    "dc-flag",
                ]),
                "CKF_PT1_",
            )
            .unwrap();
            assert_eq!(c.pool.domain, "from-file"); // file over default
            assert_eq!(c.publication.heartbeat_interval_ms, 300); // file over default
            assert_eq!(c.publication.max_delay_ms, 9); // env over file
            assert_eq!(c.publication.batch_threshold, 13); // flag over env
            assert_eq!(c.pool.dc, "dc-flag"); // flag over file
            assert_eq!(c.indexers, ["http://env:1", "http://env:2"]); // env list over file
            assert_eq!(c.limits, ProducerConfig::default().limits); // untouched defaults

            let c = load(
                &cli(&[
                    "--config",
                    path,
                    "--indexer",
                    "http://a:1",
                    "--indexer",
                    "http://b:2",
                ]),
                "CKF_PT1_",
            )
            .unwrap();
            assert_eq!(c.indexers, ["http://a:1", "http://b:2"]);
        },
    );
}

fn refusal(args: &[&str]) -> String {
    let Err(err) = load(&cli(args), "CKF_PT2_") else {
        panic!("{args:?} was accepted");
    };
    assert!(
        matches!(err, ConfigError::Invalid { .. }),
        "{args:?}: {err}"
    );
    err.to_string()
}

/// One refused command line: its flags (after the valid `--dc`/`--indexer` base when
/// `on_valid_base`) and the texts the refusal must contain (key = value, rule).
struct Refused {
    on_valid_base: bool,
    args: &'static [&'static str],
    says: &'static [&'static str],
}

const fn refused(args: &'static [&'static str], says: &'static [&'static str]) -> Refused {
    Refused {
        on_valid_base: true,
        args,
        says,
    }
}

const fn refused_alone(args: &'static [&'static str], says: &'static [&'static str]) -> Refused {
    Refused {
        on_valid_base: false,
        args,
        says,
    }
}

const REFUSED: &[Refused] = &[
    refused_alone(
        &["--indexer", "http://127.0.0.1:7600"],
        &["pool.dc", "required"],
    ),
    refused_alone(&["--dc", "dc-a"], &["indexers", "at least one"]),
    refused(
        &["--max-delay-ms", "0"],
        &["publication.max_delay_ms = 0", "1..=60000"],
    ),
    refused(
        &["--bucket-count", "1001"],
        &["table.bucket_count = 1001", "odd (it must be even)"],
    ),
    refused(
        &["--initial-backoff-ms", "500", "--max-backoff-ms", "100"],
        &["reconnect.max_backoff_ms = 100", "at least"],
    ),
    refused(
        &["--max-message-bytes", "100"],
        &["limits.max_message_bytes = 100"],
    ),
    refused(
        &["--max-tracked-sources", "0"],
        &["limits.max_tracked_sources = 0", "at least 1"],
    ),
    refused(
        &["--max-tracked-sources", "4294967295"],
        &[
            "limits.max_tracked_sources = 4294967295",
            "at most 16777216",
        ],
    ),
    refused(&["--max-kicks", "1000000"], &["table.max_kicks = 1000000"]),
    refused(
        &["--bucket-count", "1000", "--reserve-blocks", "4001"],
        &["table.reserve_blocks = 4001", "at most 4000 blocks"],
    ),
    refused(
        &[
            "--max-blocks-per-event",
            "100000",
            "--max-blocks-per-batch",
            "1000",
        ],
        &[
            "quotas.max_blocks_per_event = 100000",
            "must not exceed quotas.max_blocks_per_batch (1000)",
        ],
    ),
    refused(&["--domain", "a b"], &["pool.domain", "a b"]),
    refused_alone(
        &["--dc", "x", "--indexer", "ftp://h:1"],
        &["indexers", "http://"],
    ),
    refused_alone(
        &[
            "--dc",
            "x",
            "--indexer",
            "http://h:1",
            "--indexer",
            "http://h:1",
        ],
        &["listed twice"],
    ),
    refused(
        &["--commit-interval-ms", "0"],
        &["durability.commit_interval_ms", "1..=1000"],
    ),
    refused(
        &["--commit-interval-ms", "5000"],
        &["durability.commit_interval_ms", "5000"],
    ),
    refused(
        &["--checkpoint-retry-ms", "10"],
        &["durability.checkpoint_retry_ms", "10"],
    ),
    refused(
        &["--min-checkpoint-mib", "0"],
        &["durability.min_checkpoint_mib"],
    ),
    refused(
        &["--data-dir", "/dev/null"],
        &["durability.data_dir", "not a directory"],
    ),
];

#[test]
fn invalid_values_are_refused_naming_key_value_and_rule() {
    let ok = ["--dc", "dc-a", "--indexer", "http://127.0.0.1:7600"];
    for case in REFUSED {
        let base: &[&str] = if case.on_valid_base { &ok } else { &[] };
        let args: Vec<&str> = base.iter().chain(case.args).copied().collect();
        let text = refusal(&args);
        for needle in case.says {
            assert!(text.contains(needle), "{args:?}: {needle:?} not in {text}");
        }
    }

    // Unknown keys and wrong types are refused by the loader, naming the key.
    let file = toml_file("[publication]\nmax_dealy_ms = 5\n");
    let path = file.path().to_str().unwrap();
    let args: Vec<&str> = ok.iter().copied().chain(["--config", path]).collect();
    let err = load(&cli(&args), "CKF_PT2_").unwrap_err();
    assert!(
        matches!(err, ConfigError::Load(_)) && err.to_string().contains("max_dealy_ms"),
        "{err}"
    );
}

#[test]
fn the_example_file_is_valid_and_spells_every_default() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/producer.example.toml"
    );
    let c = load(&cli(&["--config", path]), "CKF_PT3_").unwrap();
    let mut expected = ProducerConfig::default();
    expected.pool.dc = "dc-a".into();
    expected.indexers = vec!["http://127.0.0.1:7400".into()];
    assert_eq!(c, expected);
}

/// Every leaf key of the configuration, with its default rendered as text.
fn leaves(prefix: &str, v: &serde_json::Value, out: &mut Vec<(String, String)>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(&key, v, out);
            }
        }
        serde_json::Value::String(s) => out.push((prefix.into(), s.clone())),
        other => out.push((prefix.into(), other.to_string())),
    }
}

#[test]
fn help_documents_every_key_with_its_default() {
    let help = Cli::command().render_long_help().to_string();
    let mut keys = Vec::new();
    leaves(
        "",
        &serde_json::to_value(ProducerConfig::default()).unwrap(),
        &mut keys,
    );
    assert!(keys.len() >= 20, "{keys:?}");
    for (key, default) in keys {
        // Keys with no flag (TOML and environment only) are documented in the README's
        // configuration table instead: the reload interval and the ingest principals.
        if key == "tls.reload_interval_ms" || key.starts_with("ingest_auth.") {
            continue;
        }
        let default = if default == "null" {
            "none".to_owned()
        } else {
            default
        };
        let line = help
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{key}:")))
            .unwrap_or_else(|| panic!("--help does not document {key}:\n{help}"));
        let documented = match key.as_str() {
            "pool.dc" | "indexers" => line.contains("[required; no default]"),
            "table.max_kicks" => line.contains(&format!("{default}]")),
            _ => line.contains(&format!("[default: {default}]")),
        };
        assert!(documented, "{key}: default {default} not in {line:?}");
    }
}

#[test]
fn worker_threads_reaches_the_process_settings_from_every_layer_and_is_bounded() {
    let ok = ["--dc", "dc-a", "--indexer", "http://127.0.0.1:7400"];
    let with =
        |extra: &[&'static str]| -> Vec<&'static str> { ok.iter().chain(extra).copied().collect() };
    assert_eq!(ProducerConfig::default().process().worker_threads, 0);
    let c = load(&cli(&with(&["--worker-threads", "2"])), "CKF_PT4_").unwrap();
    assert_eq!(c.process().worker_threads, 2);
    assert_eq!(c.process().log_format, c.log_format);
    with_env(&[("CKF_PT4_WORKER_THREADS", "3")], || {
        assert_eq!(load(&cli(&ok), "CKF_PT4_").unwrap().worker_threads, 3);
        let c = load(&cli(&with(&["--worker-threads", "1"])), "CKF_PT4_").unwrap();
        assert_eq!(c.worker_threads, 1, "a flag overrides the environment");
        let err = load(&cli(&with(&["--worker-threads", "1025"])), "CKF_PT5_").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("worker_threads = 1025"), "{text}");
        assert!(text.contains("0..=1024 threads"), "{text}");
    });
}

#[test]
fn off_loopback_ingest_needs_ingest_auth_or_insecure() {
    use ckf_svc_kit::tls::Exposure;
    let base = ["--dc", "dc-a", "--indexer", "http://127.0.0.1:7400"];
    // Loopback (the default): secure.
    let config = load(&cli(&base), "CKF_PT6_").unwrap();
    assert_eq!(config.exposure(), Ok(Exposure::Secure));
    // 0.0.0.0 without ingest_auth.required: refused, naming the settings.
    let open = [&base[..], &["--listen", "0.0.0.0:7500", "--plaintext"]].concat();
    let text = load(&cli(&open), "CKF_PT6_").unwrap_err().to_string();
    assert!(
        text.contains("listen = 0.0.0.0:7500: is not a loopback address and serves Ingest"),
        "{text}"
    );
    assert!(
        text.contains("for Ingest: ingest_auth.required = true"),
        "{text}"
    );
    assert!(
        text.contains("insecure = true (--insecure, CKF_PRODUCER_INSECURE=true)"),
        "{text}"
    );
    // The flag, the key and the environment each let it start, insecure.
    let is_insecure = |config: ProducerConfig| config.exposure().unwrap().is_insecure();
    let flag = [&open[..], &["--insecure"]].concat();
    assert!(is_insecure(load(&cli(&flag), "CKF_PT6_").unwrap()));
    let file = toml_file("insecure = true\n");
    let key = [&open[..], &["--config", file.path().to_str().unwrap()]].concat();
    assert!(is_insecure(load(&cli(&key), "CKF_PT6_").unwrap()));
    with_env(&[("CKF_PT7_INSECURE", "true")], || {
        assert!(is_insecure(load(&cli(&open), "CKF_PT7_").unwrap()));
        // ingest_auth.required closes it.
        let token = toml_file("0123456789abcdef0123456789abcdef\n");
        let file = toml_file(&format!(
            "[ingest_auth]\nrequired = true\n[[ingest_auth.sources]]\nname = \"r\"\n\
         token_file = {:?}\nsource_ids = [\"*\"]\nworkers = [\"*\"]\n",
            token.path()
        ));
        let secure = [&open[..], &["--config", file.path().to_str().unwrap()]].concat();
        let config = load(&cli(&secure), "CKF_PT6_").unwrap();
        assert_eq!(config.exposure(), Ok(Exposure::Secure));
    });
}

#[test]
fn the_standby_example_reports_its_engines_unequal_capacities() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/k8s/standby-dc-a/producer-dc-a-standby.yaml"
    );
    let yaml = std::fs::read_to_string(path).unwrap();
    // The ConfigMap's producer.toml block (indented by four spaces).
    let body: String = yaml
        .lines()
        .skip_while(|l| *l != "  producer.toml: |")
        .skip(1)
        .take_while(|l| l.is_empty() || l.starts_with("    "))
        .map(|l| format!("{}\n", l.get(4..).unwrap_or("")))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("producer.toml");
    std::fs::write(&file, body).unwrap();
    let c = load(&cli(&["--config", file.to_str().unwrap()]), "CKF_PT9_").expect("valid");
    let engines: Vec<_> = c
        .engines
        .iter()
        .map(|e| (e.worker_id, e.prefill_tokens_per_s, e.metrics_url.is_some()))
        .collect();
    assert_eq!(engines, [(1, 24_000, true), (2, 16_000, true)]);
}
