//! Unit tests of `ckf load`: the schedule, the queries per message, the tally, the report
//! text, and the `/proc` readers.

use std::time::{Duration, Instant};

use tonic::Code;

use super::*;

#[test]
fn open_loop_due_times_are_evenly_spaced_from_the_start() {
    let start = Instant::now();
    let interval = message_interval(1_000.0, 1).unwrap();
    assert_eq!(interval, Duration::from_millis(1));
    assert_eq!(due_time(start, interval, 0), start);
    assert_eq!(
        due_time(start, interval, 2_500),
        start + Duration::from_millis(2_500)
    );
    // 64 queries per message at 128k queries/s: one message every 500 us.
    assert_eq!(
        message_interval(128_000.0, 64).unwrap(),
        Duration::from_micros(500)
    );
    // 1e-30 and 1e-300 overflowed the Duration conversion (a panic) before it was checked.
    // 1e12 and 1e300 gave a zero interval: every message due at the start, a run without end.
    for bad in [
        0.0,
        -1.0,
        f64::NAN,
        f64::INFINITY,
        1e-30,
        1e-300,
        1e-6,
        1e12,
        1e300,
    ] {
        assert!(message_interval(bad, 1).is_err(), "{bad}");
    }
    assert_eq!(
        message_interval(1.0 / 86_400.0, 1).unwrap(),
        Duration::from_secs(86_400)
    );
}

#[test]
fn the_messages_due_before_the_end_are_those_whose_due_time_is_before_it() {
    let start = Instant::now();
    let us = Duration::from_micros(1);
    for (span, interval, messages) in [
        (300_000u64, us, None),
        (10, Duration::from_nanos(3_000), None),
        (9, Duration::from_nanos(3_000), None),
        (1_000, us, Some(7)),
        (0, us, None),
    ] {
        let end = start + Duration::from_micros(span);
        let model = (0..)
            .take_while(|&k| due_time(start, interval, k) < end)
            .take_while(|&k| messages.is_none_or(|n| k < n))
            .count() as u64;
        assert_eq!(
            due_before(start, end, interval, messages),
            model,
            "{span} {interval:?}"
        );
    }
}

#[test]
fn a_schedule_ends_after_its_messages_and_hands_each_out_once() {
    let schedule = Schedule {
        next: AtomicU64::new(0),
        start: Instant::now(),
        end: None,
        messages: Some(3),
        interval: None,
        stopped: AtomicBool::new(false),
    };
    let taken: Vec<u64> = std::iter::from_fn(|| schedule.take().map(|(k, _)| k)).collect();
    assert_eq!(taken, [0, 1, 2]);
    // Open loop: due times come from the schedule, and the end cuts later messages.
    let start = Instant::now();
    let open = Schedule {
        next: AtomicU64::new(0),
        start,
        end: Some(start + Duration::from_millis(10)),
        messages: None,
        interval: Some(Duration::from_millis(4)),
        stopped: AtomicBool::new(false),
    };
    let due: Vec<_> = std::iter::from_fn(|| open.take()).collect();
    assert_eq!(
        due,
        [0, 1, 2].map(|k| (k, Some(start + Duration::from_millis(4 * k))))
    );
    open.stopped.store(true, Ordering::Relaxed);
    assert!(open.take().is_none());
}

#[test]
fn messages_take_consecutive_queries_and_cycle() {
    let queries: Vec<Vec<u64>> = (0..5).map(|i| vec![i]).collect();
    let firsts = |k| -> Vec<u64> { message_queries(&queries, 3, k).map(|q| q[0]).collect() };
    assert_eq!(firsts(0), [0, 1, 2]);
    assert_eq!(firsts(1), [3, 4, 0]);
    assert_eq!(firsts(5), [0, 1, 2]);
}

