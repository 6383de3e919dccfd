//! `Ingest.GetMemberBlocks`: the canonical block hashes one member owns, sorted ascending, so
//! operators and tests can check the producer's exact state.

use super::service::IngestService;
use crate::actor::Command;
use crate::error::RequestError;
use ckf_core::dc::MemberId;
use ckf_proto::v1;

/// Blocks sorted on the handler's own thread below this many (a sort of well under 1 ms).
const SORT_INLINE: usize = 1 << 14;

/// Asks the state actor for the member's blocks (in table order) and sorts them.
///
/// # Errors
/// [`RequestError::MissingMember`] without a member; [`RequestError::ShuttingDown`] once the
/// actor has stopped.
pub async fn handle(
    service: &IngestService,
    request: v1::GetMemberBlocksRequest,
) -> Result<v1::MemberBlocks, RequestError> {
    let member = request.member.ok_or(RequestError::MissingMember)?;
    let member = MemberId::new(member.worker_id, member.dp_rank);
    let mut block_hashes = service
        .actor
        .ask(|reply| Command::MemberBlocks { member, reply })
        .await?;
    // Sorted here, not on the actor: ~0.2 s for 10^7 blocks, on a blocking thread when large.
    if block_hashes.len() < SORT_INLINE {
        block_hashes.sort_unstable();
    } else {
        block_hashes = tokio::task::spawn_blocking(move || {
            block_hashes.sort_unstable();
            block_hashes
        })
        .await
        .map_err(|_| RequestError::ShuttingDown)?;
    }
    Ok(v1::MemberBlocks { block_hashes })
}
