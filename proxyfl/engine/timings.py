"""Where a rank's time goes, in seconds summed over the rounds it has run (run.json's
``timings``): the loop's phases, the time spent waiting for the other ranks, and PrivateKT's
server work (rank 0 only)."""

from __future__ import annotations

from dataclasses import dataclass


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

    def as_dict(self) -> dict[str, float]:
        return dict(vars(self))

    def restore(self, saved: dict[str, float]) -> None:
        """Take a checkpoint's figures (one written before a field existed lacks it: 0)."""
        for name in vars(self):
            setattr(self, name, float(saved.get(name, 0.0)))
