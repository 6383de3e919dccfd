//! A producer restart does not blind its DC to its engines. The journal keeps, per engine
//! publisher socket, the sequence and identity of the last batch applied; a restarted
//! producer's first connection verifies that batch against the engine's replay buffer and fills
//! what the engine published while the producer was down from it. An engine that restarted
//! meanwhile fails the verification (or goes backwards): the restored members are cleared and
//! the new process's buffer is re-read.
//!
//! The engines are the real vLLM 0.33.0 and SGLang 0.5.23 publishers driven by
//! `tests/engines/drive.py` (see `engines_real_publishers.rs`); the producer is a real
//! `ckf-producer` with `[durability] data_dir`, killed with SIGKILL and started again on the
//! same directory when the driver pauses for it.

use std::time::Duration;

use ckf_e2e::cluster::{Indexer, IndexerSpec, Producer, ProducerSpec, TestDir, is_active};
use ckf_e2e::engines::{
    Driver, EngineSpec, Expect, Step, engine_python, wait_members, wait_queries,
};
use ckf_e2e::metrics;
use ckf_e2e::wait::{DEADLINE, eventually};

/// Tokens per KV block.
const BLOCK_SIZE: u32 = 4;
/// The engine's worker id.
const WORKER: u64 = 7;
/// The producer's group-commit window; a kill waits ten of them first.
const COMMIT_MS: u64 = 20;
/// The lane of the producer's DC.
const DC: &str = "dc-a";

const BATCHES: &str = "ckf_producer_engine_batches_total";
const REPLAYED: &str = "ckf_producer_engine_replayed_batches_total";
const REPLAYS: &str = "ckf_producer_engine_replays_total";
const CLEARED: &str = "ckf_producer_engine_members_cleared_total";
const UNCERTAIN: &str = "ckf_producer_engine_uncertain_total";
const RESUMING: &str = "resuming engine publisher after restored sequence";

/// An indexer (lane `DC`), a producer with `[durability] data_dir` configured with one vLLM-
/// or SGLang-flavoured engine, and `drive.py` running `scenario` for it.
struct Cluster {
    dir: TestDir,
    indexer: Indexer,
    producer: Producer,
    driver: Driver,
}

async fn cluster(python: &std::path::Path, scenario: &str) -> Cluster {
    let dir = TestDir::new(&format!("engines-durability-{scenario}"));
    let indexer = Indexer::start(
        &dir,
        &IndexerSpec {
            lanes: vec![DC.into()],
            block_size: Some(BLOCK_SIZE),
            ..IndexerSpec::default()
        },
    );
    let engine = EngineSpec::new(WORKER, 1);
    let state = dir.path().join("producer-state");
    let spec = ProducerSpec {
        block_size: Some(BLOCK_SIZE),
        engines: vec![engine.flag()],
        extra_toml: format!(
            "[durability]\ndata_dir = \"{}\"\ncommit_interval_ms = {COMMIT_MS}\n",
            state.display()
        ),
        ..ProducerSpec::new(DC)
    };
    let producer = Producer::start(&dir, "producer-a", &spec, &[indexer.url()]);
    indexer.wait_lane(DC, "active", is_active).await;
    let driver = Driver::spawn(python, &dir, scenario, &engine, BLOCK_SIZE);
    Cluster {
        dir,
        indexer,
        producer,
        driver,
    }
}

/// A finished scenario: the producer (still running) and the final model.
struct Outcome {
    producer: Producer,
    model: Expect,
    _indexer: Indexer,
    _dir: TestDir,
}

/// A counter of the engine's rank-0 publisher with extra `labels` (0 when absent).
fn counter(producer: &Producer, name: &str, labels: &[(&str, &str)]) -> f64 {
    let text = producer.metrics().unwrap_or_default();
    let publisher = format!("{WORKER}/0");
    let mut all = vec![("publisher", publisher.as_str())];
    all.extend_from_slice(labels);
    metrics::value(&text, name, &all).unwrap_or(0.0)
}

