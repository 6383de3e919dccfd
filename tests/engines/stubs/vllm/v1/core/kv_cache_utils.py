# Stub for the real-engine tests (scripts/engine-venv.sh): stands in for one import of the
# engine's publisher module (kv_events.py), so that module runs without its package.
# `vllm.v1.core.kv_cache_utils.ExternalBlockHash`: a published block hash is a 32-byte digest,
# or its low 64 bits as an int when VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES is on.

ExternalBlockHash = bytes | int
