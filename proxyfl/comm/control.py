"""Control messages between ranks (errors, flags, checkpoint rounds, metric rows, run
records) as JSON text in byte buffers, never pickles.

mpi4py's lower-case calls (``comm.allgather(obj)``) pickle and unpickle Python objects, so
a rank that receives one runs whatever the sender put in it; across hospitals that is code
execution from one institution in another. Here a value is encoded as UTF-8 JSON, its
length is exchanged as an int64, and the bytes move with the buffer calls
(``Allgatherv``, ``Gatherv``); the receiver only parses JSON. Values must be JSON-able
(dicts, lists, strings, numbers, booleans, None; NumPy scalars become numbers). A tuple
arrives as a list, and NaN and ±inf arrive as they were sent.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np


def _encode(value: Any) -> np.ndarray:
    def plain(item: Any) -> Any:
        if isinstance(item, np.generic):
            return item.item()
        raise TypeError(f"{type(item).__name__} is not a control message value")

    text = json.dumps(value, default=plain, separators=(",", ":"))
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)


def _decode(buffer: np.ndarray, lengths: np.ndarray) -> list[Any]:
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return [json.loads(buffer[offsets[i] : offsets[i + 1]].tobytes().decode("utf-8"))
            for i in range(len(lengths))]  # fmt: skip


def allgather_json(comm: Any, value: Any) -> list[Any]:
    """Every rank's ``value``, in rank order, on every rank."""
    data = _encode(value)
    lengths = np.zeros(comm.Get_size(), dtype=np.int64)
    comm.Allgather(np.array([data.size], dtype=np.int64), lengths)
    received = np.empty(int(lengths.sum()), dtype=np.uint8)
    comm.Allgatherv(data, [received, lengths])
    return _decode(received, lengths)


def gather_json(comm: Any, value: Any, root: int = 0) -> list[Any] | None:
    """Every rank's ``value``, in rank order, on ``root``; None on the other ranks."""
    data = _encode(value)
    is_root = comm.Get_rank() == root
    lengths = np.zeros(comm.Get_size(), dtype=np.int64) if is_root else None
    comm.Gather(np.array([data.size], dtype=np.int64), lengths, root=root)
    received = np.empty(int(lengths.sum()), dtype=np.uint8) if is_root else None
    comm.Gatherv(data, [received, lengths] if is_root else None, root=root)
    return _decode(received, lengths) if is_root else None  # type: ignore[arg-type]
