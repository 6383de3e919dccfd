use super::*;
use ckf_core::addressing::TableFormat;
use ckf_core::tokens::TokenQueryRules;

fn cli(args: &[&str]) -> Cli {
    Cli::parse_from(std::iter::once("ckf-indexer").chain(args.iter().copied()))
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

#[test]
fn defaults_are_valid_and_match_a_default_producer_format() {
    let config = IndexerConfig::default();
    config.validate().unwrap();
    let format = config.format().unwrap();
    assert_eq!(
        format,
        TableFormat::for_expected_blocks(1_000_000, 0).unwrap()
    );
    assert_eq!(config.manifest().unwrap().lanes.len(), 3);
}

#[test]
fn flags_override_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("indexer.toml");
    std::fs::write(
        &file,
        "listen = \"127.0.0.1:1\"\n[manifest]\ndomain = \"prod\"\nlanes = [\"x\"]\n\
         [table]\nbucket_count = 1024\n",
    )
    .unwrap();
    let file_arg = file.to_str().unwrap();
    let config = cli(&["--config", file_arg, "--lanes", "a,b", "--seed", "9"])
        .load()
        .unwrap();
    assert_eq!(config.listen, "127.0.0.1:1".parse().unwrap());
    assert_eq!(config.manifest.domain, "prod");
    assert_eq!(config.manifest.lanes, vec!["a", "b"]);
    assert_eq!(config.format().unwrap(), TableFormat::new(1024, 9).unwrap());
}

#[test]
fn search_kernel_is_chosen_by_key_flag_or_environment_and_checked() {
    // Default: auto, resolved to the best kernel of this CPU.
    let config = cli(&[]).load().unwrap();
    assert_eq!(config.search.kernel, "auto");
    assert_eq!(config.search_kernel().unwrap(), SearchKernel::best());
    // The flag forces one (portable runs everywhere).
    let config = cli(&["--search-kernel", "portable"]).load().unwrap();
    assert_eq!(config.search_kernel().unwrap(), SearchKernel::Portable);
    // On every machine at least one of these is missing (NEON on x86-64, AVX on aarch64):
    // the real refusal.
    for k in [SearchKernel::Avx2, SearchKernel::Avx512, SearchKernel::Neon] {
        let result = cli(&["--search-kernel", k.name()]).load();
        if k.is_available() {
            assert_eq!(result.unwrap().search_kernel().unwrap(), k);
        } else {
            let text = result.unwrap_err().to_string();
            assert!(
                text.contains(&format!("search.kernel = {}", k.name())),
                "{text}"
            );
            assert!(text.contains("not available on this CPU"), "{text}");
        }
    }
    // The TOML key.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("indexer.toml");
    std::fs::write(&file, "[search]\nkernel = \"portable\"\n").unwrap();
    let config = cli(&["--config", file.to_str().unwrap()]).load().unwrap();
    assert_eq!(config.search_kernel().unwrap(), SearchKernel::Portable);
    // The environment (`[search] kernel` -> CKF_INDEXER_SEARCH__KERNEL).
    with_env(&[("CKF_IT3_SEARCH__KERNEL", "portable")], || {
        let config = load_with_env(&cli(&[]), "CKF_IT3_").unwrap();
        assert_eq!(config.search_kernel().unwrap(), SearchKernel::Portable);
        // A bad name is refused like any other key.
        let text = cli(&["--search-kernel", "sse4"])
            .load()
            .unwrap_err()
            .to_string();
        assert!(text.contains("search.kernel = sse4"), "{text}");
        assert!(
            text.contains("must be one of auto, portable, avx2, avx512, neon"),
            "{text}"
        );
        // A kernel the CPU lacks (the refusal every CPU without it gets; built here from the
        // core's error so the wording is checked on any machine).
        let lacking = SearchKernelError::Unavailable {
            kernel: SearchKernel::Avx512,
            needs: SearchKernel::Avx512.requirement(),
            available: "avx2, portable".into(),
        };
        assert_eq!(
            kernel_invalid("avx512", lacking).to_string(),
            "search.kernel = avx512: is not available on this CPU (it needs x86-64 with \
         AVX-512 F, DQ, BW and BMI2); available: avx2, portable, or auto"
        );
    });
}

