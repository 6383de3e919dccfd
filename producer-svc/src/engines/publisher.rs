//! One publisher socket (one dp rank of one engine): a SUB socket on its PUB endpoint and,
//! when configured, a DEALER on its replay endpoint for the duration of one replay.
//!
//! The task reads each message ([`Read`]: size, parts, batch and dp rank checked), hands it
//! to [`PublisherSequence::take`] (the SUB socket's connection events to the rule too) and
//! executes the actions it returns: apply and clear go to the state actor through its bounded channel (a slow actor
//! slows the socket reads down; ZMQ then drops at the engine's high-water mark, which the
//! sequence rule sees as a gap), replay requests open a DEALER in a child task. Every
//! connection is checked against the engine's replay buffer: the first re-reads it (a
//! producer that starts after its engines indexes what they still hold), a reconnection or a
//! restored sequence ([`PublisherTask::resume_after`], after a producer restart) is verified
//! and filled, or cleared and re-read. Malformed input is counted and logged at most once per
//! [`LOG_INTERVAL`] per publisher (with the suppressed count); it never reaches the actor, so
//! it cannot touch any member.

use ckf_svc_kit::throttle::LogThrottle;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use ckf_engine::intake::{Batch, Read};
use ckf_engine::sequence::{
    Action, PublisherSequence, ReplayFailure, ReplayKind, SequenceConfig, Uncertainty,
};
use ckf_engine::zmtp::{ZmtpLimits, ZmtpViolation};
use ckf_svc_kit::Shutdown;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, sleep_until};
use tokio_stream::StreamExt;
use zeromq::{Socket, SocketEvent, SocketRecv, SocketSend, ZmqMessage};

use super::config::{PublisherSpec, SocketMode};
use super::guard;
use super::metrics::EngineMetrics;
use super::{EngineSettings, EngineStep, PublisherId};
use crate::actor::{ActorHandle, Command};

/// At most one malformed-input log line per publisher per interval.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Wait between attempts to bind or connect the SUB socket.
const RETRY: Duration = Duration::from_millis(500);

/// Rate limit of one publisher's malformed-input logs: one line per [`LOG_INTERVAL`].
fn log_limit() -> LogThrottle {
    LogThrottle::new(LOG_INTERVAL)
}

/// Decoding shared by the live and replay paths.
#[derive(Debug, Clone)]
struct Decoder {
    id: Arc<PublisherId>,
    metrics: EngineMetrics,
    settings: EngineSettings,
}

impl Decoder {
    fn error(&self, kind: &str, detail: &dyn std::fmt::Display, log: &LogThrottle) {
        let [p, e] = self.id.labels();
        self.metrics
            .decode_errors
            .with_label_values(&[p, e, kind])
            .inc();
        if let Some(suppressed) = log.admit() {
            tracing::warn!(publisher = p, endpoint = e, kind, %detail, suppressed, "malformed engine input dropped");
        }
    }

    /// Reads one message ([`Read::live`] or, on the replay path, [`Read::replayed`]) and
    /// counts what it found: a rejection as a decode error of its kind, the batch's events by
    /// kind, its malformed events.
    fn read(&self, parts: &[Bytes], replay: bool, log: &LogThrottle) -> Read {
        let refs: Vec<&[u8]> = parts.iter().map(AsRef::as_ref).collect();
        let limits = &self.settings.intake;
        let read = if replay {
            Read::replayed(&refs, limits)
        } else {
            Read::live(&refs, limits)
        };
        if let Some(rejection) = &read.rejected {
            self.error(rejection.kind_label(), rejection, log);
        }
        if let Some(batch) = &read.batch {
            let [p, e] = self.id.labels();
            for event in &batch.events {
                let kind = event.kind_label();
                self.metrics.events.with_label_values(&[p, e, kind]).inc();
            }
            let notes = &batch.notes;
            if notes.malformed_events > 0 {
                self.metrics
                    .decode_errors
                    .with_label_values(&[p, e, "malformed_event"])
                    .inc_by(u64::from(notes.malformed_events));
                if let Some(suppressed) = log.admit() {
                    tracing::warn!(
                        publisher = p,
                        endpoint = e,
                        malformed = notes.malformed_events,
                        first = notes.first_malformed.as_deref().unwrap_or(""),
                        suppressed,
                        "malformed engine events skipped"
                    );
                }
            }
        }
        read
    }
}

