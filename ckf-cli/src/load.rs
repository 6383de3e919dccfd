//! `ckf load`: a load generator for an indexer's Query service (in the manner of `ghz` or
//! `redis-benchmark`).
//!
//! - **Closed loop** (default): `--concurrency` request slots, each sending its next message as
//!   soon as the previous one is answered, spread round-robin over `--connections` HTTP/2
//!   connections. Latency is send to answer.
//! - **Open loop** (`--rate` queries/s): message `k` is due at `start + k x interval` whatever
//!   the answers do; a pacer thread releases each message at its due time to the next free
//!   slot, and the latency is measured **from the due time** (a message waiting for a free slot
//!   counts that wait: no coordinated omission). With too few slots for the rate the latencies
//!   grow, as they would for the real callers; the messages still unsent when `--duration`
//!   ends are not sent late but counted as `NOT_SENT` errors (at most `--concurrency` of them
//!   wait in the pacer's queue, so memory stays bounded whatever the rate).
//! - Modes: `unary` (`FindMatches`), `batch` (`FindMatchesBatch`, `--batch` queries per
//!   message), `stream` (`FindMatchesStream`: one stream per slot, `--batch` queries per
//!   message, each message's id checked in its answer), `tokens` (`FindMatchesByTokens`, the
//!   workload's blocks as `--block-size` token ids each, [`crate::feed::block_tokens`]), and
//!   `health` (`grpc.health.v1.Health/Check` for `ckf.v1.Query` on the same server: no search
//!   and no query decode, so its CPU per call is the floor of a unary RPC there, HTTP/2, HPACK,
//!   protobuf, tonic and the runtime, the baseline to hold unary `FindMatches` against).
//! - Queries: the built-in synthetic workload or a Mooncake trace (`--trace`), chained into
//!   sequence block hashes ([`crate::hashing`]), sent in order and cycled.
//! - Summary: queries and messages answered per second, latency per message
//!   p50/p90/p99/p99.9/max from an HDR histogram (`hdrhistogram`), errors by gRPC status code,
//!   and the indexer's CPU time per query when its process is on this host (`--indexer-pid`, or
//!   the process listening on the URL's port, found through `/proc/net/tcp*` and
//!   `/proc/*/fd`): utime + stime from `/proc/<pid>/stat` over the run / queries answered.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use ckf_proto::v1::{self, query_client::QueryClient};
use ckf_svc_kit::access::{AuthedChannel, authed};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use crate::cli::{LoadArgs, LoadMode};
use crate::commands::{client_tls, connect_with, load_workload, token_of};
use crate::feed::block_tokens;
use crate::hashing::block_hashes;

/// Largest latency the histogram records (60 s, in nanoseconds); longer ones count as it.
const HIGHEST_NS: u64 = 60_000_000_000;

/// When message `k` of an open-loop run is due, `interval` apart from `start`.
pub fn due_time(start: Instant, interval: Duration, k: u64) -> Instant {
    // Nanoseconds in u128: k x interval cannot overflow for any run length that ends.
    let offset = interval.as_nanos().saturating_mul(u128::from(k));
    start + Duration::from_nanos(u64::try_from(offset).unwrap_or(u64::MAX))
}

/// The time between two messages for `rate` queries/s at `per_message` queries per message.
///
/// # Errors
/// A rate that is not a positive finite number.
pub fn message_interval(rate: f64, per_message: usize) -> Result<Duration> {
    if !(rate.is_finite() && rate > 0.0) {
        bail!("--rate must be a positive number of queries per second, got {rate}");
    }
    // A rate so small that one message's interval does not fit a `Duration` (or is more than
    // a day) is a typo, not a load test: refuse it instead of panicking in the conversion.
    let interval = Duration::try_from_secs_f64(per_message as f64 / rate)
        .ok()
        .filter(|interval| *interval <= MAX_RUN)
        .with_context(|| {
            format!(
                "--rate {rate}: one message of {per_message} queries every more than a day; \
                 give a rate of at least {:.6} queries/s",
                per_message as f64 / MAX_RUN.as_secs_f64()
            )
        })?;
    // An interval that rounds to 0 ns makes every message due at the start: no message is ever
    // due after the end, so the run would never end.
    if interval.is_zero() {
        bail!(
            "--rate {rate}: more than one message of {per_message} queries per nanosecond; \
             give at most {} queries/s",
            per_message as f64 * 1e9
        );
    }
    Ok(interval)
}

