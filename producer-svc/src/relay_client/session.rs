//! One attachment to one indexer: connect -> Attach -> LeaseGranted -> barrier snapshot ->
//! deltas and heartbeats -> (drain marker -> drained Ack) or a failure.
//!
//! The session never decides what to publish: the state actor queues frames
//! ([`Outbound`]) and this task only encodes, chunks and sends them, reads the indexer's
//! replies and keeps the stream alive with heartbeats. Every way a session can end is a
//! [`SessionEnd`]; the attach loop ([`super::attach_loop`]) turns failures into a fence, a backoff
//! and a new attachment. The terms of the lease and when the snapshot counts as installed are
//! `ckf_core::relay_session`'s rules.

use std::collections::VecDeque;
use std::time::Duration;

use ckf_core::fanout::{AttachRefused, Outbound};
use ckf_core::global::AttachMode;
use ckf_core::identity::LaneLease;
use ckf_core::publication::FenceReason;
use ckf_core::relay_session::{
    AckEffect, Granted, LeaseTerms, LocalLimits, SessionFailure, StreamProgress,
};
use ckf_proto::convert::WIRE_BYTES_PER_IMAGE;
use ckf_proto::metadata::{ATTACH_REFUSED_KEY, ATTACH_REFUSED_OCCUPIED};
use ckf_proto::v1;
use ckf_proto::v1::relay_client::RelayClient;
use ckf_proto::v1::relay_frame::Frame;
use ckf_proto::v1::relay_reply::Reply;
use ckf_svc_kit::errors::error_chain;
use prost::Message;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use super::attachment::IndexerAttachment;
use crate::actor::Command;
use crate::metrics::AttachmentState;

/// Request frames buffered toward the transport before a send waits.
const REQUEST_BUFFER: usize = 16;

/// [`Failure::label`] of an `IF_VACANT` attach refused because another live producer holds
/// the lane (`FAILED_PRECONDITION` with metadata `ckf-attach-refused: occupied`).
pub const LANE_OCCUPIED: &str = "lane_occupied";

/// Unacknowledged batches remembered for the change-to-ack histogram.
const MAX_UNACKED_SAMPLES: usize = 4_096;

/// How a session ended.
#[derive(Debug)]
pub enum SessionEnd {
    /// The indexer acknowledged the drain marker: `sequence` is installed.
    Drained {
        /// The final sequence.
        sequence: u64,
    },
    /// Shutdown: the drain marker was sent but not acknowledged in time (or the stream ended).
    DrainUnacknowledged {
        /// The drain marker's sequence.
        sequence: u64,
        /// What happened instead.
        why: String,
    },
    /// Shutdown while not streaming (or the actor had no marker for this attachment).
    Shutdown,
    /// The attachment failed; reconnect.
    Failed(Failure),
}

/// A failed attachment: what to log and count, and how to fence the publisher (the fence
/// reason's `Disposition` decides the recovery, see [`super`]).
#[derive(Debug)]
pub struct Failure {
    /// Metric label (`reason`), a small fixed set.
    pub label: &'static str,
    /// Human-readable detail for the log.
    pub detail: String,
    /// The lease held, if one was granted (the actor fences that publisher).
    pub lease: Option<LaneLease>,
    /// How the publisher is fenced.
    pub fence: FenceReason,
    /// Whether the snapshot was installed before the failure (resets the backoff).
    pub was_streaming: bool,
    /// Whether the indexer must have retired this attachment for silence: it said so
    /// (`Retired(HEARTBEAT_TIMEOUT)`), or this process did not run for at least the indexer's
    /// heartbeat deadline during the session (SIGSTOP, a frozen VM: [`super::stall_watch`];
    /// waiting on the indexer's flow control is not silence).
    /// Another producer may hold the lane since, so the next attach must not take it over.
    pub outlived_deadline: bool,
}

impl Failure {
    /// The facts the attach policy decides on.
    pub fn as_session_failure(&self) -> SessionFailure {
        SessionFailure {
            lane_occupied: self.label == LANE_OCCUPIED,
            leased: self.lease.is_some(),
            outlived_deadline: self.outlived_deadline,
            fence: self.fence,
            was_streaming: self.was_streaming,
        }
    }
}

