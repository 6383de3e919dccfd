//! Shared by the integration tests: the golden payloads under `tests/fixtures/`.

/// The bytes of fixture `name` (`tests/fixtures/{name}.hex`, written by `gen_fixtures.py` with
/// the real msgspec encoder).
///
/// # Panics
/// When the file is missing or not hex.
pub fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/{name}.hex", env!("CARGO_MANIFEST_DIR"));
    let hex = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let hex = hex.trim();
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect()
}