/// What the replay child task reports.
#[derive(Debug)]
enum ReplayMsg {
    /// A reply (a batch or the end marker).
    Read(Read),
    Failed(String),
}

/// One publisher socket's task.
pub struct PublisherTask {
    spec: PublisherSpec,
    decoder: Decoder,
    actor: ActorHandle,
    stop: Shutdown,
    /// The last sequence applied by an earlier run of the producer (restored from its
    /// journal) with its batch's identity, if any.
    resume: Option<(i64, Option<u64>)>,
}

impl PublisherTask {
    /// A task for `spec`.
    pub fn new(
        spec: PublisherSpec,
        settings: EngineSettings,
        actor: ActorHandle,
        metrics: EngineMetrics,
        stop: Shutdown,
    ) -> Self {
        let id = Arc::new(PublisherId {
            worker_id: spec.worker_id,
            rank: spec.rank,
            label: spec.label(),
            endpoint: spec.endpoint.to_string(),
        });
        Self {
            spec,
            decoder: Decoder {
                id,
                metrics,
                settings,
            },
            actor,
            stop,
            resume: None,
        }
    }

    /// Starts the sequence rule after `last` (with its batch's identity), the last sequence
    /// this publisher socket applied before the producer restarted
    /// ([`PublisherSequence::resume`]): the first connection verifies it through the replay
    /// socket and fills what the engine published meanwhile; an engine that restarted
    /// meanwhile (or no replay socket) has the restored members cleared, then re-read.
    pub fn resume_after(mut self, last: i64, identity: Option<u64>) -> Self {
        self.resume = Some((last, identity));
        self
    }

    /// Runs until shutdown (or the actor stops), in an `engine` span (`publisher`, `endpoint`).
    pub async fn run(self) {
        use tracing::Instrument;
        let id = self.decoder.id.clone();
        let span = tracing::info_span!("engine", publisher = %id.label, endpoint = %id.endpoint);
        self.run_inner().instrument(span).await;
    }