fn fail(label: &'static str, detail: impl Into<String>) -> Failure {
    Failure {
        label,
        detail: detail.into(),
        lease: None,
        fence: FenceReason::UncertainDelivery,
        was_streaming: false,
        outlived_deadline: false,
    }
}

/// The granted lease and the terms of the session under it.
struct Grant {
    lease: LaneLease,
    terms: LeaseTerms,
}

/// An open stream: the request sender and the reply stream.
struct Stream {
    requests: mpsc::Sender<v1::RelayFrame>,
    replies: Streaming<v1::RelayReply>,
    /// How long one frame may wait for room before the session fails (`send_stalled`):
    /// [`LeaseTerms::send_timeout`], or the connect timeout before a lease.
    send_timeout: Duration,
}

impl IndexerAttachment {
    /// Runs one attachment in `mode` until it ends. A standby attempt leaves the exported
    /// state at `standby` until a lease is granted.
    pub(super) async fn session(&self, mode: AttachMode, standby: bool) -> SessionEnd {
        match self.connect_and_attach(mode, standby).await {
            Ok((stream, grant)) => {
                if mode == AttachMode::IfVacant {
                    tracing::info!("the lane is vacant: attached IF_VACANT");
                }
                self.attached(stream, grant).await
            }
            Err(end) => end,
        }
    }

    fn set_state_unless(&self, standby: bool, state: AttachmentState) {
        if !standby {
            self.set_state(state);
        }
    }

