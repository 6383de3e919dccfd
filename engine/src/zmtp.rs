//! Bounds on the ZMTP byte stream an engine sends, checked before the ZMQ library sees it.
//!
//! The ZMQ library the producer uses (`zeromq` 0.7) reserves a frame's whole claimed length
//! as soon as it reads the frame header: one 9-byte header claiming 2^50 bytes, from anyone who
//! can reach an engine socket, made the allocator abort the producer. The library has no
//! maximum-message option, so the producer passes every engine connection through a relay that
//! feeds the bytes from the engine to a [`ZmtpGuard`] first and closes the connection on the
//! first [`ZmtpViolation`], before any oversized frame reaches the library.
//!
//! The guard follows the ZMTP 3.x framing (<https://rfc.zeromq.org/spec/23/>, sections
//! "Greeting" and "Framing"):
//!
//! ```text
//! greeting  = 64 bytes: 0xFF, 8 padding bytes, 0x7F, major, minor, 20-byte mechanism, as-server, 31 filler
//! frame     = flags (bit 0 MORE, bit 1 LONG, bit 2 COMMAND, bits 3-7 zero)
//!             + size (1 byte, or 8 bytes big-endian when LONG) + body
//! message   = frames whose MORE bit is set, ended by one without it (commands are single frames)
//! ```
//!
//! It only counts bytes: it never buffers a body, so it costs O(1) memory whatever the peer sends,
//! and it gives the same verdict however the stream is cut into reads (a property test checks it
//! against a whole-buffer parser).

use thiserror::Error;

/// Length of the ZMTP 3 greeting, in bytes.
pub const GREETING_BYTES: usize = 64;

/// What a guarded connection may carry. Every bound is inclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZmtpLimits {
    /// Largest message frame body, in bytes (the engine's msgpack payload is one frame).
    pub max_frame_bytes: u64,
    /// Largest sum of frame bodies in one multipart message, in bytes.
    pub max_message_bytes: u64,
    /// Most frames in one multipart message (an engine sends 3; a replay reply 3 or 4).
    pub max_frames_per_message: u32,
    /// Largest command frame body (READY, SUBSCRIBE, PING, ...), in bytes.
    pub max_command_bytes: u64,
}

impl ZmtpLimits {
    /// Limits for engine sockets whose payload frames may be up to `max_frame_bytes`: the topic
    /// and sequence frames and the replay's empty delimiter fit in the 64 KiB of headroom.
    pub fn for_engine(max_frame_bytes: u64) -> Self {
        Self {
            max_frame_bytes,
            max_message_bytes: max_frame_bytes.saturating_add(64 << 10),
            max_frames_per_message: 16,
            max_command_bytes: 64 << 10,
        }
    }
}

/// Why a guarded connection is closed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ZmtpViolation {
    /// The first 64 bytes are not a ZMTP 3.x greeting.
    #[error("not a ZMTP 3 greeting: {0}")]
    BadGreeting(&'static str),
    /// A flags byte with reserved bits set, or a command frame with the MORE bit.
    #[error("bad frame flags 0x{0:02x}")]
    BadFlags(u8),
    /// A message frame claims more than [`ZmtpLimits::max_frame_bytes`].
    #[error("a frame claims {claimed} bytes; the limit is {limit}")]
    FrameTooLarge {
        /// The size in the frame header.
        claimed: u64,
        /// The limit.
        limit: u64,
    },
    /// A command frame claims more than [`ZmtpLimits::max_command_bytes`].
    #[error("a command frame claims {claimed} bytes; the limit is {limit}")]
    CommandTooLarge {
        /// The size in the frame header.
        claimed: u64,
        /// The limit.
        limit: u64,
    },
    /// A multipart message's frames add up to more than [`ZmtpLimits::max_message_bytes`].
    #[error("a message reaches {total} bytes; the limit is {limit}")]
    MessageTooLarge {
        /// Bytes of the message so far, including the frame that broke the limit.
        total: u64,
        /// The limit.
        limit: u64,
    },
    /// A multipart message has more than [`ZmtpLimits::max_frames_per_message`] frames.
    #[error("a message has more than {limit} frames")]
    TooManyFrames {
        /// The limit.
        limit: u32,
    },
}

