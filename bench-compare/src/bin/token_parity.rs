//! Token-hash parity: `ckf_core::tokens` against dynamo-kv-router 1.6.1's own functions on
//! Mooncake-like token sequences.
//!
//! Every request of the Mooncake trace becomes a token sequence: each `hash_id` stands for 512
//! tokens, derived deterministically from the id (so shared prefixes of ids are shared prefixes
//! of tokens), cut to the request's `input_length` (so most requests end in a partial block).
//! Each request is hashed in one of six variants (plain, LoRA, cache salt, both, multimodal,
//! multimodal + both) at block sizes 16, 64 and 512, and at 1 and 4 for the first requests,
//! by both sides:
//!
//! * ckf-core: `BlockSeed::new(salt, lora)`, `block_hash` per block and `sequence_hashes` over
//!   `MultimodalSpan { mm_identifier_hash(id), offset, length }`;
//! * dynamo: `compute_block_hash_for_seq(tokens, block_size, BlockHashOptions { lora_name,
//!   cache_namespace: salt, block_mm_infos: RequestExtraInfo::to_block_level(..) })`, then
//!   `compute_seq_hash_for_block`; identifiers through `hash_mm_identifier`.
//!
//! Multimodal items: 1-3 per request, 64-hex digests or short names, sometimes the same item
//! twice, random offsets and lengths (some past the end of the tokens). Exits 1 on the first
//! difference, printing it.
//!
//! `CARGO_TARGET_DIR=... cargo run --release --bin token-parity [-- --trace PATH]`

use ckf_core::addressing::fmix64;
use ckf_core::tokens::{
    BlockSeed, MultimodalSpan, block_hash, mm_identifier_hash, sequence_hashes,
};
use dynamo_kv_router::protocols::{
    BlockHashOptions, RequestExtraInfo, RequestMmObjectInfo, compute_block_hash_for_seq,
    compute_seq_hash_for_block, hash_mm_identifier,
};

const TOKENS_PER_ID: u64 = 512;
const BLOCK_SIZES: [u32; 3] = [16, 64, 512];
const SMALL_BLOCK_SIZES: [u32; 2] = [1, 4];
/// Requests also checked at the small block sizes (each is ~10k blocks of 1 token).
const SMALL_REQUESTS: usize = 200;
const VARIANTS: [&str; 6] = ["plain", "lora", "salt", "lora+salt", "mm", "mm+lora+salt"];

struct Request {
    tokens: Vec<u32>,
}

fn load(path: &str) -> Result<Vec<Request>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let mut requests = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("{path}:{}: {e}", n + 1))?;
        let ids: Vec<u64> = v["hash_ids"]
            .as_array()
            .ok_or_else(|| format!("{path}:{}: no hash_ids array", n + 1))?
            .iter()
            .map(|id| {
                id.as_u64()
                    .ok_or_else(|| format!("{path}:{}: bad id", n + 1))
            })
            .collect::<Result<_, _>>()?;
        let full = ids.len() as u64 * TOKENS_PER_ID;
        let length = v["input_length"].as_u64().unwrap_or(full).min(full);
        let tokens = (0..length)
            .map(|position| {
                let id = ids[(position / TOKENS_PER_ID) as usize];
                token(id, position % TOKENS_PER_ID)
            })
            .collect();
        requests.push(Request { tokens });
    }
    Ok(requests)
}

/// The token at `offset` of the 512-token block `id`: spread over all of `u32`, with a few
/// `u32::MAX` and 0 values so both ends of the range occur.
fn token(id: u64, offset: u64) -> u32 {
    let h = fmix64(id.wrapping_mul(TOKENS_PER_ID) ^ offset ^ 0x746f_6b65_6e73);
    match h % 97 {
        0 => u32::MAX,
        1 => 0,
        _ => (h >> 32) as u32,
    }
}

/// Deterministic multimodal items `(identifier, offset, length)` for request `index`.
fn items(index: usize, tokens: usize) -> Vec<(String, u64, u64)> {
    let mut state = fmix64(index as u64 ^ 0x6d6d);
    let mut next = || {
        state = fmix64(state.wrapping_add(0x9e37_79b9_7f4a_7c15));
        state
    };
    let count = 1 + next() % 3;
    let mut out = Vec::new();
    for k in 0..count {
        let identifier = if next() % 2 == 0 {
            format!(
                "{:016x}{:016x}{:016x}{:016x}",
                next(),
                next(),
                next(),
                next()
            )
        } else {
            format!("image-{index}-{k}")
        };
        let span = tokens as u64 + 64;
        let offset = next() % span;
        let length = 1 + next() % 600;
        out.push((identifier.clone(), offset, length));
        if next() % 4 == 0 {
            // The same item again, nearby: one block may list it twice.
            out.push((identifier, offset + length + next() % 8, 1 + next() % 4));
        }
    }
    out
}

struct Case<'a> {
    tokens: &'a [u32],
    block_size: u32,
    lora: Option<&'a str>,
    salt: Option<&'a str>,
    items: &'a [(String, u64, u64)],
}