    async fn run_inner(self) {
        let stopped = self.stop.wait();
        tokio::pin!(stopped);
        // Declared before `sub` so it is dropped after it: zeromq stops listening on the
        // socket inside before the directory is removed.
        let mut internal: Option<guard::PrivateIpc> = None;
        let mut sub = zeromq::SubSocket::new();
        // Connection events reach the sequence rule: each connection is checked.
        let mut monitor = sub.monitor();
        // Held for the task's life: zeromq only ever talks to the engine through the proxies.
        let mut proxies = Vec::new();
        loop {
            let attempt = self.open(&mut sub, &mut proxies, &mut internal);
            tokio::select! {
                () = &mut stopped => return,
                r = attempt => match r {
                    Ok(()) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "engine socket not ready; retrying");
                        tokio::select! {
                            () = &mut stopped => return,
                            () = sleep(RETRY) => {}
                        }
                    }
                },
            }
        }
        let replay_address = match &self.spec.replay_endpoint {
            None => None,
            Some(endpoint) => {
                match guard::connect_proxy(endpoint.clone(), self.proxy_options()).await {
                    Ok(proxy) => {
                        let local = proxy.local.clone();
                        proxies.push(proxy);
                        Some(local)
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "cannot start the replay proxy; publisher not ingested");
                        return;
                    }
                }
            }
        };
        if let Err(e) = sub.subscribe(&self.spec.topic).await {
            tracing::error!(error = %e, "subscribe failed; publisher not ingested");
            return;
        }
        tracing::info!(mode = ?self.spec.mode, "engine publisher subscribed");

        let s = &self.decoder.settings;
        let config = SequenceConfig {
            max_buffered_batches: s.max_buffered_batches,
            replay_available: self.spec.replay_endpoint.is_some(),
        };
        let sequence = match self.resume {
            Some((last, identity)) => {
                tracing::info!(
                    sequence = last,
                    "resuming engine publisher after restored sequence {last}; the first connection verifies it"
                );
                PublisherSequence::resume(config, last, identity)
            }
            None => PublisherSequence::new(config),
        };
        let mut state = Run {
            sequence,
            generation: 0,
            replay: None,
            kind: None,
            deadline: None,
            log: log_limit(),
            settle_at: None,
            settle_failures: 0,
        };
        let (replay_tx, mut replay_rx) = mpsc::channel::<(u64, ReplayMsg)>(1024);
        let connected = self
            .decoder
            .metrics
            .connected
            .with_label_values(&self.decoder.id.labels());
        let verify_idle = self.decoder.settings.verify_idle;
        let mut quiet_since = Instant::now();
        loop {
            let deadline = state.deadline;
            let idle_at = verify_idle.map(|d| quiet_since + d);
            let settle_at = state.settle_at;
            let actions = tokio::select! {
                biased;
                () = &mut stopped => break,
                event = monitor.next() => match event {
                    Some(SocketEvent::Connected(..) | SocketEvent::Accepted(..)) => {
                        connected.inc();
                        state.sequence.connected()
                    }
                    Some(SocketEvent::Disconnected(_)) => {
                        connected.set((connected.get() - 1).max(0));
                        state.sequence.disconnected()
                    }
                    Some(_) => continue,
                    None => {
                        tracing::error!("the SUB socket's monitor ended; publisher not ingested");
                        break;
                    }
                },
                Some((generation, msg)) = replay_rx.recv() => {
                    if generation != state.generation {
                        continue; // a replay already given up
                    }
                    // The deadline is for a replay that stops progressing, not for a long one.
                    state.deadline = Some(Instant::now() + self.decoder.settings.replay_timeout);
                    match msg {
                        ReplayMsg::Read(read) => state.sequence.take(read),
                        ReplayMsg::Failed(why) => {
                            tracing::warn!(%why, "replay socket failed");
                            state.sequence.replay_failed(ReplayFailure::Transport)
                        }
                    }
                }
                () = sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                    state.sequence.replay_failed(ReplayFailure::Timeout)
                }
                // A replay failed a while ago and no re-read has completed since: check again
                // even if the engine is busy (an idle one is checked below anyway).
                () = sleep_until(settle_at.unwrap_or_else(Instant::now)), if settle_at.is_some() => {
                    state.settle_at = None;
                    state.sequence.idle()
                }
                // Silent for a while: the connection may be dead while it looks open.
                () = sleep_until(idle_at.unwrap_or_else(Instant::now)), if idle_at.is_some() => {
                    quiet_since = Instant::now();
                    state.sequence.idle()
                }
                msg = sub.recv() => match msg {
                    Ok(msg) => {
                        quiet_since = Instant::now();
                        self.live(msg, &mut state)
                    }
                    // No peer at all (zeromq's queue is empty): wait instead of spinning.
                    Err(zeromq::ZmqError::NoMessage) => {
                        sleep(RETRY).await;
                        continue;
                    }
                    // One peer's stream failed (closed in the middle of a frame, a codec
                    // error): zeromq has already dropped that peer, the socket and its other
                    // peers are fine. Counted and logged (rate-limited) as malformed input and
                    // the loop goes on at once: sleeping here let a peer that keeps breaking
                    // off mid-frame stall ingestion and pile up zeromq's dead connections.
                    Err(e) => {
                        self.decoder.error("zmtp_peer_error", &format_args!("{e}; that connection was dropped"), &state.log);
                        continue;
                    }
                },
            };
            if self
                .execute(actions, &mut state, &replay_tx, replay_address.as_deref())
                .await
                .is_err()
            {
                break;
            }
            state.schedule_settle(verify_idle);
        }
        if let Some(task) = state.replay.take() {
            task.abort();
        }
        connected.set(0);
    }

    /// Connects or binds the SUB socket behind a [`guard`] proxy (see that module for why).
    /// In bind mode zeromq listens on a [`guard::PrivateIpc`] socket, made once into
    /// `internal` (a retry after the public endpoint failed to bind reuses it).
    async fn open(
        &self,
        sub: &mut zeromq::SubSocket,
        proxies: &mut Vec<guard::Proxy>,
        internal: &mut Option<guard::PrivateIpc>,
    ) -> Result<(), String> {
        match self.spec.mode {
            SocketMode::Connect => {
                if proxies.is_empty() {
                    let proxy =
                        guard::connect_proxy(self.spec.endpoint.clone(), self.proxy_options())
                            .await
                            .map_err(|e| format!("loopback proxy: {e}"))?;
                    proxies.push(proxy);
                }
                sub.connect(&proxies[0].local)
                    .await
                    .map_err(|e| e.to_string())
            }
            SocketMode::Bind => {
                let internal = match internal {
                    Some(ipc) => ipc,
                    None => internal.insert(bind_internal(sub).await?),
                };
                let proxy = guard::bind_proxy(
                    &self.spec.endpoint,
                    internal.endpoint().clone(),
                    self.proxy_options(),
                )
                .await
                .map_err(|e| format!("bind {}: {e}", self.spec.endpoint))?;
                proxies.push(proxy);
                Ok(())
            }
        }
    }

    /// What the proxies let through: frames up to twice `engine.max_frame_bytes` still reach
    /// the decoder, which drops and counts those above the setting (keeping their sequence, so
    /// no gap); only beyond that is the connection closed before the frame is read.
    fn zmtp_limits(&self) -> ZmtpLimits {
        let max = u64::try_from(self.decoder.settings.intake.max_message_bytes).unwrap_or(u64::MAX);
        ZmtpLimits::for_engine(max.saturating_mul(2))
    }

    /// A proxy's options: [`Self::zmtp_limits`], the default connection limit and handshake
    /// deadline; a violation is counted as a decode error of its kind, a dropped connection in
    /// `connections_dropped{reason}`; both are logged (one rate limit per proxy).
    fn proxy_options(&self) -> guard::ProxyOptions {
        let log = Arc::new(log_limit());
        let decoder = self.decoder.clone();
        let violation_log = Arc::clone(&log);
        let on_violation = Arc::new(move |v: &ZmtpViolation| {
            decoder.error(
                v.kind(),
                &format_args!("{v}; connection closed"),
                &violation_log,
            );
        });
        let decoder = self.decoder.clone();
        let on_dropped = Arc::new(move |d: guard::Dropped| {
            let [p, e] = decoder.id.labels();
            let reason = d.reason();
            decoder
                .metrics
                .connections_dropped
                .with_label_values(&[p, e, reason])
                .inc();
            if let Some(suppressed) = log.admit() {
                tracing::warn!(publisher = p, endpoint = e, reason, detail = %d, suppressed, "engine connection closed");
            }
        });
        guard::ProxyOptions::new(self.zmtp_limits(), on_violation, on_dropped)
    }

    fn live(&self, msg: ZmqMessage, state: &mut Run) -> Vec<Action<Batch>> {
        let [p, e] = self.decoder.id.labels();
        let m = &self.decoder.metrics;
        m.batches.with_label_values(&[p, e]).inc();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        m.last_batch_timestamp
            .with_label_values(&[p, e])
            .set(i64::try_from(now).unwrap_or(i64::MAX));
        let read = self.decoder.read(&msg.into_vec(), false, &state.log);
        state.sequence.take(read)
    }

    async fn execute(
        &self,
        actions: Vec<Action<Batch>>,
        state: &mut Run,
        replay_tx: &mpsc::Sender<(u64, ReplayMsg)>,
        replay_address: Option<&str>,
    ) -> Result<(), crate::error::ActorGone> {
        let id = &self.decoder.id;
        let [p, e] = id.labels();
        let m = &self.decoder.metrics;
        for action in actions {
            match action {
                Action::Apply {
                    sequence,
                    batch,
                    replayed,
                } => {
                    if replayed {
                        m.replayed_batches.with_label_values(&[p, e]).inc();
                        if state.kind == Some(ReplayKind::Reread) {
                            m.reread_batches.with_label_values(&[p, e]).inc();
                        }
                    }
                    // An undecodable batch only took its sequence number; it never reaches
                    // the actor (a restarted producer may ask for it again: no harm).
                    if let Some(batch) = batch {
                        self.actor
                            .tell(Command::Engine {
                                publisher: id.clone(),
                                step: EngineStep::Apply { sequence, batch },
                            })
                            .await?;
                    }
                }
                Action::Duplicate { .. } => {}
                Action::Foreign { sequence } => {
                    m.foreign_batches.with_label_values(&[p, e]).inc();
                    tracing::warn!(
                        sequence,
                        "a live batch the engine's replay buffer does not hold was dropped (another publisher on this endpoint?)"
                    );
                }
                Action::Gap { expected, received } => {
                    m.gaps.with_label_values(&[p, e]).inc();
                    tracing::info!(expected, received, "engine sequence gap");
                }
                Action::Uncertain { cause } => {
                    m.uncertain.with_label_values(&[p, e, cause.label()]).inc();
                    // The idle check is routine (every `engine.verify_idle_ms` of silence);
                    // what it finds (a clear, a failed replay) is logged at WARN.
                    if cause == Uncertainty::Idle {
                        tracing::debug!(
                            cause = cause.label(),
                            "engine publisher idle; verifying it"
                        );
                    } else {
                        tracing::info!(
                            cause = cause.label(),
                            "engine publisher uncertain; checking it against its replay buffer"
                        );
                    }
                }
                Action::Verified { sequence } => {
                    m.replays.with_label_values(&[p, e, "verified"]).inc();
                    tracing::debug!(sequence, "the replay confirmed the last applied batch");
                }
                Action::RequestReplay { from, kind } => {
                    m.replays.with_label_values(&[p, e, "requested"]).inc();
                    state.end_replay();
                    state.kind = Some(kind);
                    tracing::debug!(from, kind = kind.label(), "replay requested");
                    let Some(endpoint) = replay_address else {
                        continue; // unreachable: replay_available is false without one
                    };
                    state.deadline = Some(Instant::now() + self.decoder.settings.replay_timeout);
                    state.replay = Some(tokio::spawn(replay(
                        state.generation,
                        from,
                        endpoint.to_owned(),
                        self.decoder.clone(),
                        replay_tx.clone(),
                    )));
                }
                Action::ReplayFilled { from } => {
                    m.replays.with_label_values(&[p, e, "filled"]).inc();
                    tracing::debug!(from, "replay done");
                    state.end_replay();
                }
                Action::ReplayFailed { from, reason } => {
                    m.replays.with_label_values(&[p, e, "failed"]).inc();
                    tracing::warn!(from, reason = reason.label(), "replay failed");
                    state.end_replay();
                }
                Action::ClearMembers { reason } => {
                    tracing::warn!(
                        reason = reason.label(),
                        "clearing this publisher's members (their state is uncertain)"
                    );
                    self.actor
                        .tell(Command::Engine {
                            publisher: id.clone(),
                            step: EngineStep::Clear(reason),
                        })
                        .await?;
                }
            }
        }
        Ok(())
    }
}

