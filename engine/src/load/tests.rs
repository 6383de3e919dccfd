use super::*;

const VLLM: &str = include_str!("../../tests/fixtures/vllm_metrics.txt");
const SGLANG: &str = include_str!("../../tests/fixtures/sglang_metrics.txt");

#[test]
fn vllm_and_sglang_text_as_prometheus_client_writes_it() {
    // Two vLLM engine cores: 3 + 2 running, 4 + 1 waiting, usage 0.25 and 0.75.
    assert_eq!(
        read_load(EngineFamily::Vllm, VLLM),
        Ok(EngineLoad {
            running: 5,
            waiting: 5,
            kv_usage: 0.5
        })
    );
    // Two SGLang dp ranks: 5 + 1 running, 0 + 2 queued, usage 0.5 and 0.1.
    let load = read_load(EngineFamily::Sglang, SGLANG).expect("SGLang load");
    assert_eq!((load.running, load.waiting), (6, 2));
    assert!((load.kv_usage - 0.3).abs() < 1e-12, "{load:?}");
}

#[test]
fn the_other_familys_text_is_missing_its_metrics() {
    assert_eq!(
        read_load(EngineFamily::Sglang, VLLM),
        Err(LoadError::Missing("sglang:num_running_reqs"))
    );
    assert_eq!(
        read_load(EngineFamily::Vllm, "# TYPE up gauge\nup 1\n"),
        Err(LoadError::Missing("vllm:num_requests_running"))
    );
    assert!(read_load(EngineFamily::Vllm, "").is_err(), "an empty body");
}

#[test]
fn a_bad_value_or_bad_text_leaves_the_load_unknown() {
    let negative = VLLM.replace(
        "vllm:num_requests_waiting{engine=\"1\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 1.0",
        "vllm:num_requests_waiting{engine=\"1\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} -1.0",
    );
    assert_ne!(negative, VLLM, "the fixture holds that line");
    let err = read_load(EngineFamily::Vllm, &negative).unwrap_err();
    assert_eq!(err.label(), "value", "{err}");
    let nan = VLLM.replace(" 0.75\n", " NaN\n");
    assert_eq!(
        read_load(EngineFamily::Vllm, &nan).unwrap_err().label(),
        "value"
    );
    let garbage = "vllm:num_requests_running{engine=\"0\" 3\n<html>502 Bad Gateway</html>\n";
    let err = read_load(EngineFamily::Vllm, garbage).unwrap_err();
    assert!(matches!(err.label(), "parse" | "missing"), "{err}");
}

#[test]
fn a_parse_error_shows_only_the_start_of_a_huge_line() {
    let body = format!("vllm:num_requests_running{{{}", "a".repeat(100_000));
    let err = read_load(EngineFamily::Vllm, &body).unwrap_err();
    assert!(
        err.to_string().len() < 400,
        "{} bytes",
        err.to_string().len()
    );
}