#[test]
fn invalid_values_name_key_value_and_rule() {
    let text = cli(&["--bucket-count", "1001"])
        .load()
        .unwrap_err()
        .to_string();
    assert!(text.contains("table.bucket_count = 1001"), "{text}");
    assert!(text.contains("odd (it must be even)"), "{text}");

    let text = cli(&["--lanes", "a,a"]).load().unwrap_err().to_string();
    assert!(text.contains("manifest.lanes"), "{text}");
    assert!(text.contains("already lane 0"), "{text}");

    let text = cli(&["--lanes", "a,b c"]).load().unwrap_err().to_string();
    assert!(text.contains("manifest.lanes[1] = b c"), "{text}");

    let text = cli(&["--max-message-bytes", "100"])
        .load()
        .unwrap_err()
        .to_string();
    assert!(text.contains("limits.max_message_bytes = 100"), "{text}");
    assert!(text.contains("4096"), "{text}");

    let text = cli(&["--max-images-per-delta", "0"])
        .load()
        .unwrap_err()
        .to_string();
    assert!(text.contains("limits.max_images_per_delta = 0"), "{text}");

    let lanes: Vec<String> = (0..65).map(|i| format!("dc{i}")).collect();
    let text = cli(&["--lanes", &lanes.join(",")])
        .load()
        .unwrap_err()
        .to_string();
    assert!(text.contains("65 lanes"), "{text}");
}

/// `cli`'s layers with a test-private environment prefix.
fn load_with_env(cli: &Cli, prefix: &'static str) -> Result<IndexerConfig, ConfigError> {
    Layers {
        env_prefix: prefix,
        ..cli.layers()
    }
    .load()
}

#[test]
fn expected_blocks_has_the_producers_key_and_the_old_one_as_an_alias() {
    let format = |blocks: u64| TableFormat::for_expected_blocks(blocks, 0).unwrap();
    let config = cli(&["--expected-blocks", "5000"]).load().unwrap();
    assert_eq!(config.table.expected_blocks, 5000);
    assert_eq!(config.format().unwrap(), format(5000));

    // The old flag, TOML key and environment variable still set the same value.
    let config = cli(&["--expected-blocks-per-lane", "6000"]).load().unwrap();
    assert_eq!(config.format().unwrap(), format(6000));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("old.toml");
    std::fs::write(&file, "[table]\nexpected_blocks_per_lane = 7000\n").unwrap();
    let file_arg = file.to_str().unwrap();
    let config = cli(&["--config", file_arg]).load().unwrap();
    assert_eq!(config.format().unwrap(), format(7000));
    with_env(
        &[("CKF_IT1_TABLE__EXPECTED_BLOCKS_PER_LANE", "8000")],
        || {
            let config = load_with_env(&cli(&[]), "CKF_IT1_").unwrap();
            assert_eq!(config.format().unwrap(), format(8000));

            // Across layers the later one wins, whichever spelling each uses: an old config file
            // or environment is overridden by the new flag.
            let config = load_with_env(&cli(&["--expected-blocks", "9000"]), "CKF_IT1_").unwrap();
            assert_eq!(config.format().unwrap(), format(9000));
        },
    );
    let config = cli(&["--config", file_arg, "--expected-blocks", "1"])
        .load()
        .unwrap();
    assert_eq!(config.table.expected_blocks, 1);

    // Both spellings in one layer: refused, naming both and where they came from.
    let err = cli(&["--expected-blocks-per-lane", "8", "--expected-blocks", "9"])
        .load()
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, ConfigError::Invalid { .. }), "{text}");
    assert!(
        text.contains("table.expected_blocks_per_lane = 8"),
        "{text}"
    );
    assert!(text.contains("table.expected_blocks,"), "{text}");
    assert!(text.contains("command-line flag"), "{text}");
    let both = dir.path().join("both.toml");
    std::fs::write(
        &both,
        "[table]\nexpected_blocks_per_lane = 7000\nexpected_blocks = 7100\n",
    )
    .unwrap();
    let text = cli(&["--config", both.to_str().unwrap()])
        .load()
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("table.expected_blocks_per_lane = 7000"),
        "{text}"
    );
    assert!(text.contains(both.to_str().unwrap()), "{text}");

    // A rule broken under the old spelling is reported under it.
    let text = cli(&["--expected-blocks-per-lane", "0"])
        .load()
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("table.expected_blocks_per_lane = 0: must be at least 1"),
        "{text}"
    );
    assert!(text.contains("command-line flag"), "{text}");
}

