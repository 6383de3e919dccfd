//! The flags of the operator commands: `ckf query`, `ckf lanes`, `ckf source-sequence`,
//! `ckf health` (`ckf certs` keeps its own beside it, in [`crate::operator::certs`]).

use std::path::PathBuf;

use clap::{ArgGroup, Args};

use ckf_proto::v1::query_client::QueryClient;
use ckf_svc_kit::access::AuthedChannel;

use crate::connect::{TlsArgs, client_tls, connect_with, query_channel, token_of};

/// Where an operator command reaches the indexer's Query service, and as whom.
#[derive(Debug, Clone, Args)]
pub struct IndexerArgs {
    /// The indexer's gRPC endpoint.
    #[arg(long)]
    pub indexer: String,
    /// TLS toward the indexer.
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Send `authorization: Bearer <token>` with the token in FILE (one line): the indexer's
    /// `auth.query_token_file`.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// The indexer domain (model) asked about, sent as `ckf-domain` metadata: an indexer
    /// serving another domain refuses the call (NOT_FOUND) [default: none, the indexer's own].
    #[arg(long, value_name = "DOMAIN")]
    pub domain: Option<String>,
}

impl IndexerArgs {
    /// A Query client on the indexer sending the token and the domain with every call.
    ///
    /// # Errors
    /// Unreadable TLS material or token file, a domain that cannot be metadata, or an
    /// unreachable indexer.
    pub async fn client(&self) -> anyhow::Result<QueryClient<AuthedChannel>> {
        let token = token_of(self.token_file.as_deref())?;
        let tls = client_tls(&self.tls)?;
        let channel = connect_with(&self.indexer, tls.as_ref()).await?;
        let channel = query_channel(channel, token, self.domain.as_deref())?;
        Ok(QueryClient::new(channel))
    }
}

/// `ckf query`.
#[derive(Debug, Clone, Args)]
#[command(group(ArgGroup::new("by_tokens").args(["tokens", "tokens_file"])))]
pub struct QueryArgs {
    /// The indexer.
    #[command(flatten)]
    pub target: IndexerArgs,
    /// Treat the arguments as trace `hash_ids` and chain them into block hashes first.
    #[arg(long, conflicts_with = "by_tokens")]
    pub ids: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Query by token ids (FindMatchesByTokens): comma-separated u32 ids in request order.
    #[arg(long, value_name = "ID,ID,...", value_parser = parse_token_list)]
    pub tokens: Option<TokenList>,
    /// Query by the token ids in FILE (u32 ids separated by whitespace and/or commas).
    #[arg(long, value_name = "FILE")]
    pub tokens_file: Option<PathBuf>,
    /// LoRA adapter name of the token query (request-wide).
    #[arg(long, value_name = "NAME", requires = "by_tokens")]
    pub lora: Option<String>,
    /// Cache salt (cache namespace) of the token query (request-wide).
    #[arg(long, value_name = "SALT", requires = "by_tokens")]
    pub salt: Option<String>,
    /// A multimodal item of the token query, IDENTIFIER:OFFSET:LENGTH (token positions
    /// [OFFSET, OFFSET+LENGTH) of the request); repeatable.
    #[arg(long = "mm", value_name = "ID:OFFSET:LENGTH", value_parser = parse_mm_item, requires = "by_tokens")]
    pub multimodal: Vec<MmItem>,
    /// Tokens per block the token query assumes; must be a block size of the indexer's lanes
    /// (default: each lane answers in its own).
    #[arg(long, value_name = "TOKENS", requires = "by_tokens")]
    pub block_size: Option<u32>,
    /// Block hashes in prefix order (decimal or 0x-hex), or ids with --ids.
    #[arg(
        required_unless_present = "by_tokens",
        conflicts_with = "by_tokens",
        value_parser = parse_u64
    )]
    pub hashes: Vec<u64>,
}

/// `ckf route`: what `ckf query` asks, and the router's own round trips.
#[derive(Debug, Clone, Args)]
pub struct RouteArgs {
    /// The request, as for `ckf query`.
    #[command(flatten)]
    pub query: QueryArgs,
    /// The router's own round trip to a DC, DC=MS (repeatable); a DC not named uses the
    /// indexer's configured round trip.
    #[arg(long = "rtt-ms", value_name = "DC=MS", value_parser = parse_rtt)]
    pub rtt_ms: Vec<(String, f64)>,
    /// Tokens the request prefills with nothing cached (default: its token count, or its
    /// blocks x the indexer's block size).
    #[arg(long, value_name = "TOKENS")]
    pub request_tokens: Option<u64>,
    /// Book the choice as a router would (it then weighs on the next choices until the DC's
    /// next load report); by default `ckf route` only asks (`dry_run`).
    #[arg(long)]
    pub book: bool,
}

