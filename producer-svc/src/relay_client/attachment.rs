//! The relay session of one configured indexer endpoint: what it is configured with, the
//! handles it works through, and how it ended.

use std::time::Duration;

use ckf_core::identity::ProducerIdentity;
use ckf_svc_kit::Shutdown;

use crate::actor::ActorHandle;
use crate::metrics::{AttachmentState, Metrics};

/// Transport settings of every relay session (from the configuration).
#[derive(Debug, Clone)]
pub struct RelaySettings {
    /// Idle time before a heartbeat (further capped by the granted deadline / 3).
    pub heartbeat_interval: Duration,
    /// First reconnect delay.
    pub initial_backoff: Duration,
    /// Largest reconnect delay.
    pub max_backoff: Duration,
    /// Connect, lease-grant and per-frame send timeout.
    pub connect_timeout: Duration,
    /// How long to wait for the drained acknowledgement.
    pub drain_timeout: Duration,
    /// HTTP/2 keepalive ping interval and timeout.
    pub keepalive: Duration,
    /// The producer's own message size limit, in bytes.
    pub max_message_bytes: usize,
    /// Queue entries (batches) per attachment before the actor fences it.
    pub attachment_queue: usize,
    /// Trust roots and client certificate for `https://` endpoints (`[indexer_tls]`); the
    /// files are read again on every connection attempt, so rotated ones are picked up.
    pub tls: Option<ckf_svc_kit::tls::ClientTls>,
    /// The bearer token presented on every Relay stream (`indexer_token_file`), if any.
    pub indexer_token: std::sync::Arc<crate::access::IndexerToken>,
    /// How the first attach is made (`publication.start_mode`).
    pub start_mode: crate::config::StartMode,
    /// The pool's load, reported every `load_interval` to an indexer that takes it.
    pub load: std::sync::Arc<crate::engines::load::LoadBoard>,
    /// How often the pool's load is reported (`engine.load_interval_ms`).
    pub load_interval: Duration,
}

/// How one endpoint's publication ended at shutdown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainOutcome {
    /// The indexer acknowledged the exact drain marker `sequence`.
    Drained {
        /// The final sequence.
        sequence: u64,
    },
    /// The drain marker `sequence` was sent but not acknowledged.
    Unacknowledged {
        /// The drain marker's sequence.
        sequence: u64,
        /// What happened instead.
        why: String,
    },
    /// Not streaming at shutdown: no drain marker was sent.
    NotAttached,
    /// Another producer took over the pool at this indexer and still held it at shutdown
    /// (this endpoint was standing by).
    Superseded {
        /// The indexer's explanation.
        detail: String,
    },
    /// A hot standby (`publication.start_mode = "if-vacant"`) that never held the lane at this
    /// indexer: another live producer held it until shutdown (no drain marker).
    StandingBy {
        /// The indexer's explanation of the first refusal.
        detail: String,
    },
}

/// The relay session of one configured indexer endpoint: its attachment loop (attach, stream,
/// fence, back off, re-attach). Not the generated `ckf.v1.Relay` client, which it drives.
pub struct IndexerAttachment {
    pub(super) index: usize,
    pub(super) endpoint: String,
    pub(super) identity: ProducerIdentity,
    pub(super) actor: ActorHandle,
    pub(super) metrics: Metrics,
    pub(super) settings: RelaySettings,
    pub(super) shutdown: Shutdown,
}

impl IndexerAttachment {
    /// A task for endpoint number `index` (its position in the configuration).
    pub fn new(
        index: usize,
        endpoint: String,
        identity: ProducerIdentity,
        actor: ActorHandle,
        metrics: Metrics,
        settings: RelaySettings,
        shutdown: Shutdown,
    ) -> Self {
        Self {
            index,
            endpoint,
            identity,
            actor,
            metrics,
            settings,
            shutdown,
        }
    }

    pub(super) fn set_state(&self, state: AttachmentState) {
        self.metrics.set_attachment_state(&self.endpoint, state);
    }
}
