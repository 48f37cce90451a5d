"""Free loopback ports, found by binding port 0, so parallel runs do not collide."""

from __future__ import annotations

import socket
from dataclasses import dataclass, fields

from ._base import LOOPBACK, StackError


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports (all bound at once, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def shared_port(hosts: list[str]) -> int:
    """A port free on every one of ``hosts`` (several listeners on one port, as pods behind a service)."""
    for _ in range(50):
        socks = []
        try:
            first = socket.socket()
            first.bind((hosts[0], 0))
            socks.append(first)
            port = first.getsockname()[1]
            for host in hosts[1:]:
                sock = socket.socket()
                socks.append(sock)
                sock.bind((host, port))
            return port
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise StackError(f"no port free on all of {hosts}")


@dataclass
class Ports:
    """Every port of the native stack (scripts/stack/otelstack/native.py)."""

    otlp_grpc: int
    otlp_http: int
    collector_health: int
    collector_prometheus: int
    collector_telemetry: int
    jaeger_otlp_grpc: int
    jaeger_otlp_http: int
    jaeger_query_http: int
    jaeger_query_grpc: int
    jaeger_health: int
    jaeger_metrics: int
    prometheus: int
    alertmanager: int
    #: The stack's own webhook receiver (used when no --webhook-url is given; 0 in a state file from before it).
    webhook: int = 0

    @classmethod
    def allocate(cls) -> Ports:
        names = [f.name for f in fields(cls)]
        return cls(**dict(zip(names, free_ports(len(names)))))
