//! A small in-test `ckf.v1.Relay` server: it grants leases with increasing epochs, records every
//! frame, rebuilds each attachment's table from its snapshot chunks and deltas (zeroed table,
//! absolute images), checks sequence continuity and frame sizes, acknowledges what it
//! installed, answers an exact drain marker with `drained`, and can retire an attachment on
//! demand.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ckf_proto::metadata::{ATTACH_REFUSED_KEY, ATTACH_REFUSED_OCCUPIED};
use ckf_proto::v1;
use ckf_proto::v1::relay_frame::Frame;
use ckf_proto::v1::relay_reply::Reply;
use ckf_proto::v1::relay_server::{Relay, RelayServer};
use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

/// What the fake grants.
#[derive(Debug, Clone, Copy)]
pub struct GrantConfig {
    pub max_message_bytes: u64,
    pub max_images_per_delta: u32,
    pub heartbeat_deadline_ms: u64,
    /// Never read the frames of the first attachment (a stalled indexer).
    pub stall_first: bool,
    /// Say in `LeaseGranted` that load reports are taken (an older indexer does not: a load
    /// report to it is then a protocol error).
    pub accepts_load: bool,
}

impl Default for GrantConfig {
    fn default() -> Self {
        Self {
            max_message_bytes: 4096,
            max_images_per_delta: 8,
            heartbeat_deadline_ms: 3_000,
            stall_first: false,
            accepts_load: false,
        }
    }
}

/// Everything one attachment (one Relay stream) did.
#[derive(Debug, Default)]
pub struct Attachment {
    pub attach: Option<v1::Attach>,
    pub lease: Option<v1::LaneLease>,
    pub table: Vec<u64>,
    pub snapshot_sequence: Option<u64>,
    pub snapshot_chunks: usize,
    buckets_received: u64,
    /// The last installed sequence (after the snapshot completed).
    pub installed: Option<u64>,
    pub deltas: Vec<v1::Delta>,
    pub heartbeats: Vec<u64>,
    /// Load reports received (when the grant takes them).
    pub loads: Vec<v1::LoadReport>,
    pub drain_marker: Option<u64>,
    pub drained: bool,
    /// Protocol violations seen (must stay empty).
    pub errors: Vec<String>,
    /// Largest encoded frame received, in bytes.
    pub largest_frame: usize,
    pub ended: bool,
    retire: Option<mpsc::Sender<(v1::RetireReason, String)>>,
}

#[derive(Debug)]
pub struct FakeState {
    pub grant: GrantConfig,
    pub consumer_instance: u64,
    next_epoch: u64,
    pub attachments: Vec<Attachment>,
    /// Refuse `IF_VACANT` attaches as the indexer does while another producer holds the lane.
    pub occupied: bool,
    /// `IF_VACANT` attaches refused so far.
    pub refused: usize,
}

/// A running fake indexer.
pub struct FakeRelay {
    pub addr: SocketAddr,
    state: Arc<Mutex<FakeState>>,
    version: watch::Receiver<u64>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

#[derive(Clone)]
struct Service {
    state: Arc<Mutex<FakeState>>,
    version: Arc<watch::Sender<u64>>,
}

impl Service {
    fn bump(&self) {
        self.version.send_modify(|v| *v += 1);
    }
}

/// How long any wait for the producer may take before the test fails (a bound, not a measure).
const PATIENCE: Duration = Duration::from_secs(30);

impl FakeRelay {
    pub async fn start(grant: GrantConfig, consumer_instance: u64) -> Self {
        let state = Arc::new(Mutex::new(FakeState {
            grant,
            consumer_instance,
            next_epoch: 1,
            attachments: Vec::new(),
            occupied: false,
            refused: 0,
        }));
        let (tx, version) = watch::channel(0);
        let service = Service {
            state: state.clone(),
            version: Arc::new(tx),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(
            tonic::transport::Server::builder()
                // Small HTTP/2 windows so a stalled reader quickly stops the sender.
                .initial_stream_window_size(65_535)
                .initial_connection_window_size(65_535)
                .add_service(RelayServer::new(service))
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                }),
        );
        Self {
            addr,
            state,
            version,
            _stop: stop,
        }
    }

