# Stub for the real-engine tests (scripts/engine-venv.sh): stands in for one import of the
# engine's publisher module (kv_events.py), so that module runs without its package.
# `vllm.utils.network_utils`: the four helpers the publisher calls when it binds `tcp://*:0`.

import ipaddress
import os
from urllib.parse import urlparse


def get_ip() -> str:
    # The tests bind loopback only; never probe the network for a node address.
    return os.environ.get("VLLM_HOST_IP", "127.0.0.1")


def is_valid_ipv6_address(address: str) -> bool:
    try:
        ipaddress.IPv6Address(address)
        return True
    except ValueError:
        return False


def get_tcp_uri(ip: str, port: int) -> str:
    return f"tcp://[{ip}]:{port}" if is_valid_ipv6_address(ip) else f"tcp://{ip}:{port}"


def split_zmq_path(path: str) -> tuple[str, str, str]:
    """`scheme, host, port` of a ZMQ endpoint (port "" when it has none)."""
    parsed = urlparse(path)
    if not parsed.scheme:
        raise ValueError(f"Invalid zmq path: {path}")
    host = parsed.hostname or ""
    port = "" if parsed.port is None else str(parsed.port)
    if parsed.scheme == "tcp" and not (host and port):
        raise ValueError(f"Invalid zmq path: {path}")
    return parsed.scheme, host, port
