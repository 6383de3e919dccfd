//! ZMQ multipart messages of the engines' KV-event publishers.
//!
//! vLLM's `ZmqEventPublisher` (and SGLang's) send `[topic, sequence, payload]` on the PUB
//! socket, `sequence` an 8-byte big-endian signed integer; the replay (ROUTER) socket answers
//! a request with `[sequence, payload]` parts per buffered batch and ends with sequence `-1`
//! and an empty payload.

use thiserror::Error;

/// One publisher message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineMessage {
    /// The topic part (empty for replay replies, which carry none).
    pub topic: Vec<u8>,
    /// The publisher's sequence number of this batch (`-1`: end of a replay).
    pub sequence: i64,
    /// The msgpack `EventBatch` (empty for a replay end marker).
    pub payload: Vec<u8>,
}

/// Why a multipart message is not an engine message.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MessageError {
    /// Neither 2 nor 3 parts.
    #[error("expected 2 or 3 frame parts ([seq, payload] or [topic, seq, payload]), got {0}")]
    PartCount(usize),
    /// The sequence part is not 8 bytes.
    #[error("sequence part must be 8 bytes (big-endian i64), got {0}")]
    SequenceLength(usize),
}

impl MessageError {
    /// A short stable label for metrics: `"parts"` or `"sequence"`.
    pub fn kind_label(&self) -> &'static str {
        match self {
            Self::PartCount(_) => "parts",
            Self::SequenceLength(_) => "sequence",
        }
    }
}

impl EngineMessage {
    /// Parses `[topic, seq, payload]` (live) or `[seq, payload]` (replay reply); `seq` is 8
    /// bytes big-endian, read as `i64`.
    ///
    /// # Errors
    /// [`MessageError::PartCount`] for any other number of parts,
    /// [`MessageError::SequenceLength`] when the sequence part is not 8 bytes.
    pub fn parse(parts: &[&[u8]]) -> Result<EngineMessage, MessageError> {
        let (topic, seq, payload) = match parts {
            [topic, seq, payload] => (*topic, *seq, *payload),
            [seq, payload] => (&[][..], *seq, *payload),
            _ => return Err(MessageError::PartCount(parts.len())),
        };
        let seq: [u8; 8] = seq
            .try_into()
            .map_err(|_| MessageError::SequenceLength(seq.len()))?;
        Ok(EngineMessage {
            topic: topic.to_vec(),
            sequence: i64::from_be_bytes(seq),
            payload: payload.to_vec(),
        })
    }

    /// The sequence of a frame whose payload is not read (one dropped for its size keeps its
    /// place in the sequence, so it is no gap): the part before the last, when there are 2 or
    /// 3 parts and it is 8 bytes.
    pub fn sequence_of(parts: &[&[u8]]) -> Option<i64> {
        match parts {
            [_, seq, _] | [seq, _] => Some(i64::from_be_bytes((*seq).try_into().ok()?)),
            _ => None,
        }
    }

    /// Whether this is the end marker of a replay: sequence `-1` or an empty payload.
    pub fn is_replay_end(&self) -> bool {
        self.sequence == -1 || self.payload.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_and_replay_frames() {
        let seq = 258i64.to_be_bytes();
        let f = EngineMessage::parse(&[b"kv", &seq, b"\x92\x00\x90"]).unwrap();
        assert_eq!(
            f,
            EngineMessage {
                topic: b"kv".to_vec(),
                sequence: 258,
                payload: b"\x92\x00\x90".to_vec()
            }
        );
        assert!(!f.is_replay_end());
        let f = EngineMessage::parse(&[&seq, b"x"]).unwrap();
        assert_eq!((f.topic.len(), f.sequence), (0, 258));
        let end = EngineMessage::parse(&[&(-1i64).to_be_bytes(), b""]).unwrap();
        assert!(end.is_replay_end());
        assert!(EngineMessage::parse(&[&seq, b""]).unwrap().is_replay_end());
        assert!(
            EngineMessage::parse(&[&(-1i64).to_be_bytes(), b"x"])
                .unwrap()
                .is_replay_end()
        );
    }

    #[test]
    fn the_sequence_of_an_unread_frame() {
        let seq = 7i64.to_be_bytes();
        assert_eq!(EngineMessage::sequence_of(&[b"t", &seq, b"x"]), Some(7));
        assert_eq!(EngineMessage::sequence_of(&[&seq, b"x"]), Some(7));
        assert_eq!(EngineMessage::sequence_of(&[b"t", b"short", b"x"]), None);
        assert_eq!(EngineMessage::sequence_of(&[&seq]), None);
    }

    #[test]
    fn bad_frames() {
        assert_eq!(EngineMessage::parse(&[]), Err(MessageError::PartCount(0)));
        assert_eq!(
            EngineMessage::parse(&[b"x"]),
            Err(MessageError::PartCount(1))
        );
        let four: [&[u8]; 4] = [b"", b"", b"", b""];
        assert_eq!(EngineMessage::parse(&four), Err(MessageError::PartCount(4)));
        let e = EngineMessage::parse(&[b"t", b"1234567", b"p"]).unwrap_err();
        assert_eq!(
            (e.clone(), e.kind_label()),
            (MessageError::SequenceLength(7), "sequence")
        );
        assert_eq!(MessageError::PartCount(1).kind_label(), "parts");
    }
}
