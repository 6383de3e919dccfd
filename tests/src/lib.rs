//! Process harness for the end-to-end tests: start the real `ckf-indexer` / `ckf-producer`
//! binaries on 127.0.0.1 ephemeral ports, stop them with SIGTERM or SIGKILL, and clean up.
//!
//! The binaries are looked up next to the test executable (`target/<profile>/`), so the tests
//! exercise exactly what `cargo build --release --bins` produced (`scripts/test.sh` builds them
//! first).
//!
//! | module | owns |
//! | --- | --- |
//! | this file | binary lookup, spawn / SIGTERM / SIGKILL, blocking waits |
//! | [`cluster`] | indexer and producer processes: configs, ports, restarts, their gRPC calls |
//! | [`engines`] | the real engines' publishers (`tests/engines/drive.py`): driver steps, member and token-query checks |
//! | [`model`] | the exact model of a DC's content (the oracle) |
//! | [`check`] | a lane compared against its producer's model and statistics |
//! | [`hashes`] | block hashes with pairwise distinct fingerprints (exact expected depths) |
//! | [`relay`] | `ckf-testkit`'s raw `ckf.v1.Relay` client, bound to this suite's processes |
//! | [`metrics`] | `/metrics` scraping |
//! | [`wait`] | bounded async polling |

pub mod check;
pub mod cluster;
pub mod engines;
pub mod hashes;
pub mod metrics;
pub mod model;
pub mod relay;
pub mod wait;

use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Path of a workspace binary built with the same profile as the running test.
///
/// # Panics
/// When the binary does not exist, with a message saying how to build it.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test>-<hash> -> target/<profile>/<name>
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable lives in target/<profile>/deps");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} not found: build the binaries first (`cargo build --release --workspace --bins`, \
         which scripts/test.sh does)",
        path.display()
    );
    path
}

/// Waits until something accepts TCP connections on `addr`, up to `timeout`.
///
/// # Errors
/// A message naming the address when the deadline passes.
pub fn wait_for_listen(addr: SocketAddr, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("nothing listened on {addr} within {timeout:?}"))
}

/// Polls `probe` every 50 ms until it returns `Some`, up to `timeout`.
///
/// # Errors
/// `what` plus the timeout when the deadline passes.
pub fn wait_until<T>(
    what: &str,
    timeout: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> Result<T, String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe() {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            return Err(format!("timed out after {timeout:?} waiting for {what}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A running service process; killed with SIGKILL when dropped if still running.
pub struct Service {
    name: String,
    child: Option<Child>,
    log: PathBuf,
    /// Length of the (appended) log when this process started: its own lines come after.
    log_start: usize,
}

impl Service {
    /// Starts `binary` with `args`, stdout+stderr appended to `log_dir/<name>.log`.
    ///
    /// # Panics
    /// When the process cannot be spawned.
    pub fn spawn(name: &str, binary: &Path, args: &[String], log_dir: &Path) -> Self {
        let log = log_dir.join(format!("{name}.log"));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("open log");
        let log_start = std::fs::metadata(&log).map_or(0, |m| m.len() as usize);
        let err = out.try_clone().expect("clone log handle");
        let mut command = Command::new(binary);
        // SAFETY: the closure runs in the forked child before exec and only calls prctl(2),
        // which is async-signal-safe. It makes the service die with the thread that started it,
        // so a test runner killed mid-test leaves no service holding ports behind.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", binary.display()));
        Self {
            name: name.to_owned(),
            child: Some(child),
            log,
            log_start,
        }
    }

    /// The exit status when the process has exited (reaped), `None` while it runs.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Waits until this process (not an earlier one appending to the same log) writes a JSON
    /// log record whose `message` is `message`, and returns the record. Services started by
    /// the tests log with `log_format = "json"`; this is how they report the addresses they
    /// bound (port 0), so no port is ever guessed.
    ///
    /// # Errors
    /// When the process exits first (with its status and log), or after `timeout`.
    pub fn wait_for_record(
        &mut self,
        message: &str,
        timeout: Duration,
    ) -> Result<serde_json::Value, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let log = self.log();
            let found = log
                .get(self.log_start..)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .find(|r| r.get("message").and_then(|m| m.as_str()) == Some(message));
            if let Some(record) = found {
                return Ok(record);
            }
            if let Some(status) = self.exited() {
                return Err(format!(
                    "{} exited with {status} before logging {message:?}",
                    self.name
                ));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} did not log {message:?} within {timeout:?}",
                    self.name
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// Sends a signal (e.g. `libc::SIGTERM`).
    pub fn signal(&self, signal: i32) {
        if let Some(child) = &self.child {
            // SAFETY: plain kill(2) on a child pid we own and have not reaped yet.
            unsafe { libc::kill(child.id() as i32, signal) };
        }
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits up to `timeout` for exit.
    ///
    /// # Errors
    /// When the process does not exit in time (it is then killed).
    pub fn terminate(&mut self, timeout: Duration) -> Result<ExitStatus, String> {
        self.signal(libc::SIGTERM);
        let mut child = self.child.take().ok_or("already stopped")?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{} did not exit within {timeout:?}", self.name));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The process's log so far (for assertion messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.kill9();
    }
}