/// Longest `--duration` (and longest open-loop interval between two messages): one day.
pub const MAX_RUN: Duration = Duration::from_secs(86_400);

/// Parses `--duration`: seconds (`10`, `2.5`, `10s`) or milliseconds (`500ms`).
///
/// # Errors
/// Anything else, or a duration that is not positive.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, scale) = match text.strip_suffix("ms") {
        Some(ms) => (ms, 1e-3),
        None => (text.strip_suffix('s').unwrap_or(text), 1.0),
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|e| format!("`{text}`: expected seconds (10, 2.5s) or 500ms ({e})"))?;
    let seconds = value * scale;
    if !(seconds.is_finite() && seconds > 0.0) {
        return Err(format!("`{text}`: the duration must be positive"));
    }
    Duration::try_from_secs_f64(seconds)
        .ok()
        .filter(|d| *d <= MAX_RUN)
        .ok_or_else(|| format!("`{text}`: at most one day (86400 s)"))
}

/// The canonical gRPC name of a status code (`UNAVAILABLE`, `INVALID_ARGUMENT`, ...), the key
/// of the errors table.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The error key of a stream answer whose id is not the id sent (never expected).
pub const ID_MISMATCH: &str = "ID_MISMATCH";

/// The error key of a health check answered with a status other than `SERVING`.
pub const NOT_SERVING: &str = "NOT_SERVING";

/// The service `--mode health` checks: the Query service the other modes drive.
pub const HEALTH_CHECKED_SERVICE: &str = "ckf.v1.Query";

/// A process's CPU time so far (user + system), from `/proc/<pid>/stat`.
///
/// # Errors
/// The process is gone or the file is not in the documented format.
pub fn process_cpu(pid: u32) -> Result<Duration> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("cannot read /proc/{pid}/stat"))?;
    let ticks = cpu_ticks(&text).ok_or_else(|| anyhow!("/proc/{pid}/stat: unexpected format"))?;
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let per_second = if per_second > 0 {
        per_second as u64
    } else {
        100
    };
    Ok(Duration::from_nanos(
        ticks.saturating_mul(1_000_000_000) / per_second,
    ))
}

/// utime + stime (fields 14 and 15, in clock ticks) of a `/proc/<pid>/stat` line. The command
/// name (field 2) is in parentheses and may hold spaces, so fields are counted after its `)`.
pub fn cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // After ")": field 3 (state) is the first; utime is field 14, i.e. the 12th after it.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Socket inodes in LISTEN state on `port`, from the text of `/proc/net/tcp` or `tcp6`.
pub fn listening_inodes(table: &str, port: u16) -> Vec<u64> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local = fields.get(1)?;
            let local_port = u16::from_str_radix(local.rsplit(':').next()?, 16).ok()?;
            // State 0A is TCP_LISTEN.
            (local_port == port && *fields.get(3)? == "0A")
                .then(|| fields.get(9)?.parse().ok())
                .flatten()
        })
        .collect()
}

/// The process listening on TCP `port` of this host, if `/proc` shows one we may inspect.
pub fn pid_listening_on(port: u16) -> Option<u32> {
    let inodes: Vec<u64> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .flat_map(|table| listening_inodes(&table, port))
        .collect();
    if inodes.is_empty() {
        return None;
    }
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path())
                && wanted.iter().any(|w| target.as_os_str() == w.as_str())
            {
                return Some(pid);
            }
        }
    }
    None
}

