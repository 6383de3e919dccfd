//! `ckf.v1.Relay/Publish`: one producer attachment per stream.
//!
//! ```text
//! Attach -> GlobalCkfIndexer::grant_lease -> LeaseGranted
//! SnapshotChunk | Delta | Heartbeat | DrainMarker -> IngestionPool (lane's serialized ingestor)
//!            -> IngestOutcome -> Ack (activation, applied delta, drain) | Retired + status
//! ```
//! The handler only translates: it decodes wire frames ([`ckf_proto::convert`]), checks the
//! transport limits (`max_images_per_delta`; `max_message_bytes` is tonic's decoding limit) and
//! that each frame carries this stream's own lease, then lets ckf-core decide. Lane transitions
//! that happen outside the stream (heartbeat deadline, saturation, a newer attachment for the
//! same pool) arrive through the lane's event subscription and end the stream.
//!
//! A stream that breaks or ends without an exact drain marker retires its lane as
//! `StreamLost` (delivery uncertain), unless its lease was already superseded or retired.
//! Failures become statuses in [`crate::status`] only.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ckf_core::identity::{LaneLease, ProducerIdentity, ProducerIncarnation};
use ckf_core::ingestion::SubmitError;
use ckf_core::lane::{
    Frame, Heartbeat, IgnoreReason, IngestOutcome, LaneEvent, LaneEventKind, RetireReason,
};
use ckf_proto::convert;
use ckf_proto::v1::{
    self, relay_frame::Frame as WireFrame, relay_reply::Reply, relay_server::Relay,
};
use prost::Message;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::shared::Shared;
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

/// The Relay service.
#[derive(Debug, Clone)]
pub struct RelayService {
    shared: Arc<Shared>,
}