/// `Err` describes the first difference.
fn compare(case: &Case<'_>) -> Result<usize, String> {
    // ckf-core.
    let seed = BlockSeed::new(case.salt, case.lora);
    let spans: Vec<MultimodalSpan> = case
        .items
        .iter()
        .map(|(id, offset, length)| MultimodalSpan {
            hash: mm_identifier_hash(id).expect("non-empty identifier"),
            offset: *offset,
            length: *length,
        })
        .collect();
    let ours = sequence_hashes(case.tokens, case.block_size as usize, seed, &spans)
        .map_err(|e| e.to_string())?;

    // dynamo.
    let mm_objects: Vec<RequestMmObjectInfo> = case
        .items
        .iter()
        .map(|(id, offset, length)| RequestMmObjectInfo {
            mm_hash: hash_mm_identifier(id).expect("non-empty identifier"),
            offsets: vec![(*offset as usize, (*offset + *length) as usize)],
        })
        .collect();
    let block_infos = (!mm_objects.is_empty() && !case.tokens.is_empty()).then(|| {
        RequestExtraInfo { mm_objects }.to_block_level(case.block_size as usize, case.tokens.len())
    });
    let options = BlockHashOptions {
        block_mm_infos: block_infos.as_deref(),
        lora_name: case.lora,
        cache_namespace: case.salt,
        is_eagle: None,
    };
    let locals = compute_block_hash_for_seq(case.tokens, case.block_size, options);
    let theirs = compute_seq_hash_for_block(&locals);

    if ours.len() != theirs.len() {
        return Err(format!(
            "{} blocks vs dynamo's {}",
            ours.len(),
            theirs.len()
        ));
    }
    for (i, (block, local)) in case
        .tokens
        .chunks_exact(case.block_size as usize)
        .zip(&locals)
        .enumerate()
    {
        let start = (i * case.block_size as usize) as u64;
        let end = start + u64::from(case.block_size);
        let mm: Vec<u64> = spans
            .iter()
            .filter(|s| s.offset < end && start < s.offset + s.length)
            .map(|s| s.hash)
            .collect();
        let our_local = block_hash(block, &mm, seed);
        if our_local != local.0 {
            return Err(format!(
                "block {i}: block hash {our_local:#x} vs dynamo's {:#x}",
                local.0
            ));
        }
        if ours[i] != theirs[i] {
            return Err(format!(
                "block {i}: sequence hash {:#x} vs dynamo's {:#x}",
                ours[i], theirs[i]
            ));
        }
    }
    Ok(ours.len())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let trace = match args.as_slice() {
        // The Mooncake trace is not part of this repository: CKF_TRACE names it.
        [] => std::env::var("CKF_TRACE").unwrap_or_default(),
        [flag, path] if flag == "--trace" => path.clone(),
        _ => {
            eprintln!("usage: token-parity [--trace PATH]");
            std::process::exit(2);
        }
    };
    let requests = match load(&trace) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    // The identifier rule itself, on the edge cases (64 hex in both cases, 64 non-hex, short).
    for id in [
        "0123456789abcdef".repeat(4),
        "0123456789ABCDEF".repeat(4),
        format!("g{}", "0".repeat(63)),
        "img".to_owned(),
        "".to_owned(),
    ] {
        assert_eq!(mm_identifier_hash(&id), hash_mm_identifier(&id), "{id:?}");
    }

    let started = std::time::Instant::now();
    let mut blocks_per_variant = [0usize; VARIANTS.len()];
    let mut cases_per_variant = [0usize; VARIANTS.len()];
    let mut tokens_total = 0usize;
    for (index, request) in requests.iter().enumerate() {
        tokens_total += request.tokens.len();
        let variant = index % VARIANTS.len();
        let lora_name = format!("lora-{}", index % 7);
        let salt_name = format!("tenant-{}", index % 5);
        let (lora, salt) = match variant {
            1 => (Some(lora_name.as_str()), None),
            2 => (None, Some(salt_name.as_str())),
            3 | 5 => (Some(lora_name.as_str()), Some(salt_name.as_str())),
            _ => (None, None),
        };
        let items = if variant >= 4 {
            items(index, request.tokens.len())
        } else {
            Vec::new()
        };
        let small: &[u32] = if index < SMALL_REQUESTS {
            &SMALL_BLOCK_SIZES
        } else {
            &[]
        };
        for &block_size in BLOCK_SIZES.iter().chain(small) {
            let case = Case {
                tokens: &request.tokens,
                block_size,
                lora,
                salt,
                items: &items,
            };
            match compare(&case) {
                Ok(blocks) => {
                    blocks_per_variant[variant] += blocks;
                    cases_per_variant[variant] += 1;
                }
                Err(e) => {
                    eprintln!(
                        "MISMATCH request {index} ({} tokens, variant {}, block size \
                         {block_size}, lora {lora:?}, salt {salt:?}, items {items:?}): {e}",
                        request.tokens.len(),
                        VARIANTS[variant]
                    );
                    std::process::exit(1);
                }
            }
        }
    }
    println!(
        "token-parity: {} requests, {tokens_total} tokens from {trace}; block sizes \
         {BLOCK_SIZES:?} (and {SMALL_BLOCK_SIZES:?} for the first {SMALL_REQUESTS}); {:.1} s",
        requests.len(),
        started.elapsed().as_secs_f64()
    );
    for (v, name) in VARIANTS.iter().enumerate() {
        println!(
            "  {name:<13} {:>6} (request, block size) cases, {:>9} blocks: all equal",
            cases_per_variant[v], blocks_per_variant[v]
        );
    }
    println!("  identifier hash: 64-hex (lower, upper), 64 non-hex, short, empty: all equal");
    println!("0 differences");
}