/// The port of an `http://host:port` / `https://host:port` URL when its host is this machine
/// (loopback or `localhost`), else `None` (a remote indexer's CPU cannot be read).
pub fn local_port(url: &str) -> Option<u16> {
    let uri: tonic::transport::Uri = url.parse().ok()?;
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    let local = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.to_canonical().is_loopback() || ip.is_unspecified());
    local.then(|| uri.port_u16()).flatten()
}

/// The queries of a run: one block-hash sequence per workload request, in order.
pub fn workload_queries(
    trace: Option<&Path>,
    limit: Option<usize>,
    seed: u64,
) -> Result<Vec<Vec<u64>>> {
    let workload = load_workload(trace, limit, seed)?;
    let queries: Vec<Vec<u64>> = workload
        .requests
        .iter()
        .map(|r| block_hashes(&r.hash_ids))
        .collect();
    if queries.is_empty() {
        bail!("the workload ({}) has no requests", workload.source);
    }
    Ok(queries)
}

/// What one message carries: `per_message` consecutive queries from `k x per_message`, cycling.
pub fn message_queries(
    queries: &[Vec<u64>],
    per_message: usize,
    k: u64,
) -> impl Iterator<Item = &Vec<u64>> {
    let first = (k as usize).wrapping_mul(per_message);
    (0..per_message).map(move |i| &queries[first.wrapping_add(i) % queries.len()])
}

/// The counts and latencies of one slot (merged at the end).
#[derive(Debug)]
pub struct Tally {
    /// Latency per answered message, nanoseconds.
    pub latency: Histogram<u64>,
    /// Open loop only: per sent message, nanoseconds from its due time to when a slot sent it
    /// (the pacer thread's own lateness, the hand-off to a slot and any wait for a free slot).
    /// Part of `latency`: it tells how much of a tail the load generator itself added.
    pub send_delay: Histogram<u64>,
    /// Messages answered.
    pub messages: u64,
    /// Queries answered (messages x queries per message).
    pub queries: u64,
    /// Queries sent (answered or not).
    pub sent: u64,
    /// Failed messages by status code name.
    pub errors: BTreeMap<&'static str, u64>,
}

impl Tally {
    /// Empty.
    pub fn new() -> Self {
        Self {
            latency: Histogram::new_with_bounds(1, HIGHEST_NS, 3)
                .expect("static histogram bounds are valid"),
            send_delay: Histogram::new_with_bounds(1, HIGHEST_NS, 3)
                .expect("static histogram bounds are valid"),
            messages: 0,
            queries: 0,
            sent: 0,
            errors: BTreeMap::new(),
        }
    }

    /// Adds `other` into this one.
    pub fn merge(&mut self, other: &Tally) {
        self.latency
            .add(&other.latency)
            .expect("histograms with equal bounds merge");
        self.send_delay
            .add(&other.send_delay)
            .expect("histograms with equal bounds merge");
        self.messages += other.messages;
        self.queries += other.queries;
        self.sent += other.sent;
        for (code, n) in &other.errors {
            *self.errors.entry(code).or_default() += n;
        }
    }

    fn answered(&mut self, latency: Duration, queries: usize) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.latency.saturating_record(ns.max(1));
        self.messages += 1;
        self.queries += queries as u64;
    }

    fn delayed(&mut self, delay: Duration) {
        let ns = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
        self.send_delay.saturating_record(ns.max(1));
    }

    fn failed(&mut self, code: &'static str) {
        *self.errors.entry(code).or_default() += 1;
    }

    /// Latency at `quantile` (0..=1) in microseconds (0 when nothing was answered).
    pub fn latency_us(&self, quantile: f64) -> f64 {
        quantile_us(&self.latency, quantile)
    }

    /// Open-loop send delay at `quantile` (0..=1) in microseconds, `None` when no message was
    /// sent on a schedule (closed loop).
    pub fn send_delay_us(&self, quantile: f64) -> Option<f64> {
        (!self.send_delay.is_empty()).then(|| quantile_us(&self.send_delay, quantile))
    }
}

