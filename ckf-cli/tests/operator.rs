//! The operator's commands through the built binary against in-process services: `ckf lanes`,
//! `ckf query` (raw hashes, `--ids`, and token ids), `ckf route`, `ckf health`.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use ckf_cli::bench::fleet::FleetShape;
use ckf_cli::demo::Services;
use ckf_cli::hashing::block_hashes;
use ckf_proto::v1::{self, ingest_client::IngestClient, kv_event::Kind};

async fn ckf(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_ckf"))
            .args(&args)
            .output()
            .expect("run ckf")
    })
    .await
    .unwrap()
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// Panics unless `ckf` exited with `code` (showing its stderr).
fn assert_exit(out: &Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_query_and_health_against_running_services() {
    let shape = FleetShape {
        dcs: 2,
        workers_per_dc: 1,
        ranks_per_worker: 1,
        capacity_blocks: 64,
    };
    let services = Services::start(shape).await.unwrap();
    let indexer = services.indexer_url.clone();

    // Lanes become active once each producer's barrier snapshot is in.
    let deadline = Instant::now() + Duration::from_secs(30);
    let lanes = loop {
        let lanes = json(&ckf(args(&["lanes", "--indexer", &indexer, "--json"])).await);
        let active = lanes["lanes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| l["state"] == "active")
            .count();
        if active == 2 {
            break lanes;
        }
        assert!(
            Instant::now() < deadline,
            "lanes never became active: {lanes}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(lanes["domain"], "ckf-demo");
    let dcs: Vec<&str> = lanes["lanes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["dc"].as_str().unwrap())
        .collect();
    assert_eq!(dcs, ["dc-a", "dc-b"]);
    let text = ckf(args(&["lanes", "--indexer", &indexer])).await;
    assert!(text.status.success());
    assert!(String::from_utf8_lossy(&text.stdout).contains("dc-b"));
    // `--domain` names the model asked about: its own is answered, another refused.
    let own = ckf(args(&[
        "lanes",
        "--indexer",
        &indexer,
        "--domain",
        "ckf-demo",
    ]))
    .await;
    assert!(own.status.success(), "{own:?}");
    let other = ckf(args(&[
        "query",
        "--indexer",
        &indexer,
        "--domain",
        "qwen-7b",
        "1",
    ]))
    .await;
    assert_eq!(other.status.code(), Some(1), "{other:?}");
    let stderr = String::from_utf8_lossy(&other.stderr);
    assert!(
        stderr.contains("domain qwen-7b is not served here: this indexer serves ckf-demo"),
        "{stderr}"
    );

    // Store trace ids [7, 8, 9] as chained block hashes on dc-a.
    let hashes = block_hashes(&[7, 8, 9]);
    let mut ingest = IngestClient::connect(services.producers[0].1.clone())
        .await
        .unwrap();
    let result = ingest
        .publish_batch(v1::KvEventBatch {
            source_id: "operator-test".into(),
            sequence: 1,
            events: vec![v1::KvEvent {
                member: Some(v1::MemberId {
                    worker_id: 0,
                    dp_rank: 0,
                }),
                kind: Some(Kind::Stored(v1::Stored {
                    block_hashes: hashes.clone(),
                    parent_hash: None,
                })),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(result.events[0].applied_blocks, 3);

    // `--ids` applies the hashing rule; raw hashes (decimal and hex) give the same answer.
    let depth_of = |answer: &serde_json::Value, dc: &str| {
        answer["matches"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["dc"] == dc)
            .map(|m| m["depth"].as_u64().unwrap())
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = json(
            &ckf(args(&[
                "query",
                "--indexer",
                &indexer,
                "--json",
                "--ids",
                "7",
                "8",
                "9",
                "10",
            ]))
            .await,
        );
        if depth_of(&answer, "dc-a") == Some(3) {
            assert_eq!(depth_of(&answer, "dc-b"), Some(0));
            assert_eq!(answer["blocks"], 4);
            // The ready lanes, as the mask and as a list (exact for lanes 53..63 in any reader).
            let mut lanes: Vec<u64> = answer["matches"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["lane"].as_u64().unwrap())
                .collect();
            lanes.sort_unstable();
            let listed: Vec<u64> = serde_json::from_value(answer["ready_lanes"].clone()).unwrap();
            assert_eq!((listed.len(), &listed), (2, &lanes), "{answer}");
            let mask = lanes.iter().fold(0, |m, l| m | 1 << l);
            assert_eq!(answer["ready_mask"].as_u64(), Some(mask), "{answer}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "store never became visible: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let raw = json(
        &ckf(vec![
            "query".into(),
            "--indexer".into(),
            indexer.clone(),
            "--json".into(),
            hashes[0].to_string(),
            format!("{:#x}", hashes[1]),
        ])
        .await,
    );
    assert_eq!(depth_of(&raw, "dc-a"), Some(2));
    let bad = ckf(args(&["query", "--indexer", &indexer, "not-a-hash"])).await;
    assert!(!bad.status.success());

    // `ckf route`: 4 blocks of 16 tokens, 3 cached at dc-a; no load reports (unknown load: no
    // queue, 10,000 tokens/s) and the default 1 ms round trips: dc-a 1 + 1.6 ms, dc-b
    // 1 + 6.4 ms. With the router 50 ms from dc-a, dc-b is the faster by more than the band.
    let route = |extra: &[&str]| {
        let mut list = args(&["route", "--indexer", &indexer, "--json", "--ids"]);
        list.extend(args(extra));
        list.extend(args(&["7", "8", "9", "10"]));
        list
    };
    let answer = json(&ckf(route(&[])).await);
    assert_eq!(
        (answer["chosen"].as_str(), answer["reason"].as_str()),
        (Some("dc-a"), Some("ROUTE_REASON_FASTEST")),
        "{answer}"
    );
    let first = &answer["ranked"][0];
    assert_eq!(
        (first["dc"].as_str(), first["depth"].as_u64()),
        (Some("dc-a"), Some(3))
    );
    assert_eq!(
        (
            first["cached_tokens"].as_u64(),
            first["uncached_tokens"].as_u64()
        ),
        (Some(48), Some(16))
    );
    assert_eq!(first["load"], "LOAD_STATE_UNKNOWN");
    assert!(
        (first["ttft_ms"].as_f64().unwrap() - 2.6).abs() < 1e-6,
        "{answer}"
    );
    let far = json(&ckf(route(&["--rtt-ms", "dc-a=50"])).await);
    assert_eq!(far["chosen"], "dc-b", "{far}");
    assert_eq!(far["ranked"][1]["rtt_from_request"], true, "{far}");
    let text = ckf(args(&["route", "--indexer", &indexer, "--ids", "7", "8"])).await;
    assert_exit(&text, 0);
    assert!(String::from_utf8_lossy(&text.stdout).contains("route to dc-a"));
    let bad = ckf(route(&["--rtt-ms", "dc-a=soon"])).await;
    assert_exit(&bad, 2);

    // Health: SERVING -> 0; the producer too; nothing listening -> 2.
    let ok = ckf(args(&["health", "--endpoint", &indexer])).await;
    assert_exit(&ok, 0);
    assert!(String::from_utf8_lossy(&ok.stdout).contains("SERVING"));
    let producer = services.producers[1].1.clone();
    let ok = ckf(args(&[
        "health",
        "--endpoint",
        &producer,
        "--service",
        "ckf.v1.Ingest",
    ]))
    .await;
    assert_exit(&ok, 0);
    let unknown = ckf(args(&[
        "health",
        "--endpoint",
        &indexer,
        "--service",
        "no.such.Service",
    ]))
    .await;
    assert_ne!(unknown.status.code(), Some(0));

    services.shutdown().await.unwrap();
    let down = ckf(args(&[
        "health",
        "--endpoint",
        &indexer,
        "--timeout-ms",
        "2000",
    ]))
    .await;
    assert_exit(&down, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_by_tokens_against_running_services() {
    use ckf_core::tokens::{BlockSeed, sequence_hashes};
    let shape = FleetShape {
        dcs: 1,
        workers_per_dc: 1,
        ranks_per_worker: 1,
        capacity_blocks: 64,
    };
    let services = Services::start(shape).await.unwrap();
    let indexer = services.indexer_url.clone();

    // 40 tokens = 2 full blocks of 16 (the indexer's default block size) and a partial one,
    // stored under cache salt "tenant" on dc-a as their canonical hashes.
    let tokens: Vec<u32> = (0..40).map(|i| 100 + i * 3).collect();
    let list = tokens
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let seed = BlockSeed::new(Some("tenant"), None);
    let hashes = sequence_hashes(&tokens, 16, seed, &[]).unwrap();
    let mut ingest = IngestClient::connect(services.producers[0].1.clone())
        .await
        .unwrap();
    ingest
        .publish_batch(v1::KvEventBatch {
            source_id: "operator-tokens".into(),
            sequence: 1,
            events: vec![v1::KvEvent {
                member: Some(v1::MemberId {
                    worker_id: 0,
                    dp_rank: 0,
                }),
                kind: Some(Kind::Stored(v1::Stored {
                    block_hashes: hashes,
                    parent_hash: None,
                })),
            }],
        })
        .await
        .unwrap();

    let dc_a = |answer: &serde_json::Value| {
        answer["matches"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["dc"] == "dc-a")
            .map(|m| m["depth"].as_u64().unwrap())
    };
    let query = |extra: &[&str]| {
        let mut a = args(&["query", "--indexer", &indexer, "--json"]);
        a.extend(extra.iter().map(|s| s.to_string()));
        ckf(a)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = json(&query(&["--tokens", &list, "--salt", "tenant"]).await);
        if dc_a(&answer) == Some(2) {
            assert_eq!(answer["tokens"], 40);
            break;
        }
        assert!(Instant::now() < deadline, "never visible: {answer}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Without the salt (or with a LoRA name) the hashes differ.
    let plain = json(&query(&["--tokens", &list]).await);
    assert_eq!(dc_a(&plain), Some(0));
    let lora = json(&query(&["--tokens", &list, "--salt", "tenant", "--lora", "x"]).await);
    assert_eq!(dc_a(&lora), Some(0));
    // The same ids from a file (whitespace and commas), the block size named explicitly.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens.txt");
    let text = tokens
        .chunks(7)
        .map(|c| c.iter().map(u32::to_string).collect::<Vec<_>>().join(", "))
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&file, text).unwrap();
    let from_file = json(
        &query(&[
            "--tokens-file",
            file.to_str().unwrap(),
            "--salt",
            "tenant",
            "--block-size",
            "16",
        ])
        .await,
    );
    assert_eq!(dc_a(&from_file), Some(2));

    // Bad input: a clear message and a failure exit, nothing sent or nothing changed.
    let stderr = |out: &Output| String::from_utf8_lossy(&out.stderr).into_owned();
    let bad = query(&["--tokens", "1,x"]).await;
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("token id #2 `x` is not a u32"),
        "{}",
        stderr(&bad)
    );
    let wrong_size = query(&["--tokens", &list, "--block-size", "32"]).await;
    assert!(!wrong_size.status.success());
    assert!(
        stderr(&wrong_size).contains("block_size 32 differs from the indexer's block_size 16"),
        "{}",
        stderr(&wrong_size)
    );
    let missing = query(&["--tokens-file", "/nonexistent/tokens.txt"]).await;
    assert!(!missing.status.success());
    assert!(
        stderr(&missing).contains("cannot read --tokens-file"),
        "{}",
        stderr(&missing)
    );
    std::fs::write(&file, "1 2 three").unwrap();
    let garbled = query(&["--tokens-file", file.to_str().unwrap()]).await;
    assert!(!garbled.status.success());
    assert!(
        stderr(&garbled).contains("token id #3 `three`"),
        "{}",
        stderr(&garbled)
    );
    let still = json(&query(&["--tokens", &list, "--salt", "tenant"]).await);
    assert_eq!(dc_a(&still), Some(2));

    services.shutdown().await.unwrap();
}

/// `ckf ... | head`: a reader that closes standard output early ends the command quietly (exit
/// 0, nothing on stderr), not with a panic about printing.
#[test]
fn a_closed_standard_output_ends_a_command_quietly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ckf"))
        .args(["simulate", "--limit", "200"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run ckf");
    // Close the read end before the command writes (it simulates first).
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("ckf ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    assert!(stderr.is_empty(), "stderr: {stderr}");
}

/// A command that writes files finishes them whatever happens to standard output, and a
/// closed standard error keeps the exit code (no panic: 1 for an error, as always).
#[test]
fn closed_outputs_neither_cut_work_short_nor_change_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ckf"))
        .args(["certs", "--pools", "dc-a,dc-b", "--out"])
        .arg(dir.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run ckf");
    drop(child.stdout.take());
    assert_eq!(child.wait().unwrap().code(), Some(0));
    for file in ["ca.crt", "ca.key", "query.token", "dc-b.token"] {
        assert!(dir.path().join(file).exists(), "{file} missing");
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_ckf"))
        .args(["query", "--indexer", "http://127.0.0.1:1", "1"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run ckf");
    drop(child.stderr.take());
    assert_eq!(child.wait().unwrap().code(), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_catalog_plans_applies_and_reports_a_refusal() {
    use clap::Parser;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("admin.token");
    std::fs::write(&token, "admin.0123456789abcdef\n").unwrap();
    let config = dir.path().join("indexer.toml");
    let write = |extra: &str| {
        let text = format!(
            "listen = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:0\"\n\
             config_watch_interval_ms = 0\n\
             [manifest]\ndomain = \"llama\"\nlanes = [\"dc-a\"]\n\
             [auth]\nadmin_token_file = {token:?}\n{extra}"
        );
        std::fs::write(&config, text).unwrap();
    };
    write("");
    let source =
        indexer_svc::Cli::parse_from(["ckf-indexer", "--config", config.to_str().unwrap()]);
    let running = indexer_svc::serve_from(source, std::future::pending())
        .await
        .unwrap();
    let url = format!("http://{}", running.grpc_addr);
    let reload = |extra: &[&str]| {
        let mut list = vec![
            "reload-catalog",
            "--indexer",
            &url,
            "--admin-token-file",
            token.to_str().unwrap(),
        ];
        list.extend_from_slice(extra);
        ckf(args(&list))
    };

    write("[[domains]]\ndomain = \"qwen\"\nlanes = [\"dc-a\", \"dc-b\"]\n");
    let planned = reload(&["--dry-run"]).await;
    assert_exit(&planned, 0);
    let text = String::from_utf8_lossy(&planned.stdout);
    assert!(
        text.contains("dry run, nothing changed; a reload would apply"),
        "{text}"
    );
    assert!(text.contains("added: qwen"), "{text}");
    let lanes = ckf(args(&["lanes", "--indexer", &url, "--domain", "qwen"])).await;
    assert_exit(&lanes, 1);

    let applied = json(&reload(&["--json"]).await);
    assert_eq!(applied["applied"], true, "{applied}");
    assert_eq!(applied["domains_added"], serde_json::json!(["qwen"]));
    let lanes = json(
        &ckf(args(&[
            "lanes",
            "--indexer",
            &url,
            "--domain",
            "qwen",
            "--json",
        ]))
        .await,
    );
    assert_eq!(lanes["domain"], "qwen");
    assert_eq!(lanes["lanes"].as_array().unwrap().len(), 2);
    // Applied: a dry run has nothing left to do, and says so.
    let planned = reload(&["--dry-run"]).await;
    assert_exit(&planned, 0);
    let text = String::from_utf8_lossy(&planned.stdout);
    assert!(
        text.contains("a reload would add or remove no domain or lane"),
        "{text}"
    );

    // A refusal: exit 1, the indexer's reason on stderr, nothing changed.
    write("[[domains]]\ndomain = \"qwen\"\nlanes = [\"dc-a\", \"dc-b\"]\nblock_size = 32\n");
    let refused = reload(&[]).await;
    assert_exit(&refused, 1);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("domain qwen is served and its definition changed (block_size 16 -> 32)"),
        "{stderr}"
    );
    // The wrong token: refused before anything is read.
    let wrong = dir.path().join("wrong.token");
    std::fs::write(&wrong, "wrong.0123456789abcdef\n").unwrap();
    let out = ckf(args(&[
        "reload-catalog",
        "--indexer",
        &url,
        "--admin-token-file",
        wrong.to_str().unwrap(),
    ]))
    .await;
    assert_exit(&out, 1);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("ckf.v1.Admin"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    running.stop().await.unwrap();
}