/// Runs `scenario` of `drive.py` against an indexer and a durable producer, checking every
/// step like `run_steps`; on `PAUSE kill` it waits until the producer has received
/// `batches_before_kill` live batches and ten commit windows, then kills it with SIGKILL; on
/// `PAUSE restart` it starts it again on the same data directory and checks that its recovery
/// restored as many ownership edges as the last model checked holds and that it logged its
/// resumed sequence. `None` when the real-engine tests are skipped.
async fn run(scenario: &str, batches_before_kill: f64) -> Option<Outcome> {
    let python = engine_python()?;
    let Cluster {
        dir,
        indexer,
        mut producer,
        mut driver,
    } = cluster(&python, scenario).await;
    let mut checked: Option<Expect> = None;
    let mut index = 0;
    loop {
        index += 1;
        let what = format!("{scenario} step {index}");
        match driver.next_step().await {
            Step::Ready(expect) => wait_members(producer.addr, &what, &expect).await,
            Step::Check(expect) | Step::Catchup(expect) => {
                wait_members(producer.addr, &what, &expect).await;
                wait_queries(indexer.addr, DC, &what, &expect).await;
                checked = Some(expect);
            }
            Step::Emptied(expect) => wait_members(producer.addr, &what, &expect).await,
            Step::Pause(name) if name == "kill" => {
                eventually(&format!("{what}: batches received"), DEADLINE, || {
                    let n = counter(&producer, BATCHES, &[]);
                    async move {
                        if n >= batches_before_kill {
                            Ok(())
                        } else {
                            Err(format!("{n} < {batches_before_kill}"))
                        }
                    }
                })
                .await;
                // The batches are counted on receipt, before the state actor applies and
                // journals them, and a kill -9 loses what is still queued in the process
                // (journal/src/writer.rs). No metric says that queue is empty (the journal's
                // `queued_bytes` is not exported), so ten commit windows stand in for it.
                tokio::time::sleep(Duration::from_millis(10 * COMMIT_MS)).await;
                producer.kill9();
            }
            Step::Pause(name) if name == "restart" => {
                assert!(
                    producer.log_records(RESUMING).is_empty(),
                    "{what}: the first start resumed nothing"
                );
                producer.restart();
                // The state is rebuilt from the journal before the listeners bind; the
                // recovery's own gauge counts what it restored (the members themselves may
                // already hold the downtime too: the catch-up replays it at once). The later
                // steps check every member's blocks exactly.
                let expect = checked.as_ref().expect("a CHECK before the restart");
                let restored: usize = expect.members.iter().map(|m| m.canonical.len()).sum();
                let text = producer.metrics().unwrap_or_default();
                assert_eq!(
                    metrics::value(&text, "ckf_producer_recovered_edges", &[]),
                    Some(restored as f64),
                    "{what}: the ownership restored from the journal"
                );
                eventually(&format!("{what}: resumed log line"), DEADLINE, || {
                    let n = producer.log_records(RESUMING).len();
                    async move {
                        if n == 1 {
                            Ok(())
                        } else {
                            Err(format!("{n} {RESUMING:?} records"))
                        }
                    }
                })
                .await;
            }
            Step::Pause(name) => panic!("{what}: unknown PAUSE {name:?}"),
            Step::Done => break,
        }
        driver.go();
    }
    let model = driver.model();
    wait_members(producer.addr, &format!("{scenario} final"), &model).await;
    wait_queries(indexer.addr, DC, &format!("{scenario} final"), &model).await;
    driver.go();
    driver.wait_success();
    Some(Outcome {
        producer,
        model,
        _indexer: indexer,
        _dir: dir,
    })
}