/// `histogram` (nanoseconds) at `quantile`, in microseconds; 0 when empty.
fn quantile_us(histogram: &Histogram<u64>, quantile: f64) -> f64 {
    if histogram.is_empty() {
        return 0.0;
    }
    histogram.value_at_quantile(quantile) as f64 / 1_000.0
}

impl Default for Tally {
    fn default() -> Self {
        Self::new()
    }
}

/// The schedule every slot shares: which message is next and when to stop.
struct Schedule {
    next: AtomicU64,
    start: Instant,
    end: Option<Instant>,
    messages: Option<u64>,
    interval: Option<Duration>,
    stopped: AtomicBool,
}

impl Schedule {
    /// The next message to send and its due time (open loop), or `None` when the run is over.
    fn take(&self) -> Option<(u64, Option<Instant>)> {
        if self.stopped.load(Ordering::Relaxed) {
            return None;
        }
        let k = self.next.fetch_add(1, Ordering::Relaxed);
        if self.messages.is_some_and(|n| k >= n) {
            return None;
        }
        let due = self.interval.map(|i| due_time(self.start, i, k));
        let at = due.unwrap_or_else(Instant::now);
        if self.end.is_some_and(|end| at >= end) {
            return None;
        }
        Some((k, due))
    }
}

/// One connection's clients: the Query service, and the health service on the same channel.
#[derive(Clone)]
struct Client {
    query: QueryClient<AuthedChannel>,
    health: HealthClient<AuthedChannel>,
}

/// Sets the calling thread's timer slack to 1 ns (Linux `PR_SET_TIMERSLACK`), so its sleeps
/// end when asked rather than up to the default 50 us later (`prctl(2)`). Elsewhere, or if
/// refused, the default stays: the pacer is then that much later, which the send delay shows.
fn tighten_timer_slack() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and touches no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
    }
}

/// The error key of the open-loop messages due before the end of the run that no slot was
/// free to send by then (the rate is above what `--concurrency` slots sustain).
pub const NOT_SENT: &str = "NOT_SENT";

/// How many messages of an open-loop run are due before `end` (`interval` apart from `start`,
/// at most `messages`): the `k` with `due_time(start, interval, k) < end`.
pub fn due_before(start: Instant, end: Instant, interval: Duration, messages: Option<u64>) -> u64 {
    let span = end.saturating_duration_since(start).as_nanos();
    let step = interval.as_nanos().max(1);
    let due = u64::try_from(span.div_ceil(step)).unwrap_or(u64::MAX);
    messages.map_or(due, |n| due.min(n))
}

/// The open-loop pacer: a thread that releases every message of `schedule` at its due time
/// into `tx` (bounded by the caller; when every slot is busy and the queue is full the pacer
/// waits, and the waiting message's latency still starts at its due time). A thread with
/// `std::thread::sleep` and not a tokio timer, whose millisecond ticks would add up to a
/// millisecond of the generator's own lateness to every latency. The thread's timer slack is
/// set to 1 ns ([`tighten_timer_slack`]). What lateness is left (measured on a 2-vCPU KVM
/// guest: p50 45 us for a 0.85 ms sleep, 140 us for 8.5 ms, mostly waking a halted vCPU) is
/// reported as the send delay ([`Tally::send_delay`]).
///
/// Returns the messages due before the end that it never released: once the end has passed,
/// a backlog sent late would stretch the run far past `--duration` (without bound for a rate
/// far above what the slots sustain), so it is counted as [`NOT_SENT`] instead.
fn pace(
    schedule: Arc<Schedule>,
    tx: flume::Sender<(u64, Instant)>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        tighten_timer_slack();
        while let Some((k, due)) = schedule.take() {
            let due = due.expect("an open-loop schedule has due times");
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if let (Some(end), Some(interval)) = (schedule.end, schedule.interval)
                && now >= end
            {
                return due_before(schedule.start, end, interval, schedule.messages) - k;
            }
            if tx.send((k, due)).is_err() {
                return 0;
            }
        }
        0
    })
}

