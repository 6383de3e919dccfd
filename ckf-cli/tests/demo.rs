//! `ckf demo` through the built binary: starts its services, replays the built-in synthetic
//! workload, prints a complete report and exits 0.

use std::process::Command;

fn demo(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ckf"))
        .arg("demo")
        .args(args)
        .output()
        .expect("run ckf");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn demo_json_report_is_complete() {
    let (code, stdout, stderr) = demo(&["--json", "--limit", "1500"]);
    assert_eq!(code, 0, "stderr: {stderr}");
    let report: serde_json::Value =
        serde_json::from_str(&stdout).expect("stdout is the JSON report");
    let n = |path: &str| {
        report
            .pointer(path)
            .and_then(serde_json::Value::as_f64)
            .unwrap_or_else(|| panic!("report lacks {path}: {stdout}"))
    };
    assert_eq!(report["workload"]["source"], "synthetic");
    assert_eq!(n("/workload/requests"), 1500.0);
    assert_eq!(n("/fleet/dcs"), 3.0);
    assert_eq!(n("/throughput/queries"), 1500.0);
    for path in [
        "/throughput/events_per_s",
        "/throughput/blocks_per_s",
        "/throughput/queries_per_s",
        "/query_latency_us/p50",
        "/query_latency_us/p99",
        "/query_latency_us/max",
        "/visibility_lag_ms/p50",
        "/visibility_lag_ms/p99",
        "/cost/producer_exact_state_bytes_per_block",
        "/cost/consumer_table_bytes_per_block_per_lane",
        "/cost/wire_bytes_per_event",
        "/cost/relay_wire_bytes_per_event",
    ] {
        assert!(n(path) > 0.0, "{path} is {}", n(path));
    }
    assert_eq!(n("/accuracy/under_estimates/unexplained"), 0.0);
    assert_eq!(n("/final_check/accuracy/under_estimates/unexplained"), 0.0);
    assert_eq!(report["final_check"]["settled"], true);
    let routing = report["routing"].as_array().unwrap();
    let policies: Vec<&str> = routing
        .iter()
        .map(|r| r["policy"].as_str().unwrap())
        .collect();
    assert_eq!(
        policies,
        [
            "deepest-prefix",
            "random",
            "round-robin",
            "least-loaded",
            "deepest-prefix",
            "expected-ttft"
        ]
    );
    let rate = |i: usize| routing[i]["hit_rate"].as_f64().unwrap();
    assert!(
        rate(0) > rate(1),
        "deepest-prefix through the indexer beats random: {routing:?}"
    );
    // The serving model's comparison: every policy with its times to first token.
    let serving = report["serving"]["policies"].as_array().unwrap();
    assert_eq!(serving.len(), 5);
    for p in serving {
        let ttft = &p["ttft_ms"];
        let at = |q: &str| ttft[q].as_f64().unwrap();
        assert!(
            at("p50") > 0.0 && at("p50") <= at("p90") && at("p90") <= at("p99"),
            "{p}"
        );
        let shares: f64 = p["dcs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["share"].as_f64().unwrap())
            .sum();
        assert!((shares - 1.0).abs() < 1e-9, "{p}");
    }
    // The live run's own choices, served on the same model, unpaced (it reads no load).
    let live = &report["live_serving"];
    assert_eq!(live["paced"], false, "{live}");
    assert_eq!(live["route_answers"], 0, "{live}");
    assert_eq!(live["serving"]["ttft_ms"]["count"], 1500, "{live}");
    assert_eq!(live["serving"]["hit_rate"], routing[0], "{live}");
    assert!(
        stderr.is_empty() || !stderr.contains("replay ["),
        "no progress bar under --json"
    );
}

#[test]
fn demo_routes_by_the_indexers_route_on_the_load_its_producers_scrape() {
    let (code, stdout, stderr) = demo(&["--json", "--limit", "400", "--policy", "expected-ttft"]);
    assert_eq!(code, 0, "stderr: {stderr}");
    let report: serde_json::Value =
        serde_json::from_str(&stdout).expect("stdout is the JSON report");
    let live = &report["live_serving"];
    let n = |v: &serde_json::Value| v.as_f64().unwrap_or_else(|| panic!("{live}"));
    // Every request went through Route, on the workload's clock.
    assert_eq!(live["paced"], true, "{live}");
    assert_eq!(n(&live["route_answers"]), 400.0, "{live}");
    assert_eq!(n(&live["serving"]["ttft_ms"]["count"]), 400.0, "{live}");
    assert_eq!(live["serving"]["hit_rate"], report["routing"][0], "{live}");
    // The load Route used came from the producers scraping the simulated engines (the run
    // starts once every DC's is known; a scrape that timed out would make one unknown).
    assert!(
        n(&live["load_known"]) >= 0.9 * 400.0,
        "load known in too few answers: {live}"
    );
    // Routing on that load cut the tail that deepest-prefix's queues make on the same model.
    let offline = |policy: &str| {
        report["serving"]["policies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["policy"] == policy)
            .map(|p| n(&p["ttft_ms"]["p99"]))
            .unwrap()
    };
    let live_p99 = n(&live["serving"]["ttft_ms"]["p99"]);
    assert!(
        live_p99 < offline("deepest-prefix"),
        "live expected-ttft p99 {live_p99} ms vs deepest-prefix {} ms: {live}",
        offline("deepest-prefix")
    );
    // Refused before anything starts: no engines to scrape without the zmq feed, a capacity
    // the demo's units would round away, no request at all.
    for (flags, says) in [
        (&["--feed", "grpc"][..], "needs --feed zmq"),
        (
            &["--dc-prefill-tokens-per-s", "64000,100,64000"][..],
            "for DC 2: with --policy expected-ttft",
        ),
        (
            &["--limit", "0"][..],
            "--limit 0: replay at least one request",
        ),
    ] {
        let mut all = vec!["--policy", "expected-ttft"];
        all.extend_from_slice(flags);
        let (code, _, stderr) = demo(&all);
        assert_eq!(code, 1, "{flags:?}: {stderr}");
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
    }
}

#[test]
fn demo_text_report_has_every_section() {
    let (code, stdout, stderr) = demo(&["--limit", "300", "--dcs", "2", "--policy", "round-robin"]);
    assert_eq!(code, 0, "stderr: {stderr}");
    for section in [
        "ckf replay report: synthetic (300 requests",
        "fleet: 2 DCs x 2 workers x 2 ranks",
        "policy round-robin",
        "throughput",
        "query latency",
        "event-to-visible lag",
        "accuracy during replay",
        "accuracy after final drain (settled)",
        "routing: prefix-cache hit rate",
        "serving model: per DC (prefill, round trip)",
        "expected-ttft",
        "cost",
        "dc-a",
        "dc-b",
    ] {
        assert!(
            stdout.contains(section),
            "text report lacks {section:?}:\n{stdout}"
        );
    }
    assert!(stdout.contains("0 unexplained"), "{stdout}");
}
