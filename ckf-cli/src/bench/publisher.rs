//! A built-in inference-engine KV-event publisher speaking exactly vLLM's ZMQ protocol, so
//! `ckf demo` drives the producers through the same path a real engine does.
//!
//! Origin: vLLM's `ZmqEventPublisher` (`vllm/distributed/kv_events.py`):
//! - a PUB socket sends each batch as `[topic, sequence (8 bytes, big-endian), payload]`, the
//!   sequence counting from 0 per socket;
//! - an optional ROUTER socket answers a replay request `[identity, "", start (8 bytes BE)]`
//!   with every buffered batch whose sequence is `>= start`, as
//!   `[identity, "", topic, sequence, payload]`, then the end marker
//!   `[identity, "", "", -1 (8 bytes BE), ""]`; requests of another shape are ignored;
//! - the replay buffer keeps the last `buffer_steps` batches (vLLM's default 10,000).
//!
//! The payload is [`ckf_engine::encode`]'s vLLM msgpack encoding. A PUB socket drops what it
//! sends before a subscriber is connected (ZMQ's slow-joiner rule): callers that need every
//! batch seen make sure one is (see `crate::bench::feed`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use ckf_engine::encode::{Batch, Layout, encode_batch};
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// vLLM's replay end marker: sequence -1, empty topic and payload.
pub const END_SEQ: i64 = -1;
/// vLLM's default replay buffer length, in batches.
pub const DEFAULT_BUFFER_STEPS: usize = 10_000;

/// The last `capacity` published batches, for replay.
#[derive(Debug)]
struct ReplayBuffer {
    capacity: usize,
    batches: VecDeque<(i64, Bytes)>,
}

impl ReplayBuffer {
    fn push(&mut self, seq: i64, payload: Bytes) {
        if self.capacity == 0 {
            return;
        }
        if self.batches.len() == self.capacity {
            self.batches.pop_front();
        }
        self.batches.push_back((seq, payload));
    }

    fn from(&self, start: i64) -> Vec<(i64, Bytes)> {
        self.batches
            .iter()
            .filter(|(seq, _)| *seq >= start)
            .cloned()
            .collect()
    }
}

/// One engine publisher socket pair (one vLLM data-parallel rank).
pub struct EnginePublisher {
    socket: PubSocket,
    endpoint: String,
    replay_endpoint: Option<String>,
    topic: Bytes,
    layout: Layout,
    next_seq: i64,
    buffer: Arc<Mutex<ReplayBuffer>>,
    replay_task: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for EnginePublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnginePublisher")
            .field("endpoint", &self.endpoint)
            .field("replay_endpoint", &self.replay_endpoint)
            .field("next_seq", &self.next_seq)
            .finish_non_exhaustive()
    }
}

impl EnginePublisher {
    /// Binds the PUB socket on `endpoint` (e.g. `tcp://127.0.0.1:0`: port 0 lets the OS pick)
    /// and, when given, the ROUTER replay socket on `replay_endpoint`, keeping the last
    /// `buffer_steps` batches for replay. Needs a tokio runtime (the replay service is a task).
    ///
    /// # Errors
    /// An invalid endpoint or one that cannot be bound (e.g. the port is taken).
    pub async fn bind(
        endpoint: &str,
        replay_endpoint: Option<&str>,
        topic: &str,
        buffer_steps: usize,
        layout: Layout,
    ) -> Result<Self> {
        let mut socket = PubSocket::new();
        let bound = socket
            .bind(endpoint)
            .await
            .with_context(|| format!("binding the engine PUB socket on {endpoint}"))?
            .to_string();
        let buffer = Arc::new(Mutex::new(ReplayBuffer {
            capacity: buffer_steps,
            batches: VecDeque::new(),
        }));
        let topic = Bytes::copy_from_slice(topic.as_bytes());
        let (replay_endpoint, replay_task) = match replay_endpoint {
            None => (None, None),
            Some(replay) => {
                let mut router = RouterSocket::new();
                let bound = router
                    .bind(replay)
                    .await
                    .with_context(|| format!("binding the engine replay socket on {replay}"))?
                    .to_string();
                let task = tokio::spawn(serve_replay(router, buffer.clone(), topic.clone()));
                (Some(bound), Some(task))
            }
        };
        Ok(Self {
            socket,
            endpoint: bound,
            replay_endpoint,
            topic,
            layout,
            next_seq: 0,
            buffer,
            replay_task,
        })
    }

