//! The batch envelope: `[ts, events, dp_rank?]` or a map with `ts` and `events`, its events
//! array, and [`decode_batch`].

use crate::event::{DecodeNotes, EngineBatch, EngineEvent};
use crate::wire::limits::{DecodeError, DecodeLimits};
use crate::wire::reader::{Reader, Tok};

/// Decodes one `EventBatch` payload (vLLM, SGLang or TensorRT-LLM; tagged-map or positional
/// events).
///
/// # Errors
/// A [`DecodeError`] when the payload or its envelope is not a batch; malformed events inside
/// a good envelope are skipped and counted in [`EngineBatch::notes`] instead.
pub fn decode_batch(payload: &[u8], limits: &DecodeLimits) -> Result<EngineBatch, DecodeError> {
    let mut rd = Reader {
        buf: payload,
        pos: 0,
        limits,
    };
    let mut batch = EngineBatch::default();
    let mut ts = None;
    let mut events = None;
    // The envelope is depth 1, its fields depth 2, events depth 3, event fields depth 4.
    let envelope = rd.next()?;
    if let Tok::Array(_) | Tok::Map(_) = envelope {
        rd.enter(1)?;
    }
    match envelope {
        Tok::Array(n) => {
            if n < 2 {
                rd.skip_items(u64::from(n), 2)?;
                return Err(DecodeError::Type(format!("batch array of {n} elements")));
            }
            ts = Some(rd.read_ts()?);
            events = Some(rd.read_events(&mut batch.notes)?);
            if n >= 3 {
                batch.dp_rank = rd.read_dp_rank()?;
            }
            for _ in 3..n {
                rd.skip_value(2)?;
                batch.notes.unknown_fields += 1;
            }
        }
        Tok::Map(n) => {
            for _ in 0..n {
                let key = rd.next()?;
                match key {
                    Tok::Str(b"ts") => ts = Some(rd.read_ts()?),
                    Tok::Str(b"events") => events = Some(rd.read_events(&mut batch.notes)?),
                    Tok::Str(b"data_parallel_rank" | b"attn_dp_rank") => {
                        batch.dp_rank = rd.read_dp_rank()?;
                    }
                    other => {
                        rd.skip_rest(&other, 2)?;
                        rd.skip_value(2)?;
                        batch.notes.unknown_fields += 1;
                    }
                }
            }
        }
        other => {
            return Err(DecodeError::Type(format!(
                "batch is {}, not an array or map",
                other.kind()
            )));
        }
    }
    if rd.pos != payload.len() {
        return Err(DecodeError::Trailing(payload.len() - rd.pos));
    }
    batch.ts = ts.ok_or_else(|| DecodeError::Type("no ts".into()))?;
    batch.events = events.ok_or_else(|| DecodeError::Type("no events".into()))?;
    Ok(batch)
}

impl Reader<'_, '_> {
    pub(super) fn read_ts(&mut self) -> Result<f64, DecodeError> {
        match self.next()? {
            Tok::Float(f) => Ok(f),
            Tok::Uint(u) => Ok(u as f64),
            Tok::Int(i) => Ok(i as f64),
            other => {
                self.skip_rest(&other, 2)?;
                Err(DecodeError::Type(format!("ts is {}", other.kind())))
            }
        }
    }

    pub(super) fn read_dp_rank(&mut self) -> Result<Option<u32>, DecodeError> {
        match self.next()? {
            Tok::Nil => Ok(None),
            // A rank outside `u32` (negative, or 2^32 and above) reads as `u32::MAX`, which no
            // rank bound admits: the caller refuses it as a rank, not as a malformed batch.
            t @ (Tok::Uint(_) | Tok::Int(_)) => Ok(Some(t.as_u32().unwrap_or(u32::MAX))),
            other => {
                self.skip_rest(&other, 2)?;
                Err(DecodeError::Type(format!("dp rank is {}", other.kind())))
            }
        }
    }

    /// The events array (depth 2); each event at depth 3.
    pub(super) fn read_events(
        &mut self,
        notes: &mut DecodeNotes,
    ) -> Result<Vec<EngineEvent>, DecodeError> {
        let n = match self.next()? {
            Tok::Array(n) => n,
            other => {
                self.skip_rest(&other, 2)?;
                return Err(DecodeError::Type(format!("events is {}", other.kind())));
            }
        };
        self.enter(2)?;
        if n as usize > self.limits.max_events {
            return Err(DecodeError::Limit(format!(
                "{n} events > max_events {}",
                self.limits.max_events
            )));
        }
        let mut events = Vec::with_capacity(self.cap(n as usize));
        for _ in 0..n {
            match self.read_event(notes)? {
                Ok(ev) => {
                    if let EngineEvent::Unknown { .. } = ev {
                        notes.unknown_events += 1;
                    }
                    events.push(ev);
                }
                Err(why) => {
                    notes.malformed_events += 1;
                    notes.first_malformed.get_or_insert(why);
                }
            }
        }
        Ok(events)
    }
}
