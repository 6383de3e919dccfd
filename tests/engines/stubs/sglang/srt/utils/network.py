# Stub for the real-engine tests (scripts/engine-venv.sh): stands in for one import of the
# engine's publisher module (kv_events.py), so that module runs without its package.
# `sglang.srt.utils.network.NetworkAddress`: a host and port, parsed from `host:port` or
# `[v6]:port`.

import ipaddress
from dataclasses import dataclass


@dataclass(frozen=True)
class NetworkAddress:
    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> "NetworkAddress":
        """`host:port` or `[v6 host]:port`; ValueError otherwise."""
        if text.startswith("["):
            host, sep, rest = text[1:].partition("]")
            if not sep or not rest.startswith(":"):
                raise ValueError(f"bad address: {text!r}")
            return cls(host, int(rest[1:]))
        host, sep, port = text.rpartition(":")
        if not sep or ":" in host:
            raise ValueError(f"bad address: {text!r}")
        return cls(host, int(port))

    @property
    def is_ipv6(self) -> bool:
        try:
            return isinstance(ipaddress.ip_address(self.host), ipaddress.IPv6Address)
        except ValueError:
            return False

    def to_tcp(self) -> str:
        host = f"[{self.host}]" if self.is_ipv6 else self.host
        return f"tcp://{host}:{self.port}"
