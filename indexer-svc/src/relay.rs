//! `ckf.v1.Relay/Publish`: one producer attachment per stream, in the domain of the pool it
//! claims (`ckf_core::catalog::Catalog::for_pool`; a domain not served is `NOT_FOUND`).
//!
//! ```text
//! Attach -> the pool's domain -> GlobalCkfIndexer::attach -> Attachment (lease, incarnation, lane events) -> LeaseGranted
//! SnapshotChunk | Delta | Heartbeat | DrainMarker -> decode -> Attachment::check
//!            -> IngestionWorkers (lane's serialized ingestor) -> Attachment::outcome
//!            -> StreamVerdict -> Ack (activation, applied delta, drain) | Retired + status
//! ```
//! The handler only translates: it decodes wire frames ([`ckf_proto::convert`]), enforces the
//! transport limits (`max_images_per_delta`, checked before a delta is decoded so an oversized
//! one is never materialised; `max_message_bytes` is tonic's decoding limit), submits, and
//! turns ckf-core's [`StreamVerdict`]s into replies. Lane transitions that happen outside the
//! stream (heartbeat deadline, saturation, a newer attachment for the same pool) arrive through
//! the attachment's event subscription and end the stream the same way.
//!
//! The service acts on the [`Disposition`] of how a stream ended: a lane made uncertain (a
//! stream that broke at the transport or ended without an exact drain marker) is reported to
//! ckf-core ([`Attachment::stream_lost`]), which retires it as `StreamLost` unless the lease
//! was already superseded or retired. Failures become statuses in [`crate::status`] only.
//! Each session logs inside a `relay` span carrying its pool, lease and incarnation.

