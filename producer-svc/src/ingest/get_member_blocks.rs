//! `Ingest.GetMemberBlocks`: the canonical block hashes one member owns, sorted ascending, so
//! operators and tests can check the producer's exact state.

use super::IngestService;
use crate::actor::Command;
use crate::error::RequestError;
use ckf_core::dc::MemberId;
use ckf_proto::v1;

/// Asks the state actor for the member's blocks.
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
    let block_hashes = service
        .actor
        .ask(|reply| Command::MemberBlocks { member, reply })
        .await?;
    Ok(v1::MemberBlocks { block_hashes })
}
