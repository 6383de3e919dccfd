//! The real engines' publishers as test peers: `tests/engines/drive.py` (run with the venv of
//! `scripts/engine-venv.sh`, named by `CKF_ENGINE_PYTHON`) publishes scenarios through vLLM's
//! and SGLang's own `ZmqEventPublisher` and reports, step by step, the exact model of the
//! engine caches it produced; this module runs it and checks a producer and an indexer against
//! each step.
//!
//! The step protocol (one line per step on the driver's stdout, `go` back on its stdin once the
//! test is satisfied): `READY {..}` (warm-up: each member holds exactly its probe block),
//! `CHECK {..}` (the producer holds exactly this; the token queries answer these depths),
//! `EMPTIED {..}` (the producer cleared these members on its own), `CATCHUP {..}` (as `CHECK`,
//! with the driver sending heartbeats meanwhile), `PAUSE {name}` (the test acts on the
//! producer: `kill`, `restart`), `DONE` (the final model is in the `--out` file; the publishers
//! stay up until the test has checked it).

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

use ckf_proto::v1::{self, ingest_client::IngestClient, query_client::QueryClient};
use serde::Deserialize;
use tokio::sync::mpsc;

use crate::cluster::{DOMAIN, TestDir, channel};
use crate::wait::{DEADLINE, eventually};

/// Environment variable naming the python of the engine venv.
pub const PYTHON_ENV: &str = "CKF_ENGINE_PYTHON";
/// Set to `1` to skip the real-engine tests (they then pass without running).
pub const SKIP_ENV: &str = "CKF_SKIP_ENGINE_TESTS";

/// The engine venv's python, or `None` when the tests are skipped on purpose.
///
/// # Panics
/// When neither [`PYTHON_ENV`] nor [`SKIP_ENV`]`=1` is set, saying how to set the venv up.
pub fn engine_python() -> Option<PathBuf> {
    if std::env::var(SKIP_ENV).is_ok_and(|v| v == "1") {
        eprintln!("{SKIP_ENV}=1: real-engine test skipped");
        return None;
    }
    let python = std::env::var_os(PYTHON_ENV).unwrap_or_else(|| {
        panic!(
            "{PYTHON_ENV} is not set: run scripts/engine-venv.sh and export {PYTHON_ENV} to the \
             python it prints (scripts/test.sh does both), or set {SKIP_ENV}=1 to skip"
        )
    });
    let python = PathBuf::from(python);
    assert!(
        python.exists(),
        "{PYTHON_ENV}={} does not exist: run scripts/engine-venv.sh",
        python.display()
    );
    Some(python)
}

/// The repository's `tests/engines/` directory.
pub fn engines_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("engines")
}

/// Where engine ports are taken from: below Linux's ephemeral range (32768..=60999 by
/// default), so no outgoing connection of this or a parallel test (gRPC clients, the producer's
/// SUB and Relay connections) can take a port between our check and the engine's bind, which is
/// what an ephemeral `bind(0)` probe allowed (seen in CI: `Address already in use`).
pub const ENGINE_PORTS: std::ops::Range<u32> = 20_000..32_000;

/// A base port `p` with `p .. p + count` all free on 127.0.0.1 now (held while checking,
/// released on return): an engine's rank `r` publishes on `p + r`, its replay socket on
/// `p + dp_size + r`. Runs are spread over [`ENGINE_PORTS`] by process id and a per-process
/// counter, so parallel tests and test binaries start at different places.
///
/// # Panics
/// When no such run is found after many tries.
pub fn free_port_run(count: u16) -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let span = ENGINE_PORTS.end - ENGINE_PORTS.start;
    let stride = u32::from(count).max(1) + 1;
    for _ in 0..400 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let offset = (std::process::id().wrapping_mul(7919) + n * stride) % span;
        let Ok(base) = u16::try_from(ENGINE_PORTS.start + offset) else {
            continue;
        };
        if u32::from(base) + u32::from(count) > ENGINE_PORTS.end {
            continue;
        }
        let held: Option<Vec<TcpListener>> = (0..count)
            .map(|i| TcpListener::bind(("127.0.0.1", base + i)).ok())
            .collect();
        if held.is_some() {
            return base;
        }
    }
    panic!("no run of {count} free loopback ports in {ENGINE_PORTS:?}");
}

