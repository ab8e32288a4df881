"""A benchmark worker's own peak memory: what the benches measure in fresh processes."""

from __future__ import annotations


def peak_rss_bytes() -> int:
    """This process's peak resident set (``VmHWM`` of /proc/self/status), in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")
