#!/usr/bin/env python3
"""Reference implementation of ckf-relay's canonical token hash (proto/TOKEN_HASH.md).

From a request's token ids to the 64-bit sequence block hashes that ckf-relay's filter holds
and that its queries probe. The scheme is NVIDIA Dynamo 1.6.1's (crates dynamo-kv-router /
dynamo-tokens / dynamo-kv-hashing); the Rust implementation is `ckf_core::tokens`.

Pure Python plus the `xxhash` PyPI package (`pip install xxhash`). Import it from tests:

    from ckf_token_hash import block_seed, sequence_hashes, mm_identifier_hash
    seed = block_seed(cache_salt="tenant-a", lora_name=None)
    hashes = sequence_hashes(token_ids, 16, seed, [(mm_identifier_hash("img-1"), 5, 20)])

Run `python3 ckf_token_hash.py --vectors > vectors.json` to regenerate the test vectors that
ckf-core's tests check (`python3 ckf_token_hash.py --check vectors.json` re-checks a file).
"""

import json
import sys

import xxhash

CHAIN_SEED = 1337
"""The chain seed, and the block seed of a request with neither LoRA name nor cache salt."""

_U32 = 1 << 32
_U64 = 1 << 64


def _xxh3(data, seed=0):
    return xxhash.xxh3_64_intdigest(data, seed=seed)


def block_seed(cache_salt=None, lora_name=None):
    """The request-wide block seed (int, u64): 1337, plus xxh3_64(lora_name, seed 0) when a
    non-empty LoRA name is given, plus xxh3_64(cache_salt, seed 1) when a non-empty cache salt
    is given; additions wrap modulo 2**64. None and "" are the same (absent)."""
    seed = CHAIN_SEED
    if lora_name:
        seed = (seed + _xxh3(lora_name.encode("utf-8"), 0)) % _U64
    if cache_salt:
        seed = (seed + _xxh3(cache_salt.encode("utf-8"), 1)) % _U64
    return seed


def mm_identifier_hash(identifier):
    """The u64 hash of a multimodal item's identifier (str), or None for "" (item ignored).

    A 64-character hexadecimal digest (vLLM's multimodal hash) maps to its first 16 hex digits
    read as an integer; any other identifier to xxh3_64 of its UTF-8 bytes (seed 0)."""
    if not identifier:
        return None
    if len(identifier) == 64 and all(c in "0123456789abcdefABCDEF" for c in identifier):
        return int(identifier[:16], 16)
    return _xxh3(identifier.encode("utf-8"), 0)


def block_hash(tokens, mm_hashes=(), seed=CHAIN_SEED):
    """The block hash (u64) of one full block: xxh3_64 with seed `seed` of the token ids as
    u32 little-endian, followed by the distinct multimodal identifier hashes `mm_hashes`
    sorted ascending, each as u64 little-endian (duplicates count once)."""
    out = bytearray()
    for token in tokens:
        if not 0 <= token < _U32:
            raise ValueError(f"token id {token} is not a u32")
        out += token.to_bytes(4, "little")
    for mm in sorted(set(mm_hashes)):
        if not 0 <= mm < _U64:
            raise ValueError(f"multimodal hash {mm} is not a u64")
        out += mm.to_bytes(8, "little")
    return _xxh3(bytes(out), seed)


def next_sequence_hash(parent, block):
    """Sequence hash of a block with block hash `block` after a block whose sequence hash is
    `parent`: xxh3_64 with seed 1337 of le64(parent) ++ le64(block)."""
    return _xxh3(parent.to_bytes(8, "little") + block.to_bytes(8, "little"), CHAIN_SEED)