/// One slot: sends messages until the schedule ends, tallying answers and errors.
async fn slot(
    mut client: Client,
    mode: LoadMode,
    per_message: usize,
    block_size: u32,
    queries: Arc<Vec<Vec<u64>>>,
    schedule: Arc<Schedule>,
    paced: Option<flume::Receiver<(u64, Instant)>>,
) -> Tally {
    let mut tally = Tally::new();
    // Stream mode: the slot's open stream (request sender, answers), reopened after an error.
    let mut stream: Option<(
        mpsc::Sender<v1::FindMatchesStreamRequest>,
        tonic::Streaming<v1::FindMatchesStreamResponse>,
    )> = None;
    loop {
        let next = match &paced {
            // Open loop: the pacer thread hands out each message at its due time.
            Some(rx) => rx.recv_async().await.ok().map(|(k, due)| (k, Some(due))),
            None => schedule.take(),
        };
        let Some((k, due)) = next else { break };
        let batch = || -> Vec<v1::BlockHashQuery> {
            message_queries(&queries, per_message, k)
                .map(|q| v1::BlockHashQuery {
                    block_hashes: q.clone(),
                })
                .collect()
        };
        let sent = Instant::now();
        if let Some(due) = due {
            tally.delayed(sent.saturating_duration_since(due));
        }
        tally.sent += per_message as u64;
        let outcome: Result<(), &'static str> = match mode {
            LoadMode::Unary => {
                let block_hashes = message_queries(&queries, 1, k)
                    .next()
                    .cloned()
                    .unwrap_or_default();
                client
                    .query
                    .find_matches(v1::FindMatchesRequest { block_hashes })
                    .await
                    .map(drop)
                    .map_err(|s| code_name(s.code()))
            }
            LoadMode::Tokens => {
                let ids = message_queries(&queries, 1, k)
                    .next()
                    .cloned()
                    .unwrap_or_default();
                let token_ids = ids
                    .iter()
                    .flat_map(|&h| block_tokens(h, block_size))
                    .collect();
                client
                    .query
                    .find_matches_by_tokens(v1::FindMatchesByTokensRequest {
                        token_ids,
                        // Sent, so an indexer with another block size refuses the run's
                        // queries (INVALID_ARGUMENT) instead of probing other blocks.
                        block_size,
                        ..Default::default()
                    })
                    .await
                    .map(drop)
                    .map_err(|s| code_name(s.code()))
            }
            LoadMode::Batch => client
                .query
                .find_matches_batch(v1::FindMatchesBatchRequest { queries: batch() })
                .await
                .map(drop)
                .map_err(|s| code_name(s.code())),
            LoadMode::Stream => {
                let result = stream_one(&mut client, &mut stream, k, batch()).await;
                if result.is_err() {
                    stream = None;
                }
                result
            }
            LoadMode::Health => match client
                .health
                .check(HealthCheckRequest {
                    service: HEALTH_CHECKED_SERVICE.into(),
                })
                .await
            {
                Ok(answer) if answer.get_ref().status == ServingStatus::Serving as i32 => Ok(()),
                Ok(_) => Err(NOT_SERVING),
                Err(status) => Err(code_name(status.code())),
            },
        };
        match outcome {
            Ok(()) => tally.answered(due.unwrap_or(sent).elapsed(), per_message),
            Err(code) => tally.failed(code),
        }
    }
    tally
}