use ckf_svc_kit::throttle::{LogThrottle, REFUSAL_LOG_INTERVAL, peer_addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ckf_core::addressing::TableFormat;
use ckf_core::failure::{Disposed, Disposition};
use ckf_core::frames::Heartbeat;
use ckf_core::global::{AttachRequest, Attachment, ClaimedFormat, StreamVerdict};
use ckf_core::identity::ProducerIncarnation;
use ckf_core::lane::Frame;
use ckf_proto::convert::{self, LoadFrame};
use ckf_proto::v1::{
    self, relay_frame::Frame as WireFrame, relay_reply::Reply, relay_server::Relay,
};
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use crate::metrics::{LaneLabels, LaneMetrics};
use crate::state::{Domain, IndexerState, wire_kind};
use crate::status::{FrameError, RelayError};

/// How long a new stream may take to send `Attach` when no heartbeat deadline is configured.
const ATTACH_TIMEOUT_WITHOUT_DEADLINE: Duration = Duration::from_secs(30);
/// Replies buffered per stream before the handler waits for the producer to read them.
const REPLY_BUFFER: usize = 64;
/// How long the final `Retired` reply and status may wait for room in the reply buffer.
const TERMINAL_SEND_TIMEOUT: Duration = Duration::from_secs(1);
/// How long the request side is kept open (and read) after the final reply, so that reply is
/// not lost to an HTTP/2 stream reset triggered by dropping an unfinished request stream.
const TERMINAL_LINGER: Duration = Duration::from_secs(2);
/// How long the inbound side is read for its transport error once the reply stream closed.
const CLOSED_PROBE: Duration = Duration::from_millis(200);

/// Why the reply stream closed under the indexer: tonic drops it when the connection closes
/// (a `GOAWAY` either way, a reset) or the producer resets the stream, and the inbound side
/// then reports the transport's error (h2's, with the `GOAWAY`'s reason and debug data).
async fn replies_closed(inbound: &mut Streaming<v1::RelayFrame>) -> RelayError {
    match tokio::time::timeout(CLOSED_PROBE, inbound.message()).await {
        Ok(Err(status)) => FrameError::Transport(status).into(),
        _ => FrameError::RepliesClosed.into(),
    }
}

/// The Relay service.
#[derive(Debug, Clone)]
pub struct RelayService {
    shared: Arc<IndexerState>,
}

impl RelayService {
    /// A Relay service over the shared indexer state.
    pub fn new(shared: Arc<IndexerState>) -> Self {
        Self { shared }
    }
}

#[tonic::async_trait]
impl Relay for RelayService {
    type PublishStream = ReceiverStream<Result<v1::RelayReply, Status>>;

    async fn publish(
        &self,
        request: Request<Streaming<v1::RelayFrame>>,
    ) -> Result<Response<Self::PublishStream>, Status> {
        let shared = Arc::clone(&self.shared);
        let peer = peer_addr(&request);
        let refuse = |error: RelayError| {
            shared
                .metrics
                .attach_refused
                .with_label_values(&[error.code_label()])
                .inc();
            // Anyone who reaches the listener can trigger this line: at most one per interval,
            // with the count of those suppressed (the metric counts every one).
            // One limit per code: a flood of anonymous attempts must not hide the
            // PERMISSION_DENIED line of a real principal asking for another pool.
            let throttle = match error.code_label() {
                "unauthenticated" => &UNAUTHENTICATED_LOG,
                "permission_denied" => &DENIED_LOG,
                _ => &REFUSAL_LOG,
            };
            if let Some(suppressed) = throttle.admit() {
                tracing::warn!(%error, %peer, suppressed, "relay attachment refused");
            }
            error.status()
        };
        let credentials = ckf_svc_kit::access::credentials(&request);
        let mut inbound = request.into_inner();
        let attach = first_attach(&shared, &mut inbound).await.map_err(refuse)?;
        // `[auth]` decides before ckf-core sees the Attach: a refused one gets no lease and
        // cannot supersede the lane's holder.
        let principal = shared
            .access
            .authorize_attach(&credentials, &attach)
            .map_err(refuse)?;
        let request = attach_request(attach).map_err(refuse)?;
        let domain = shared
            .domains()
            .for_pool(&request.pool)
            .map_err(|error| {
                refuse(RelayError::Domain {
                    pool: request.pool.clone(),
                    error,
                })
            })?
            .clone();
        // The stream limit counts attached streams only: connections that never send `Attach`
        // must not lock honest producers out of their lanes (they time out on their own). Each
        // domain has its own, so one domain's streams cannot lock another's producers out.
        let permit = Arc::clone(&domain.relay_streams)
            .try_acquire_owned()
            .map_err(|_| {
                refuse(RelayError::TooManyStreams {
                    limit: shared.limits.max_relay_streams,
                })
            })?;
        let session =
            Session::attach(Arc::clone(&shared), domain, &request, credentials).map_err(refuse)?;
        let lease = session.attachment.lease();

        let (tx, rx) = mpsc::channel(REPLY_BUFFER);
        let granted = Reply::LeaseGranted(v1::LeaseGranted {
            lease: Some(lease.into()),
            max_message_bytes: shared.limits.max_message_bytes,
            max_images_per_delta: shared.limits.max_images_per_delta,
            heartbeat_deadline_ms: shared.heartbeat_deadline_ms,
            accepts_load: true,
        });
        // The channel is fresh and has room: this cannot wait.
        let _ = tx.send(Ok(granted.into())).await;
        let span = session.span();
        span.in_scope(|| tracing::info!(%principal, "attachment authorized"));
        tokio::spawn(session.run(inbound, tx, permit).instrument(span));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// The rate limits of "relay attachment refused" lines: `UNAUTHENTICATED`, `PERMISSION_DENIED`,
/// and every other refusal, each its own.
static UNAUTHENTICATED_LOG: LogThrottle = LogThrottle::new(REFUSAL_LOG_INTERVAL);
static DENIED_LOG: LogThrottle = LogThrottle::new(REFUSAL_LOG_INTERVAL);
static REFUSAL_LOG: LogThrottle = LogThrottle::new(REFUSAL_LOG_INTERVAL);

/// Reads the first frame, which must be `Attach`, within the heartbeat deadline.
async fn first_attach(
    shared: &IndexerState,
    inbound: &mut Streaming<v1::RelayFrame>,
) -> Result<v1::Attach, RelayError> {
    let timeout = match shared.heartbeat_deadline_ms {
        0 => ATTACH_TIMEOUT_WITHOUT_DEADLINE,
        ms => Duration::from_millis(ms),
    };
    let first = tokio::select! {
        () = shared.shutdown.wait() => return Err(RelayError::Shutdown),
        first = tokio::time::timeout(timeout, inbound.message()) => first,
    };
    match first {
        Err(_) => Err(RelayError::NoAttach {
            got: "nothing within the heartbeat deadline",
        }),
        Ok(Err(status)) => Err(RelayError::Frame(FrameError::Transport(status))),
        Ok(Ok(None)) => Err(RelayError::NoAttach {
            got: "end of stream",
        }),
        Ok(Ok(Some(frame))) => {
            shared.count_frame(&frame);
            match frame.frame {
                Some(WireFrame::Attach(attach)) => Ok(attach),
                Some(other) => Err(RelayError::NoAttach {
                    got: wire_kind(&other),
                }),
                None => Err(RelayError::NoAttach {
                    got: "an empty RelayFrame",
                }),
            }
        }
    }
}

/// The core attach request of a wire `Attach`. A producer format this build cannot even decode
/// is still a claim: ckf-core refuses it as a format mismatch naming both formats.
fn attach_request(attach: v1::Attach) -> Result<AttachRequest, RelayError> {
    let pool = convert::attach_pool(&attach).map_err(RelayError::BadAttach)?;
    let mode = convert::attach_mode(&attach).map_err(RelayError::BadAttach)?;
    let wire_format = attach.format.unwrap_or_default();
    let format = match TableFormat::try_from(wire_format) {
        Ok(format) => ClaimedFormat::Valid(format),
        Err(error) => ClaimedFormat::Unusable {
            shown: format!("{wire_format:?}"),
            problem: error.to_string(),
        },
    };
    Ok(AttachRequest {
        pool,
        incarnation: ProducerIncarnation(attach.incarnation),
        format,
        mode,
    })
}

/// One attached stream: its domain, ckf-core's attachment and the lane's metrics.
struct Session {
    shared: Arc<IndexerState>,
    domain: Arc<Domain>,
    /// The lane's metric labels.
    labels: LaneLabels,
    /// What the stream's request presented (checked again when a reload changes the grants).
    credentials: Result<ckf_core::access::Credentials, ckf_core::access::AccessError>,
    attachment: Attachment,
    metrics: LaneMetrics,
}

/// What the stream does next, from one verdict.
enum Step {
    /// Keep reading; send this reply first, if any.
    Continue(Option<v1::RelayReply>),
    /// Exact drain accepted: send the final Ack and end the stream with OK.
    Drained(v1::RelayReply),
}

fn ack(installed_sequence: u64, drained: bool) -> v1::RelayReply {
    Reply::Ack(v1::Ack {
        installed_sequence,
        ready: true,
        drained,
    })
    .into()
}

impl Session {
    /// Asks the domain's consumer (ckf-core) for an attachment.
    fn attach(
        shared: Arc<IndexerState>,
        domain: Arc<Domain>,
        request: &AttachRequest,
        credentials: Result<ckf_core::access::Credentials, ckf_core::access::AccessError>,
    ) -> Result<Self, RelayError> {
        let attachment = domain.indexer.attach(request)?;
        // The lane's load is this lease's from now on, never its predecessor's.
        let lease = attachment.lease();
        domain.router.lease_started(lease.lane, lease.epoch);
        // A lane that attaches serves a pool: it has labels.
        let labels = LaneLabels::of(&domain.indexer, attachment.lane())
            .expect("an attached lane serves a pool");
        let metrics = shared.metrics.lane(&labels);
        metrics.leases_granted.inc();
        Ok(Self {
            credentials,
            shared,
            domain,
            labels,
            attachment,
            metrics,
        })
    }

    /// The session's span: every log line of the stream carries its pool, lease and
    /// incarnation once.
    fn span(&self) -> tracing::Span {
        let a = &self.attachment;
        tracing::info_span!(
            "relay",
            pool = %a.pool(),
            lease = %a.lease(),
            incarnation = %a.incarnation(),
        )
    }

    /// Drives the stream until drain, retirement, supersession, breakage or shutdown.
    async fn run(
        self,
        mut inbound: Streaming<v1::RelayFrame>,
        tx: mpsc::Sender<Result<v1::RelayReply, Status>>,
        permit: OwnedSemaphorePermit,
    ) {
        let _permit = permit;
        tracing::info!("lease granted");
        self.shared.metrics.relay_streams.inc();
        let end = self.pump(&mut inbound, &tx).await;
        self.shared.metrics.relay_streams.dec();
        let linger = !matches!(&end, Err(error) if error.is_shutdown());
        match end {
            Ok(()) => tracing::info!("relay stream drained"),
            Err(error) => {
                // An uncertain lane is retired by ckf-core if this lease still holds it (a no-op
                // when the core already retired or superseded it).
                if error.disposition() == Disposition::RetireLane {
                    self.attachment.stream_lost(&self.domain.indexer, &error);
                }
                tracing::warn!(%error, "relay stream ended");
                // A producer that stopped reading replies must not hold this task.
                let terminal = async {
                    if let Some(reply) = error.retired_reply() {
                        let _ = tx.send(Ok(reply)).await;
                    }
                    let _ = tx.send(Err(error.status())).await;
                };
                let _ = tokio::time::timeout(TERMINAL_SEND_TIMEOUT, terminal).await;
            }
        }
        // Read and discard until the producer closes its side (it does once it has the final
        // reply), bounded, so the final reply reaches it before the stream is torn down.
        drop(tx);
        if linger {
            let discard = async { while let Ok(Some(_)) = inbound.message().await {} };
            let _ = tokio::time::timeout(TERMINAL_LINGER, discard).await;
        }
    }

    async fn pump(
        &self,
        inbound: &mut Streaming<v1::RelayFrame>,
        tx: &mpsc::Sender<Result<v1::RelayReply, Status>>,
    ) -> Result<(), RelayError> {
        let events = self.attachment.events();
        let mut grants = self.shared.access.grants_changed();
        loop {
            let step = tokio::select! {
                biased;
                () = self.shared.shutdown.wait() => return Err(RelayError::Shutdown),
                Ok(()) = grants.changed() => {
                    self.shared
                        .access
                        .recheck(&self.credentials, self.attachment.pool())
                        .map_err(RelayError::Revoked)?;
                    Step::Continue(None)
                }
                () = self.domain.removed.wait() => return Err(RelayError::Removed {
                    domain: self.domain.name().clone(),
                }),
                event = events.recv_async() => match event {
                    Ok(event) => self.step(self.attachment.event(event), None)?,
                    // The lane dropped its subscribers: the indexer is going away.
                    Err(_) => return Err(RelayError::Shutdown),
                },
                message = inbound.message() => match message {
                    Ok(Some(frame)) => self.on_frame(frame).await?,
                    Ok(None) => return Err(RelayError::EndedWithoutDrain),
                    Err(status) => return Err(FrameError::Transport(status).into()),
                },
            };
            match step {
                Step::Continue(None) => {}
                Step::Continue(Some(reply)) => {
                    let sent = tokio::select! {
                        () = self.shared.shutdown.wait() => return Err(RelayError::Shutdown),
                        sent = tx.send(Ok(reply)) => sent,
                    };
                    if sent.is_err() {
                        return Err(replies_closed(inbound).await);
                    }
                }
                Step::Drained(reply) => {
                    let _ = tx.send(Ok(reply)).await;
                    return Ok(());
                }
            }
        }
    }

    /// Decodes one frame, submits it to the lane's ingestor and translates ckf-core's verdict.
    async fn on_frame(&self, wire: v1::RelayFrame) -> Result<Step, RelayError> {
        let received_at = Instant::now();
        self.shared.count_frame(&wire);
        let frame = match self.decode(wire)? {
            Decoded::Frame(frame) => frame,
            Decoded::Load(load) => return self.on_load(&load),
        };
        self.attachment.check(&frame).map_err(FrameError::Refused)?;
        let delta = match &frame {
            Frame::Delta(d) => Some((d.images.len() as u64, d.oldest_change_age_ms)),
            _ => None,
        };
        let (reply_tx, reply_rx) = flume::bounded(1);
        if let Err(error) = self.domain.workers.submit(frame, Some(reply_tx)) {
            return Err(RelayError::Ended(self.attachment.submit_failed(error)));
        }
        let outcome = reply_rx
            .recv_async()
            .await
            .map_err(|_| RelayError::Shutdown)?;
        let verdict = self.attachment.outcome(outcome);
        self.step(verdict, Some((received_at, delta)))
    }

    /// A verdict as a stream step, recording the lane metrics of what was applied.
    /// `frame` is when the frame arrived and, for a delta, its image count and change age.
    fn step(
        &self,
        verdict: StreamVerdict,
        frame: Option<(Instant, Option<(u64, u64)>)>,
    ) -> Result<Step, RelayError> {
        let m = &self.metrics;
        match verdict {
            StreamVerdict::Continue => Ok(Step::Continue(None)),
            StreamVerdict::Applied { installed_sequence } => {
                m.deltas_applied.inc();
                if let Some((received_at, Some((images, age_ms)))) = frame {
                    m.images_applied.inc_by(images);
                    let lag = Duration::from_millis(age_ms) + received_at.elapsed();
                    m.event_to_applied_lag.observe(lag.as_secs_f64());
                }
                Ok(Step::Continue(Some(ack(installed_sequence, false))))
            }
            StreamVerdict::Activated { installed_sequence } => {
                m.snapshots_installed.inc();
                tracing::info!(installed_sequence, "lane ready");
                Ok(Step::Continue(Some(ack(installed_sequence, false))))
            }
            StreamVerdict::Drained { installed_sequence } => {
                m.drains.inc();
                Ok(Step::Drained(ack(installed_sequence, true)))
            }
            StreamVerdict::End(end) => Err(RelayError::Ended(end)),
        }
    }

    /// A load report of this stream's lease: kept as the lane's newest (an older or invalid
    /// one is counted and dropped; the stream goes on). It never waits for the lane's ingestor.
    fn on_load(&self, load: &LoadFrame) -> Result<Step, RelayError> {
        self.attachment
            .check_lease("load", load.tag.lease)
            .map_err(FrameError::Refused)?;
        let lease = load.tag.lease;
        // A kept report counts the choices booked before it.
        let kept = self.domain.router.report_load(
            lease.lane,
            lease.epoch,
            load.sequence,
            load.load,
            load.age,
            Instant::now(),
        );
        if let Err(refused) = kept {
            tracing::debug!(%refused, sequence = load.sequence, "load report dropped")
        }
        // A lane or domain being removed has its gauges withdrawn: not set again.
        if self.domain.removed.is_triggered() || self.domain.indexer.is_removed(lease.lane) {
            return Ok(Step::Continue(None));
        }
        let labels = &self.labels;
        self.shared
            .metrics
            .load_report(labels, kept, &load.load, load.age);
        Ok(Step::Continue(None))
    }

    /// Wire frame -> core frame (stamped with this stream's incarnation), checking the
    /// transport limits.
    fn decode(&self, frame: v1::RelayFrame) -> Result<Decoded, FrameError> {
        let inc = self.attachment.incarnation();
        let decode_error = |frame: &'static str| move |error| FrameError::Decode { frame, error };
        Ok(Decoded::Frame(
            match frame.frame.ok_or(FrameError::Empty)? {
                WireFrame::Attach(_) => return Err(FrameError::SecondAttach),
                WireFrame::SnapshotChunk(c) => Frame::Chunk(
                    convert::snapshot_chunk_from_wire(c, inc)
                        .map_err(decode_error("snapshot_chunk"))?,
                ),
                WireFrame::Delta(d) => {
                    let limit = self.shared.limits.max_images_per_delta;
                    if d.images.len() > limit as usize || d.buckets.len() > limit as usize {
                        return Err(FrameError::TooManyImages {
                            images: d.images.len().max(d.buckets.len()),
                            limit,
                        });
                    }
                    Frame::Delta(convert::delta_from_wire(d, inc).map_err(decode_error("delta"))?)
                }
                WireFrame::Heartbeat(h) => {
                    let (tag, sequence) =
                        convert::heartbeat_from_wire(h, inc).map_err(decode_error("heartbeat"))?;
                    Frame::Heartbeat(Heartbeat { tag, sequence })
                }
                WireFrame::DrainMarker(m) => Frame::Drain(
                    convert::drain_marker_from_wire(m, inc)
                        .map_err(decode_error("drain_marker"))?,
                ),
                WireFrame::Load(l) => {
                    return Ok(Decoded::Load(
                        convert::load_from_wire(l, inc).map_err(decode_error("load"))?,
                    ));
                }
            },
        ))
    }
}

/// A decoded frame: one for the lane's ingestor, or a load report.
enum Decoded {
    Frame(Frame),
    Load(LoadFrame),
}
