//! Bad trace input: `ckf replay` and `ckf demo` refuse it with an error naming the line and the
//! field, before connecting to anything (the endpoints below do not exist, so an error about
//! the trace proves nothing was sent).

use std::process::Command;

const GOOD: &str =
    r#"{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}"#;

fn run(args: &[&str], trace: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.jsonl");
    std::fs::write(&path, trace).unwrap();
    let mut full: Vec<&str> = args.to_vec();
    let path_str = path.to_str().unwrap();
    full.extend(["--trace", path_str]);
    let out = Command::new(env!("CARGO_BIN_EXE_ckf"))
        .args(&full)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const REPLAY: &[&str] = &[
    "replay",
    "--indexer",
    "http://127.0.0.1:1",
    "--producer",
    "dc-a=http://127.0.0.1:1",
];

#[test]
fn replay_names_line_and_field_and_sends_nothing() {
    let cases = [
        (
            format!("{GOOD}\n{GOOD}\n{{\"timestamp\": 1,\n"),
            "line 3: not a JSON object",
        ),
        (
            format!("{GOOD}\n{{\"timestamp\": 1, \"input_length\": 2, \"hash_ids\": [0]}}\n"),
            "line 2: missing field `output_length`",
        ),
        (
            format!(
                "{GOOD}\n{{\"timestamp\": 1, \"input_length\": -5, \"output_length\": 1, \"hash_ids\": [0]}}\n"
            ),
            "line 2: field `input_length` must be a non-negative integer, got -5",
        ),
        (
            format!(
                "{{\"timestamp\": \"soon\", \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [0]}}\n{GOOD}\n"
            ),
            "line 1: field `timestamp`",
        ),
        (
            format!(
                "{GOOD}\n{GOOD}\n{GOOD}\n{{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [0, -1]}}\n"
            ),
            "line 4: field `hash_ids[1]`",
        ),
        (String::new(), "line 1: trace is empty"),
    ];
    for (trace, expected) in cases {
        let (code, stderr) = run(REPLAY, &trace);
        assert_eq!(code, 1, "{stderr}");
        assert!(
            stderr.contains(expected),
            "stderr {stderr:?} lacks {expected:?}"
        );
        assert!(
            !stderr.contains("connect"),
            "failed on the trace, not the network: {stderr}"
        );
    }
}

#[test]
fn demo_refuses_a_bad_trace_before_starting_services() {
    let (code, stderr) = run(&["demo", "--json"], &format!("{GOOD}\nnot json\n"));
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("line 2: not a JSON object"), "{stderr}");
}

#[test]
fn a_missing_trace_file_is_named() {
    let out = Command::new(env!("CARGO_BIN_EXE_ckf"))
        .args(REPLAY)
        .args(["--trace", "/nonexistent/trace.jsonl"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/nonexistent/trace.jsonl"), "{stderr}");
}
