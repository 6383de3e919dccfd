//! Raw bytes as a ZMQ multipart message (parts split at `0xff 0x00`), through
//! `EngineMessage::parse` and then `decode_batch` on the payload.
#![no_main]

use ckf_engine::message::EngineMessage;
use ckf_engine::wire::{DecodeLimits, decode_batch};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut parts: Vec<&[u8]> = Vec::new();
    let mut rest = data;
    while let Some(at) = rest.windows(2).position(|w| w == [0xff, 0x00]) {
        parts.push(&rest[..at]);
        rest = &rest[at + 2..];
    }
    parts.push(rest);
    if let Ok(frame) = EngineMessage::parse(&parts) {
        let _ = frame.is_replay_end();
        let _ = decode_batch(&frame.payload, &DecodeLimits::default());
    }
});
