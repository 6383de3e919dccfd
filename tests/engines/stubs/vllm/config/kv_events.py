# Stub for the real-engine tests (scripts/engine-venv.sh): stands in for one import of the
# engine's publisher module (kv_events.py), so that module runs without its package.
# `vllm.config.kv_events.KVEventsConfig`: the publisher only builds one to report its settings.

from dataclasses import dataclass


@dataclass
class KVEventsConfig:
    """The publisher's settings, as vLLM's `--kv-events-config` names them."""

    enable_kv_cache_events: bool = False
    publisher: str | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    def __post_init__(self) -> None:
        if self.publisher is None:
            self.publisher = "zmq" if self.enable_kv_cache_events else "null"
