//! [`AttachMode`]: how a lease grant treats a lane another incarnation holds live.

/// How an attach treats a lane that another incarnation holds with a live attachment (see
/// [`crate::lane`] for what "live" means exactly).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum AttachMode {
    /// Supersede the holder (a freshly started producer: the newest one wins). Taking over a
    /// live holder is counted as contention.
    #[default]
    Takeover,
    /// Only if the lane has no live attachment of another incarnation; otherwise refused with
    /// [`AttachError::Occupied`](crate::global::AttachError::Occupied) and nothing changes (a superseded producer waiting for its lane
    /// back, so two live producers never take the lane from each other in turn).
    IfVacant,
}

impl AttachMode {
    /// Lower-case name for logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            AttachMode::Takeover => "takeover",
            AttachMode::IfVacant => "if_vacant",
        }
    }
}