impl RelayService {
    /// A Relay service over the shared indexer state.
    pub fn new(shared: Arc<Shared>) -> Self {
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
        let refuse = |error: RelayError| {
            shared
                .metrics
                .attach_refused
                .with_label_values(&[error.code_label()])
                .inc();
            tracing::warn!(%error, "relay attachment refused");
            error.status()
        };
        let mut inbound = request.into_inner();
        let attach = first_attach(&shared, &mut inbound).await.map_err(refuse)?;
        // The stream limit counts attached streams only: connections that never send `Attach`
        // must not lock honest producers out of their lanes (they time out on their own).
        let permit = Arc::clone(&shared.relay_streams)
            .try_acquire_owned()
            .map_err(|_| {
                refuse(RelayError::TooManyStreams {
                    limit: shared.limits.max_relay_streams,
                })
            })?;
        let session = Session::attach(Arc::clone(&shared), attach).map_err(refuse)?;

        let (tx, rx) = mpsc::channel(REPLY_BUFFER);
        let granted = Reply::LeaseGranted(v1::LeaseGranted {
            lease: Some(session.lease.into()),
            max_message_bytes: shared.limits.max_message_bytes,
            max_images_per_delta: shared.limits.max_images_per_delta,
            heartbeat_deadline_ms: shared.heartbeat_deadline_ms,
        });
        // The channel is fresh and has room: this cannot wait.
        let _ = tx.send(Ok(granted.into())).await;
        tokio::spawn(session.run(inbound, tx, permit));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Reads the first frame, which must be `Attach`, within the heartbeat deadline.
async fn first_attach(
    shared: &Shared,
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
            count_frame(shared, &frame);
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

fn wire_kind(frame: &WireFrame) -> &'static str {
    match frame {
        WireFrame::Attach(_) => "attach",
        WireFrame::SnapshotChunk(_) => "snapshot_chunk",
        WireFrame::Delta(_) => "delta",
        WireFrame::Heartbeat(_) => "heartbeat",
        WireFrame::DrainMarker(_) => "drain_marker",
    }
}

fn count_frame(shared: &Shared, frame: &v1::RelayFrame) {
    let kind = frame.frame.as_ref().map_or("empty", wire_kind);
    shared
        .metrics
        .frames_received
        .with_label_values(&[kind])
        .inc();
    shared
        .metrics
        .bytes_received
        .inc_by(frame.encoded_len() as u64);
}

/// One attached stream: the lease it holds and the lane's event subscription.
struct Session {
    shared: Arc<Shared>,
    incarnation: ProducerIncarnation,
    pool_name: ckf_core::PoolId,
    lease: LaneLease,
    events: flume::Receiver<LaneEvent>,
}

/// What one inbound frame did to the stream.
enum Step {
    /// Keep reading; send this reply first, if any.
    Continue(Option<v1::RelayReply>),
    /// Exact drain accepted: send the final Ack and end the stream with OK.
    Drained(v1::RelayReply),
}

impl Session {
    /// Decodes the identity and asks ckf-core for a lease.
    fn attach(shared: Arc<Shared>, attach: v1::Attach) -> Result<Self, RelayError> {
        let indexer = &shared.indexer;
        let pool = convert::attach_pool(&attach).map_err(RelayError::BadAttach)?;
        let configured = &indexer.manifest().lanes;
        if indexer.lane_of(&pool).is_none() {
            return Err(RelayError::from_attach(
                ckf_core::global::AttachError::UnknownPool(pool),
                configured,
            ));
        }
        // A producer format this build cannot even decode is still a format mismatch: name
        // both formats, plus why the producer's is invalid.
        let wire_format = attach.format.unwrap_or_default();
        let identity = match ProducerIdentity::try_from(attach) {
            Ok(identity) => identity,
            Err(error) => {
                return Err(RelayError::FormatMismatch {
                    pool,
                    expected: indexer.manifest().format,
                    got: format!("{wire_format:?}"),
                    problem: Some(error.to_string()),
                });
            }
        };
        let lease = indexer
            .grant_lease(&identity)
            .map_err(|e| RelayError::from_attach(e, configured))?;
        // Subscribe right after the grant; a supersession racing in between is still seen as
        // a stale-lease outcome of the next frame.
        let events = indexer
            .subscribe(lease.lane)
            .map_err(RelayError::Unattributable)?;
        let labels = shared.labels(lease.lane);
        shared
            .metrics
            .leases_granted
            .with_label_values(&[&labels.lane, &labels.dc])
            .inc();
        tracing::info!(
            pool = %identity.pool,
            incarnation = %identity.incarnation,
            %lease,
            "lease granted"
        );
        Ok(Self {
            incarnation: identity.incarnation,
            pool_name: identity.pool,
            lease,
            events,
            shared,
        })
    }

    /// Drives the stream until drain, retirement, supersession, breakage or shutdown.
    async fn run(
        self,
        mut inbound: Streaming<v1::RelayFrame>,
        tx: mpsc::Sender<Result<v1::RelayReply, Status>>,
        permit: OwnedSemaphorePermit,
    ) {
        let _permit = permit;
        self.shared.metrics.relay_streams.inc();
        let end = self.pump(&mut inbound, &tx).await;
        self.shared.metrics.relay_streams.dec();
        let linger = !matches!(end, Err(RelayError::Shutdown));
        match end {
            Ok(()) => {
                tracing::info!(lease = %self.lease, pool = %self.pool_name, "relay stream drained")
            }
            Err(error) => {
                self.retire_if_uncertain(&error);
                tracing::warn!(lease = %self.lease, pool = %self.pool_name, %error, "relay stream ended");
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

    /// Delivery became uncertain on this stream: retire its lease (ckf-core ignores the call
    /// when the lease was already superseded or retired).
    fn retire_if_uncertain(&self, error: &RelayError) {
        if matches!(error, RelayError::Frame(_) | RelayError::EndedWithoutDrain) {
            let reason = RetireReason::StreamLost {
                detail: error.to_string(),
            };
            self.shared.indexer.retire_lease(self.lease, reason);
        }
    }

    async fn pump(
        &self,
        inbound: &mut Streaming<v1::RelayFrame>,
        tx: &mpsc::Sender<Result<v1::RelayReply, Status>>,
    ) -> Result<(), RelayError> {
        loop {
            let step = tokio::select! {
                biased;
                () = self.shared.shutdown.wait() => return Err(RelayError::Shutdown),
                event = self.events.recv_async() => {
                    match event {
                        Ok(event) => self.on_event(event)?,
                        // The lane dropped its subscribers: the indexer is going away.
                        Err(_) => return Err(RelayError::Shutdown),
                    }
                    continue;
                }
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
                        return Err(FrameError::Transport(Status::cancelled(
                            "producer stopped reading replies",
                        ))
                        .into());
                    }
                }
                Step::Drained(reply) => {
                    let _ = tx.send(Ok(reply)).await;
                    return Ok(());
                }
            }
        }
    }

    /// A lane transition published by ckf-core.
    fn on_event(&self, event: LaneEvent) -> Result<(), RelayError> {
        if event.lease != self.lease {
            return Ok(());
        }
        match event.kind {
            LaneEventKind::Retired(reason) => Err(RelayError::Retired {
                lane: self.lease.lane,
                reason,
            }),
            LaneEventKind::Superseded { by } => Err(self.superseded(by)),
            LaneEventKind::Activated { .. } | LaneEventKind::Drained { .. } => Ok(()),
        }
    }

    fn superseded(&self, by: LaneLease) -> RelayError {
        RelayError::Superseded {
            pool: self.pool_name.clone(),
            held: self.lease,
            by,
        }
    }

    /// Decodes one frame, submits it to the lane's ingestor and turns the outcome into a step.
    async fn on_frame(&self, frame: v1::RelayFrame) -> Result<Step, RelayError> {
        let received_at = Instant::now();
        count_frame(&self.shared, &frame);
        let frame = self.decode(frame)?;
        let oldest_change_age_ms = match &frame {
            Frame::Delta(d) => Some(d.oldest_change_age_ms),
            _ => None,
        };
        let images = match &frame {
            Frame::Delta(d) => d.images.len() as u64,
            _ => 0,
        };
        let (reply_tx, reply_rx) = flume::bounded(1);
        self.shared
            .pool
            .submit(frame, Some(reply_tx))
            .map_err(|e| self.submit_error(e))?;
        let outcome = reply_rx
            .recv_async()
            .await
            .map_err(|_| RelayError::Shutdown)?;
        let labels = self.shared.labels(self.lease.lane);
        let metrics = &self.shared.metrics;
        let ack = |installed_sequence: u64, drained: bool| -> v1::RelayReply {
            Reply::Ack(v1::Ack {
                installed_sequence,
                ready: true,
                drained,
            })
            .into()
        };
        match outcome {
            IngestOutcome::Applied { installed_sequence } => {
                metrics
                    .deltas_applied
                    .with_label_values(&[&labels.lane, &labels.dc])
                    .inc();
                metrics
                    .images_applied
                    .with_label_values(&[&labels.lane, &labels.dc])
                    .inc_by(images);
                let lag = Duration::from_millis(oldest_change_age_ms.unwrap_or(0))
                    + received_at.elapsed();
                metrics
                    .event_to_applied_lag
                    .with_label_values(&[&labels.lane, &labels.dc])
                    .observe(lag.as_secs_f64());
                Ok(Step::Continue(Some(ack(installed_sequence, false))))
            }
            IngestOutcome::Activated { installed_sequence } => {
                metrics
                    .snapshots_installed
                    .with_label_values(&[&labels.lane, &labels.dc])
                    .inc();
                tracing::info!(lease = %self.lease, installed_sequence, "lane ready");
                Ok(Step::Continue(Some(ack(installed_sequence, false))))
            }
            IngestOutcome::Drained { installed_sequence } => {
                metrics
                    .drains
                    .with_label_values(&[&labels.lane, &labels.dc])
                    .inc();
                Ok(Step::Drained(ack(installed_sequence, true)))
            }
            IngestOutcome::ChunkAccepted { .. } | IngestOutcome::Alive => Ok(Step::Continue(None)),
            IngestOutcome::Ignored(reason) => Err(self.ignored(reason)),
            IngestOutcome::Rejected(error) => Err(RelayError::Unattributable(error)),
            IngestOutcome::Retired(reason) => Err(RelayError::Retired {
                lane: self.lease.lane,
                reason,
            }),
        }
    }

    /// Ignored traffic on an attached stream means this stream no longer holds the lane.
    fn ignored(&self, reason: IgnoreReason) -> RelayError {
        match reason {
            IgnoreReason::StaleLease { current, .. } => self.superseded(LaneLease {
                epoch: current,
                ..self.lease
            }),
            IgnoreReason::LaneRetired(reason) => RelayError::Retired {
                lane: self.lease.lane,
                reason,
            },
            // The handler stamps this stream's own incarnation and checks the lease, so neither
            // can differ; report it as a fence if it ever does.
            IgnoreReason::OtherConsumer { .. } | IgnoreReason::OtherIncarnation { .. } => {
                RelayError::Unattributable(ckf_core::lane::IngestError::UnknownLease {
                    lane: self.lease.lane,
                    epoch: self.lease.epoch,
                    latest: 0,
                })
            }
        }
    }

    fn submit_error(&self, error: SubmitError) -> RelayError {
        match error {
            SubmitError::Saturated { lane, capacity, .. } => RelayError::Retired {
                lane,
                reason: RetireReason::Saturated { capacity },
            },
            SubmitError::UnknownLane(e) => RelayError::Unattributable(e),
            SubmitError::ShutDown => RelayError::Shutdown,
        }
    }

    /// Wire frame -> core frame, checking the transport limits and this stream's lease.
    fn decode(&self, frame: v1::RelayFrame) -> Result<Frame, FrameError> {
        let inc = self.incarnation;
        let decode_error = |frame: &'static str| move |error| FrameError::Decode { frame, error };
        let frame = match frame.frame.ok_or(FrameError::Empty)? {
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
                let (tag, _sequence) =
                    convert::heartbeat_from_wire(h, inc).map_err(decode_error("heartbeat"))?;
                Frame::Heartbeat(Heartbeat { tag })
            }
            WireFrame::DrainMarker(m) => Frame::Drain(
                convert::drain_marker_from_wire(m, inc).map_err(decode_error("drain_marker"))?,
            ),
        };
        let got = frame.tag().lease;
        if got != self.lease {
            return Err(FrameError::ForeignLease {
                frame: frame.kind(),
                got,
                held: self.lease,
            });
        }
        Ok(frame)
    }
}
