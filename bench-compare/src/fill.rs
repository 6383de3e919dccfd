//! Random filler fingerprints: top a lane's words up to a target slot load. Both CKFs use the
//! same bucket layout for this purpose (four 16-bit slots per `u64`, 0 = empty, any nonzero
//! value in any slot), so the same routine serves both; each side fills its own words.

use ckf_core::addressing::fmix64;

/// Occupied slots in `words`.
pub fn occupied(words: &[u64]) -> u64 {
    words
        .iter()
        .map(|&w| (0..4).filter(|s| (w >> (16 * s)) as u16 != 0).count() as u64)
        .sum()
}

/// Puts uniform random nonzero fingerprints into empty slots until about `load` of all slots
/// are occupied. Returns the number of filler fingerprints written.
pub fn top_up(words: &mut [u64], load: f64, seed: u64) -> u64 {
    let slots = words.len() as u64 * 4;
    let have = occupied(words);
    let want = (slots as f64 * load) as u64;
    if want <= have {
        return 0;
    }
    let empty = slots - have;
    // Probability that an empty slot gets a filler, as a 32-bit threshold.
    let threshold = ((want - have) as f64 / empty as f64 * u32::MAX as f64) as u64;
    let mut state = seed;
    let mut added = 0;
    for w in words.iter_mut() {
        for s in 0..4 {
            if (*w >> (16 * s)) as u16 != 0 {
                continue;
            }
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let r = fmix64(state);
            if r & 0xFFFF_FFFF < threshold {
                let fp = ((r >> 32) as u16).max(1);
                *w |= u64::from(fp) << (16 * s);
                added += 1;
            }
        }
    }
    added
}