/// Sends message `id` on the slot's stream (opening it first if needed) and waits for its
/// answer, which must carry the same id.
async fn stream_one(
    client: &mut Client,
    stream: &mut Option<(
        mpsc::Sender<v1::FindMatchesStreamRequest>,
        tonic::Streaming<v1::FindMatchesStreamResponse>,
    )>,
    id: u64,
    queries: Vec<v1::BlockHashQuery>,
) -> Result<(), &'static str> {
    if stream.is_none() {
        let (tx, rx) = mpsc::channel(1);
        let answers = client
            .query
            .find_matches_stream(ReceiverStream::new(rx))
            .await
            .map_err(|s| code_name(s.code()))?
            .into_inner();
        *stream = Some((tx, answers));
    }
    let (tx, answers) = stream.as_mut().expect("opened above");
    tx.send(v1::FindMatchesStreamRequest { id, queries })
        .await
        .map_err(|_| code_name(Code::Unavailable))?;
    match answers.message().await {
        Ok(Some(answer)) if answer.id == id => Ok(()),
        Ok(Some(_)) => Err(ID_MISMATCH),
        Ok(None) => Err(code_name(Code::Unavailable)),
        Err(status) => Err(code_name(status.code())),
    }
}

/// The outcome of a run (what the summary prints).
#[derive(Debug)]
pub struct LoadReport {
    /// Every slot's tally merged.
    pub tally: Tally,
    /// Wall time from the first send to the last answer.
    pub elapsed: Duration,
    /// The indexer's pid and CPU time over the run, when its process is on this host.
    pub indexer_cpu: Option<(u32, Duration)>,
}

impl LoadReport {
    /// Indexer CPU per answered query, microseconds.
    pub fn cpu_per_query_us(&self) -> Option<f64> {
        let (_, cpu) = self.indexer_cpu?;
        (self.tally.queries > 0).then(|| cpu.as_secs_f64() * 1e6 / self.tally.queries as f64)
    }
}

