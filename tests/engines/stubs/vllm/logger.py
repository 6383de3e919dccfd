# Stub for the real-engine tests (scripts/engine-venv.sh): stands in for one import of the
# engine's publisher module (kv_events.py), so that module runs without its package.
# `vllm.logger.init_logger`: a plain standard-library logger.

import logging


def init_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)
