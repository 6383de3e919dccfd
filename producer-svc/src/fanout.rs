//! The tokio side of `ckf_core::fanout`: each attachment's frame queue is a bounded
//! [`mpsc`] channel from the state actor to the attachment's relay-client task.
//!
//! Every rule (the barrier across attachments, delta splitting, fencing a full or closed queue,
//! drain markers) is [`ckf_core::fanout::Fanout`]'s; this module only adapts the channel to its
//! [`FrameSink`] trait. When the fan-out fences an attachment it drops the [`AttachmentQueue`],
//! which closes the channel: the relay-client task sees `recv() == None`, reconnects and gets a
//! new lease and a new barrier snapshot.
//!
//! A queue more than half full is [backed up](AttachmentQueue::backed_up): while one is, the
//! state actor cuts batches less often (`ckf_core::cadence`, "Backed up"), so a reader that stalls
//! for less than its heartbeat deadline finds its queue still open.

use ckf_core::fanout::{FrameSink, Outbound, SinkError};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

/// The fan-out the state actor owns: one publisher per configured endpoint.
pub type Fanout = ckf_core::fanout::Fanout<AttachmentQueue>;

/// The sending half of one attachment's bounded frame queue (one entry per batch).
#[derive(Debug)]
pub struct AttachmentQueue(pub mpsc::Sender<Outbound>);

impl AttachmentQueue {
    /// Entries queued and not yet taken by the attachment's task.
    pub fn depth(&self) -> usize {
        self.0.max_capacity() - self.0.capacity()
    }
}

impl FrameSink for AttachmentQueue {
    fn try_send(&mut self, frame: Outbound) -> Result<(), SinkError> {
        self.0.try_send(frame).map_err(|e| match e {
            TrySendError::Full(_) => SinkError::Full,
            TrySendError::Closed(_) => SinkError::Closed,
        })
    }

    /// More than half of the channel's slots are taken.
    fn backed_up(&self) -> bool {
        self.depth() * 2 > self.0.max_capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ckf_core::frames::DrainMarker;
    use ckf_core::identity::{LaneLease, ProducerIncarnation, StreamTag};

    fn marker() -> Outbound {
        Outbound::Drain(DrainMarker {
            tag: StreamTag {
                incarnation: ProducerIncarnation(1),
                lease: LaneLease {
                    consumer_instance: 1,
                    lane: 0,
                    epoch: 1,
                },
            },
            sequence: 0,
        })
    }

    #[test]
    fn the_queue_is_backed_up_past_half_of_its_slots() {
        let (tx, mut rx) = mpsc::channel(4);
        let mut queue = AttachmentQueue(tx);
        assert!(!queue.backed_up());
        for depth in 1..=4 {
            queue.try_send(marker()).expect("room");
            assert_eq!(queue.depth(), depth);
            assert_eq!(queue.backed_up(), depth > 2, "depth {depth}");
        }
        assert!(rx.try_recv().is_ok());
        assert!(rx.try_recv().is_ok());
        assert_eq!(queue.depth(), 2);
        assert!(!queue.backed_up());
    }

    #[test]
    fn channel_errors_map_to_sink_errors_and_dropping_closes_the_queue() {
        let (tx, mut rx) = mpsc::channel(1);
        let mut queue = AttachmentQueue(tx);
        assert_eq!(queue.try_send(marker()), Ok(()));
        assert_eq!(queue.try_send(marker()), Err(SinkError::Full));
        assert!(rx.try_recv().is_ok());
        drop(queue);
        assert!(rx.is_closed());
        let (tx, rx) = mpsc::channel(1);
        drop(rx);
        assert_eq!(
            AttachmentQueue(tx).try_send(marker()),
            Err(SinkError::Closed)
        );
    }
}
