//! gRPC response metadata of the `ckf.v1` contract: keys and values both sides agree on beside
//! the messages, so the indexer sets them and a producer reads them from one definition.

/// Response metadata key the indexer sets on an `IF_VACANT` attach refusal (value
/// [`ATTACH_REFUSED_OCCUPIED`]), so a producer tells "the lane is held by another live
/// producer" from other `FAILED_PRECONDITION` refusals without parsing the message.
pub const ATTACH_REFUSED_KEY: &str = "ckf-attach-refused";

/// The [`ATTACH_REFUSED_KEY`] value of an `IF_VACANT` refusal: the lane is occupied.
pub const ATTACH_REFUSED_OCCUPIED: &str = "occupied";
