//! Who a connection comes from, for `max_connections_per_peer`: the remote IP address of an
//! accepted connection, the per-address counts of one listener, and one connection's share
//! of its address's count (given back when the connection closes).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// The remote IP address of an accepted connection, which `max_connections_per_peer` counts.
pub trait PeerAddr {
    /// The peer's IP address (IPv4-mapped IPv6 as IPv4); `None` when unknown (such a
    /// connection is bounded by `max_connections` only).
    fn peer_ip(&self) -> Option<IpAddr>;
}

impl PeerAddr for tokio::net::TcpStream {
    fn peer_ip(&self) -> Option<IpAddr> {
        self.peer_addr().ok().map(|addr| addr.ip().to_canonical())
    }
}

/// Connections held per remote IP address; an entry is removed when its count reaches 0, so
/// the map holds at most one entry per held connection.
pub(crate) type PeerCounts = Arc<Mutex<HashMap<IpAddr, u32>>>;

pub(crate) fn lock_peers(peers: &PeerCounts) -> std::sync::MutexGuard<'_, HashMap<IpAddr, u32>> {
    // The map is only incremented or decremented under the lock, never left half-changed.
    peers
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One connection's share of its peer's `max_connections_per_peer`; given back on drop.
#[derive(Debug)]
pub(crate) struct PeerSlot {
    pub(crate) peers: PeerCounts,
    pub(crate) ip: IpAddr,
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut peers = lock_peers(&self.peers);
        if let Some(count) = peers.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                peers.remove(&self.ip);
            }
        }
    }
}
