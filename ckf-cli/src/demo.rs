//! `ckf demo`: one indexer and one producer per DC, in-process on loopback (being written).

use anyhow::Result;

use crate::cli::DemoArgs;

/// Runs the demo.
///
/// # Errors
/// Not yet available.
pub async fn run(_args: DemoArgs) -> Result<()> {
    anyhow::bail!("ckf demo: waiting for the in-process indexer")
}