/// One engine as the producer's `--engine` flag and the driver's arguments name it.
#[derive(Debug, Clone)]
pub struct EngineSpec {
    /// The producer's worker id for it.
    pub worker_id: u64,
    /// Rank 0's PUB port (rank r: `port + r`).
    pub port: u16,
    /// Rank 0's replay (ROUTER) port, if it has one.
    pub replay_port: Option<u16>,
    /// Data-parallel ranks.
    pub dp_size: u16,
    /// The producer binds its SUB sockets (`mode=bind`) and the engine connects.
    pub producer_binds: bool,
}

impl EngineSpec {
    /// An engine of `dp_size` ranks on free loopback ports, with a replay socket.
    pub fn new(worker_id: u64, dp_size: u16) -> Self {
        let port = free_port_run(2 * dp_size);
        Self {
            worker_id,
            port,
            replay_port: Some(port + dp_size),
            dp_size,
            producer_binds: false,
        }
    }

    /// The PUB endpoint of rank 0.
    pub fn endpoint(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.port)
    }

    /// The replay endpoint of rank 0.
    pub fn replay_endpoint(&self) -> Option<String> {
        self.replay_port.map(|p| format!("tcp://127.0.0.1:{p}"))
    }

    /// The producer's `--engine` value.
    pub fn flag(&self) -> String {
        let mut flag = format!(
            "worker_id={},endpoint={},dp_size={}",
            self.worker_id,
            self.endpoint(),
            self.dp_size
        );
        if let Some(replay) = self.replay_endpoint() {
            flag.push_str(&format!(",replay_endpoint={replay}"));
        }
        if self.producer_binds {
            flag.push_str(",mode=bind");
        }
        flag
    }
}

/// A member's exact expected content (canonical hashes, sorted).
#[derive(Debug, Clone, Deserialize)]
pub struct MemberExpect {
    /// Worker id.
    pub worker_id: u64,
    /// Data-parallel rank.
    pub dp_rank: u32,
    /// Canonical block hashes it holds, ascending.
    pub canonical: Vec<u64>,
}

/// A multimodal item of a token query.
#[derive(Debug, Clone, Deserialize)]
pub struct MultimodalExpect {
    /// The item's identifier.
    pub identifier: String,
    /// First token position.
    pub offset: u64,
    /// Token positions it occupies.
    pub length: u64,
}

/// A token query and the depth the model expects for the engines' lane.
#[derive(Debug, Clone, Deserialize)]
pub struct QueryExpect {
    /// What the query is (for messages).
    pub name: String,
    /// Token ids.
    pub token_ids: Vec<u32>,
    /// LoRA name ("" = none).
    pub lora_name: String,
    /// Cache salt ("" = none).
    pub cache_salt: String,
    /// Multimodal items.
    #[serde(default)]
    pub multimodal: Vec<MultimodalExpect>,
    /// Leading blocks the pool holds.
    pub expected_depth: u32,
}

/// One step's (or the final) model.
#[derive(Debug, Clone, Deserialize)]
pub struct Expect {
    /// Every member of the engine.
    pub members: Vec<MemberExpect>,
    /// Token queries (none at warm-up).
    #[serde(default)]
    pub queries: Vec<QueryExpect>,
}

/// A step the driver asks the test to confirm.
#[derive(Debug, Clone)]
pub enum Step {
    /// Warm-up: every member holds exactly its probe.
    Ready(Expect),
    /// The producer holds exactly this, the queries answer these depths.
    Check(Expect),
    /// The producer cleared these members on its own (restart, unfilled gap).
    Emptied(Expect),
    /// As [`Step::Check`], while the driver sends heartbeats: a producer that was down
    /// learns from a live batch what it missed.
    Catchup(Expect),
    /// The driver waits while the test acts on the producer (`kill`, `restart`).
    Pause(String),
    /// Finished; the final model is in the out file (publishers up until `go`).
    Done,
}

/// A running `drive.py`; killed when dropped.
pub struct Driver {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::UnboundedReceiver<String>,
    /// The final model's path.
    pub out: PathBuf,
    log: PathBuf,
}

