//! Content checks of one indexer lane against a producer: the lane holds exactly what the
//! producer's exact model says (every tracked hash found, every dropped hash absent), and its
//! load factor equals the producer's.

use ckf_proto::v1;

use crate::cluster::{BUCKETS, Indexer, Producer, is_active};
use crate::model::DcModel;
use crate::wait::{DEADLINE, eventually};

/// Block hashes per `FindMatches` in content checks (about 2.5 KiB on the wire).
pub const QUERY_CHUNK: usize = 256;

/// One look at the lane of `dc`: `Ok(lane)` when it is active and holds exactly `model`'s
/// content; otherwise what differs.
///
/// # Errors
/// A description of the first difference (or the transport error).
pub async fn lane_matches(
    indexer: &Indexer,
    dc: &str,
    model: &DcModel,
) -> Result<v1::LaneInfo, String> {
    let lane = indexer.lane(dc).await?;
    if !is_active(&lane) {
        return Err(format!("lane {dc} is not active: {lane:?}"));
    }
    let tracked = model.tracked();
    // Depth = leading blocks present: all found <=> depth == len; else it names the first miss.
    // Chunked so every query stays under the smallest message limit (4 KiB).
    for chunk in tracked.chunks(QUERY_CHUNK) {
        let depths = indexer.depths(chunk).await?;
        let depth = *depths
            .get(dc)
            .ok_or_else(|| format!("lane {dc} did not answer FindMatches: {depths:?}"))?
            as usize;
        if depth != chunk.len() {
            return Err(format!(
                "lane {dc}: tracked hash {:#x} not found ({} tracked in all)",
                chunk[depth],
                tracked.len()
            ));
        }
    }
    // With pairwise distinct fingerprints, "every tracked hash found" plus "occupied slots ==
    // tracked hashes" already excludes stale fingerprints; the absent hashes are still queried
    // one by one, as a router would.
    let expected = tracked.len() as f64 / (BUCKETS * 4) as f64;
    if (lane.load_factor - expected).abs() > 1e-9 {
        return Err(format!(
            "lane {dc}: load factor {} but {} tracked hashes make {expected}",
            lane.load_factor,
            tracked.len()
        ));
    }
    for gone in model.gone() {
        let depths = indexer.depths(&[gone]).await?;
        match depths.get(dc) {
            Some(0) => {}
            other => {
                return Err(format!(
                    "lane {dc}: dropped hash {gone:#x} has depth {other:?}"
                ));
            }
        }
    }
    Ok(lane)
}

/// Waits until the producer's lane holds exactly the producer's model and the producer's own
/// statistics agree (unique blocks, load factor, incarnation). Returns the lane.
///
/// # Panics
/// After [`DEADLINE`], with the last difference seen.
pub async fn wait_converged(indexer: &Indexer, producer: &Producer) -> v1::LaneInfo {
    let what = format!("lane {} to equal producer {}", producer.dc, producer.name);
    eventually(&what, DEADLINE, || async {
        let lane = lane_matches(indexer, &producer.dc, &producer.model).await?;
        let stats = producer.stats().await?;
        let tracked = producer.model.tracked().len() as u64;
        if stats.unique_blocks != tracked || stats.resident_fingerprints != tracked {
            return Err(format!(
                "producer stats {stats:?} but the model tracks {tracked}"
            ));
        }
        if stats.load_factor != lane.load_factor {
            return Err(format!(
                "producer load factor {} != lane load factor {}",
                stats.load_factor, lane.load_factor
            ));
        }
        if stats.incarnation != lane.incarnation {
            return Err(format!(
                "lane held by incarnation {:#x}, producer is {:#x}",
                lane.incarnation, stats.incarnation
            ));
        }
        Ok(lane)
    })
    .await
}
