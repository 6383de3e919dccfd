//! Hash-map housekeeping shared by the exact maps (members, charges, spill): giving memory back
//! after removals.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};

/// Maps below this capacity are never shrunk: small tables cost little and shrinking them
/// would only churn the allocator.
pub(crate) const SHRINK_MIN_CAPACITY: usize = 1024;

/// Gives a hash map's memory back when it is far below its capacity: at under a quarter full it
/// is rehashed to twice its length. The gap between the two factors is the hysteresis: after a
/// shrink the map is half full, so it must lose half its entries again before the next shrink
/// and double before it grows, and a map whose size oscillates does not rehash back and forth.
/// Costs O(len) when it shrinks, amortized over the >= 3/4 capacity's worth of removals that
/// made it sparse.
pub(crate) fn shrink_map<K: Eq + Hash, V, S: BuildHasher>(map: &mut HashMap<K, V, S>) {
    let capacity = map.capacity();
    if capacity > SHRINK_MIN_CAPACITY && map.len() < capacity / 4 {
        map.shrink_to(map.len() * 2);
    }
}