    /// The bound PUB endpoint (with the OS-chosen port), e.g. `tcp://127.0.0.1:40123`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The bound replay endpoint, if any.
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }

    /// The sequence the next batch gets.
    pub fn next_sequence(&self) -> i64 {
        self.next_seq
    }

    /// Encodes and publishes one batch; returns its sequence.
    ///
    /// # Errors
    /// The socket failed (not: no subscriber, which silently drops the batch as ZMQ does; it
    /// stays in the replay buffer).
    pub async fn publish(&mut self, batch: &Batch) -> Result<i64> {
        self.publish_payload(encode_batch(batch, self.layout)).await
    }

    /// Publishes one already-encoded payload; returns its sequence.
    ///
    /// # Errors
    /// As [`EnginePublisher::publish`].
    pub async fn publish_payload(&mut self, payload: Vec<u8>) -> Result<i64> {
        let seq = self.next_seq;
        self.next_seq += 1;
        let payload = Bytes::from(payload);
        // Buffered before sending: a subscriber that sees a gap right after may ask for it.
        self.buffer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(seq, payload.clone());
        let mut message = ZmqMessage::from(self.topic.clone());
        message.push_back(Bytes::copy_from_slice(&seq.to_be_bytes()));
        message.push_back(payload);
        self.socket
            .send(message)
            .await
            .with_context(|| format!("publishing on {}", self.endpoint))?;
        Ok(seq)
    }
}

impl Drop for EnginePublisher {
    fn drop(&mut self) {
        if let Some(task) = self.replay_task.take() {
            task.abort();
        }
    }
}

/// Answers replay requests until the socket fails.
async fn serve_replay(mut router: RouterSocket, buffer: Arc<Mutex<ReplayBuffer>>, topic: Bytes) {
    loop {
        let Ok(request) = router.recv().await else {
            return;
        };
        let Ok(start) = parse_request(&request) else {
            // vLLM logs and ignores a request of another shape; so do we (nothing is sent).
            continue;
        };
        let identity = request.get(0).cloned().unwrap_or_default();
        let batches = buffer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .from(start);
        for (seq, payload) in batches {
            let mut reply = ZmqMessage::from(identity.clone());
            reply.push_back(Bytes::new());
            reply.push_back(topic.clone());
            reply.push_back(Bytes::copy_from_slice(&seq.to_be_bytes()));
            reply.push_back(payload);
            if router.send(reply).await.is_err() {
                break;
            }
        }
        let mut end = ZmqMessage::from(identity);
        end.push_back(Bytes::new());
        end.push_back(Bytes::new());
        end.push_back(Bytes::copy_from_slice(&END_SEQ.to_be_bytes()));
        end.push_back(Bytes::new());
        // A requester that went away cannot take the marker; nothing else to do.
        let _ = router.send(end).await;
    }
}

/// `[identity, "", start (8 bytes BE)]` -> `start` (vLLM reads it as unsigned big-endian; a
/// start above `i64::MAX` replays nothing, as no sequence reaches it).
fn parse_request(request: &ZmqMessage) -> Result<i64> {
    if request.len() != 3 {
        bail!("replay request has {} frames, not 3", request.len());
    }
    let start = request.get(2).map(|f| f.to_vec()).unwrap_or_default();
    if start.len() > 8 {
        bail!("replay start has {} bytes, more than 8", start.len());
    }
    let mut be = [0u8; 8];
    be[8 - start.len()..].copy_from_slice(&start);
    Ok(i64::try_from(u64::from_be_bytes(be)).unwrap_or(i64::MAX))
}