/// The engine stores A; the producer is killed; the engine stores B and evicts one of A's
/// blocks (kept only in its replay buffer); the restarted producer holds A at once, then A
/// without that block, B and C once the engine stores C: the downtime came from the replay
/// socket (batches counted as replayed, one replay filled, nothing cleared), and the indexer
/// lane answers for all of it.
async fn downtime_filled_by_the_replay(scenario: &str) {
    let Some(out) = run(scenario, 2.0).await else {
        return;
    };
    let p = &out.producer;
    let member = &out.model.members[0];
    assert_eq!(
        member.canonical.len(),
        5 + 3 + 3,
        "A - 1 + B + C: {:?}",
        member.canonical
    );
    let replayed = counter(p, REPLAYED, &[]);
    assert!(
        replayed >= 2.0,
        "{scenario}: B and the eviction come from the replay socket, {replayed} replayed"
    );
    assert_eq!(
        counter(p, REPLAYS, &[("outcome", "filled")]),
        1.0,
        "{scenario}"
    );
    assert_eq!(
        counter(p, REPLAYS, &[("outcome", "failed")]),
        0.0,
        "{scenario}"
    );
    assert_eq!(counter(p, CLEARED, &[]), 0.0, "{scenario}: nothing cleared");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_downtime_is_filled_from_the_replay_socket() {
    downtime_filled_by_the_replay("resume_replay").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_downtime_is_filled_from_the_replay_socket() {
    downtime_filled_by_the_replay("sglang_resume_replay").await;
}

/// The engine stores A; the producer is killed; the engine stores B and evicts one of A's
/// blocks, then stays idle: the restarted producer verifies its restored sequence through the
/// replay socket at its first connection and holds A without that block and B, with no live
/// batch after its restart.
async fn an_idle_engines_downtime_is_caught_up(scenario: &str) {
    let Some(out) = run(scenario, 2.0).await else {
        return;
    };
    let p = &out.producer;
    assert_eq!(
        out.model.members[0].canonical.len(),
        5 + 3,
        "A - 1 + B: {:?}",
        out.model.members[0].canonical
    );
    assert!(
        counter(p, REPLAYED, &[]) >= 2.0,
        "{scenario}: B and the eviction come from the replay socket"
    );
    assert_eq!(
        counter(p, REPLAYS, &[("outcome", "filled")]),
        1.0,
        "{scenario}"
    );
    assert_eq!(counter(p, CLEARED, &[]), 0.0, "{scenario}: nothing cleared");
    assert_eq!(
        counter(p, UNCERTAIN, &[("cause", "restored")]),
        1.0,
        "{scenario}: the restored sequence checked once"
    );
    assert_eq!(
        counter(p, REPLAYS, &[("outcome", "verified")]),
        1.0,
        "{scenario}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_idle_engine_downtime_is_caught_up_at_restart() {
    an_idle_engines_downtime_is_caught_up("resume_idle").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_idle_engine_downtime_is_caught_up_at_restart() {
    an_idle_engines_downtime_is_caught_up("sglang_resume_idle").await;
}

/// The engine stores A and B and sends 300 heartbeats; the producer is killed; the engine
/// restarts (a new publisher, sequence from 0, empty cache); the restarted producer restores A
/// and B, and its first connection finds the new process (its replay buffer does not hold the
/// restored sequence, or its first batch goes backwards): A and B are cleared once
/// (`unverified` or `restart`), and the producer then holds only C, which the new engine
/// stores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_engine_restarted_while_the_producer_was_down_is_cleared() {
    let Some(out) = run("resume_engine_restart", 300.0).await else {
        return;
    };
    let p = &out.producer;
    assert_eq!(
        counter(p, CLEARED, &[]),
        1.0,
        "the restored members cleared once"
    );
    assert_eq!(counter(p, CLEARED, &[("reason", "gap")]), 0.0);
    assert_eq!(counter(p, UNCERTAIN, &[("cause", "restored")]), 1.0);
    assert_eq!(
        counter(p, REPLAYS, &[("outcome", "verified")]),
        0.0,
        "the old sequence cannot be verified against the new process"
    );
    assert_eq!(out.model.members[0].canonical.len(), 3, "C only");
}

/// The engine keeps storing (and evicting) a request every 50 ms while the producer is killed
/// with SIGKILL and started again on its journal; with `restart_engine` the engine also
/// restarts while the producer is down. Afterwards the producer holds exactly what the engine
/// holds: what the journal lost is verified and filled (or, after an engine restart, cleared
/// and re-read) from the engine's replay buffer.
async fn churn_through_a_kill(scenario: &str, restart_engine: bool) {
    let Some(python) = engine_python() else {
        return;
    };
    let Cluster {
        dir: _dir,
        indexer,
        mut producer,
        mut driver,
    } = cluster(&python, scenario).await;
    let mut index = 0;
    loop {
        index += 1;
        let what = format!("{scenario} step {index}");
        match driver.next_step().await {
            Step::Ready(expect) => wait_members(producer.addr, &what, &expect).await,
            Step::Check(expect) => {
                wait_members(producer.addr, &what, &expect).await;
                wait_queries(indexer.addr, DC, &what, &expect).await;
            }
            // The engine keeps publishing through both pauses.
            Step::Pause(name) if name == "kill" => {
                tokio::time::sleep(Duration::from_millis(300)).await;
                producer.kill9();
            }
            Step::Pause(name) if name == "restart" => {
                tokio::time::sleep(Duration::from_millis(300)).await;
                producer.restart();
            }
            Step::Done => break,
            other => panic!("{what}: unexpected step {other:?}"),
        }
        driver.go();
    }
    let model = driver.model();
    wait_members(producer.addr, &format!("{scenario} final"), &model).await;
    driver.go();
    driver.wait_success();
    let cleared = counter(&producer, CLEARED, &[]);
    if restart_engine {
        assert!(cleared >= 1.0, "{scenario}: the restored members cleared");
    } else {
        assert_eq!(cleared, 0.0, "{scenario}: nothing cleared");
        assert!(counter(&producer, REPLAYS, &[("outcome", "verified")]) >= 1.0);
    }
    assert_eq!(counter(&producer, UNCERTAIN, &[("cause", "restored")]), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_churn_through_a_producer_kill() {
    churn_through_a_kill("churn_kill", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_churn_through_a_producer_kill_and_an_engine_restart() {
    churn_through_a_kill("churn_kill_engine_restart", true).await;
}