#[test]
fn the_text_summary_names_what_a_mode_counts() {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        load: LoadArgs,
    }
    let args = |mode: &str| {
        Cli::try_parse_from(["load", "--indexer", "http://127.0.0.1:1", "--mode", mode])
            .expect("valid flags")
            .load
    };
    let mut tally = Tally::new();
    tally.answered(Duration::from_micros(30), 1);
    tally.sent = 1;
    let report = LoadReport {
        tally,
        elapsed: Duration::from_secs(1),
        indexer_cpu: Some((7, Duration::from_micros(25))),
    };
    let health = text_report(&args("health"), 1, &report);
    assert!(
        health.starts_with("ckf load: health (1 health check/message)"),
        "{health}"
    );
    assert!(
        health.contains("answered   1 health checks (1/s)"),
        "{health}"
    );
    assert!(health.contains("25.00 us per health check"), "{health}");
    let mut open = args("health");
    open.rate = Some(500.0);
    let open = text_report(&open, 1, &report);
    assert!(open.contains("open loop at 500 health checks/s"), "{open}");
    let unary = text_report(&args("unary"), 1, &report);
    assert!(
        unary.starts_with("ckf load: unary (1 query/message)"),
        "{unary}"
    );
    assert!(unary.contains("answered   1 queries (1/s)"), "{unary}");
    assert!(unary.contains("25.00 us per query"), "{unary}");
}

#[test]
fn tallies_merge_counts_errors_and_hdr_percentiles() {
    let mut a = Tally::new();
    for us in 1..=99u64 {
        a.answered(Duration::from_micros(us), 2);
    }
    a.failed("UNAVAILABLE");
    let mut b = Tally::new();
    b.answered(Duration::from_micros(10_000), 2);
    b.failed("UNAVAILABLE");
    b.failed(ID_MISMATCH);
    b.sent = 7;
    a.merge(&b);
    assert_eq!((a.messages, a.queries, a.sent), (100, 200, 7));
    assert_eq!(a.errors.get("UNAVAILABLE"), Some(&2));
    assert_eq!(a.errors.get(ID_MISMATCH), Some(&1));
    let close = |got: f64, want: f64| (got - want).abs() <= want * 1e-3;
    assert!(close(a.latency_us(0.5), 50.0), "{}", a.latency_us(0.5));
    assert!(close(a.latency_us(0.99), 99.0), "{}", a.latency_us(0.99));
    assert!(close(a.latency_us(1.0), 10_000.0), "{}", a.latency_us(1.0));
    assert_eq!(Tally::new().latency_us(0.5), 0.0);
    // Closed loop: no send delay at all; open loop: merged like the latency.
    assert_eq!(a.send_delay_us(0.5), None);
    let mut c = Tally::new();
    c.delayed(Duration::from_micros(40));
    let mut d = Tally::new();
    d.delayed(Duration::from_micros(3_000));
    c.merge(&d);
    assert!(close(c.send_delay_us(0.5).unwrap(), 40.0));
    assert!(close(c.send_delay_us(1.0).unwrap(), 3_000.0));
    assert!(
        close(c.latency_us(0.5), 0.0),
        "a send delay is not an answer"
    );
}

#[test]
fn proc_stat_cpu_skips_a_command_name_with_spaces() {
    let line = "4242 (ckf indexer) S 1 4242 4242 0 -1 4194560 2000 0 0 0 150 25 0 0 20 0 5 0";
    assert_eq!(cpu_ticks(line), Some(175));
    assert_eq!(cpu_ticks("garbage"), None);
    // Our own process has a readable stat.
    assert!(process_cpu(std::process::id()).is_ok());
}

#[test]
fn listening_sockets_are_found_by_port_in_proc_net_tcp() {
    let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1CE8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5551 1 0
   1: 0100007F:1CE8 0100007F:A000 01 00000000:00000000 00:00000000 00000000     0        0 5552 1 0
   2: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5553 1 0";
    assert_eq!(listening_inodes(table, 0x1CE8), [5551]);
    assert_eq!(listening_inodes(table, 0x1F90), [5553]);
    assert!(listening_inodes(table, 1).is_empty());
    // A listener of this process is found from its port.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    assert_eq!(pid_listening_on(port), Some(std::process::id()));
}

#[test]
fn only_local_urls_name_a_port_to_look_up() {
    assert_eq!(local_port("http://127.0.0.1:7400"), Some(7400));
    assert_eq!(local_port("https://localhost:7443"), Some(7443));
    assert_eq!(local_port("http://[::1]:7400"), Some(7400));
    assert_eq!(local_port("http://10.1.2.3:7400"), None);
    assert_eq!(local_port("http://indexer:7400"), None);
}

#[test]
fn status_codes_have_their_canonical_names() {
    assert_eq!(code_name(Code::InvalidArgument), "INVALID_ARGUMENT");
    assert_eq!(code_name(Code::Unauthenticated), "UNAUTHENTICATED");
}