    async fn connect_and_attach(
        &self,
        mode: AttachMode,
        standby: bool,
    ) -> Result<(Stream, Grant), SessionEnd> {
        let s = &self.settings;
        self.set_state_unless(standby, AttachmentState::Connecting);
        tracing::debug!("connecting");
        let tls = s.tls.as_ref().map(ckf_svc_kit::tls::ClientTls::reloaded);
        let endpoint = ckf_svc_kit::tls::endpoint(&self.endpoint, tls.as_ref(), false)
            .map_err(|e| SessionEnd::Failed(fail("connect_failed", error_chain(&e))))?
            .connect_timeout(s.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(s.keepalive)
            .keep_alive_timeout(s.keepalive)
            .keep_alive_while_idle(true);
        let channel = tokio::select! {
            () = self.shutdown.wait() => return Err(SessionEnd::Shutdown),
            c = timeout(s.connect_timeout, endpoint.connect()) => match c {
                Ok(Ok(channel)) => channel,
                Ok(Err(e)) => return Err(SessionEnd::Failed(fail("connect_failed", error_chain(&e)))),
                Err(_) => return Err(SessionEnd::Failed(fail("connect_failed", "connect timed out"))),
            },
        };
        let mut client = RelayClient::new(channel)
            .max_decoding_message_size(s.max_message_bytes)
            .max_encoding_message_size(s.max_message_bytes);
        let (requests, rx) = mpsc::channel(REQUEST_BUFFER);
        let mut attach: v1::Attach = (&self.identity).into();
        attach.mode = v1::AttachMode::from(mode) as i32;
        let attach = v1::RelayFrame::from(Frame::Attach(attach));
        requests
            .send(attach)
            .await
            .map_err(|_| SessionEnd::Failed(fail("stream_error", "request stream closed")))?;
        self.set_state_unless(standby, AttachmentState::AwaitingLease);
        tracing::debug!(mode = mode.as_str(), "attach sent; awaiting the lease");
        let deadline = Instant::now() + s.connect_timeout;
        let token = s.indexer_token.get();
        let call = async {
            let request = tonic::Request::new(ReceiverStream::new(rx));
            let request = ckf_svc_kit::access::with_bearer(request, (*token).as_ref());
            let mut replies = client.publish(request).await?.into_inner();
            let first = replies.message().await?;
            Ok::<_, tonic::Status>((replies, first))
        };
        let (replies, first) = tokio::select! {
            () = self.shutdown.wait() => return Err(SessionEnd::Shutdown),
            r = tokio::time::timeout_at(deadline, call) => match r {
                Err(_) => return Err(SessionEnd::Failed(fail("lease_timeout", "no LeaseGranted within the connect timeout"))),
                Ok(Err(status)) if is_occupied(&status) => return Err(SessionEnd::Failed(fail(
                    LANE_OCCUPIED,
                    status.message(),
                ))),
                Ok(Err(status)) if is_transport_failure(&status) => return Err(SessionEnd::Failed(fail(
                    "transport_error",
                    format!(
                        "the connection failed before any gRPC reply: {}{}",
                        error_chain(&status),
                        transport_hint(&self.endpoint, tls.as_ref().is_some_and(ckf_svc_kit::tls::ClientTls::has_client_certificate)),
                    ),
                ))),
                Ok(Err(status)) => return Err(SessionEnd::Failed(fail(
                    "attach_refused",
                    format!("indexer refused the attachment: {:?}: {}", status.code(), status.message()),
                ))),
                Ok(Ok(r)) => r,
            },
        };
        let granted = match first.and_then(|r| r.reply) {
            Some(Reply::LeaseGranted(g)) => g,
            Some(Reply::Retired(r)) => return Err(SessionEnd::Failed(retired(&r, None, false))),
            Some(Reply::Ack(_)) => {
                return Err(SessionEnd::Failed(fail(
                    "protocol_error",
                    "Ack before LeaseGranted",
                )));
            }
            None => {
                return Err(SessionEnd::Failed(fail(
                    "stream_ended",
                    "indexer ended the stream before granting a lease",
                )));
            }
        };
        let grant = self.grant(granted).map_err(SessionEnd::Failed)?;
        let send_timeout = grant.terms.send_timeout;
        Ok((
            Stream {
                requests,
                replies,
                send_timeout,
            },
            grant,
        ))
    }

    fn grant(&self, g: v1::LeaseGranted) -> Result<Grant, Failure> {
        let lease = g
            .lease
            .ok_or_else(|| fail("protocol_error", "LeaseGranted.lease is missing"))
            .and_then(|l| {
                LaneLease::try_from(l)
                    .map_err(|e| fail("protocol_error", format!("LeaseGranted: {e}")))
            })?;
        let s = &self.settings;
        let granted = Granted {
            max_message_bytes: g.max_message_bytes,
            max_images_per_delta: g.max_images_per_delta,
            heartbeat_deadline_ms: g.heartbeat_deadline_ms,
            accepts_load: g.accepts_load,
        };
        let local = LocalLimits {
            max_message_bytes: s.max_message_bytes,
            heartbeat_interval: s.heartbeat_interval,
            connect_timeout: s.connect_timeout,
            bytes_per_image: WIRE_BYTES_PER_IMAGE,
        };
        Ok(Grant {
            lease,
            terms: LeaseTerms::derive(granted, local),
        })
    }

    async fn attached(&self, mut stream: Stream, grant: Grant) -> SessionEnd {
        let (lease, terms) = (grant.lease, grant.terms);
        tracing::Span::current().record("lease", tracing::field::display(lease));
        tracing::info!(
            max_images_per_delta = terms.limits.max_images_per_delta,
            chunk_bytes = terms.chunk_bytes,
            heartbeat_ms = terms.heartbeat.as_millis() as u64,
            "lease granted"
        );
        if let Some(deadline) = terms.deadline {
            let outlasts = ckf_core::cadence::backed_up_queue_lasts(
                self.settings.attachment_queue,
                ckf_core::cadence::BACKED_UP_INTERVAL,
            );
            if outlasts < deadline {
                tracing::warn!(
                    attachment_queue = self.settings.attachment_queue,
                    outlasts_ms = outlasts.as_millis() as u64,
                    heartbeat_deadline_ms = deadline.as_millis() as u64,
                    "publication.attachment_queue fills before this indexer's heartbeat deadline \
                     if the indexer stalls: a shorter stall can cost the lane; raise it"
                );
            }
        }
        let (frames_tx, mut frames) = mpsc::channel(self.settings.attachment_queue);
        let attached = self
            .actor
            .ask(|reply| Command::Attach {
                endpoint: self.index,
                lease,
                limits: terms.limits,
                frames: frames_tx,
                reply,
            })
            .await;
        match attached {
            Ok(Ok(sequence)) => {
                tracing::info!(sequence, "sending barrier snapshot");
            }
            Ok(Err(AttachRefused::ShuttingDown)) | Err(_) => return SessionEnd::Shutdown,
            Ok(Err(e)) => {
                let mut f = fail("attach_refused", format!("producer refused the lease: {e}"));
                f.lease = Some(lease);
                return SessionEnd::Failed(f);
            }
        }
        self.set_state(AttachmentState::Snapshotting);

        let mut last_sequence = 0u64;
        let mut progress = StreamProgress::default();
        let mut in_flight: VecDeque<(u64, std::time::Instant)> = VecDeque::new();
        let mut draining: Option<(u64, Instant)> = None;
        let mut idle_since = Instant::now();
        // Load reports: only to an indexer that takes them, never while draining; they do not
        // stand in for heartbeats (the lane's deadline counts the frames its ingestor sees).
        let mut load_at = terms
            .load_reports
            .then(|| Instant::now() + self.settings.load_interval);
        let mut load_sequence = 0u64;
        // Whether this process itself stalled during the session is the stall watch's to say
        // (waiting on the indexer's flow control is not this producer's silence).
        let started = std::time::Instant::now();
        let end = loop {
            let heartbeat_at = idle_since + terms.heartbeat;
            let drain_deadline = draining.map(|(_, at)| at);
            tokio::select! {
                frame = frames.recv(), if draining.is_none() => {
                    let result = match frame {
                        Some(Outbound::Snapshot(snapshot)) => {
                            last_sequence = snapshot.sequence;
                            progress.snapshot_sent(snapshot.sequence);
                            let mut r = Ok(());
                            for chunk in ckf_proto::convert::snapshot_to_wire(&snapshot, terms.chunk_bytes) {
                                r = self.send(&stream, Frame::SnapshotChunk(chunk)).await;
                                if r.is_err() { break; }
                                self.metrics.snapshot_chunks_sent.with_label_values(&[&self.endpoint]).inc();
                            }
                            if r.is_ok() {
                                self.metrics.snapshots_sent.with_label_values(&[&self.endpoint]).inc();
                            }
                            r
                        }
                        Some(Outbound::Deltas(deltas, oldest)) => {
                            let mut r = Ok(());
                            for delta in &deltas {
                                last_sequence = delta.sequence;
                                r = self.send(&stream, Frame::Delta(delta.into())).await;
                                if r.is_err() { break; }
                                self.metrics.deltas_sent.with_label_values(&[&self.endpoint]).inc();
                            }
                            if let Some(last) = deltas.last() {
                                // Bounded: an indexer that never acknowledges costs samples, not memory.
                                if in_flight.len() == MAX_UNACKED_SAMPLES {
                                    in_flight.pop_front();
                                }
                                in_flight.push_back((last.sequence, oldest));
                            }
                            r
                        }
                        Some(Outbound::Drain(marker)) => {
                            let r = self.send(&stream, Frame::DrainMarker((&marker).into())).await;
                            if r.is_ok() {
                                self.metrics.drain_markers_sent.with_label_values(&[&self.endpoint]).inc();
                                self.set_state(AttachmentState::Draining);
                                // The message is matched by the e2e tests (tests/): keep it stable.
                                tracing::info!(sequence = marker.sequence, "drain marker sent");
                                draining = Some((marker.sequence, Instant::now() + self.settings.drain_timeout));
                            }
                            r
                        }
                        None if self.shutdown.is_triggered() => break SessionEnd::Shutdown,
                        None => Err(fail(
                            "fenced_by_producer",
                            "the producer fenced this attachment (its frame queue overflowed or a delta was refused)",
                        )),
                    };
                    if let Err(f) = result {
                        break SessionEnd::Failed(f);
                    }
                    idle_since = Instant::now();
                }
                reply = stream.replies.message() => {
                    let reply = match reply {
                        Ok(Some(r)) => r.reply,
                        Ok(None) => {
                            break match draining {
                                Some((sequence, _)) => SessionEnd::DrainUnacknowledged {
                                    sequence,
                                    why: "the indexer ended the stream without a drained Ack".into(),
                                },
                                None => SessionEnd::Failed(fail("stream_ended", "the indexer ended the stream")),
                            };
                        }
                        Err(status) => {
                            // The transport's own words when it closed the stream: a GOAWAY
                            // names its reason, debug data and which side sent it.
                            let detail = match ckf_svc_kit::transport::http2::transport_cause(&status) {
                                Some(cause) => format!("stream failed: {:?}: {} ({cause})", status.code(), status.message()),
                                None => format!("stream failed: {:?}: {}", status.code(), status.message()),
                            };
                            break match draining {
                                Some((sequence, _)) => SessionEnd::DrainUnacknowledged { sequence, why: detail },
                                None => SessionEnd::Failed(fail("stream_error", detail)),
                            };
                        }
                    };
                    match reply {
                        Some(Reply::Ack(ack)) => {
                            self.metrics.acked_sequence.with_label_values(&[&self.endpoint])
                                .set(i64::try_from(ack.installed_sequence).unwrap_or(i64::MAX));
                            while in_flight.front().is_some_and(|(s, _)| *s <= ack.installed_sequence) {
                                let (_, oldest) = in_flight.pop_front().expect("front exists");
                                self.metrics.change_to_ack_seconds.with_label_values(&[&self.endpoint])
                                    .observe(oldest.elapsed().as_secs_f64());
                            }
                            match progress.on_ack(ack.installed_sequence, ack.ready, ack.drained) {
                                AckEffect::Drained(sequence) => break SessionEnd::Drained { sequence },
                                AckEffect::SnapshotInstalled(sequence) => {
                                    if draining.is_none() {
                                        self.set_state(AttachmentState::Streaming);
                                    }
                                    tracing::info!(sequence, "snapshot installed; streaming deltas");
                                }
                                AckEffect::Progress => {}
                            }
                        }
                        Some(Reply::Retired(r)) => break SessionEnd::Failed(retired(&r, Some(lease), progress.streaming())),
                        Some(Reply::LeaseGranted(_)) => break SessionEnd::Failed(fail("protocol_error", "second LeaseGranted on one stream")),
                        None => break SessionEnd::Failed(fail("protocol_error", "empty RelayReply")),
                    }
                }
                () = sleep_until(load_at.unwrap_or_else(Instant::now)), if load_at.is_some() && draining.is_none() => {
                    load_at = Some(Instant::now() + self.settings.load_interval);
                    if let Some((pool, age)) = self.settings.load.pool() {
                        load_sequence += 1;
                        let report = ckf_proto::convert::load_to_wire(lease, load_sequence, &pool, age);
                        if let Err(f) = self.send(&stream, Frame::Load(report)).await {
                            break SessionEnd::Failed(f);
                        }
                        self.metrics.load_reports_sent.with_label_values(&[&self.endpoint]).inc();
                    }
                }
                () = sleep_until(heartbeat_at), if draining.is_none() => {
                    let beat = Frame::Heartbeat(v1::Heartbeat { lease: Some(lease.into()), sequence: last_sequence });
                    if let Err(f) = self.send(&stream, beat).await {
                        break SessionEnd::Failed(f);
                    }
                    self.metrics.heartbeats_sent.with_label_values(&[&self.endpoint]).inc();
                    idle_since = Instant::now();
                }
                () = sleep_until(drain_deadline.unwrap_or_else(Instant::now)), if drain_deadline.is_some() => {
                    let (sequence, _) = draining.expect("draining");
                    break SessionEnd::DrainUnacknowledged { sequence, why: "no drained Ack within the drain timeout".into() };
                }
            }
        };
        match end {
            SessionEnd::Failed(mut f) => {
                f.lease = Some(lease);
                f.was_streaming |= progress.streaming();
                let stalled = super::stall_watch::StallWatch::get().longest_since(started);
                f.outlived_deadline |= terms.outlived(stalled);
                SessionEnd::Failed(f)
            }
            other => other,
        }
    }

    /// Sends one frame, bounded by the stream's send timeout (the connect timeout, or the
    /// heartbeat deadline when longer) so a stalled indexer cannot hold the session (and the
    /// drain) forever.
    async fn send(&self, stream: &Stream, frame: Frame) -> Result<(), Failure> {
        let frame = v1::RelayFrame::from(frame);
        let bytes = frame.encoded_len() as u64;
        match timeout(stream.send_timeout, stream.requests.send(frame)).await {
            Ok(Ok(())) => {
                self.metrics
                    .sent_bytes
                    .with_label_values(&[&self.endpoint])
                    .inc_by(bytes);
                Ok(())
            }
            Ok(Err(_)) => Err(fail("stream_error", "the request stream closed")),
            Err(_) => Err(fail(
                "send_stalled",
                "a frame could not be sent within the timeout",
            )),
        }
    }
}

/// Whether `status` did not come from the indexer but from the transport under the call
/// (connection reset, HTTP/2 or TLS failure): tonic keeps the transport error as its source.
fn is_transport_failure(status: &tonic::Status) -> bool {
    std::error::Error::source(status).is_some()
}

/// What to add to a transport failure on `endpoint`: a plaintext indexer URL against an
/// indexer serving TLS, or a TLS connection without a client certificate to an indexer that
/// requires one, both look like a connection the server cut (under TLS 1.3 a refused client
/// certificate shows only as a broken pipe).
fn transport_hint(endpoint: &str, client_certificate: bool) -> &'static str {
    if !ckf_svc_kit::tls::is_https(endpoint) {
        " (this endpoint is plaintext http://: an indexer serving TLS looks like this; use an \
         https:// URL and [indexer_tls] ca_file)"
    } else if !client_certificate {
        " (no client certificate is configured: an indexer requiring one (tls.client_auth = \
         \"required\") looks like this; set [indexer_tls] cert_file and key_file, or have the \
         indexer use client_auth = \"optional\" for token-only producers)"
    } else {
        ""
    }
}