/// `ckf load`.
///
/// # Errors
/// Bad flags, an unreadable trace or token file, or an indexer that cannot be reached. Errors
/// of individual requests are counted, not returned.
pub async fn run(args: LoadArgs) -> Result<()> {
    let per_message = match args.mode {
        LoadMode::Batch | LoadMode::Stream => args.batch,
        LoadMode::Unary | LoadMode::Tokens | LoadMode::Health => 1,
    };
    if per_message == 0 || args.concurrency == 0 || args.connections == 0 {
        bail!("--batch, --concurrency and --connections must be at least 1");
    }
    if args.mode == LoadMode::Tokens && args.block_size == 0 {
        bail!("--block-size must be at least 1 token (the indexer's block size)");
    }
    let interval = args
        .rate
        .map(|rate| message_interval(rate, per_message))
        .transpose()?;
    let queries = Arc::new(workload_queries(
        args.trace.as_deref(),
        args.limit,
        args.seed,
    )?);
    let token = token_of(args.token_file.as_deref())?;
    let tls = client_tls(&args.tls)?;
    let mut clients = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        let channel = authed(
            connect_with(&args.indexer, tls.as_ref()).await?,
            token.clone(),
        );
        clients.push(Client {
            query: QueryClient::new(channel.clone())
                .max_decoding_message_size(64 << 20)
                .max_encoding_message_size(64 << 20),
            health: HealthClient::new(channel),
        });
    }
    let pid = args
        .indexer_pid
        .or_else(|| local_port(&args.indexer).and_then(pid_listening_on));
    let duration = match args.requests {
        Some(_) => args.duration,
        None => Some(args.duration.unwrap_or(Duration::from_secs(10))),
    };
    // A pid the user gave must be readable (a typo would otherwise print "not measured"); one
    // found from the port is measured when it can be.
    let cpu_before = match (args.indexer_pid, pid) {
        (Some(given), _) => Some(process_cpu(given).context("--indexer-pid")?),
        (None, Some(found)) => process_cpu(found).ok(),
        (None, None) => None,
    };
    let start = Instant::now() + Duration::from_millis(1);
    let schedule = Arc::new(Schedule {
        next: AtomicU64::new(0),
        start,
        end: duration.map(|d| start + d),
        messages: args.requests,
        interval,
        stopped: AtomicBool::new(false),
    });
    let bar = progress(&args, duration);
    let ticker = {
        let bar = bar.clone();
        let schedule = Arc::clone(&schedule);
        let by_messages = args.requests.is_some() && duration.is_none();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let position = if by_messages {
                    schedule.next.load(Ordering::Relaxed)
                } else {
                    start.elapsed().as_millis() as u64
                };
                bar.set_position(position);
            }
        })
    };
    let (pacer, paced) = if interval.is_some() {
        // Bounded: a rate above what the slots sustain must not queue messages without bound.
        let (tx, rx) = flume::bounded(args.concurrency);
        (Some(pace(Arc::clone(&schedule), tx)), Some(rx))
    } else {
        (None, None)
    };
    let slots: Vec<_> = (0..args.concurrency)
        .map(|i| {
            tokio::spawn(slot(
                clients[i % clients.len()].clone(),
                args.mode,
                per_message,
                args.block_size,
                Arc::clone(&queries),
                Arc::clone(&schedule),
                paced.clone(),
            ))
        })
        .collect();
    let interrupted = {
        let schedule = Arc::clone(&schedule);
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                schedule.stopped.store(true, Ordering::Relaxed);
            }
        })
    };
    drop(paced);
    let mut tally = Tally::new();
    for slot in slots {
        tally.merge(&slot.await.context("a load slot panicked")?);
    }
    let elapsed = start.elapsed();
    if let Some(pacer) = pacer {
        let not_sent = pacer
            .join()
            .map_err(|_| anyhow!("the open-loop pacer panicked"))?;
        if not_sent > 0 {
            *tally.errors.entry(NOT_SENT).or_default() += not_sent;
        }
    }
    ticker.abort();
    interrupted.abort();
    bar.finish_and_clear();
    let indexer_cpu = match (pid, cpu_before) {
        (Some(pid), Some(before)) => process_cpu(pid)
            .ok()
            .map(|after| (pid, after.saturating_sub(before))),
        _ => None,
    };
    let report = LoadReport {
        tally,
        elapsed,
        indexer_cpu,
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json_report(&args, per_message, &report))?
        );
    } else {
        print!("{}", text_report(&args, per_message, &report));
    }
    Ok(())
}

fn progress(args: &LoadArgs, duration: Option<Duration>) -> ProgressBar {
    if !crate::live::want_progress(args.json) {
        return ProgressBar::hidden();
    }
    let (len, unit) = match (duration, args.requests) {
        (Some(d), _) => (d.as_millis() as u64, "ms"),
        (None, Some(n)) => (n, "messages"),
        (None, None) => (0, ""),
    };
    let bar = ProgressBar::with_draw_target(Some(len), indicatif::ProgressDrawTarget::stderr());
    let template =
        format!("{{spinner}} load [{{elapsed_precise}}] {{wide_bar}} {{pos}}/{{len}} {unit}");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style);
    }
    bar
}

/// "closed loop", or "open loop at RATE UNIT/s" (`unit`: what the mode counts).
fn loop_kind(args: &LoadArgs, unit: &str) -> String {
    match args.rate {
        Some(rate) => format!("open loop at {rate} {unit}/s"),
        None => "closed loop".into(),
    }
}