#[test]
fn the_producers_table_settings_are_refused_here() {
    let dir = tempfile::tempdir().unwrap();
    for (key, value) in [("max_kicks", 500), ("reserve_blocks", 1000)] {
        let file = dir.path().join(format!("{key}.toml"));
        std::fs::write(&file, format!("[table]\n{key} = {value}\n")).unwrap();
        let text = cli(&["--config", file.to_str().unwrap()])
            .load()
            .unwrap_err()
            .to_string();
        assert!(text.contains(&format!("table.{key} = {value}")), "{text}");
        assert!(text.contains("producer setting"), "{text}");
    }
}

#[test]
fn images_per_delta_is_lowered_to_what_fits_a_message() {
    let config = cli(&["--max-message-bytes", "65536"]).load().unwrap();
    assert_eq!(config.effective_max_images_per_delta(), 65536 / 13); // 5 + 8 bytes per image
    let config = cli(&["--max-images-per-delta", "100"]).load().unwrap();
    assert_eq!(config.effective_max_images_per_delta(), 100);
}

#[test]
fn block_size_comes_from_every_layer_and_is_bounded() {
    assert_eq!(IndexerConfig::default().block_size, 16);
    let config = cli(&["--block-size", "64"]).load().unwrap();
    assert_eq!(config.block_size, 64);
    assert_eq!(
        config.token_rules(),
        TokenQueryRules {
            block_size: 64,
            max_blocks: 8192
        }
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bs.toml");
    std::fs::write(&file, "block_size = 32\n").unwrap();
    let file_arg = file.to_str().unwrap();
    assert_eq!(cli(&["--config", file_arg]).load().unwrap().block_size, 32);
    with_env(&[("CKF_IT2_BLOCK_SIZE", "128")], || {
        let from_env = load_with_env(&cli(&["--config", file_arg]), "CKF_IT2_").unwrap();
        assert_eq!(
            from_env.block_size, 128,
            "the environment overrides the file"
        );
        let flag = load_with_env(&cli(&["--block-size", "8"]), "CKF_IT2_").unwrap();
        assert_eq!(flag.block_size, 8, "a flag overrides the environment");
        for bad in ["0", "65537"] {
            let text = cli(&["--block-size", bad]).load().unwrap_err().to_string();
            assert!(text.contains(&format!("block_size = {bad}")), "{text}");
            assert!(text.contains("1..=65536"), "{text}");
        }
        assert_eq!(
            cli(&["--block-size", "65536"]).load().unwrap().block_size,
            65536
        );
    });
}

#[test]
fn worker_threads_reaches_the_process_settings_and_is_bounded() {
    let default = IndexerConfig::default().process();
    assert_eq!(
        (default.worker_threads, default.log_format),
        (0, LogFormat::Human)
    );
    let config = cli(&["--worker-threads", "1", "--log-format", "json"])
        .load()
        .unwrap();
    assert_eq!(
        config.process(),
        ProcessSettings {
            log_format: LogFormat::Json,
            worker_threads: 1
        }
    );
    with_env(&[("CKF_IT3_WORKER_THREADS", "3")], || {
        let from_env = load_with_env(&cli(&[]), "CKF_IT3_").unwrap();
        assert_eq!(from_env.worker_threads, 3);
        assert_eq!(
            cli(&["--worker-threads", "1024"])
                .load()
                .unwrap()
                .worker_threads,
            1024
        );
        let text = cli(&["--worker-threads", "1025"])
            .load()
            .unwrap_err()
            .to_string();
        assert!(text.contains("worker_threads = 1025"), "{text}");
        assert!(text.contains("0..=1024 threads"), "{text}");
    });
}

#[test]
fn off_loopback_relay_and_query_need_authorization_or_insecure() {
    use ckf_svc_kit::tls::Exposure;
    // Loopback (the default and the quick start): secure, nothing asked.
    assert_eq!(cli(&[]).load().unwrap().exposure(), Ok(Exposure::Secure));
    // 0.0.0.0 (plaintext on purpose, so only the authorization rule speaks).
    let open = ["--listen", "0.0.0.0:7400", "--plaintext"];
    let text = cli(&open).load().unwrap_err().to_string();
    assert!(
        text.contains("listen = 0.0.0.0:7400: is not a loopback address and serves Relay"),
        "{text}"
    );
    assert!(text.contains("for Relay: auth.required = true"), "{text}");
    assert!(text.contains("for Query: auth.query_token_file"), "{text}");
    assert!(text.contains("CKF_INDEXER_INSECURE=true"), "{text}");
    // The flag, the key and the environment each let it start, insecure.
    let insecure = |config: IndexerConfig| {
        let exposure = config.exposure().unwrap();
        assert!(exposure.is_insecure(), "{exposure:?}");
        let Exposure::Insecure { open } = exposure else {
            unreachable!()
        };
        open.iter().map(|o| o.service).collect::<Vec<_>>()
    };
    let flag = cli(&[&open[..], &["--insecure"]].concat()).load().unwrap();
    assert_eq!(insecure(flag), ["Relay", "Query"]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("insecure.toml");
    std::fs::write(&file, "insecure = true\n").unwrap();
    let key = cli(&[&open[..], &["--config", file.to_str().unwrap()]].concat());
    assert_eq!(insecure(key.load().unwrap()), ["Relay", "Query"]);
    with_env(&[("CKF_IT4_INSECURE", "true")], || {
        let env = load_with_env(&cli(&open), "CKF_IT4_").unwrap();
        assert_eq!(insecure(env), ["Relay", "Query"]);
        // A query token closes Query; a separate query_listen on loopback is not asked for one.
        let token = dir.path().join("query.token");
        std::fs::write(&token, "0123456789abcdef0123456789abcdef\n").unwrap();
        let token_arg = token.to_str().unwrap();
        let text = cli(&[&open[..], &["--query-token-file", token_arg]].concat())
            .load()
            .unwrap_err()
            .to_string();
        assert!(
            text.contains("serves Relay") && !text.contains("Query"),
            "{text}"
        );
        let split = ["--query-listen", "127.0.0.1:7401", "--insecure"];
        let config = cli(&[&open[..], &split[..]].concat()).load().unwrap();
        assert_eq!(insecure(config), ["Relay"]);
    });
}

#[test]
fn zero_deadline_disables_it() {
    let config = cli(&["--heartbeat-deadline-ms", "0"]).load().unwrap();
    let policy = config.lag_policy();
    assert_eq!(policy.heartbeat_deadline, None);
    assert_eq!(policy.apply_deadline, Some(Duration::from_secs(10)));
}

#[test]
fn drain_grace_defaults_to_30_s_zero_is_a_real_zero_and_too_long_is_refused() {
    let policy = cli(&[]).load().unwrap().lag_policy();
    assert_eq!(policy.drain_grace, Some(Duration::from_secs(30)));
    let policy = cli(&["--drain-grace-ms", "0"]).load().unwrap().lag_policy();
    assert_eq!(policy.drain_grace, Some(Duration::ZERO));
    let text = cli(&["--drain-grace-ms", "86400001"])
        .load()
        .unwrap_err()
        .to_string();
    assert!(text.contains("lag.drain_grace_ms = 86400001"), "{text}");
}

#[test]
fn example_file_in_deploy_is_valid() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/indexer.example.toml"
    );
    let config = cli(&["--config", path]).load().unwrap();
    assert_eq!(
        config,
        IndexerConfig::default(),
        "the example documents the defaults"
    );
}

