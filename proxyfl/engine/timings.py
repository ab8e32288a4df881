"""Where a rank's time goes, in seconds summed over the rounds it has run (machine.json's
``timings``): its start-up, its set-up, the loop's phases, the time spent waiting for the
other ranks, and PrivateKT's server work (rank 0 only).

A rank's life from its process's creation to its last record is, up to the few
statements between the timed blocks (``data_wait`` is part of ``train``, not added to it),

    process seconds = startup + setup + compile + train + eval + comm + checkpoint
                      + records + wait + server (fine-tune, self-train, sampling)

where ``startup`` is the time before the rank's own clock starts (the interpreter, the
imports before ``proxyfl.run``'s first line, MPI's initialisation: :func:`process_age`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from plumbing.warm_shim import STARTED_ENV, start_ticks

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass
class Timings:
    """Seconds per phase. ``wait_seconds``: at the barriers before an exchange (and, in
    PrivateKT, for the server's update): time the rank was idle, not communicating."""

    setup_seconds: float = 0.0  # imports, checks, stores opened, models built, resume
    train_seconds: float = 0.0
    eval_seconds: float = 0.0
    comm_seconds: float = 0.0
    checkpoint_seconds: float = 0.0
    records_seconds: float = 0.0  # agreeing on members, metrics gathered and written
    wait_seconds: float = 0.0
    server_finetune_seconds: float = 0.0  # PrivateKT: Eq. 3, the buffer, fine-tuning
    server_self_train_seconds: float = 0.0  # PrivateKT: scoring the pool, self-training
    server_sampling_seconds: float = 0.0  # PrivateKT: scoring the pool for Eq. 4
    startup_seconds: float = 0.0  # process created -> the rank's clock (process_age)
    compile_seconds: float = 0.0  # torch.compile's first calls, in the pre-run check
    # inside train: the loop waiting for its next batch (what prefetching did not hide)
    data_wait_seconds: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return dict(vars(self))

    def restore(self, saved: dict[str, float]) -> None:
        """Take a checkpoint's figures (one written before a field existed lacks it: 0)."""
        for name in vars(self):
            setattr(self, name, float(saved.get(name, 0.0)))


def process_age() -> float | None:
    """Seconds since this process was created (fork, not exec: a rank's interpreter start,
    imports and MPI initialisation count), or None where it cannot be told. A rank forked
    from a warm server (:mod:`plumbing.warm`) counts from its shim's creation: its wait for
    the server's imports is its start-up too.

    On Linux both ends are read on the clock since boot (``/proc/self/stat``'s start time,
    in clock ticks, and ``CLOCK_BOOTTIME``): 10 ms resolution. Elsewhere psutil's creation
    time against the wall clock, whose boot time may be rounded to the second."""
    try:
        started = int(os.environ.get(STARTED_ENV) or start_ticks()) / _CLOCK_TICKS
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, IndexError, ValueError, AttributeError):
        pass
    try:
        import psutil

        return max(0.0, time.time() - psutil.Process().create_time())
    except Exception:
        return None