/// Whether `status` is an `IF_VACANT` refusal: the lane is held by another live producer.
fn is_occupied(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::FailedPrecondition
        && status
            .metadata()
            .get(ATTACH_REFUSED_KEY)
            .is_some_and(|v| v.as_bytes() == ATTACH_REFUSED_OCCUPIED.as_bytes())
}

/// A `Retired` reply as a failure.
fn retired(r: &v1::Retired, lease: Option<LaneLease>, was_streaming: bool) -> Failure {
    let reason = v1::RetireReason::try_from(r.reason).unwrap_or(v1::RetireReason::Unspecified);
    let label = match reason {
        v1::RetireReason::Unspecified => "retired_unspecified",
        v1::RetireReason::Gap => "retired_gap",
        v1::RetireReason::MalformedFrame => "retired_malformed_frame",
        v1::RetireReason::LagExceeded => "retired_lag_exceeded",
        v1::RetireReason::HeartbeatTimeout => "retired_heartbeat_timeout",
        v1::RetireReason::Saturated => "retired_saturated",
        v1::RetireReason::LostFinalDelta => "retired_lost_final_delta",
        v1::RetireReason::Superseded => "retired_superseded",
        v1::RetireReason::ApplyFailure => "retired_apply_failure",
        v1::RetireReason::StreamLost => "retired_stream_lost",
        v1::RetireReason::Shutdown => "retired_shutdown",
        v1::RetireReason::DrainGraceExpired => "retired_drain_grace_expired",
        v1::RetireReason::Removed => "retired_removed",
    };
    Failure {
        label,
        detail: format!(
            "lane retired by the indexer ({}): {}",
            reason.as_str_name(),
            r.detail
        ),
        lease,
        fence: FenceReason::from(reason),
        was_streaming,
        outlived_deadline: reason == v1::RetireReason::HeartbeatTimeout,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_failures_are_told_apart_from_indexer_refusals() {
        // A status the indexer sent (grpc-status in the reply) has no source.
        assert!(!is_transport_failure(&tonic::Status::failed_precondition(
            "format mismatch"
        )));
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let transport = tonic::Status::from_error(Box::new(reset));
        assert!(is_transport_failure(&transport));
        assert!(transport_hint("http://indexer:50051", false).contains("use an https:// URL"));
        assert!(
            transport_hint("https://indexer:50051", false)
                .contains("no client certificate is configured")
        );
        assert_eq!(transport_hint("https://indexer:50051", true), "");
    }

    #[test]
    fn a_heartbeat_timeout_retirement_outlived_the_deadline() {
        let r = |reason: v1::RetireReason| v1::Retired {
            reason: reason as i32,
            detail: String::new(),
        };
        assert!(retired(&r(v1::RetireReason::HeartbeatTimeout), None, true).outlived_deadline);
        assert!(!retired(&r(v1::RetireReason::Gap), None, true).outlived_deadline);
        assert!(!retired(&r(v1::RetireReason::Superseded), None, true).outlived_deadline);
    }
}
