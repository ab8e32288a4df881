"""Communication schedules for PushSum: a column-stochastic mixing matrix P(t) per round.

``P[i, j]`` is the weight client ``i`` puts on what client ``j`` sends (``P[i, j] != 0``:
``i`` receives from ``j``). Column-stochastic means every client sends out exactly its whole
mass: ``sum_i P[i, j] = 1``. Matrices are over the *members* of a round (the clients still
taking part, in rank order), so a client that drops out simply leaves the graph.

Schedules, by the name given to ``--graph``:

* ``exponential`` (the paper's, default): one peer per round, ``P(t)`` a permutation.
  With ``s = 2^(t mod (floor(log2(n-1)) + 1))`` client ``k`` sends to ``(k+s) mod n`` and
  receives from ``(k-s) mod n``; the received proxy replaces its own.
* ``exponential_mix``: the same peers, but each client keeps half of its mass and sends
  half (stochastic gradient push, Assran et al. 2019). Doubly stochastic; with ``n`` a
  power of two, ``log2 n`` rounds average exactly.
* ``exponential_uneven``: the same peers, client ``k`` keeps ``1/(k+2)`` and sends the
  rest. Column- but not row-stochastic, so the de-biasing weights matter.
* ``file:PATH``: a JSON list of K×K column-stochastic matrices, used in turn (round t
  uses matrix ``t mod len``). When clients have dropped out, the members' sub-matrix is
  used with its columns renormalised (a column left empty keeps its own mass).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BUILTIN_SCHEDULES: tuple[str, ...] = ("exponential", "exponential_mix", "exponential_uneven")
_TOLERANCE = 1e-9


def exponential_offset(round_index: int, n_members: int) -> int:
    """The peer offset ``s = 2^(t mod (floor(log2(n-1)) + 1))`` of round ``t`` (0-based)."""
    if n_members < 2:
        return 0
    period = (n_members - 1).bit_length()  # floor(log2(n - 1)) + 1, exactly
    return 2 ** (round_index % period)


def check_column_stochastic(matrix: np.ndarray, what: str = "mixing matrix") -> None:
    """Raise ``ValueError`` unless ``matrix`` is square, non-negative, with columns summing to 1."""
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"{what} must be square, got shape {matrix.shape}")
    if (matrix < -_TOLERANCE).any():
        raise ValueError(f"{what} has negative entries")
    sums = matrix.sum(axis=0)
    if not np.allclose(sums, 1.0, atol=1e-6):
        raise ValueError(f"{what} is not column-stochastic: column sums {sums.tolist()}")


@dataclass(frozen=True)
class Schedule:
    """A named rule giving the mixing matrix of each round."""

    name: str
    matrices: tuple[np.ndarray, ...] = ()

    def matrix(self, round_index: int, members: list[int], world_size: int) -> np.ndarray:
        """``P(t)`` over ``members`` (world ranks in increasing order), round ``t`` 0-based."""
        n = len(members)
        if n == 0:
            return np.zeros((0, 0))
        if self.name.startswith("file:"):
            full = self.matrices[round_index % len(self.matrices)]
            if full.shape[0] != world_size:
                raise ValueError(
                    f"graph file holds {full.shape[0]}x{full.shape[0]} matrices "
                    f"for {world_size} clients"
                )
            sub = full[np.ix_(members, members)].astype(np.float64)
            for column in range(n):
                total = sub[:, column].sum()
                if total <= _TOLERANCE:
                    sub[:, column] = 0.0
                    sub[column, column] = 1.0
                else:
                    sub[:, column] /= total
            return sub
        matrix = np.zeros((n, n))
        if n == 1:
            matrix[0, 0] = 1.0
            return matrix
        shift = exponential_offset(round_index, n)
        for k in range(n):
            peer = (k + shift) % n
            if self.name == "exponential":
                keep = 0.0
            elif self.name == "exponential_mix":
                keep = 0.5
            else:  # exponential_uneven
                keep = 1.0 / (k + 2)
            matrix[k, k] += keep
            matrix[peer, k] += 1.0 - keep
        return matrix

    @property
    def is_permutation(self) -> bool:
        return self.name == "exponential"


def graph_matrices(raw: object, where: str) -> tuple[np.ndarray, ...]:
    """The mixing matrices of a graph file's JSON ``raw``: a non-empty list of n x n
    column-stochastic matrices of one size, or an object whose ``matrices`` is one;
    ``ValueError`` naming ``where`` and what is wrong."""
    if isinstance(raw, dict):
        raw = raw.get("matrices")
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"{where} must hold a non-empty list of matrices")
    matrices = []
    for index, item in enumerate(raw):
        try:
            matrix = np.asarray(item, dtype=np.float64)
        except (TypeError, ValueError) as error:
            raise ValueError(f"matrix {index} of {where} is not a matrix of numbers") from error
        check_column_stochastic(matrix, f"matrix {index} of {where}")
        matrices.append(matrix)
    if len({m.shape for m in matrices}) != 1:
        raise ValueError(f"{where}: matrices differ in size")
    return tuple(matrices)


def matrices_lists(matrices: Sequence[np.ndarray]) -> list[list[list[float]]]:
    """A graph file's matrices as nested lists of floats: what a federation's job carries
    of them (every float64 to the bit in JSON)."""
    return [matrix.tolist() for matrix in matrices]


def matrices_json(matrices: Sequence[np.ndarray]) -> str:
    """:func:`matrices_lists` as canonical JSON: every float64 to the bit (``repr``), no
    spaces; what a run is identified by."""
    return json.dumps(matrices_lists(matrices), separators=(",", ":"))


def matrices_digest(matrices: Sequence[np.ndarray]) -> str:
    """SHA-256 of :func:`matrices_json`: equal digests, equal graphs, wherever the file
    that held them lies."""
    return hashlib.sha256(matrices_json(matrices).encode()).hexdigest()


def parse_schedule_spec(spec: str) -> Schedule:
    """A :class:`Schedule` from a ``--graph`` value; ``ValueError`` naming what is wrong."""
    if spec in BUILTIN_SCHEDULES:
        return Schedule(spec)
    if spec.startswith("file:"):
        path = Path(spec.removeprefix("file:"))
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"cannot read graph file {path}: {error}") from error
        return Schedule(spec, graph_matrices(raw, f"graph file {path}"))
    raise ValueError(
        f"unknown graph {spec!r}; choose one of {', '.join(BUILTIN_SCHEDULES)} or file:PATH.json"
    )