/// Parses `DC=MS` (a round trip in milliseconds, finite and >= 0).
fn parse_rtt(s: &str) -> Result<(String, f64), String> {
    let (dc, ms) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected DC=MS"))?;
    let ms: f64 = ms
        .parse()
        .map_err(|_| format!("`{s}`: {ms} is not a number of milliseconds"))?;
    if dc.is_empty() || !ms.is_finite() || ms < 0.0 {
        return Err(format!(
            "`{s}`: expected DC=MS with a DC id and a round trip >= 0"
        ));
    }
    Ok((dc.to_owned(), ms))
}

/// Token ids parsed from `--tokens` or `--tokens-file` (clap needs one named type per value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenList(pub Vec<u32>);

/// One `--mm` item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MmItem {
    /// The identifier (vLLM 64-hex digest or any other non-empty text).
    pub identifier: String,
    /// First token position.
    pub offset: u64,
    /// Token positions occupied.
    pub length: u64,
}

/// Token ids separated by commas and/or whitespace (`--tokens`, `--tokens-file`).
///
/// # Errors
/// Names the first id that is not a `u32` (with its 1-based position), or says the list is
/// empty.
pub fn parse_token_list(text: &str) -> Result<TokenList, String> {
    let ids = text
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .enumerate()
        .map(|(i, s)| {
            s.parse::<u32>().map_err(|e| {
                format!(
                    "token id #{} `{s}` is not a u32 (0..=4294967295): {e}",
                    i + 1
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if ids.is_empty() {
        return Err("no token ids (expected u32 ids separated by commas or whitespace)".into());
    }
    Ok(TokenList(ids))
}

fn parse_mm_item(text: &str) -> Result<MmItem, String> {
    // The identifier may itself contain ':', so split from the right.
    let mut parts = text.rsplitn(3, ':');
    let (Some(length), Some(offset), Some(identifier)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("`{text}`: expected IDENTIFIER:OFFSET:LENGTH"));
    };
    if identifier.is_empty() {
        return Err(format!("`{text}`: the identifier is empty"));
    }
    let number = |what: &str, s: &str| {
        s.parse::<u64>()
            .map_err(|e| format!("`{text}`: {what} `{s}` is not a u64 ({e})"))
    };
    Ok(MmItem {
        identifier: identifier.to_owned(),
        offset: number("offset", offset)?,
        length: number("length", length)?,
    })
}

/// `ckf lanes`.
#[derive(Debug, Clone, Args)]
pub struct LanesArgs {
    /// The indexer.
    #[command(flatten)]
    pub target: IndexerArgs,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `ckf reload-catalog`.
#[derive(Debug, Clone, Args)]
pub struct ReloadArgs {
    /// The indexer's gRPC endpoint (its `listen` address: Admin is not served on
    /// `query_listen`).
    #[arg(long)]
    pub indexer: String,
    /// TLS toward the indexer.
    #[command(flatten)]
    pub tls: TlsArgs,
    /// The admin token (one line): the indexer's `auth.admin_token_file`.
    #[arg(long, value_name = "FILE")]
    pub admin_token_file: PathBuf,
    /// Plan only: print what a reload would change, change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `ckf source-sequence`.
#[derive(Debug, Clone, Args)]
pub struct SourceSequenceArgs {
    /// The producer's Ingest gRPC endpoint, e.g. http://127.0.0.1:7501.
    #[arg(long)]
    pub producer: String,
    /// The source id (`KvEventBatch.source_id`) to look up.
    #[arg(long, value_name = "ID")]
    pub source: String,
    /// TLS toward the producer.
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Send `authorization: Bearer <token>` with the token in FILE (one line): the token of an
    /// `[[ingest_auth.sources]]` entry whose `source_ids` hold the source.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Print JSON (one line).
    #[arg(long)]
    pub json: bool,
}

/// `ckf health`.
#[derive(Debug, Clone, Args)]
pub struct HealthArgs {
    /// The server's gRPC endpoint, e.g. http://127.0.0.1:7400.
    #[arg(long)]
    pub endpoint: String,
    /// TLS toward the server.
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Service name to check; empty = the whole server.
    #[arg(long, default_value = "")]
    pub service: String,
    /// Give up after this many milliseconds (connect + check).
    #[arg(long, default_value_t = 3_000)]
    pub timeout_ms: u64,
}

/// Parses a decimal or `0x`-hex `u64`.
pub(crate) fn parse_u64(s: &str) -> Result<u64, String> {
    let parsed = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    parsed.map_err(|e| format!("`{s}`: not a 64-bit unsigned integer ({e})"))
}