/// Binds `ranks` publishers on consecutive ports of `host` (rank r on base + r, vLLM's rule for
/// data-parallel ranks), and their replay sockets on another consecutive run; retries with new
/// OS-chosen bases when a port is taken.
///
/// # Errors
/// No free consecutive run was found after several tries, or a socket failed to bind otherwise.
pub async fn bind_ranks(
    host: &str,
    ranks: usize,
    topic: &str,
    buffer_steps: usize,
    layout: Layout,
) -> Result<Vec<EnginePublisher>> {
    const TRIES: usize = 20;
    let mut last_error = None;
    for _ in 0..TRIES {
        match try_bind_ranks(host, ranks, topic, buffer_steps, layout).await {
            Ok(publishers) => return Ok(publishers),
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error
        .unwrap_or_else(|| anyhow::anyhow!("no ranks to bind"))
        .context(format!(
            "binding {ranks} consecutive engine ports on {host}"
        )))
}

async fn try_bind_ranks(
    host: &str,
    ranks: usize,
    topic: &str,
    buffer_steps: usize,
    layout: Layout,
) -> Result<Vec<EnginePublisher>> {
    let mut publishers: Vec<EnginePublisher> = Vec::with_capacity(ranks);
    let (mut base, mut replay_base) = (0u16, 0u16);
    for rank in 0..ranks {
        let port = |base: u16| -> Result<u16> {
            if rank == 0 {
                return Ok(0);
            }
            base.checked_add(rank as u16)
                .context("port range exhausted")
        };
        let endpoint = format!("tcp://{host}:{}", port(base)?);
        let replay = format!("tcp://{host}:{}", port(replay_base)?);
        let publisher =
            EnginePublisher::bind(&endpoint, Some(&replay), topic, buffer_steps, layout).await?;
        if rank == 0 {
            base = port_of(publisher.endpoint())?;
            replay_base = port_of(publisher.replay_endpoint().unwrap_or_default())?;
        }
        publishers.push(publisher);
    }
    Ok(publishers)
}

/// The port of a `tcp://host:port` endpoint.
///
/// # Errors
/// No numeric port after the last `:`.
pub fn port_of(endpoint: &str) -> Result<u16> {
    endpoint
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .with_context(|| format!("endpoint {endpoint} has no port"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ckf_engine::encode::{BlockRemoved, Event};
    use std::time::Duration;
    use zeromq::{DealerSocket, SubSocket};

    fn batch(n: u64) -> Batch {
        Batch {
            ts: n as f64,
            events: vec![Event::Removed(BlockRemoved {
                block_hashes: vec![n],
                medium: Some("GPU".into()),
                ..BlockRemoved::default()
            })],
            data_parallel_rank: Some(0),
        }
    }

    fn frames(message: ZmqMessage) -> Vec<Vec<u8>> {
        message.into_vec().into_iter().map(|f| f.to_vec()).collect()
    }

    async fn recv(socket: &mut impl SocketRecv) -> Vec<Vec<u8>> {
        let message = tokio::time::timeout(Duration::from_secs(10), socket.recv())
            .await
            .expect("a message within 10 s")
            .expect("recv");
        frames(message)
    }

    #[tokio::test]
    async fn publishes_vllm_frames_and_replays_the_bounded_buffer() {
        let mut publisher = EnginePublisher::bind(
            "tcp://127.0.0.1:0",
            Some("tcp://127.0.0.1:0"),
            "kv",
            3,
            Layout::Tagged,
        )
        .await
        .unwrap();
        let mut sub = SubSocket::new();
        sub.connect(publisher.endpoint()).await.unwrap();
        sub.subscribe("").await.unwrap();
        // Slow joiner: publish until the subscription is live, then count from there.
        let first = loop {
            let seq = publisher.publish(&batch(99)).await.unwrap();
            if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(50), sub.recv()).await {
                break (seq, frames(m));
            }
        };
        assert_eq!(first.1[0], b"kv");
        assert_eq!(first.1[2], encode_batch(&batch(99), Layout::Tagged));
        let start = publisher.next_sequence();
        for n in 0..5 {
            assert_eq!(
                publisher.publish(&batch(n)).await.unwrap(),
                start + n as i64
            );
        }
        let mut seen = Vec::new();
        while seen.last() != Some(&(start + 4)) {
            let f = recv(&mut sub).await;
            assert_eq!(f.len(), 3);
            seen.push(i64::from_be_bytes(f[1].clone().try_into().unwrap()));
        }
        assert_eq!(seen, (start..start + 5).collect::<Vec<_>>());

        // Replay from `start`: only the last 3 batches are kept.
        let mut dealer = DealerSocket::new();
        dealer
            .connect(publisher.replay_endpoint().unwrap())
            .await
            .unwrap();
        let mut request = ZmqMessage::from(Bytes::new());
        request.push_back(Bytes::copy_from_slice(&start.to_be_bytes()));
        dealer.send(request).await.unwrap();
        for n in 2..5 {
            let f = recv(&mut dealer).await;
            assert_eq!(f.len(), 4, "{f:?}");
            assert!(f[0].is_empty());
            assert_eq!(f[1], b"kv");
            assert_eq!(
                i64::from_be_bytes(f[2].clone().try_into().unwrap()),
                start + n
            );
            assert_eq!(f[3], encode_batch(&batch(n as u64), Layout::Tagged));
        }
        let end = recv(&mut dealer).await;
        assert_eq!(
            end,
            vec![vec![], vec![], (-1i64).to_be_bytes().to_vec(), vec![]]
        );

        // A malformed request is ignored; the next good one is still served.
        let mut bad = ZmqMessage::from(Bytes::new());
        bad.push_back(Bytes::from_static(b"x"));
        bad.push_back(Bytes::from_static(b"y"));
        dealer.send(bad).await.unwrap();
        let mut request = ZmqMessage::from(Bytes::new());
        request.push_back(Bytes::copy_from_slice(&(start + 4).to_be_bytes()));
        dealer.send(request).await.unwrap();
        let f = recv(&mut dealer).await;
        assert_eq!(
            i64::from_be_bytes(f[2].clone().try_into().unwrap()),
            start + 4
        );
        assert_eq!(recv(&mut dealer).await[2], (-1i64).to_be_bytes().to_vec());
    }

    #[tokio::test]
    async fn ranks_bind_consecutive_ports() {
        let publishers = bind_ranks("127.0.0.1", 3, "", 8, Layout::Tagged)
            .await
            .unwrap();
        let ports: Vec<u16> = publishers
            .iter()
            .map(|p| port_of(p.endpoint()).unwrap())
            .collect();
        assert_eq!(ports, vec![ports[0], ports[0] + 1, ports[0] + 2]);
        let replay: Vec<u16> = publishers
            .iter()
            .map(|p| port_of(p.replay_endpoint().unwrap()).unwrap())
            .collect();
        assert_eq!(replay, vec![replay[0], replay[0] + 1, replay[0] + 2]);
    }

    #[test]
    fn replay_requests_parse_as_vllm_does() {
        let mut m = ZmqMessage::from(Bytes::from_static(b"id"));
        m.push_back(Bytes::new());
        m.push_back(Bytes::copy_from_slice(&7u64.to_be_bytes()));
        assert_eq!(parse_request(&m).unwrap(), 7);
        let mut short = ZmqMessage::from(Bytes::from_static(b"id"));
        short.push_back(Bytes::new());
        short.push_back(Bytes::from_static(&[1, 0]));
        assert_eq!(parse_request(&short).unwrap(), 256);
        let mut huge = ZmqMessage::from(Bytes::from_static(b"id"));
        huge.push_back(Bytes::new());
        huge.push_back(Bytes::copy_from_slice(&u64::MAX.to_be_bytes()));
        assert_eq!(parse_request(&huge).unwrap(), i64::MAX);
        assert!(parse_request(&ZmqMessage::from(Bytes::from_static(b"id"))).is_err());
    }
}
