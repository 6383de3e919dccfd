//! `ckf demo` stopped by a signal: the services it runs in-process listen for SIGHUP (token
//! reloads), which takes away SIGHUP's default action of ending the process, so the demo
//! listens for SIGHUP, SIGINT and SIGTERM itself. Each stops the replay, shuts the services
//! down and ends the demo with an error naming the signal.

#![cfg(unix)]

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
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

/// Starts a demo that replays for minutes ([`LONG_DEMO`]), sends `signal` once it runs, and
/// returns its exit code, its stderr and how long it took to end after the signal.
fn stopped_by(signal: &str) -> (Option<i32>, String, Duration) {
    let mut child = with_default_signals(env!("CARGO_BIN_EXE_ckf"), &LONG_DEMO)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ckf");
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        child.try_wait().expect("poll the demo").is_none(),
        "the demo ended before {signal} was sent: this test cannot check anything"
    );
    let sent = Instant::now();
    let kill = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(kill.success(), "kill -{signal}");
    let status = loop {
        if let Some(status) = child.try_wait().expect("poll the demo") {
            break status;
        }
        if sent.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("the demo still ran 60 s after {signal}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = sent.elapsed();
    let out = child.wait_with_output().expect("the demo's stderr");
    (
        status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        took,
    )
}

#[test]
fn a_hangup_or_an_interrupt_stops_the_demo_and_its_services() {
    for signal in ["HUP", "INT"] {
        let (code, stderr, took) = stopped_by(signal);
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
        // The services' graceful shutdown (producers drain first) is quick on an idle fleet.
        assert!(took < Duration::from_secs(30), "SIG{signal}: took {took:?}");
    }
}

/// Under `nohup` (SIGHUP ignored from the start) a hangup leaves the demo running, as nohup
/// asks; SIGTERM still stops it.
#[test]
fn a_demo_started_with_sighup_ignored_keeps_it_ignored() {
    let mut args = vec![env!("CARGO_BIN_EXE_ckf")];
    args.extend(LONG_DEMO);
    let mut child = with_default_signals("nohup", &args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run nohup ckf");
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        child.try_wait().expect("poll the demo").is_none(),
        "the demo ended before SIGHUP was sent: this test cannot check anything"
    );
    let pid = child.id().to_string();
    let signal = |name: &str| {
        let kill = Command::new("kill")
            .args([&format!("-{name}"), &pid])
            .status()
            .expect("run kill");
        assert!(kill.success(), "kill -{name}");
    };
    signal("HUP");
    std::thread::sleep(Duration::from_secs(3));
    if child.try_wait().expect("poll the demo").is_some() {
        let out = child.wait_with_output().expect("the demo's stderr");
        panic!(
            "SIGHUP under nohup stopped the demo: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    signal("TERM");
    let sent = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("poll the demo") {
            break status;
        }
        if sent.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("the demo still ran 60 s after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().expect("the demo's stderr");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("error: stopped by SIGTERM before the replay finished"),
        "{stderr}"
    );
}

/// Waits up to 60 s for `child` to end; its exit code (`None`: killed by a signal).
fn exit_code(child: &mut std::process::Child, what: &str) -> Option<i32> {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("poll the demo") {
            return status.code();
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("the demo still ran 60 s after {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn send(child: &std::process::Child, name: &str) {
    let kill = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(kill.success(), "kill -{name}");
}

/// A closed terminal: SIGHUP with stderr gone (here a pipe whose reader closed it). Writing
/// the stop message fails, and the demo must still shut down and exit 1, not panic (101).
#[test]
fn a_hangup_with_stderr_closed_still_stops_the_demo_cleanly() {
    let mut child = with_default_signals(env!("CARGO_BIN_EXE_ckf"), &LONG_DEMO)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ckf");
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        child.try_wait().expect("poll the demo").is_none(),
        "the demo ended before SIGHUP was sent: this test cannot check anything"
    );
    drop(child.stderr.take());
    send(&child, "HUP");
    assert_eq!(exit_code(&mut child, "SIGHUP"), Some(1));
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
    let mut child = with_default_signals(
        env!("CARGO_BIN_EXE_ckf"),
        &["demo", "--trace", fifo.to_str().expect("a UTF-8 path")],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .expect("run ckf");
    std::thread::sleep(Duration::from_secs(2));
    send(&child, "INT");
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        child.try_wait().expect("poll the demo").is_none(),
        "one signal ended a demo whose start cannot finish"
    );
    send(&child, "TERM");
    assert_eq!(exit_code(&mut child, "the second signal"), Some(130));
    let out = child.wait_with_output().expect("the demo's stderr");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("ckf demo: SIGINT: stopping"), "{stderr}");
    assert!(
        stderr.contains("ckf demo: SIGTERM again: exiting"),
        "{stderr}"
    );
}
