//! Malformed input from an engine publisher socket. Beside a well-behaved vLLM publisher (worker 7,
//! the real `ZmqEventPublisher`), a raw pyzmq PUB (worker 9) sends truncated msgpack, wrong
//! types, a sequence frame of the wrong size, a 100 MB frame and a flood of 100k unknown event
//! types, then one valid store. The producer keeps running, counts what it refused, and both
//! members stay exact: worker 7's blocks are untouched, worker 9 holds only its valid store.

use ckf_e2e::cluster::{Indexer, IndexerSpec, Producer, ProducerSpec, TestDir, is_active};
use ckf_e2e::engines::{Driver, EngineSpec, engine_python, engines_dir, free_port_run, run_steps};
use ckf_e2e::metrics;
use ckf_e2e::wait::{DEADLINE, eventually};

const BLOCK_SIZE: u32 = 4;
const GOOD: u64 = 7;
const BAD: u64 = 9;

/// Frames, payloads or events refused, by `publisher` ("worker/rank") and `kind`.
const DECODE_ERRORS: &str = "ckf_producer_engine_decode_errors_total";
/// Decoded events, by `publisher` and `type` (`unknown` for types the producer does not know).
const EVENTS: &str = "ckf_producer_engine_events_total";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_are_counted_and_touch_no_other_member() {
    let Some(python) = engine_python() else {
        return;
    };
    let dir = TestDir::new("engines-malformed");
    let indexer = Indexer::start(
        &dir,
        &IndexerSpec {
            lanes: vec!["dc-a".into()],
            block_size: Some(BLOCK_SIZE),
            ..IndexerSpec::default()
        },
    );
    let good = EngineSpec::new(GOOD, 1);
    let bad = EngineSpec {
        worker_id: BAD,
        port: free_port_run(1),
        replay_port: None,
        dp_size: 1,
        producer_binds: false,
    };
    let spec = ProducerSpec {
        block_size: Some(BLOCK_SIZE),
        engines: vec![good.flag(), bad.flag()],
        ..ProducerSpec::new("dc-a")
    };
    let mut producer = Producer::start(&dir, "producer-a", &spec, &[indexer.url()]);
    indexer.wait_lane("dc-a", "active", is_active).await;

    let out = dir.path().join("malformed-model.json");
    let log = dir.path().join("driver.log");
    let stderr = std::fs::File::create(&log).expect("create driver.log");
    let mut args = vec![
        engines_dir().join("drive.py").display().to_string(),
        "malformed".into(),
        "--endpoint".into(),
        good.endpoint(),
        "--worker-id".into(),
        GOOD.to_string(),
        "--bad-endpoint".into(),
        bad.endpoint(),
        "--bad-worker".into(),
        BAD.to_string(),
        "--block-size".into(),
        BLOCK_SIZE.to_string(),
        "--out".into(),
        out.display().to_string(),
    ];
    if let Some(replay) = good.replay_endpoint() {
        args.extend(["--replay".into(), replay]);
    }
    let mut driver = Driver::spawn_args(&python, &args, out, log, stderr);
    let model = run_steps(&mut driver, producer.addr, indexer.addr, "dc-a").await;
    assert_eq!(model.members.len(), 2, "{model:?}");

    // Still serving, and what it refused is counted against the bad publisher only.
    producer.stats().await.expect("the producer still answers");
    let bad_publisher = format!("{BAD}/0");
    let good_publisher = format!("{GOOD}/0");
    eventually(
        "decode errors and unknown events counted",
        DEADLINE,
        || async {
            let text = producer.metrics()?;
            let errors = metrics::value(&text, DECODE_ERRORS, &[("publisher", &bad_publisher)])
                .unwrap_or(0.0);
            let unknown = metrics::value(
                &text,
                EVENTS,
                &[("publisher", &bad_publisher), ("type", "unknown")],
            )
            .unwrap_or(0.0);
            let good_errors =
                metrics::value(&text, DECODE_ERRORS, &[("publisher", &good_publisher)])
                    .unwrap_or(0.0);
            // At least the 7 payloads no decoder can read as a batch (2 truncated, an invalid
            // byte, a string, an int, a non-list `events`, a map of wrong types) and the frame over
            // the size limit; the wrong-typed events inside well-formed batches may be counted as
            // skipped events instead, and the short sequence frame as a frame error.
            if errors >= 8.0 && unknown >= 100_000.0 && good_errors == 0.0 {
                Ok(())
            } else {
                Err(format!(
                    "bad worker: {errors} decode errors, {unknown} unknown events; good worker: \
                 {good_errors} decode errors"
                ))
            }
        },
    )
    .await;
    let status = producer.terminate();
    assert!(status.success(), "the producer exited with {status:?}");
}
