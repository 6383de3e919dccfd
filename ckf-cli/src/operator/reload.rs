//! `ckf reload-catalog`: asks a running indexer to re-read its configuration and apply its
//! catalog (`ckf.v1.Admin/ReloadCatalog`), or with `--dry-run` only to say what that would
//! change; prints what changed, or the refusal (exit 1) naming what is wrong.

use anyhow::{Context, Result};
use ckf_proto::v1::{ReloadCatalogRequest, admin_client::AdminClient};
use serde_json::json;

use crate::connect::{client_tls, connect_with, query_channel, token_of};
use crate::operator::args::ReloadArgs;

/// `ckf reload-catalog`.
///
/// # Errors
/// Unreadable TLS material or token file, an unreachable indexer, or a refused reload (its
/// message names what is wrong; nothing changed).
pub async fn reload_catalog(args: ReloadArgs) -> Result<()> {
    let token = token_of(Some(&args.admin_token_file))?;
    let tls = client_tls(&args.tls)?;
    let channel = connect_with(&args.indexer, tls.as_ref()).await?;
    let mut client = AdminClient::new(query_channel(channel, token, None)?);
    let answer = client
        .reload_catalog(ReloadCatalogRequest {
            dry_run: args.dry_run,
        })
        .await
        .context("ReloadCatalog")?
        .into_inner();
    if args.json {
        let out = json!({
            "dry_run": args.dry_run, "applied": answer.applied,
            "domains_added": answer.added, "domains_removed": answer.removed,
            "domains_kept": answer.kept,
            "lanes_added": answer.lanes_added, "lanes_removed": answer.lanes_removed,
        });
        crate::outln!("{}", serde_json::to_string_pretty(&out)?)?;
        return Ok(());
    }
    let changes = [
        &answer.added,
        &answer.removed,
        &answer.lanes_added,
        &answer.lanes_removed,
    ];
    let what = match (args.dry_run, answer.applied) {
        (true, _) if changes.iter().all(|l| l.is_empty()) => {
            "dry run, nothing changed; a reload would add or remove no domain or lane"
        }
        (true, _) => "dry run, nothing changed; a reload would apply",
        (false, true) => "applied",
        (false, false) => "nothing to change",
    };
    let list = |l: &[String]| {
        if l.is_empty() {
            "-".to_owned()
        } else {
            l.join(", ")
        }
    };
    crate::outln!("{what}")?;
    crate::outln!(
        "domains  added: {}  removed: {}  kept: {}",
        list(&answer.added),
        list(&answer.removed),
        list(&answer.kept)
    )?;
    crate::outln!(
        "lanes    added: {}  removed: {}",
        list(&answer.lanes_added),
        list(&answer.lanes_removed)
    )?;
    Ok(())
}