impl Driver {
    /// Starts `drive.py scenario` for `engine` with `block_size`; its stderr goes to
    /// `driver.log` in the test dir (printed when the test fails).
    ///
    /// # Panics
    /// When it cannot be started.
    pub fn spawn(
        python: &Path,
        dir: &TestDir,
        scenario: &str,
        engine: &EngineSpec,
        block_size: u32,
    ) -> Self {
        let out = dir.path().join(format!("{scenario}-model.json"));
        let log = dir.path().join("driver.log");
        let stderr = std::fs::File::create(&log).expect("create driver.log");
        let mut args = vec![
            engines_dir().join("drive.py").display().to_string(),
            scenario.to_owned(),
            "--endpoint".into(),
            engine.endpoint(),
            "--dp-size".into(),
            engine.dp_size.to_string(),
            "--worker-id".into(),
            engine.worker_id.to_string(),
            "--block-size".into(),
            block_size.to_string(),
            "--out".into(),
            out.display().to_string(),
        ];
        if let Some(replay) = engine.replay_endpoint() {
            args.extend(["--replay".into(), replay]);
        }
        Self::spawn_args(python, &args, out, log, stderr)
    }

    /// Starts `python args...` with the step protocol on its stdio.
    ///
    /// # Panics
    /// When it cannot be started.
    pub fn spawn_args(
        python: &Path,
        args: &[String],
        out: PathBuf,
        log: PathBuf,
        stderr: std::fs::File,
    ) -> Self {
        let mut command = Command::new(python);
        // SAFETY: runs in the forked child before exec and only calls prctl(2) (async-signal
        // safe): the driver dies with the test thread that started it.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", python.display()));
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            stdin,
            lines,
            out,
            log,
        }
    }

    /// The driver's next step (bounded wait).
    ///
    /// # Panics
    /// When the driver exits, prints something else, or says nothing within the deadline.
    pub async fn next_step(&mut self) -> Step {
        let line = tokio::time::timeout(2 * DEADLINE, self.lines.recv())
            .await
            .unwrap_or_else(|_| panic!("drive.py said nothing for {:?}", 2 * DEADLINE));
        let Some(line) = line else {
            let status = self.child.wait().ok();
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            panic!("drive.py exited ({status:?}) before DONE:\n{log}");
        };
        let (kind, body) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        let parse = || -> Expect {
            serde_json::from_str(body).unwrap_or_else(|e| panic!("drive.py {kind}: {e}: {body}"))
        };
        match kind {
            "READY" => Step::Ready(parse()),
            "CHECK" => Step::Check(parse()),
            "EMPTIED" => Step::Emptied(parse()),
            "CATCHUP" => Step::Catchup(parse()),
            "PAUSE" => {
                let body: serde_json::Value = serde_json::from_str(body)
                    .unwrap_or_else(|e| panic!("drive.py PAUSE: {e}: {body}"));
                let name = body["name"]
                    .as_str()
                    .unwrap_or_else(|| panic!("drive.py PAUSE: no name: {body}"));
                Step::Pause(name.to_owned())
            }
            "DONE" => Step::Done,
            _ => panic!("drive.py printed {line:?}"),
        }
    }

    /// Sends a signal to the driver process, whose publishers run in it (`SIGSTOP` stalls the
    /// engine: nothing published, no replay answered).
    pub fn signal(&self, signal: i32) {
        // SAFETY: plain kill(2) on a child pid we own and have not reaped yet.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }

    /// Lets the driver go on with its next step.
    ///
    /// # Panics
    /// When its stdin is closed.
    pub fn go(&mut self) {
        writeln!(self.stdin, "go")
            .and_then(|()| self.stdin.flush())
            .expect("write to drive.py");
    }

    /// The final model (after [`Step::Done`]).
    ///
    /// # Panics
    /// When the file is missing or not a model.
    pub fn model(&self) -> Expect {
        let text = std::fs::read_to_string(&self.out)
            .unwrap_or_else(|e| panic!("{}: {e}", self.out.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", self.out.display()))
    }

    /// Waits (bounded) for the driver to exit 0.
    ///
    /// # Panics
    /// When it fails or does not exit.
    pub fn wait_success(&mut self) {
        let status = crate::wait_until("drive.py to exit", DEADLINE, || {
            self.child.try_wait().ok().flatten()
        })
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(status.success(), "drive.py exited with {status}");
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `ckf.v1.Ingest/GetMemberBlocks`: the canonical block hashes a member holds, ascending.
///
/// # Errors
/// The transport error or status, as text.
pub async fn member_blocks(
    producer: SocketAddr,
    worker_id: u64,
    dp_rank: u32,
) -> Result<Vec<u64>, String> {
    let mut client = IngestClient::new(channel(producer).await?);
    let request = v1::GetMemberBlocksRequest {
        member: Some(v1::MemberId { worker_id, dp_rank }),
    };
    client
        .get_member_blocks(request)
        .await
        .map(|r| r.into_inner().block_hashes)
        .map_err(|s| format!("GetMemberBlocks({worker_id}, {dp_rank}): {s:?}"))
}

/// `ckf.v1.Query/FindMatchesByTokens` for `query`: the depth of lane `dc` (block size: the
/// indexer's).
///
/// # Errors
/// The transport error or status, or `dc` not answering (not ready), as text.
pub async fn token_depth(
    indexer: SocketAddr,
    dc: &str,
    query: &QueryExpect,
) -> Result<u32, String> {
    let mut client = QueryClient::new(channel(indexer).await?);
    let request = v1::FindMatchesByTokensRequest {
        token_ids: query.token_ids.clone(),
        lora_name: query.lora_name.clone(),
        cache_salt: query.cache_salt.clone(),
        multimodal: query
            .multimodal
            .iter()
            .map(|m| v1::MultimodalItem {
                identifier: m.identifier.clone(),
                offset: m.offset,
                length: m.length,
            })
            .collect(),
        block_size: 0,
    };
    let response = client
        .find_matches_by_tokens(request)
        .await
        .map_err(|s| format!("FindMatchesByTokens({}): {s:?}", query.name))?
        .into_inner();
    response
        .matches
        .iter()
        .find(|m| {
            m.pool
                .as_ref()
                .is_some_and(|p| p.domain == DOMAIN && p.dc == dc)
        })
        .map(|m| m.depth)
        .ok_or_else(|| format!("lane {dc} did not answer: {response:?}"))
}

/// Waits until every member in `expect` holds exactly its canonical hashes.
///
/// # Panics
/// After [`DEADLINE`], naming the member and what it held.
pub async fn wait_members(producer: SocketAddr, what: &str, expect: &Expect) {
    for member in &expect.members {
        let mut want = member.canonical.clone();
        want.sort_unstable();
        let label = format!(
            "{what}: member ({}, {}) holds exactly {} blocks",
            member.worker_id,
            member.dp_rank,
            want.len()
        );
        eventually(&label, DEADLINE, || async {
            let held = member_blocks(producer, member.worker_id, member.dp_rank).await?;
            if held == want {
                Ok(())
            } else {
                Err(format!("held {held:?}, expected {want:?}"))
            }
        })
        .await;
    }
}

/// Waits until every query in `expect` answers its expected depth for lane `dc`.
///
/// # Panics
/// After [`DEADLINE`], naming the query and the depth seen.
pub async fn wait_queries(indexer: SocketAddr, dc: &str, what: &str, expect: &Expect) {
    for query in &expect.queries {
        let label = format!(
            "{what}: query {:?} answers depth {}",
            query.name, query.expected_depth
        );
        eventually(&label, DEADLINE, || async {
            let depth = token_depth(indexer, dc, query).await?;
            if depth == query.expected_depth {
                Ok(())
            } else {
                Err(format!("depth {depth}"))
            }
        })
        .await;
    }
}

/// Runs the driver to its end, confirming each step: members (producer) and queries (indexer,
/// lane `dc`) as the step says. Returns the final model, already checked the same way.
///
/// # Panics
/// As [`wait_members`], [`wait_queries`] and [`Driver::next_step`].
pub async fn run_steps(
    driver: &mut Driver,
    producer: SocketAddr,
    indexer: SocketAddr,
    dc: &str,
) -> Expect {
    let mut index = 0;
    loop {
        index += 1;
        match driver.next_step().await {
            Step::Ready(expect) => wait_members(producer, "warm-up", &expect).await,
            Step::Check(expect) | Step::Catchup(expect) => {
                let what = format!("step {index}");
                wait_members(producer, &what, &expect).await;
                wait_queries(indexer, dc, &what, &expect).await;
            }
            Step::Pause(name) => {
                panic!("step {index}: PAUSE {name:?} needs a test that controls the producer")
            }
            Step::Emptied(expect) => {
                wait_members(
                    producer,
                    &format!("step {index} (cleared by the producer)"),
                    &expect,
                )
                .await;
            }
            Step::Done => break,
        }
        driver.go();
    }
    let model = driver.model();
    wait_members(producer, "final", &model).await;
    wait_queries(indexer, dc, "final", &model).await;
    driver.go();
    driver.wait_success();
    model
}