/// The task's mutable state between events.
struct Run {
    sequence: PublisherSequence<Batch>,
    /// Replies tagged with an older generation belong to an abandoned replay.
    generation: u64,
    replay: Option<JoinHandle<()>>,
    /// What the replay in flight is for.
    kind: Option<ReplayKind>,
    deadline: Option<Instant>,
    log: LogThrottle,
    /// When to check an unsettled publisher again ([`PublisherSequence::unsettled`]).
    settle_at: Option<Instant>,
    /// Failed checks in a row while unsettled: each doubles the wait (up to
    /// [`MAX_SETTLE_DOUBLINGS`] times), so a replay socket that stays broken costs a clear
    /// every few minutes, not every interval.
    settle_failures: u32,
}

/// How many times the wait before re-checking an unsettled publisher doubles.
const MAX_SETTLE_DOUBLINGS: u32 = 4;

impl Run {
    /// Arms (or disarms) the next check of an unsettled publisher: `engine.verify_idle_ms`
    /// after a failed replay, doubling with each failure in a row. Without an idle interval
    /// an unsettled publisher is re-read at its next connection only.
    fn schedule_settle(&mut self, verify_idle: Option<Duration>) {
        let waiting = self.settle_at.is_some() || self.replay.is_some();
        match verify_idle {
            Some(interval) if self.sequence.unsettled() && !waiting => {
                let wait = interval * (1 << self.settle_failures.min(MAX_SETTLE_DOUBLINGS));
                self.settle_failures += 1;
                self.settle_at = Some(Instant::now() + wait);
            }
            _ if !self.sequence.unsettled() => {
                self.settle_failures = 0;
                self.settle_at = None;
            }
            _ => {}
        }
    }