#[test]
#[allow(clippy::result_large_err)] // the closure's error type is figment's, fixed by `Jail`
fn route_settings_are_read_from_the_file_and_checked() {
    figment::Jail::expect_with(|jail| {
        jail.create_file(
            "ok.toml",
            "[manifest]\nlanes = [\"dc-a\", \"dc-b\"]\n[route]\ndefault_rtt_ms = 2.5\nstale_after_ms = 800\n[route.rtt_ms]\ndc-b = 279.0\n",
        )?;
        let config = cli(&["--config", "ok.toml"]).load().expect("valid");
        let model = config.route.model();
        assert_eq!(model.default_rtt, Duration::from_micros(2_500));
        assert_eq!(model.stale_after, Duration::from_millis(800));
        assert_eq!(config.route.rtt("dc-b"), Some(Duration::from_millis(279)));
        assert_eq!(config.route.rtt("dc-a"), None);
        for (name, body, says) in [
            (
                "unknown.toml",
                "[route.rtt_ms]\ndc-z = 1.0\n",
                "route.rtt_ms.dc-z",
            ),
            (
                "negative.toml",
                "[route]\ndefault_rtt_ms = -1.0\n",
                "route.default_rtt_ms = -1",
            ),
            (
                "capacity.toml",
                "[route]\ndefault_prefill_tokens_per_s = 0.0\n",
                "route.default_prefill_tokens_per_s = 0",
            ),
            (
                "stale.toml",
                "[route]\nstale_after_ms = 0\n",
                "route.stale_after_ms = 0",
            ),
        ] {
            jail.create_file(
                name,
                &format!("[manifest]\nlanes = [\"dc-a\", \"dc-b\"]\n{body}"),
            )?;
            let text = cli(&["--config", name]).load().unwrap_err().to_string();
            assert!(text.contains(says), "{name}: {text}");
        }
        Ok(())
    });
}

