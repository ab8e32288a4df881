"""TCP ports of this machine: one free to listen on, whether one is taken, whether
something answers on one."""

from __future__ import annotations

import contextlib
import socket

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nothing on ``host`` listens on now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def port_taken(port: int, host: str = LOOPBACK) -> bool:
    """Whether ``port`` of ``host`` cannot be bound now (another process holds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def accepts(port: int, host: str = LOOPBACK, timeout_s: float = 1.0) -> bool:
    """Whether something listening on ``port`` of ``host`` accepts a connection."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=timeout_s):
        return True
    return False