def local_block_hashes(tokens, block_size, seed=CHAIN_SEED, multimodal=()):
    """The block hashes (before chaining) of every full block; see sequence_hashes."""
    if block_size < 1:
        raise ValueError("the block size must be at least 1 token")
    hashes = []
    for index in range(len(tokens) // block_size):
        start = index * block_size
        end = start + block_size
        mm = [
            mm_hash
            for (mm_hash, offset, length) in multimodal
            if length > 0 and offset < end and start < offset + length
        ]
        hashes.append(block_hash(tokens[start:end], mm, seed))
    return hashes


def sequence_hashes(tokens, block_size, seed=CHAIN_SEED, multimodal=()):
    """The sequence hashes (list of u64) of every full block of `tokens` (u32 ids).

    Tokens are cut into blocks of `block_size`; a trailing partial block has no hash. Block i
    covers tokens [i*block_size, (i+1)*block_size) and is hashed with the request-wide `seed`
    (block_seed) and the identifier hashes of the multimodal items (hash, offset, length) whose
    token range [offset, offset+length) overlaps it (length 0: ignored). The first block's
    sequence hash is its block hash; block i > 0 chains: next_sequence_hash(seq[i-1], block)."""
    result = []
    for block in local_block_hashes(tokens, block_size, seed, multimodal):
        result.append(block if not result else next_sequence_hash(result[-1], block))
    return result


# ---------------------------------------------------------------------------------------------
# Test vectors


def _tokens(count, start, step=7919):
    """Deterministic token ids: start, start+step, ... modulo 2**32 (no randomness needed)."""
    return [(start + i * step) % _U32 for i in range(count)]


_HEX_A = "0123456789abcdef" + "fedcba9876543210" * 3
_HEX_B = "FFEEDDCCBBAA9988" + "0" * 48
_NOT_HEX = "g" + "0" * 63  # 64 characters but not hex: hashed as a string


def _cases():
    near_max = [_U32 - 1 - i for i in range(8)]
    return [
        ("dynamo_constants_bs4", list(range(1, 15)), 4, None, None, []),
        ("plain_bs16_two_blocks", _tokens(32, 100), 16, None, None, []),
        ("plain_bs16_partial_tail", _tokens(40, 5), 16, None, None, []),
        ("plain_bs16_shorter_than_one_block", _tokens(15, 5), 16, None, None, []),
        ("plain_empty", [], 16, None, None, []),
        ("plain_bs1", [0, 1, 2, 3, 4], 1, None, None, []),
        ("plain_bs4_zeros", [0] * 12, 4, None, None, []),
        ("plain_bs64", _tokens(130, 151643), 64, None, None, []),
        ("near_u32_max_bs4", near_max, 4, None, None, []),
        ("near_u32_max_bs1", near_max[:3], 1, None, None, []),
        ("lora_bs16", _tokens(48, 100), 16, None, "sql-adapter", []),
        ("lora_bs4", list(range(1, 13)), 4, None, "a", []),
        ("salt_bs16", _tokens(48, 100), 16, "tenant-a", None, []),
        ("salt_bs4_unicode", list(range(1, 13)), 4, "tenant-ü-東京", None, []),
        ("salt_equals_lora_text_bs4", list(range(1, 13)), 4, "same", None, []),
        ("lora_equals_salt_text_bs4", list(range(1, 13)), 4, None, "same", []),
        ("salt_and_lora_bs16", _tokens(48, 100), 16, "tenant-a", "sql-adapter", []),
        ("empty_salt_and_lora_are_absent", list(range(1, 13)), 4, "", "", []),
        ("mm_short_id_bs4", list(range(0, 16)), 4, None, None, [("img-1", 5, 2)]),
        ("mm_hex64_bs4", list(range(0, 16)), 4, None, None, [(_HEX_A, 4, 8)]),
        ("mm_hex64_upper_bs4", list(range(0, 16)), 4, None, None, [(_HEX_B, 0, 4)]),
        ("mm_64_chars_not_hex_bs4", list(range(0, 16)), 4, None, None, [(_NOT_HEX, 0, 4)]),
        (
            "mm_two_items_one_block_bs16",
            _tokens(32, 9),
            16,
            None,
            None,
            [("img-b", 2, 3), ("img-a", 8, 4)],
        ),
        (
            "mm_same_item_twice_in_block_bs16",
            _tokens(32, 9),
            16,
            None,
            None,
            [("img-a", 2, 3), ("img-a", 8, 4)],
        ),
        ("mm_spans_three_blocks_bs4", list(range(0, 20)), 4, None, None, [("video", 3, 6)]),
        ("mm_zero_length_ignored_bs4", list(range(0, 8)), 4, None, None, [("img-1", 4, 0)]),
        ("mm_in_partial_tail_only_bs4", list(range(0, 10)), 4, None, None, [("img-1", 8, 2)]),
        ("mm_empty_identifier_ignored_bs4", list(range(0, 8)), 4, None, None, [("", 0, 4)]),
        (
            "mm_with_salt_and_lora_bs16",
            _tokens(64, 77),
            16,
            "tenant-b",
            "vision-lora",
            [(_HEX_A, 10, 30), ("img-2", 50, 2)],
        ),
        ("mm_bs1", [10, 11, 12, 13], 1, None, None, [("img-1", 1, 2)]),
        ("mm_bs64", _tokens(128, 3), 64, None, None, [("img-1", 60, 10)]),
    ]


def vectors():
    """The test vectors (a JSON-ready dict); every hash is an integer (u64)."""
    out = []
    for name, tokens, block_size, salt, lora, items in _cases():
        seed = block_seed(salt, lora)
        spans = []
        for identifier, offset, length in items:
            mm = mm_identifier_hash(identifier)
            if mm is not None:
                spans.append((mm, offset, length))
        out.append(
            {
                "name": name,
                "block_size": block_size,
                "cache_salt": salt,
                "lora_name": lora,
                "tokens": tokens,
                "multimodal": [
                    {
                        "identifier": identifier,
                        "offset": offset,
                        "length": length,
                        "hash": mm_identifier_hash(identifier),
                    }
                    for identifier, offset, length in items
                ],
                "seed": seed,
                "block_hashes": local_block_hashes(tokens, block_size, seed, spans),
                "sequence_hashes": sequence_hashes(tokens, block_size, seed, spans),
            }
        )
    return {
        "scheme": "ckf-relay canonical token hash = NVIDIA Dynamo 1.6.1 (proto/TOKEN_HASH.md)",
        "generator": "proto/token_hash/ckf_token_hash.py --vectors",
        "vectors": out,
    }


def _dumps(doc):
    """JSON text with one vector field per line (short lines, readable diffs)."""
    lines = ["{"]
    for key in ("scheme", "generator"):
        lines.append(f"  {json.dumps(key)}: {json.dumps(doc[key], ensure_ascii=False)},")
    lines.append('  "vectors": [')
    for i, vector in enumerate(doc["vectors"]):
        fields = [
            f"    {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in vector.items()
        ]
        comma = "," if i + 1 < len(doc["vectors"]) else ""
        lines.append("   {\n" + ",\n".join(fields) + "\n   }" + comma)
    lines.append("  ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _check(path):
    with open(path, encoding="utf-8") as f:
        stored = json.load(f)
    fresh = vectors()
    if stored != fresh:
        print(f"{path}: differs from what this file generates", file=sys.stderr)
        return 1
    print(f"{path}: {len(fresh['vectors'])} vectors match")
    return 0


def _self_test():
    # Constants published in dynamo-tokens 1.6.1's own tests (block size 4).
    assert block_hash([1, 2, 3, 4]) == 14643705804678351452
    assert sequence_hashes(list(range(1, 15)), 4) == [
        14643705804678351452,
        4945711292740353085,
        12583592247330656132,
    ]


def main(argv):
    _self_test()
    if argv == ["--vectors"]:
        sys.stdout.write(_dumps(vectors()))
        return 0
    if len(argv) == 2 and argv[0] == "--check":
        return _check(argv[1])
    print("usage: ckf_token_hash.py --vectors | --check vectors.json", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