/// The JSON summary.
pub fn json_report(args: &LoadArgs, per_message: usize, report: &LoadReport) -> serde_json::Value {
    let t = &report.tally;
    let seconds = report.elapsed.as_secs_f64();
    json!({
        "mode": args.mode.name(),
        "loop": if args.rate.is_some() { "open" } else { "closed" },
        "rate": args.rate,
        "queries_per_message": per_message,
        "concurrency": args.concurrency,
        "connections": args.connections,
        "elapsed_s": seconds,
        "messages": t.messages,
        "queries_sent": t.sent,
        "queries": t.queries,
        "qps": t.queries as f64 / seconds,
        "messages_per_s": t.messages as f64 / seconds,
        "latency_us": {
            "p50": t.latency_us(0.50),
            "p90": t.latency_us(0.90),
            "p99": t.latency_us(0.99),
            "p999": t.latency_us(0.999),
            "max": t.latency_us(1.0),
        },
        // Open loop: due time to send, per message (null in closed loop).
        "send_delay_us": (!t.send_delay.is_empty()).then(|| json!({
            "p50": t.send_delay_us(0.50),
            "p99": t.send_delay_us(0.99),
            "max": t.send_delay_us(1.0),
        })),
        "errors": t.errors,
        "error_count": t.errors.values().sum::<u64>(),
        "indexer_pid": report.indexer_cpu.map(|(pid, _)| pid),
        "indexer_cpu_s": report.indexer_cpu.map(|(_, cpu)| cpu.as_secs_f64()),
        "indexer_cpu_us_per_query": report.cpu_per_query_us(),
    })
}

/// The text summary.
pub fn text_report(args: &LoadArgs, per_message: usize, report: &LoadReport) -> String {
    let t = &report.tally;
    let seconds = report.elapsed.as_secs_f64();
    // A health check is counted where a query would be; the text names it.
    let (unit, one) = match args.mode {
        LoadMode::Health => ("health checks", "health check"),
        _ => ("queries", "query"),
    };
    let per = if per_message == 1 { one } else { unit };
    let mut out = format!(
        "ckf load: {} ({per_message} {per}/message), {}, {} in flight over {} connection(s), {seconds:.2} s\n",
        args.mode.name(),
        loop_kind(args, unit),
        args.concurrency,
        args.connections,
    );
    out += &format!(
        "answered   {} {unit} ({:.0}/s) in {} messages ({:.0}/s); {} {unit} sent\n",
        t.queries,
        t.queries as f64 / seconds,
        t.messages,
        t.messages as f64 / seconds,
        t.sent,
    );
    out += &format!(
        "latency    per message, us: p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}\n",
        t.latency_us(0.50),
        t.latency_us(0.90),
        t.latency_us(0.99),
        t.latency_us(0.999),
        t.latency_us(1.0),
    );
    if let (Some(p50), Some(p99), Some(max)) = (
        t.send_delay_us(0.50),
        t.send_delay_us(0.99),
        t.send_delay_us(1.0),
    ) {
        out += &format!(
            "send delay per message, due to sent (part of the latency), us: p50 {p50:.1}  p99 {p99:.1}  max {max:.1}\n"
        );
    }
    if t.errors.is_empty() {
        out += "errors     none\n";
    } else {
        let list: Vec<String> = t.errors.iter().map(|(c, n)| format!("{c} {n}")).collect();
        out += &format!("errors     {}\n", list.join(", "));
    }
    match (report.indexer_cpu, report.cpu_per_query_us()) {
        (Some((pid, cpu)), Some(per_query)) => {
            out += &format!(
                "indexer    pid {pid}: {:.3} s CPU, {per_query:.2} us per {}\n",
                cpu.as_secs_f64(),
                one,
            );
        }
        (Some((pid, cpu)), None) => {
            out += &format!(
                "indexer    pid {pid}: {:.3} s CPU, none answered (no CPU per {})\n",
                cpu.as_secs_f64(),
                one,
            );
        }
        _ => out += "indexer    CPU not measured (not on this host, or give --indexer-pid)\n",
    }
    out
}

#[cfg(test)]
mod tests {
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
    fn durations_parse_in_seconds_or_milliseconds() {
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2.5s"), Ok(Duration::from_millis(2_500)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("86400"), Ok(MAX_RUN));
        // 1e30 panicked in the conversion, 1e19 later when added to the start instant.
        for bad in ["", "0", "-1s", "ten", "5m", "1e30", "1e19", "86401"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
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
}
