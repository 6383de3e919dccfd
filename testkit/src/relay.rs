//! A raw `ckf.v1.Relay` client for tests: it sends exactly the frames a test builds (including
//! broken ones) and reads the indexer's replies and final status. It checks nothing itself, so
//! every refusal a test expects comes from the indexer.

use ckf_core::addressing::{Addressing, TableFormat};
use ckf_core::bucket;
use ckf_proto::v1::{self, relay_client::RelayClient, relay_frame::Frame, relay_reply::Reply};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

/// Largest message the client encodes: far above any indexer limit, so an oversized frame is
/// refused by the indexer, not by the client.
pub const MAX_ENCODING_BYTES: usize = 64 << 20;

/// The `Attach` frame of a raw producer of pool `domain/dc` with `format`.
pub fn attach(domain: &str, dc: &str, incarnation: u64, format: TableFormat) -> v1::Attach {
    v1::Attach {
        pool: Some(v1::PoolId {
            domain: domain.into(),
            dc: dc.into(),
        }),
        incarnation,
        format: Some(format.into()),
        mode: v1::AttachMode::Takeover as i32,
    }
}

/// An open, attached relay stream.
#[derive(Debug)]
pub struct RawStream {
    tx: mpsc::Sender<v1::RelayFrame>,
    replies: Streaming<v1::RelayReply>,
    /// The granted lease.
    pub lease: v1::LaneLease,
    /// The whole `LeaseGranted` reply.
    pub granted: v1::LeaseGranted,
}

impl RawStream {
    /// Opens a stream on `channel` and sends `attach`.
    ///
    /// # Errors
    /// The indexer's status when it refuses the attachment.
    ///
    /// # Panics
    /// When the first reply is not `LeaseGranted`.
    pub async fn open(channel: Channel, attach: v1::Attach) -> Result<Self, Status> {
        Self::open_with(channel, attach, MetadataMap::new()).await
    }

    /// As [`RawStream::open`], sending `authorization: Bearer <token>` when `token` is given.
    ///
    /// # Errors
    /// The indexer's status when it refuses the attachment.
    ///
    /// # Panics
    /// When the first reply is not `LeaseGranted`, or `token` is not a valid header value.
    pub async fn open_with_token(
        channel: Channel,
        attach: v1::Attach,
        token: Option<&str>,
    ) -> Result<Self, Status> {
        let mut metadata = MetadataMap::new();
        if let Some(token) = token {
            let value = format!("Bearer {token}").parse().expect("a header value");
            metadata.insert("authorization", value);
        }
        Self::open_with(channel, attach, metadata).await
    }

    /// As [`RawStream::open`], with `metadata` on the stream's request.
    ///
    /// # Errors
    /// The indexer's status when it refuses the attachment.
    ///
    /// # Panics
    /// When the first reply is not `LeaseGranted`.
    pub async fn open_with(
        channel: Channel,
        attach: v1::Attach,
        metadata: MetadataMap,
    ) -> Result<Self, Status> {
        let mut client = RelayClient::new(channel).max_encoding_message_size(MAX_ENCODING_BYTES);
        let (tx, rx) = mpsc::channel(64);
        tx.send(Frame::Attach(attach).into())
            .await
            .expect("fresh channel has room");
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        *request.metadata_mut() = metadata;
        let mut replies = client.publish(request).await?.into_inner();
        match replies.message().await?.and_then(|r| r.reply) {
            Some(Reply::LeaseGranted(granted)) => Ok(Self {
                tx,
                replies,
                lease: granted.lease.expect("LeaseGranted carries a lease"),
                granted,
            }),
            other => panic!("expected LeaseGranted, got {other:?}"),
        }
    }

    /// Sends a frame (a send after the indexer ended the stream is not an error here: the test
    /// reads the outcome from the replies).
    pub async fn send(&self, frame: Frame) {
        self.send_raw(frame.into()).await;
    }

    /// Sends a whole `RelayFrame` as built (e.g. one with no frame set).
    pub async fn send_raw(&self, frame: v1::RelayFrame) {
        let _ = self.tx.send(frame).await;
    }

    /// The next reply (`None` at a clean end), or the terminal status.
    ///
    /// # Errors
    /// The stream's terminal status.
    pub async fn next(&mut self) -> Result<Option<Reply>, Status> {
        Ok(self.replies.message().await?.and_then(|r| r.reply))
    }

    /// The next reply, which must be an `Ack`.
    ///
    /// # Panics
    /// On anything else.
    pub async fn expect_ack(&mut self) -> v1::Ack {
        match self.next().await {
            Ok(Some(Reply::Ack(ack))) => ack,
            other => panic!("expected Ack, got {other:?}"),
        }
    }

