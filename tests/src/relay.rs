//! The raw `ckf.v1.Relay` client of [`ckf_testkit::relay`], bound to this suite's domain and
//! indexer processes: it sends exactly the frames a test builds (including broken ones).

use ckf_core::addressing::TableFormat;
use ckf_proto::v1;
pub use ckf_testkit::relay::{RawStream, RawTable};
use tonic::Status;

use crate::cluster::{DOMAIN, Indexer, channel};

/// The `Attach` frame of a raw producer of `dc` (domain [`DOMAIN`]) with `format`.
pub fn attach(dc: &str, incarnation: u64, format: TableFormat) -> v1::Attach {
    ckf_testkit::relay::attach(DOMAIN, dc, incarnation, format)
}

/// Opens a raw stream to `indexer` and attaches.
///
/// # Errors
/// The indexer's status when it refuses the attachment (a connection failure as
/// `UNAVAILABLE`).
pub async fn open(indexer: &Indexer, attach: v1::Attach) -> Result<RawStream, Status> {
    let channel = channel(indexer.addr).await.map_err(Status::unavailable)?;
    RawStream::open(channel, attach).await
}