    /// Whether `IF_VACANT` attaches are refused (another producer "holds" the lane).
    pub fn set_occupied(&self, occupied: bool) {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .occupied = occupied;
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Runs `f` on the state.
    pub fn with<R>(&self, f: impl FnOnce(&FakeState) -> R) -> R {
        f(&self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Waits until `cond` holds; panics naming `what` after a generous bound.
    pub async fn wait_for(&self, what: &str, mut cond: impl FnMut(&FakeState) -> bool) {
        let mut version = self.version.clone();
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if cond(
                &self
                    .state
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            ) {
                return;
            }
            match tokio::time::timeout_at(deadline, version.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => panic!("fake relay stopped while waiting for: {what}"),
                Err(_) => panic!(
                    "timed out waiting for: {what}; state: {:#?}",
                    summary(
                        &self
                            .state
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                    )
                ),
            }
        }
    }

    /// Waits until attachment `index` (0 = the first Relay stream) has installed its barrier
    /// snapshot.
    pub async fn wait_installed(&self, index: usize, what: &str) {
        self.wait_for(what, |s| {
            s.attachments
                .get(index)
                .is_some_and(|a| a.installed.is_some())
        })
        .await;
    }

    /// Waits until attachment `index`'s rebuilt table equals `table` (the producer's).
    pub async fn wait_converged(&self, index: usize, table: &[u64], what: &str) {
        self.wait_for(what, |s| {
            s.attachments.get(index).is_some_and(|a| a.table == table)
        })
        .await;
    }

    /// Every protocol violation seen on any attachment (must stay empty).
    pub fn errors(&self) -> Vec<String> {
        self.with(|s| {
            s.attachments
                .iter()
                .flat_map(|a| a.errors.clone())
                .collect()
        })
    }

    /// Retires attachment `index` with `reason` (the fake sends `Retired` and ends the stream).
    pub async fn retire(&self, index: usize, reason: v1::RetireReason, detail: &str) {
        let tx = self
            .with(|s| s.attachments[index].retire.clone())
            .expect("attachment is live");
        tx.send((reason, detail.to_owned())).await.unwrap();
    }
}

fn summary(s: &FakeState) -> Vec<String> {
    s.attachments
        .iter()
        .map(|a| {
            format!(
                "lease {:?} snapshot {:?} installed {:?} deltas {} heartbeats {} drain {:?} drained {} ended {} errors {:?}",
                a.lease.map(|l| l.epoch),
                a.snapshot_sequence,
                a.installed,
                a.deltas.len(),
                a.heartbeats.len(),
                a.drain_marker,
                a.drained,
                a.ended,
                a.errors
            )
        })
        .collect()
}

fn ack(installed: u64, drained: bool) -> Result<v1::RelayReply, Status> {
    Ok(Reply::Ack(v1::Ack {
        installed_sequence: installed,
        ready: true,
        drained,
    })
    .into())
}

#[tonic::async_trait]
impl Relay for Service {
    type PublishStream = ReceiverStream<Result<v1::RelayReply, Status>>;

    async fn publish(
        &self,
        request: Request<Streaming<v1::RelayFrame>>,
    ) -> Result<Response<Self::PublishStream>, Status> {
        let mut frames = request.into_inner();
        let first = frames.message().await?.and_then(|f| f.frame);
        let Some(Frame::Attach(attach)) = first else {
            return Err(Status::invalid_argument("first frame must be Attach"));
        };
        let (retire_tx, mut retire_rx) = mpsc::channel(1);
        let (index, lease, grant, bucket_count) = {
            let mut s = self
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if s.occupied && attach.mode == v1::AttachMode::IfVacant as i32 {
                s.refused += 1;
                drop(s);
                self.bump();
                let mut metadata = tonic::metadata::MetadataMap::new();
                metadata.insert(ATTACH_REFUSED_KEY, ATTACH_REFUSED_OCCUPIED.parse().unwrap());
                return Err(Status::with_metadata(
                    tonic::Code::FailedPrecondition,
                    "pool prod/dc-a (lane 0) is held by a live attachment: incarnation 0x0000000000000009, lease epoch 2, active",
                    metadata,
                ));
            }
            let lease = v1::LaneLease {
                consumer_instance: s.consumer_instance,
                lane: 0,
                epoch: s.next_epoch,
            };
            s.next_epoch += 1;
            let bucket_count = attach.format.unwrap_or_default().bucket_count;
            s.attachments.push(Attachment {
                attach: Some(attach),
                lease: Some(lease),
                table: vec![0; bucket_count as usize],
                retire: Some(retire_tx),
                ..Default::default()
            });
            (s.attachments.len() - 1, lease, s.grant, bucket_count)
        };
        let (tx, rx) = mpsc::channel(64);
        tx.send(Ok(Reply::LeaseGranted(v1::LeaseGranted {
            lease: Some(lease),
            max_message_bytes: grant.max_message_bytes,
            max_images_per_delta: grant.max_images_per_delta,
            heartbeat_deadline_ms: grant.heartbeat_deadline_ms,
            accepts_load: grant.accepts_load,
        })
        .into()))
            .await
            .unwrap();
        self.bump();
        if grant.stall_first && index == 0 {
            // Hold the stream open without reading it until the test retires it.
            tokio::spawn(async move {
                let _ = retire_rx.recv().await;
                drop((frames, tx));
            });
            return Ok(Response::new(ReceiverStream::new(rx)));
        }
        let service = self.clone();
        tokio::spawn(async move {
            loop {
                let frame = tokio::select! {
                    r = retire_rx.recv() => {
                        if let Some((reason, detail)) = r {
                            let _ = tx.send(Ok(Reply::Retired(v1::Retired { reason: reason.into(), detail }).into())).await;
                        }
                        break;
                    }
                    f = frames.message() => f,
                };
                let frame = match frame {
                    Ok(Some(f)) => f,
                    Ok(None) | Err(_) => break,
                };
                let (reply, done) = {
                    let mut s = service
                        .state
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    let a = &mut s.attachments[index];
                    let reply = handle_frame(a, frame, lease, grant, bucket_count);
                    (reply, a.drained)
                };
                service.bump();
                if let Some(reply) = reply {
                    let _ = tx.send(reply).await;
                }
                if done {
                    break;
                }
            }
            // End the reply stream (trailers), then read the request stream to its end, as a
            // well-behaved server does: dropping it unread makes the HTTP/2 layer reset the
            // stream, which can cost the client the final reply it has not read yet.
            drop(tx);
            while let Ok(Some(_)) = frames.message().await {}
            {
                let mut s = service
                    .state
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                s.attachments[index].ended = true;
                s.attachments[index].retire = None;
            }
            service.bump();
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

type ReplyResult = Result<v1::RelayReply, Status>;

/// Applies one frame to an attachment's record; returns the reply to send, if any.
fn handle_frame(
    a: &mut Attachment,
    frame: v1::RelayFrame,
    lease: v1::LaneLease,
    grant: GrantConfig,
    bucket_count: u64,
) -> Option<ReplyResult> {
    let size = frame.encoded_len();
    a.largest_frame = a.largest_frame.max(size);
    if size as u64 > grant.max_message_bytes / 2 {
        a.errors.push(format!(
            "frame of {size} bytes is not well under {}",
            grant.max_message_bytes
        ));
    }
    match frame.frame {
        Some(Frame::Load(report)) => {
            if !grant.accepts_load {
                a.errors
                    .push("a load report to an indexer that does not take them".into());
            } else if report.lease != Some(lease) {
                a.errors.push("load report with a foreign lease".into());
            }
            a.loads.push(report);
            None
        }
        Some(Frame::SnapshotChunk(c)) => {
            if c.lease != Some(lease) {
                a.errors.push("snapshot chunk with a foreign lease".into());
            }
            if c.first_bucket != a.buckets_received || c.words.is_empty() || c.words.len() % 8 != 0
            {
                a.errors.push(format!(
                    "bad chunk at {} (expected {})",
                    c.first_bucket, a.buckets_received
                ));
                None
            } else {
                if a.snapshot_sequence.is_some_and(|s| s != c.sequence) {
                    a.errors
                        .push("chunks of different snapshots interleaved".into());
                }
                a.snapshot_sequence = Some(c.sequence);
                a.snapshot_chunks += 1;
                for (i, w) in c.words.chunks_exact(8).enumerate() {
                    a.table[c.first_bucket as usize + i] =
                        u64::from_le_bytes(w.try_into().unwrap());
                }
                a.buckets_received += (c.words.len() / 8) as u64;
                if a.buckets_received == bucket_count {
                    a.installed = Some(c.sequence);
                    Some(ack(c.sequence, false))
                } else {
                    None
                }
            }
        }
        Some(Frame::Delta(d)) => {
            if d.lease != Some(lease) {
                a.errors.push("delta with a foreign lease".into());
            }
            if a.installed != Some(d.base_sequence) || d.sequence != d.base_sequence + 1 {
                a.errors.push(format!(
                    "gap: delta {} -> {} on installed {:?}",
                    d.base_sequence, d.sequence, a.installed
                ));
            }
            if d.buckets.is_empty() || d.buckets.len() != d.images.len() {
                a.errors.push("empty or ragged delta".into());
            }
            if d.buckets.len() > grant.max_images_per_delta as usize {
                a.errors
                    .push(format!("delta with {} images", d.buckets.len()));
            }
            let mut seen = std::collections::HashSet::new();
            for (&b, &img) in d.buckets.iter().zip(&d.images) {
                if !seen.insert(b) || u64::from(b) >= bucket_count {
                    a.errors
                        .push(format!("duplicate or out-of-range bucket {b}"));
                    continue;
                }
                a.table[b as usize] = img;
            }
            a.installed = Some(d.sequence);
            a.deltas.push(d.clone());
            Some(ack(d.sequence, false))
        }
        Some(Frame::Heartbeat(h)) => {
            a.heartbeats.push(h.sequence);
            None
        }
        Some(Frame::DrainMarker(m)) => {
            a.drain_marker = Some(m.sequence);
            if a.installed == Some(m.sequence) {
                a.drained = true;
                Some(ack(m.sequence, true))
            } else {
                a.errors.push(format!(
                    "drain marker {} on installed {:?}",
                    m.sequence, a.installed
                ));
                Some(Ok(Reply::Retired(v1::Retired {
                    reason: v1::RetireReason::LostFinalDelta.into(),
                    detail: "drain marker does not match".into(),
                })
                .into()))
            }
        }
        Some(Frame::Attach(_)) | None => {
            a.errors.push("unexpected frame".into());
            None
        }
    }
}
