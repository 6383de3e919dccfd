//! The consumer's deadlines ([`LagPolicy`]): how long a lane may go without a frame, and how old
//! a delta's oldest change may be when it is applied.

use std::time::Duration;

/// Deadlines enforced by the consumer. A lane that violates one is retired, and only that lane
/// (design source, "Lane recovery and failure boundaries": "a ... lag-policy violation ...
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
}

impl Default for LagPolicy {
    /// Heartbeat deadline 10 s, dirty-to-applied deadline 10 s.
    fn default() -> Self {
        Self {
            heartbeat_deadline: Some(Duration::from_secs(10)),
            apply_deadline: Some(Duration::from_secs(10)),
        }
    }
}

impl LagPolicy {
    /// No deadlines at all (tests and offline tools).
    pub const DISABLED: Self = Self {
        heartbeat_deadline: None,
        apply_deadline: None,
    };
}