    /// Expects `Retired` and then the terminal status; returns both.
    ///
    /// # Panics
    /// When the replies are anything else.
    pub async fn expect_retired(&mut self) -> (v1::Retired, Status) {
        let retired = match self.next().await {
            Ok(Some(Reply::Retired(r))) => r,
            other => panic!("expected Retired, got {other:?}"),
        };
        let status = match self.next().await {
            Err(status) => status,
            other => panic!("expected a terminal status after {retired:?}, got {other:?}"),
        };
        (retired, status)
    }

    /// Expects `Retired(reason)` with a detail, then a terminal status with `code`; returns the
    /// status.
    ///
    /// # Panics
    /// When the reason, the detail or the code differ.
    pub async fn expect_retired_as(&mut self, reason: v1::RetireReason, code: Code) -> Status {
        let (retired, status) = self.expect_retired().await;
        assert_eq!(retired.reason(), reason, "{retired:?} / {status:?}");
        assert!(!retired.detail.is_empty(), "{retired:?}");
        assert_eq!(status.code(), code, "{status:?}");
        status
    }

    /// Sends `table` as a barrier snapshot tagged `sequence` in chunks of `chunk_buckets`
    /// buckets and returns the activation `Ack`.
    ///
    /// # Panics
    /// When the indexer answers anything but an `Ack` after the last chunk.
    pub async fn snapshot(
        &mut self,
        sequence: u64,
        table: &[u64],
        chunk_buckets: usize,
    ) -> v1::Ack {
        for (i, chunk) in table.chunks(chunk_buckets).enumerate() {
            self.send(self.chunk(sequence, (i * chunk_buckets) as u64, chunk))
                .await;
        }
        self.expect_ack().await
    }

    /// A snapshot chunk of `words` starting at `first_bucket` under this stream's lease.
    pub fn chunk(&self, sequence: u64, first_bucket: u64, words: &[u64]) -> Frame {
        Frame::SnapshotChunk(v1::SnapshotChunk {
            lease: Some(self.lease),
            sequence,
            first_bucket,
            words: words.iter().flat_map(|w| w.to_le_bytes()).collect(),
        })
    }

    /// A delta `base -> sequence` installing `images` (`(bucket, image)` pairs) under this
    /// stream's lease.
    pub fn delta(&self, base: u64, sequence: u64, images: &[(u32, u64)]) -> Frame {
        Frame::Delta(v1::Delta {
            lease: Some(self.lease),
            base_sequence: base,
            sequence,
            buckets: images.iter().map(|&(b, _)| b).collect(),
            images: images.iter().map(|&(_, i)| i).collect(),
            oldest_change_age_ms: 0,
        })
    }

    /// A drain marker claiming `sequence` under this stream's lease.
    pub fn drain(&self, sequence: u64) -> Frame {
        Frame::DrainMarker(v1::DrainMarker {
            lease: Some(self.lease),
            sequence,
        })
    }

    /// A heartbeat under this stream's lease claiming `sequence` as the last one sent (an
    /// active lane retires when it differs from the installed sequence).
    pub fn heartbeat_claiming(&self, sequence: u64) -> Frame {
        Frame::Heartbeat(v1::Heartbeat {
            lease: Some(self.lease),
            sequence,
        })
    }

    /// A heartbeat under this stream's lease claiming sequence 0.
    pub fn heartbeat(&self) -> Frame {
        Frame::Heartbeat(v1::Heartbeat {
            lease: Some(self.lease),
            sequence: 0,
        })
    }
}

/// A packed table built by hand: block hashes placed in their primary bucket's first free slot.
#[derive(Debug, Clone)]
pub struct RawTable {
    addressing: Addressing,
    /// Packed bucket words (slot 0 in the low 16 bits).
    pub words: Vec<u64>,
}

impl RawTable {
    /// An empty table of `format`.
    ///
    /// # Panics
    /// When `format` is invalid.
    pub fn new(format: &TableFormat) -> Self {
        let addressing = Addressing::new(format).expect("valid format");
        Self {
            words: vec![0; addressing.bucket_count() as usize],
            addressing,
        }
    }

    /// Places `hash`'s fingerprint in its primary bucket; returns `(bucket, new image)`.
    ///
    /// # Panics
    /// When the bucket is full (tests place a handful of hashes).
    pub fn place(&mut self, hash: u64) -> (u32, u64) {
        let loc = self.addressing.locate(hash);
        let word = &mut self.words[loc.bucket_a as usize];
        let slot = bucket::find_empty(*word).expect("a free slot in a nearly empty table");
        *word = bucket::with_slot(*word, slot, loc.fingerprint);
        (loc.bucket_a, *word)
    }
}