impl ZmtpViolation {
    /// A short metric label for the violation.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::BadGreeting(_) => "zmtp_bad_greeting",
            Self::BadFlags(_) => "zmtp_bad_flags",
            Self::FrameTooLarge { .. } => "zmtp_frame_too_large",
            Self::CommandTooLarge { .. } => "zmtp_command_too_large",
            Self::MessageTooLarge { .. } => "zmtp_message_too_large",
            Self::TooManyFrames { .. } => "zmtp_too_many_frames",
        }
    }
}

/// Where the guard is in the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading the greeting; `seen` bytes of it so far.
    Greeting { seen: usize },
    /// Expecting a flags byte.
    Flags,
    /// Reading a size field: `need` more bytes, value so far `acc`.
    Size { flags: u8, need: u8, acc: u64 },
    /// Skipping a body: `left` bytes to go; `command` when it is a command frame's.
    Body { left: u64, command: bool },
}

/// A stream checker for the bytes one peer sends (see the module docs).
#[derive(Debug, Clone)]
pub struct ZmtpGuard {
    limits: ZmtpLimits,
    state: State,
    /// The first greeting bytes kept for the checks (0xFF at 0, 0x7F at 9, major at 10).
    greeting: [u8; 11],
    /// Bytes and frames of the multipart message in progress.
    message_bytes: u64,
    message_frames: u32,
    /// Set once a violation was reported: every later call reports it again.
    failed: Option<ZmtpViolation>,
    /// Set once the greeting and one whole command frame have passed.
    handshaken: bool,
}

const FLAG_MORE: u8 = 0b001;
const FLAG_LONG: u8 = 0b010;
const FLAG_COMMAND: u8 = 0b100;

impl ZmtpGuard {
    /// A guard at the start of a connection.
    pub fn new(limits: ZmtpLimits) -> Self {
        Self {
            limits,
            state: State::Greeting { seen: 0 },
            greeting: [0; 11],
            message_bytes: 0,
            message_frames: 0,
            failed: None,
            handshaken: false,
        }
    }

    /// True once the whole 64-byte greeting has passed.
    pub fn greeting_done(&self) -> bool {
        !matches!(self.state, State::Greeting { .. })
    }

    /// True once the greeting and the peer's first whole command frame (the NULL mechanism's
    /// READY, which ends its handshake) have passed without a violation.
    ///
    /// Why: a relay gives a new connection a deadline to get here, so a peer that connects and
    /// then stays silent (or stops mid-greeting) cannot hold a connection slot for ever; after
    /// this point the peer has proven it speaks ZMTP and only the connection limit applies.
    pub fn handshake_done(&self) -> bool {
        self.handshaken && self.failed.is_none()
    }

    /// Checks the next `bytes` the peer sent (any split of the stream gives the same verdict).
    ///
    /// # Errors
    /// The first [`ZmtpViolation`] in the stream; once one was reported, every later call
    /// returns it again (the connection must be closed).
    pub fn inspect(&mut self, bytes: &[u8]) -> Result<(), ZmtpViolation> {
        if let Some(v) = &self.failed {
            return Err(v.clone());
        }
        let result = self.run(bytes);
        if let Err(v) = &result {
            self.failed = Some(v.clone());
        }
        result
    }

    fn run(&mut self, mut bytes: &[u8]) -> Result<(), ZmtpViolation> {
        while !bytes.is_empty() {
            match self.state {
                State::Greeting { seen } => {
                    let take = (GREETING_BYTES - seen).min(bytes.len());
                    for (i, &b) in bytes[..take].iter().enumerate() {
                        if let Some(slot) = self.greeting.get_mut(seen + i) {
                            *slot = b;
                        }
                    }
                    let seen = seen + take;
                    bytes = &bytes[take..];
                    self.check_greeting(seen)?;
                    self.state = if seen == GREETING_BYTES {
                        State::Flags
                    } else {
                        State::Greeting { seen }
                    };
                }
                State::Flags => {
                    let flags = bytes[0];
                    bytes = &bytes[1..];
                    if flags & !(FLAG_MORE | FLAG_LONG | FLAG_COMMAND) != 0
                        || (flags & FLAG_COMMAND != 0 && flags & FLAG_MORE != 0)
                    {
                        return Err(ZmtpViolation::BadFlags(flags));
                    }
                    let need = if flags & FLAG_LONG != 0 { 8 } else { 1 };
                    self.state = State::Size {
                        flags,
                        need,
                        acc: 0,
                    };
                }
                State::Size { flags, need, acc } => {
                    let acc = (acc << 8) | u64::from(bytes[0]);
                    bytes = &bytes[1..];
                    self.state = if need > 1 {
                        State::Size {
                            flags,
                            need: need - 1,
                            acc,
                        }
                    } else {
                        self.frame(flags, acc)?
                    };
                }
                State::Body { left, command } => {
                    let take = left.min(bytes.len() as u64);
                    bytes = &bytes[take as usize..];
                    self.state = if left == take {
                        self.handshaken |= command;
                        State::Flags
                    } else {
                        State::Body {
                            left: left - take,
                            command,
                        }
                    };
                }
            }
        }
        Ok(())
    }