    fn end_replay(&mut self) {
        self.generation += 1;
        self.kind = None;
        self.deadline = None;
        if let Some(task) = self.replay.take() {
            task.abort();
        }
    }
}

/// Binds `sub` to a new [`guard::PrivateIpc`] socket, so no TCP port is opened for zeromq.
///
/// # Errors
/// The directory cannot be made (or its path is too long), or zeromq cannot bind; the text
/// names the path.
async fn bind_internal(sub: &mut zeromq::SubSocket) -> Result<guard::PrivateIpc, String> {
    let ipc = guard::PrivateIpc::create().map_err(|e| e.to_string())?;
    let endpoint = ipc.endpoint().to_string();
    sub.bind(&endpoint)
        .await
        .map_err(|e| format!("zeromq's internal listener {endpoint}: {e}"))?;
    Ok(ipc)
}

/// One replay: DEALER connect, request `[b"", from as 8 bytes BE]`, forward every reply until
/// the end marker. The ROUTER prefixes each reply with an empty delimiter part.
async fn replay(
    generation: u64,
    from: i64,
    endpoint: String,
    decoder: Decoder,
    tx: mpsc::Sender<(u64, ReplayMsg)>,
) {
    let log = log_limit();
    let result: Result<(), String> = async {
        let mut dealer = zeromq::DealerSocket::new();
        dealer
            .connect(&endpoint)
            .await
            .map_err(|e| format!("connect {endpoint}: {e}"))?;
        let mut request = ZmqMessage::from(Bytes::new());
        request.push_back(Bytes::copy_from_slice(&from.to_be_bytes()));
        dealer
            .send(request)
            .await
            .map_err(|e| format!("send: {e}"))?;
        loop {
            let msg = dealer.recv().await.map_err(|e| format!("receive: {e}"))?;
            let mut parts = msg.into_vec();
            if parts.len() >= 3 && parts[0].is_empty() {
                parts.remove(0);
            }
            let read = decoder.read(&parts, true, &log);
            if read.sequence.is_none() {
                return Err("a reply is not an engine message".into());
            }
            let done = read.replay_end;
            if tx.send((generation, ReplayMsg::Read(read))).await.is_err() || done {
                return Ok(());
            }
        }
    }
    .await;
    if let Err(why) = result {
        let _ = tx.send((generation, ReplayMsg::Failed(why))).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::config::Endpoint;

    #[tokio::test]
    async fn bind_mode_gives_zeromq_a_private_ipc_socket_and_no_tcp_port() {
        use std::os::unix::fs::PermissionsExt;
        let mut sub = zeromq::SubSocket::new();
        let ipc = bind_internal(&mut sub).await.unwrap();
        let Endpoint::Ipc(path) = ipc.endpoint().clone() else {
            panic!("zeromq's internal endpoint is not ipc: {}", ipc.endpoint());
        };
        let dir = ipc.dir().to_owned();
        assert!(std::path::Path::new(&path).starts_with(&dir));
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "mode {mode:o}");
        // zeromq listens there and answers with its ZMTP greeting.
        let mut s = tokio::net::UnixStream::connect(&path).await.unwrap();
        let mut first = [0u8; 1];
        tokio::io::AsyncReadExt::read_exact(&mut s, &mut first)
            .await
            .unwrap();
        assert_eq!(first[0], 0xff, "a ZMTP signature");
        // zeromq has no other listener (so no TCP one).
        assert_eq!(sub.binds().len(), 1);
        assert!(
            sub.binds()
                .keys()
                .all(|e| matches!(e, zeromq::Endpoint::Ipc(_))),
            "{:?}",
            sub.binds().keys().collect::<Vec<_>>()
        );
        drop(s);
        drop(sub);
        drop(ipc);
        assert!(!dir.exists(), "the private directory is removed");
    }
}
