# Stub for the real-engine tests (scripts/engine-venv.sh): stands in for one import of the
# engine's publisher module (kv_events.py), so that module runs without its package.
# `sglang.srt.runtime_context.get_parallel`: one process, rank 0 of every parallel dimension.

from dataclasses import dataclass


@dataclass(frozen=True)
class Parallel:
    pp_rank: int = 0
    attn_tp_rank: int = 0
    attn_cp_rank: int = 0


def get_parallel() -> Parallel:
    return Parallel()