/// The TOML of the ConfigMap key `key` in the Kubernetes manifest `yaml` (a `key: |` block
/// indented by four spaces), as a file in `dir`.
fn config_map_file(yaml: &str, key: &str, dir: &std::path::Path) -> std::path::PathBuf {
    let start = format!("  {key}: |");
    let body: String = yaml
        .lines()
        .skip_while(|l| *l != start)
        .skip(1)
        .take_while(|l| l.is_empty() || l.starts_with("    "))
        .map(|l| format!("{}\n", l.get(4..).unwrap_or("")))
        .collect();
    assert!(body.contains("[manifest]"), "{key} not found");
    let path = dir.join(key);
    std::fs::write(&path, body).unwrap();
    path
}

#[test]
fn the_deploy_examples_load_with_their_round_trips_and_capacity() {
    let deploy = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy");
    let dir = tempfile::tempdir().unwrap();
    let yaml = std::fs::read_to_string(format!("{deploy}/k8s/indexer.yaml")).unwrap();
    let k8s = config_map_file(&yaml, "indexer.toml", dir.path());
    let compose = format!("{deploy}/compose/indexer.toml");
    for path in [compose.as_str(), k8s.to_str().unwrap()] {
        let config = cli(&["--config", path]).load().expect(path);
        let route = &config.route;
        let rtt = |dc| route.rtt(dc).map(|d| d.as_secs_f64() * 1e3);
        assert_eq!(
            (rtt("dc-a"), rtt("dc-b"), rtt("dc-c")),
            (Some(1.0), Some(40.0), Some(280.0)),
            "{path}"
        );
        assert_eq!(route.default_prefill_tokens_per_s, 10_000.0, "{path}");
    }
}

#[test]
fn a_message_limit_too_small_for_one_answer_of_every_lane_is_refused() {
    let lanes: Vec<String> = (0..64).map(|i| format!("dc-{i}")).collect();
    let lanes = lanes.join(",");
    let text = cli(&["--lanes", &lanes, "--max-message-bytes", "16384"])
        .load()
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("limits.max_message_bytes") && text.contains("32768 bytes for 64 lanes"),
        "{text}"
    );
    cli(&["--lanes", &lanes, "--max-message-bytes", "32768"])
        .load()
        .unwrap();
    cli(&["--lanes", "dc-a", "--max-message-bytes", "4096"])
        .load()
        .unwrap();
}

/// A configuration of domains `llama` (primary: dc-a, dc-b, dc-c) and `qwen` (dc-a, dc-d; block
/// size 32, its own table) loaded from TOML.
fn two_domains(extra: &str) -> Result<IndexerConfig, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("indexer.toml");
    std::fs::write(
        &file,
        format!(
            "[manifest]\ndomain = \"llama\"\nlanes = [\"dc-a\", \"dc-b\", \"dc-c\"]\n\
             [[domains]]\ndomain = \"qwen\"\nlanes = [\"dc-a\", \"dc-d\"]\nblock_size = 32\n\
             [domains.table]\nexpected_blocks = 5000\n{extra}"
        ),
    )
    .unwrap();
    cli(&["--config", file.to_str().unwrap()]).load()
}

#[test]
fn domains_are_resolved_each_with_its_own_lanes_block_size_and_table() {
    let config = two_domains("").unwrap();
    let specs = config.domain_specs().unwrap();
    assert_eq!(specs.len(), 2);
    let (llama, qwen) = (&specs[0], &specs[1]);
    assert_eq!(llama.manifest.domain.as_str(), "llama");
    assert_eq!(llama.manifest.lanes.len(), 3);
    assert_eq!(
        llama.manifest.format,
        TableFormat::for_expected_blocks(1_000_000, 0).unwrap()
    );
    assert_eq!(llama.token_rules.block_size, 16);
    assert_eq!(qwen.manifest.domain.as_str(), "qwen");
    assert_eq!(qwen.manifest.lanes[1].to_string(), "qwen/dc-d");
    assert_eq!(
        qwen.manifest.format,
        TableFormat::for_expected_blocks(5000, 0).unwrap()
    );
    assert_eq!(qwen.token_rules.block_size, 32);
    assert_eq!(qwen.block_sizes.of(1), 32);
    // The primary's accessors stay the primary's.
    assert_eq!(config.manifest().unwrap(), llama.manifest);
    assert_eq!(config.catalog().all_dcs(), ["dc-a", "dc-b", "dc-c", "dc-d"]);
    // A round trip may name a DC of any domain.
    two_domains("[route]\nrtt_ms = { dc-d = 40.0 }\n").unwrap();
}

