//! One relay session per configured indexer endpoint: the client side of `ckf.v1.Relay`.
//!
//! Each endpoint is an independent attachment with its own lease, barrier snapshot and sequence
//! continuity. The task runs [sessions](session) in a loop: when one fails (transport error,
//! stream end, `Retired` reply, a fence by the producer) the session names the
//! [`FenceReason`](ckf_core::publication::FenceReason) (a `Retired` reason converts with ckf-proto's `From<v1::RetireReason>`), the
//! task tells the state actor to fence that publisher and acts on the reason's
//! [`Disposition`](ckf_core::failure::Disposition):
//! [`NewLeaseAndSnapshot`](ckf_core::failure::Disposition::NewLeaseAndSnapshot) waits out a
//! bounded exponential [`Backoff`] with jitter and attaches again (new lease, new barrier
//! snapshot); [`Omission`](ckf_core::failure::Disposition::Omission) (a shutdown) ends the task. Every transition is logged
//! with its reason and exported as `ckf_producer_attachment_state`.
//!
//! Log context: the task runs inside a `relay` span (`indexer`, `pool`) and each session inside
//! a `session` span whose `lease` is recorded once granted, so the events themselves carry only
//! what is new (the end-to-end-matched events keep their fields unchanged).
//!
//! Supersession is recovered without fighting: `Retired(SUPERSEDED)` on the current stream
//! means *another* attachment for this pool got a newer lease (a second producer process for
//! the pool, or the same indexer listed twice), because this task never runs two sessions at
//! once. Re-attaching as a fresh producer does (`ATTACH_MODE_TAKEOVER`) would supersede the
//! other producer in turn and the two would take the lane from each other forever. Instead the
//! task logs an ERROR naming the pool and the new holder, exports `superseded` and then
//! `standby`, and from then on attaches to that endpoint with `ATTACH_MODE_IF_VACANT` under the
//! same bounded backoff (at most `max_backoff` apart). The indexer refuses such an attach
//! (`FAILED_PRECONDITION`, metadata `ckf-attach-refused: occupied`) while the other producer's
//! attachment is live, changing nothing; each refusal is counted
//! (`ckf_producer_standby_refusals_total`) and logged at most once per [`STANDBY_LOG_EVERY`].
//! Once the lane is vacant (the other producer drained, was killed and missed the heartbeat
//! deadline, or was retired) the attach is granted and the task publishes a barrier snapshot
//! as usual. A fresh producer start always uses `TAKEOVER`: the newest producer wins, and the
//! older one stands by. The same holds after this producer stalled (SIGSTOP, a frozen VM)
//! past the indexer's heartbeat deadline, told by `Retired(HEARTBEAT_TIMEOUT)` or seen by the
//! process's [`stall_watch`] (time spent waiting on the indexer's flow control does not count):
//! it re-attaches `IF_VACANT`, so a standby that
//! recovered the lane meanwhile keeps it (one lane swap per stall, not two). The producer stays `SERVING` on health and keeps answering Ingest while
//! it stands by: it holds its exact state and is ready to publish it the moment the lane is
//! vacant.
//!
//! The rules (the terms of a lease, when the snapshot counts as installed, the mode of the
//! next attach) are `ckf_core::relay_session`'s; these files do the I/O, logs and metrics.
//!
//! | file | owns |
//! | --- | --- |
//! | [`attachment`] | the relay session of one endpoint: its settings, handles and exported state |
//! | [`attach_loop`] | attach, fence, back off, re-attach; standing by; the drain outcome |
//! | [`session`] | one attachment: connect, attach, snapshot chunks, deltas, heartbeats, drain |
//! | [`backoff`] | reconnect delays |
//! | [`stall_watch`] | this process's own stalls, told from waiting on an indexer |

pub mod attach_loop;
pub mod attachment;
pub mod backoff;
pub mod session;
pub mod stall_watch;

pub use attach_loop::STANDBY_LOG_EVERY;
pub use attachment::{DrainOutcome, IndexerAttachment, RelaySettings};
pub use backoff::Backoff;
