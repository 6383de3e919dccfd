//! `ckf query`: one `FindMatches` by block hashes (or trace `--ids`), or `FindMatchesByTokens`
//! by token ids, printed per DC lane.

use anyhow::{Context, Result, anyhow};
use ckf_proto::v1::FindMatchesRequest;
use ckf_proto::v1::{FindMatchesByTokensRequest, MultimodalItem};
use serde_json::json;

use crate::hashing::block_hashes;
use crate::operator::args::{QueryArgs, parse_token_list};

/// `ckf query`: by block hashes (or `--ids`), or by token ids (`--tokens`, `--tokens-file`).
///
/// # Errors
/// An unreadable or malformed tokens file, an unreachable indexer or a failed call (the
/// indexer's `INVALID_ARGUMENT` message names a refused token query's fault).
pub async fn query(args: QueryArgs) -> Result<()> {
    let ask = Ask::of(&args)?;
    let mut client = args.target.client().await?;
    let (count, unit) = (ask.count(), ask.unit());
    let answer = match ask {
        Ask::Tokens(request) => client
            .find_matches_by_tokens(request)
            .await
            .context("FindMatchesByTokens")?
            .into_inner(),
        Ask::Hashes(request) => client
            .find_matches(request)
            .await
            .context("FindMatches")?
            .into_inner(),
    };
    if args.json {
        let lanes: Vec<_> = answer
            .matches
            .iter()
            .map(|m| {
                let pool = m.pool.clone().unwrap_or_default();
                json!({
                    "lane": m.lane, "domain": pool.domain, "dc": pool.dc, "depth": m.depth,
                    "cached_tokens": m.cached_tokens,
                })
            })
            .collect();
        let ready = answer.ready_lanes();
        let out = json!({
            unit: count, "ready_mask": ready,
            "ready_lanes": crate::operator::ready_lane_list(ready), "matches": lanes,
        });
        crate::outln!("{}", serde_json::to_string_pretty(&out)?)?;
        return Ok(());
    }
    crate::outln!("{count} {unit}; ready lanes {:#x}", answer.ready_lanes())?;
    crate::outln!(
        "{:>4}  {:<16} {:>6} {:>13}",
        "lane",
        "dc",
        "depth",
        "cached tokens"
    )?;
    for m in &answer.matches {
        let dc = m.pool.as_ref().map_or("?", |p| p.dc.as_str());
        crate::outln!(
            "{:>4}  {:<16} {:>6} {:>13}",
            m.lane,
            dc,
            m.depth,
            m.cached_tokens
        )?;
    }
    Ok(())
}

/// What `ckf query` and `ckf route` ask about: a request's block hashes or its token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum Ask {
    /// By block hashes (`FindMatches`).
    Hashes(FindMatchesRequest),
    /// By token ids (`FindMatchesByTokens`).
    Tokens(FindMatchesByTokensRequest),
}

impl Ask {
    /// The request the flags describe: `--tokens` / `--tokens-file`, else the hashes (chained
    /// from trace ids with `--ids`).
    ///
    /// # Errors
    /// An unreadable or malformed tokens file.
    pub fn of(args: &QueryArgs) -> Result<Self> {
        let tokens = match (&args.tokens, &args.tokens_file) {
            (Some(list), _) => Some(list.0.clone()),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read --tokens-file {}", path.display()))?;
                let list = parse_token_list(&text)
                    .map_err(|e| anyhow!("--tokens-file {}: {e}", path.display()))?;
                Some(list.0)
            }
            (None, None) => None,
        };
        Ok(match tokens {
            Some(token_ids) => Ask::Tokens(FindMatchesByTokensRequest {
                token_ids,
                lora_name: args.lora.clone().unwrap_or_default(),
                cache_salt: args.salt.clone().unwrap_or_default(),
                multimodal: args
                    .multimodal
                    .iter()
                    .map(|m| MultimodalItem {
                        identifier: m.identifier.clone(),
                        offset: m.offset,
                        length: m.length,
                    })
                    .collect(),
                block_size: args.block_size.unwrap_or(0),
            }),
            None => Ask::Hashes(FindMatchesRequest {
                block_hashes: if args.ids {
                    block_hashes(&args.hashes)
                } else {
                    args.hashes.clone()
                },
            }),
        })
    }

    /// Tokens or blocks asked about.
    pub fn count(&self) -> usize {
        match self {
            Ask::Hashes(r) => r.block_hashes.len(),
            Ask::Tokens(r) => r.token_ids.len(),
        }
    }

    /// `"blocks"` or `"tokens"`.
    pub fn unit(&self) -> &'static str {
        match self {
            Ask::Hashes(_) => "blocks",
            Ask::Tokens(_) => "tokens",
        }
    }
}