#[test]
fn a_bad_domain_entry_is_refused_naming_its_key() {
    let refused = |extra: &str| two_domains(extra).unwrap_err().to_string();
    let text = refused("[[domains]]\ndomain = \"llama\"\nlanes = [\"dc-z\"]\n");
    assert!(
        text.contains("domains[1].domain = llama: is configured twice"),
        "{text}"
    );
    let text = refused("[[domains]]\ndomain = \"m\"\nlanes = [\"dc-a\", \"bad dc\"]\n");
    assert!(text.contains("domains[1].lanes[1] = bad dc"), "{text}");
    let text = refused("[[domains]]\ndomain = \"m\"\nlanes = []\n");
    assert!(text.contains("domains[1].lanes"), "{text}");
    let text = refused("[[domains]]\ndomain = \"m\"\nlanes = [\"a\"]\nblock_size = 0\n");
    assert!(text.contains("domains[1].block_size = 0"), "{text}");
    let text = refused("[[domains]]\ndomain = \"m\"\nlanes = [\"a\"]\nblock_sizes = { b = 8 }\n");
    assert!(
        text.contains("domains[1].block_sizes.b = 8: not a DC of domains[1].lanes"),
        "{text}"
    );
    let text =
        refused("[[domains]]\ndomain = \"m\"\nlanes = [\"a\"]\n[domains.table]\nmax_kicks = 8\n");
    assert!(text.contains("domains[1].table.max_kicks = 8"), "{text}");
    let text = refused(
        "[[domains]]\ndomain = \"m\"\nlanes = [\"a\"]\n[domains.table]\nbucket_count = 3\n",
    );
    assert!(text.contains("domains[1].table.bucket_count = 3"), "{text}");
    let text = refused("[[domains]]\ndomain = \"m\"\nlanes = [\"a\"]\nsurprise = 1\n");
    assert!(text.contains("surprise"), "{text}");
    let text = refused("[route]\nrtt_ms = { dc-z = 40.0 }\n");
    assert!(
        text.contains("route.rtt_ms.dc-z = 40: not a DC of any domain's lanes"),
        "{text}"
    );
}

#[test]
fn the_message_limit_follows_the_largest_domain() {
    let lanes: Vec<String> = (0..40).map(|i| format!("\"dc-{i}\"")).collect();
    let big = format!(
        "[[domains]]\ndomain = \"wide\"\nlanes = [{}]\n[limits]\nmax_message_bytes = 16384\n",
        lanes.join(", ")
    );
    let text = two_domains(&big).unwrap_err().to_string();
    assert!(
        text.contains("at least 20480 bytes for 40 lanes in one domain"),
        "{text}"
    );
}

#[test]
fn the_tables_of_every_domain_must_fit_the_memory_limit() {
    // 5,000 expected blocks -> 1,360 buckets; llama: 3 lanes x 1,000,000 blocks (271,740
    // buckets); qwen: 2 lanes, 1,360 buckets.
    let text = two_domains("[limits]\nmax_table_bytes = 1000000\n")
        .unwrap_err()
        .to_string();
    assert!(text.contains("limits.max_table_bytes = 1000000"), "{text}");
    assert!(
        text.contains("would take 6.2 MiB (llama: 6.2 MiB, qwen: 0.0 MiB)"),
        "{text}"
    );
    let fits = two_domains("[limits]\nmax_table_bytes = 7000000\n").unwrap();
    let specs = fits.domain_specs().unwrap();
    assert_eq!(specs[0].table_bytes(), 271_740 * 3 * 8);
    // 0: the machine's memory; a 2 TiB table does not fit a test machine.
    let huge = two_domains(
        "[[domains]]\ndomain = \"huge\"\nlanes = [\"a\"]\nspare_lanes = 63\n\
                           [domains.table]\nbucket_count = 4294967294\n",
    );
    if domains::machine_memory().is_some_and(|m| m < 2 << 40) {
        let text = huge.unwrap_err().to_string();
        assert!(text.contains("more than this machine's memory"), "{text}");
    }
}
