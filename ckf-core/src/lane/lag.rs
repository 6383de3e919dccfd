//! The consumer's deadlines ([`LagPolicy`]): how long a lane may go without a frame, and how old
//! a delta's oldest change may be when it is applied.

use std::time::Duration;

/// Deadlines enforced by the consumer. A lane that violates one is retired, and only that lane
/// (docs/design.md, "Lane recovery and failure boundaries": "a ... lag-policy violation ...
/// retires only the affected lane").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LagPolicy {
    /// A lane holding a lease (awaiting its snapshot, or active and not drained) that receives no
    /// frame of its current lease for this long is retired with
    /// [`RetireReason::HeartbeatTimeout`](super::RetireReason::HeartbeatTimeout). `None` disables the check. Enforced by the
    /// [`crate::ingestion::IngestionWorkers`] workers, or by calling
    /// [`crate::global::GlobalCkfIndexer::check_deadlines`].
    pub heartbeat_deadline: Option<Duration>,
    /// Dirty-to-applied deadline: a delta whose `oldest_change_age_ms` plus the time it waited at
    /// the consumer exceeds this is not applied and the lane is retired with
    /// [`RetireReason::LagExceeded`](super::RetireReason::LagExceeded). `None` disables the check.
    pub apply_deadline: Option<Duration>,
    /// Drain grace: an active lane whose stream ended with an exact drain marker stays ready
    /// for this long (so a rolling producer restart keeps its DC warm), then is retired with
    /// [`RetireReason::DrainGraceExpired`](super::RetireReason::DrainGraceExpired) unless a new
    /// lease arrived. `Some(ZERO)` retires it at the first deadline check after the drain;
    /// `None` keeps drained lanes ready forever (tests and offline tools only). Enforced with
    /// the heartbeat deadline.
    pub drain_grace: Option<Duration>,
}

impl Default for LagPolicy {
    /// Heartbeat deadline 10 s, dirty-to-applied deadline 10 s, drain grace 30 s.
    fn default() -> Self {
        Self {
            heartbeat_deadline: Some(Duration::from_secs(10)),
            apply_deadline: Some(Duration::from_secs(10)),
            drain_grace: Some(Duration::from_secs(30)),
        }
    }
}

impl LagPolicy {
    /// No deadlines at all (tests and offline tools).
    pub const DISABLED: Self = Self {
        heartbeat_deadline: None,
        apply_deadline: None,
        drain_grace: None,
    };
}