    /// Checks what the greeting bytes seen so far can already tell.
    fn check_greeting(&self, seen: usize) -> Result<(), ZmtpViolation> {
        let g = &self.greeting;
        if seen > 0 && g[0] != 0xff {
            return Err(ZmtpViolation::BadGreeting("first byte is not 0xFF"));
        }
        if seen > 9 && g[9] & 1 != 1 {
            return Err(ZmtpViolation::BadGreeting("signature byte 9 lacks bit 0"));
        }
        if seen > 10 && g[10] < 3 {
            return Err(ZmtpViolation::BadGreeting("major version below 3"));
        }
        Ok(())
    }

    /// A complete frame header: checks it and returns the state for its body.
    fn frame(&mut self, flags: u8, size: u64) -> Result<State, ZmtpViolation> {
        let l = &self.limits;
        let command = flags & FLAG_COMMAND != 0;
        if command {
            if size > l.max_command_bytes {
                return Err(ZmtpViolation::CommandTooLarge {
                    claimed: size,
                    limit: l.max_command_bytes,
                });
            }
        } else {
            if size > l.max_frame_bytes {
                return Err(ZmtpViolation::FrameTooLarge {
                    claimed: size,
                    limit: l.max_frame_bytes,
                });
            }
            self.message_frames += 1;
            self.message_bytes += size;
            if self.message_frames > l.max_frames_per_message {
                return Err(ZmtpViolation::TooManyFrames {
                    limit: l.max_frames_per_message,
                });
            }
            if self.message_bytes > l.max_message_bytes {
                return Err(ZmtpViolation::MessageTooLarge {
                    total: self.message_bytes,
                    limit: l.max_message_bytes,
                });
            }
            if flags & FLAG_MORE == 0 {
                self.message_frames = 0;
                self.message_bytes = 0;
            }
        }
        Ok(if size == 0 {
            self.handshaken |= command;
            State::Flags
        } else {
            State::Body {
                left: size,
                command,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LIMITS: ZmtpLimits = ZmtpLimits {
        max_frame_bytes: 1000,
        max_message_bytes: 1500,
        max_frames_per_message: 4,
        max_command_bytes: 100,
    };

    fn greeting() -> Vec<u8> {
        let mut g = vec![0u8; GREETING_BYTES];
        g[0] = 0xff;
        g[9] = 0x7f;
        g[10] = 3;
        g[11] = 1;
        g[12..16].copy_from_slice(b"NULL");
        g
    }

    /// One frame's bytes: short form when the size fits a byte unless `long` is asked for.
    fn frame(flags: u8, body: &[u8], long: bool) -> Vec<u8> {
        let mut out = Vec::new();
        if long || body.len() > 255 {
            out.push(flags | FLAG_LONG);
            out.extend_from_slice(&(body.len() as u64).to_be_bytes());
        } else {
            out.push(flags);
            out.push(body.len() as u8);
        }
        out.extend_from_slice(body);
        out
    }

    /// An engine message `[topic, seq, payload]` as ZMTP frames.
    fn engine_message(payload: &[u8]) -> Vec<u8> {
        let mut out = frame(FLAG_MORE, b"", false);
        out.extend(frame(FLAG_MORE, &7u64.to_be_bytes(), false));
        out.extend(frame(0, payload, false));
        out
    }

    fn check(bytes: &[u8]) -> Result<(), ZmtpViolation> {
        ZmtpGuard::new(LIMITS).inspect(bytes)
    }

    #[test]
    fn a_real_engine_stream_passes() {
        let mut s = greeting();
        s.extend(frame(
            FLAG_COMMAND,
            b"\x05READY\x0bSocket-Type\0\0\0\x03PUB",
            false,
        ));
        s.extend(engine_message(&[0xab; 900]));
        s.extend(engine_message(b""));
        assert_eq!(check(&s), Ok(()));
    }

    #[test]
    fn the_one_header_that_aborted_the_producer_is_refused() {
        let mut s = greeting();
        s.push(FLAG_LONG);
        s.extend_from_slice(&(1u64 << 50).to_be_bytes());
        assert_eq!(
            check(&s),
            Err(ZmtpViolation::FrameTooLarge {
                claimed: 1 << 50,
                limit: 1000
            })
        );
    }

    #[test]
    fn each_limit_is_inclusive_and_refused_one_past_it() {
        let ok = |s: Vec<u8>| check(&[greeting(), s].concat());
        assert_eq!(ok(frame(0, &[1; 1000], false)), Ok(()));
        assert!(matches!(
            ok(frame(0, &[1; 1001], false)),
            Err(ZmtpViolation::FrameTooLarge { claimed: 1001, .. })
        ));
        assert_eq!(ok(frame(FLAG_COMMAND, &[1; 100], false)), Ok(()));
        assert!(matches!(
            ok(frame(FLAG_COMMAND, &[1; 101], true)),
            Err(ZmtpViolation::CommandTooLarge { claimed: 101, .. })
        ));
        let parts = [
            frame(FLAG_MORE, &[1; 1000], false),
            frame(0, &[1; 500], false),
        ];
        assert_eq!(ok(parts.concat()), Ok(()));
        let parts = [
            frame(FLAG_MORE, &[1; 1000], false),
            frame(0, &[1; 501], false),
        ];
        assert!(matches!(
            ok(parts.concat()),
            Err(ZmtpViolation::MessageTooLarge { total: 1501, .. })
        ));
        let four: Vec<u8> = [
            frame(FLAG_MORE, b"a", false),
            frame(FLAG_MORE, b"b", false),
            frame(FLAG_MORE, b"c", false),
            frame(0, b"d", false),
        ]
        .concat();
        assert_eq!(ok(four.clone()), Ok(()));
        let five = [frame(FLAG_MORE, b"x", false), four].concat();
        assert_eq!(ok(five), Err(ZmtpViolation::TooManyFrames { limit: 4 }));
    }

    #[test]
    fn message_totals_restart_after_the_last_frame() {
        // Many maximum-size single-frame messages: each alone is within every limit.
        let mut s = greeting();
        for _ in 0..20 {
            s.extend(frame(0, &[2; 1000], false));
        }
        assert_eq!(check(&s), Ok(()));
    }

    #[test]
    fn bad_greetings_and_flags_are_refused() {
        let mut g = greeting();
        g[0] = 0x00;
        assert!(matches!(check(&g[..1]), Err(ZmtpViolation::BadGreeting(_))));
        let mut g = greeting();
        g[10] = 2;
        assert!(matches!(check(&g), Err(ZmtpViolation::BadGreeting(_))));
        let s = [greeting(), vec![0x08, 0]].concat();
        assert_eq!(check(&s), Err(ZmtpViolation::BadFlags(0x08)));
        let s = [greeting(), vec![FLAG_COMMAND | FLAG_MORE, 0]].concat();
        assert_eq!(
            check(&s),
            Err(ZmtpViolation::BadFlags(FLAG_COMMAND | FLAG_MORE))
        );
    }

    #[test]
    fn the_handshake_is_done_after_the_greeting_and_one_whole_command() {
        let mut guard = ZmtpGuard::new(LIMITS);
        let g = greeting();
        guard.inspect(&g[..63]).unwrap();
        assert!(!guard.greeting_done());
        guard.inspect(&g[63..]).unwrap();
        assert!(guard.greeting_done());
        assert!(!guard.handshake_done());
        // A message frame is no handshake.
        guard.inspect(&frame(0, b"x", false)).unwrap();
        assert!(!guard.handshake_done());
        let ready = frame(FLAG_COMMAND, b"\x05READY", false);
        guard.inspect(&ready[..ready.len() - 1]).unwrap();
        assert!(!guard.handshake_done(), "the command is not whole yet");
        guard.inspect(&ready[ready.len() - 1..]).unwrap();
        assert!(guard.handshake_done());
        // An empty command body counts too; a violation undoes it.
        let mut guard = ZmtpGuard::new(LIMITS);
        guard
            .inspect(&[greeting(), frame(FLAG_COMMAND, b"", false)].concat())
            .unwrap();
        assert!(guard.handshake_done());
        assert!(guard.inspect(&[0xff]).is_err());
        assert!(!guard.handshake_done());
    }

    #[test]
    fn a_violation_sticks() {
        let mut guard = ZmtpGuard::new(LIMITS);
        assert!(guard.inspect(&[0x00]).is_err());
        assert!(guard.inspect(&greeting()).is_err());
    }

    /// The model: parse the whole buffer at once, frame by frame.
    fn model(bytes: &[u8]) -> Result<(), ZmtpViolation> {
        let n = bytes.len().min(GREETING_BYTES);
        let g = &bytes[..n];
        if n > 0 && g[0] != 0xff {
            return Err(ZmtpViolation::BadGreeting("first byte is not 0xFF"));
        }
        if n > 9 && g[9] & 1 != 1 {
            return Err(ZmtpViolation::BadGreeting("signature byte 9 lacks bit 0"));
        }
        if n > 10 && g[10] < 3 {
            return Err(ZmtpViolation::BadGreeting("major version below 3"));
        }
        let mut i = GREETING_BYTES;
        let (mut frames, mut total) = (0u32, 0u64);
        while i < bytes.len() {
            let flags = bytes[i];
            if flags > 7 || flags & 5 == 5 {
                return Err(ZmtpViolation::BadFlags(flags));
            }
            let width = if flags & 2 != 0 { 8 } else { 1 };
            if i + 1 + width > bytes.len() {
                return Ok(());
            }
            let size = bytes[i + 1..i + 1 + width]
                .iter()
                .fold(0u64, |a, &b| (a << 8) | u64::from(b));
            if flags & 4 != 0 {
                if size > LIMITS.max_command_bytes {
                    return Err(ZmtpViolation::CommandTooLarge {
                        claimed: size,
                        limit: LIMITS.max_command_bytes,
                    });
                }
            } else {
                if size > LIMITS.max_frame_bytes {
                    return Err(ZmtpViolation::FrameTooLarge {
                        claimed: size,
                        limit: LIMITS.max_frame_bytes,
                    });
                }
                frames += 1;
                total += size;
                if frames > LIMITS.max_frames_per_message {
                    return Err(ZmtpViolation::TooManyFrames {
                        limit: LIMITS.max_frames_per_message,
                    });
                }
                if total > LIMITS.max_message_bytes {
                    return Err(ZmtpViolation::MessageTooLarge {
                        total,
                        limit: LIMITS.max_message_bytes,
                    });
                }
                if flags & 1 == 0 {
                    (frames, total) = (0, 0);
                }
            }
            i += 1 + width + size as usize;
        }
        Ok(())
    }

    /// A stream of frames, some of them over a limit, optionally with a corrupted byte.
    fn stream() -> impl Strategy<Value = Vec<u8>> {
        let one = (0u8..8, 0usize..1200, any::<bool>()).prop_map(|(flags, len, long)| {
            let flags = flags & !FLAG_LONG;
            frame(flags, &vec![0x5a; len], long)
        });
        (
            proptest::collection::vec(one, 0..12),
            proptest::option::of((any::<prop::sample::Index>(), any::<u8>())),
        )
            .prop_map(|(frames, corrupt)| {
                let mut s = [greeting(), frames.concat()].concat();
                if let Some((at, b)) = corrupt {
                    let i = at.index(s.len());
                    s[i] = b;
                }
                s
            })
    }

    proptest! {
        #[test]
        fn any_split_gives_the_whole_buffer_verdict(
            s in stream(),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
        ) {
            let expected = model(&s);
            let mut points: Vec<usize> = cuts.iter().map(|c| c.index(s.len() + 1)).collect();
            points.push(0);
            points.push(s.len());
            points.sort_unstable();
            let mut guard = ZmtpGuard::new(LIMITS);
            let mut got = Ok(());
            for w in points.windows(2) {
                got = guard.inspect(&s[w[0]..w[1]]);
                if got.is_err() {
                    break;
                }
            }
            prop_assert_eq!(got, expected);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = ZmtpGuard::new(ZmtpLimits::for_engine(64)).inspect(&bytes);
        }
    }
}
