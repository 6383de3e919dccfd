//! `ckf_core::tokens` against the published test vectors `proto/token_hash/vectors.json`, which
//! the Python reference `proto/token_hash/ckf_token_hash.py --vectors` generates. A difference
//! means the Rust and Python definitions disagree (or the file was not regenerated).

use ckf_core::tokens::{
    BlockSeed, MultimodalSpan, block_hash, chain_step, mm_identifier_hash, sequence_hashes,
};
use serde_json::Value;

const VECTORS: &str = include_str!("../../proto/token_hash/vectors.json");

fn u64_of(value: &Value, what: &str) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("{what}: not a u64: {value}"))
}

fn u64s(value: &Value, what: &str) -> Vec<u64> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("{what}: not an array"))
        .iter()
        .map(|v| u64_of(v, what))
        .collect()
}

#[test]
fn every_published_vector_matches() {
    let doc: Value = serde_json::from_str(VECTORS).expect("vectors.json is JSON");
    let vectors = doc["vectors"].as_array().expect("a vectors array");
    assert!(vectors.len() >= 20, "only {} vectors", vectors.len());
    for vector in vectors {
        let name = vector["name"].as_str().expect("a name");
        let block_size = u64_of(&vector["block_size"], name) as usize;
        let tokens: Vec<u32> = u64s(&vector["tokens"], name)
            .into_iter()
            .map(|t| u32::try_from(t).expect("u32 token"))
            .collect();
        let seed = BlockSeed::new(vector["cache_salt"].as_str(), vector["lora_name"].as_str());
        assert_eq!(seed.0, u64_of(&vector["seed"], name), "{name}: seed");

        let mut spans = Vec::new();
        for item in vector["multimodal"].as_array().expect("multimodal array") {
            let identifier = item["identifier"].as_str().expect("identifier");
            let hash = mm_identifier_hash(identifier);
            assert_eq!(
                hash,
                item["hash"].as_u64(),
                "{name}: hash of {identifier:?}"
            );
            if let Some(hash) = hash {
                spans.push(MultimodalSpan {
                    hash,
                    offset: u64_of(&item["offset"], name),
                    length: u64_of(&item["length"], name),
                });
            }
        }

        let expected = u64s(&vector["sequence_hashes"], name);
        let got = sequence_hashes(&tokens, block_size, seed, &spans).expect("block size >= 1");
        assert_eq!(got, expected, "{name}: sequence hashes");

        // The block hashes and the chain, one step at a time (the producer's path).
        let locals = u64s(&vector["block_hashes"], name);
        assert_eq!(
            locals.len(),
            expected.len(),
            "{name}: one block hash per block"
        );
        let mut parent = None;
        for (index, block) in tokens.chunks_exact(block_size).enumerate() {
            let start = (index * block_size) as u64;
            let end = start + block_size as u64;
            let mm: Vec<u64> = spans
                .iter()
                .filter(|s| s.length > 0 && s.offset < end && start < s.offset + s.length)
                .map(|s| s.hash)
                .collect();
            let local = block_hash(block, &mm, seed);
            assert_eq!(local, locals[index], "{name}: block hash {index}");
            let seq = chain_step(parent, local);
            assert_eq!(seq, expected[index], "{name}: chain step {index}");
            parent = Some(seq);
        }
    }
}
