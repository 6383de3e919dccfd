//! The operator commands: each asks a running service one thing and prints the answer (text
//! or `--json`); `certs` issues development certificates and token files.
//!
//! | module | owns |
//! | --- | --- |
//! | [`args`] | the flags of `query`, `route`, `lanes`, `reload-catalog`, `source-sequence`, `health` |
//! | [`query`] | `ckf query`: `FindMatches` by hashes or ids, `FindMatchesByTokens` by token ids |
//! | [`route`] | `ckf route`: `Route`, the DCs ranked by expected time to first token |
//! | [`lanes`] | `ckf lanes`: `ListLanes` |
//! | [`reload`] | `ckf reload-catalog`: `Admin/ReloadCatalog` (or its dry run) |
//! | [`source_sequence`] | `ckf source-sequence`: `GetSourceSequence` on a producer |
//! | [`health`] | `ckf health`: `grpc.health.v1` check, exit code for scripts |
//! | [`certs`] | `ckf certs`: development CA, indexer / producer / query certificates, token files (rcgen) |

pub mod args;
pub mod certs;
pub mod health;
pub mod lanes;
pub mod query;
pub mod reload;
pub mod route;
pub mod source_sequence;

/// The lanes of a ready mask (bit `i` = lane `i`), lowest first: the `--json` outputs give
/// them as `ready_lanes` next to the mask, since a JSON number above 2^53 (a ready lane 53..63)
/// is not exact in readers that hold numbers as doubles (JavaScript, jq before 1.7).
pub(crate) fn ready_lane_list(mask: u64) -> Vec<u32> {
    (0..u64::BITS).filter(|&i| mask >> i & 1 == 1).collect()
}

#[cfg(test)]
mod tests {
    use super::ready_lane_list;

    #[test]
    fn ready_lanes_list_every_set_bit_up_to_lane_63() {
        assert_eq!(ready_lane_list(0), Vec::<u32>::new());
        assert_eq!(ready_lane_list(0b1010_0001), [0, 5, 7]);
        assert_eq!(ready_lane_list(1 << 63 | 1 << 53 | 1), [0, 53, 63]);
        assert_eq!(ready_lane_list(u64::MAX).len(), 64);
    }
}
