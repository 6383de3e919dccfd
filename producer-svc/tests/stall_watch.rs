//! The stall watch in its own test process: the test stops the whole process (SIGSTOP), which
//! would stall any other test running beside it.

use std::time::{Duration, Instant};

use producer_svc::relay_client::stall_watch::{StallWatch, TICK};

#[test]
fn a_stopped_process_is_seen_and_a_blocked_task_is_not() {
    let watch = StallWatch::get();
    let start = Instant::now();
    // Blocking this thread (as a session blocked on a send would wait) is no stall of the
    // process: the watch thread keeps running.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        watch.longest_since(start) < Duration::from_millis(300),
        "{:?}",
        watch.longest_since(start)
    );
    // Stop the whole process for half a second, as SIGSTOP does, and let SIGCONT resume it.
    let pid = std::process::id().to_string();
    let resumer = std::process::Command::new("sh")
        .args(["-c", &format!("sleep 0.5; kill -CONT {pid}")])
        .spawn()
        .expect("sh");
    let stop = std::process::Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .expect("kill");
    assert!(stop.success());
    let mut resumer = resumer;
    resumer.wait().expect("resumer");
    // Give the watch a tick to record the gap.
    std::thread::sleep(TICK * 5);
    assert!(
        watch.longest_since(start) >= Duration::from_millis(300),
        "{:?}",
        watch.longest_since(start)
    );
}
