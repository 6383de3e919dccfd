//! `ckf demo` stopped by a signal: the services it runs in-process listen for SIGHUP (token
//! reloads), which takes away SIGHUP's default action of ending the process, so the demo
//! listens for SIGHUP, SIGINT and SIGTERM itself. Each stops the replay, shuts the services
//! down and ends the demo with an error naming the signal.

#![cfg(unix)]

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `program args`, started with SIGHUP, SIGINT and SIGTERM at their default actions whatever
/// this test inherited (a shell's background job ignores SIGINT, `nohup` SIGHUP), so the demo
/// sees the signals as a terminal would send them.
fn with_default_signals(program: &str, args: &[&str]) -> Command {
    let mut command = Command::new(program);
    command.args(args);
    // SAFETY: `signal` is async-signal-safe and only resets dispositions in the child between
    // fork and exec.
    unsafe {
        command.pre_exec(|| {
            for signo in [libc::SIGHUP, libc::SIGINT, libc::SIGTERM] {
                if libc::signal(signo, libc::SIG_DFL) == libc::SIG_ERR {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    command
}

/// The demo's arguments: a replay of minutes (expected-ttft sends its requests on the
/// workload's clock, here slowed 100 times).
const LONG_DEMO: [&str; 5] = ["demo", "--policy", "expected-ttft", "--speed", "0.01"];

/// Spawns `command` (stdout discarded, stderr piped) and waits 3 s for it to be running; fails
/// if it already ended, since the test could then check nothing.
fn running(mut command: Command) -> Child {
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the demo");
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        child.try_wait().expect("poll the demo").is_none(),
        "the demo ended before any signal was sent: this test cannot check anything"
    );
    child
}

/// A long demo started with the stop signals at their defaults.
fn long_demo() -> Child {
    running(with_default_signals(env!("CARGO_BIN_EXE_ckf"), &LONG_DEMO))
}

fn send(child: &Child, name: &str) {
    let kill = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(kill.success(), "kill -{name}");
}

/// Waits for `child` to end and returns its exit code (`None`: killed by a signal) and stderr.
/// The 60 s limit only turns a hang into a failure.
fn ended(mut child: Child, after: &str) -> (Option<i32>, String) {
    let started = Instant::now();
    while child.try_wait().expect("poll the demo").is_none() {
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("the demo still ran 60 s after {after}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("the demo's stderr");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_hangup_or_an_interrupt_stops_the_demo_and_its_services() {
    for signal in ["HUP", "INT"] {
        let child = long_demo();
        send(&child, signal);
        let (code, stderr) = ended(child, signal);
        // Ended by its own error path, not killed by the signal (no exit code then).
        assert_eq!(code, Some(1), "SIG{signal}: stderr: {stderr}");
        assert!(
            stderr.contains(&format!("ckf demo: SIG{signal}: stopping")),
            "SIG{signal}: {stderr}"
        );
        assert!(
            stderr.contains(&format!(
                "error: stopped by SIG{signal} before the replay finished"
            )),
            "SIG{signal}: {stderr}"
        );
    }
}

/// Under `nohup` (SIGHUP ignored from the start) a hangup leaves the demo running, as nohup
/// asks; SIGTERM still stops it.
#[test]
fn a_demo_started_with_sighup_ignored_keeps_it_ignored() {
    let mut args = vec![env!("CARGO_BIN_EXE_ckf")];
    args.extend(LONG_DEMO);
    let mut child = running(with_default_signals("nohup", &args));
    send(&child, "HUP");
    std::thread::sleep(Duration::from_secs(3));
    if child.try_wait().expect("poll the demo").is_some() {
        let (_, stderr) = ended(child, "SIGHUP");
        panic!("SIGHUP under nohup stopped the demo: {stderr}");
    }
    send(&child, "TERM");
    let (code, stderr) = ended(child, "SIGTERM");
    assert_eq!(code, Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("error: stopped by SIGTERM before the replay finished"),
        "{stderr}"
    );
}

/// A closed terminal: SIGHUP with stderr gone (here a pipe whose reader closed it). Writing
/// the stop message fails, and the demo must still shut down and exit 1, not panic (101).
#[test]
fn a_hangup_with_stderr_closed_still_stops_the_demo_cleanly() {
    let mut child = long_demo();
    drop(child.stderr.take());
    send(&child, "HUP");
    assert_eq!(ended(child, "SIGHUP").0, Some(1));
}

/// A start-up that never ends (the trace is a FIFO nobody writes): the first signal waits for
/// the services, the second exits at once with status 130.
#[test]
fn a_second_signal_during_a_stuck_start_exits_at_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let fifo = dir.path().join("trace.jsonl");
    let made = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("run mkfifo");
    assert!(made.success(), "mkfifo");
    let trace = fifo.to_str().expect("a UTF-8 path");
    let mut child = running(with_default_signals(
        env!("CARGO_BIN_EXE_ckf"),
        &["demo", "--trace", trace],
    ));
    send(&child, "INT");
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        child.try_wait().expect("poll the demo").is_none(),
        "one signal ended a demo whose start cannot finish"
    );
    send(&child, "TERM");
    let (code, stderr) = ended(child, "the second signal");
    assert_eq!(code, Some(130), "stderr: {stderr}");
    assert!(stderr.contains("ckf demo: SIGINT: stopping"), "{stderr}");
    assert!(
        stderr.contains("ckf demo: SIGTERM again: exiting"),
        "{stderr}"
    );
}
