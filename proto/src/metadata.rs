//! gRPC metadata of the `ckf.v1` contract: keys and values both sides agree on beside the
//! messages, so one side sets them and the other reads them from one definition.

/// Request metadata key a `Query` call names its indexer domain with (the model's KV
/// namespace, e.g. `ckf-domain: llama-70b`). Without it a call is for the indexer's domain; an
/// indexer refuses a call naming another domain with `NOT_FOUND` (a router that maps models to
/// indexers, or a proxy routing on this header, learns of a wrong mapping instead of getting
/// another model's answers).
pub const DOMAIN_KEY: &str = "ckf-domain";

/// Response metadata key the indexer sets on an `IF_VACANT` attach refusal (value
/// [`ATTACH_REFUSED_OCCUPIED`]), so a producer tells "the lane is held by another live
/// producer" from other `FAILED_PRECONDITION` refusals without parsing the message.
pub const ATTACH_REFUSED_KEY: &str = "ckf-attach-refused";

/// The [`ATTACH_REFUSED_KEY`] value of an `IF_VACANT` refusal: the lane is occupied.
pub const ATTACH_REFUSED_OCCUPIED: &str = "occupied";
