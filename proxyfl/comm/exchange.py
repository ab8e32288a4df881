"""Moving shared models between ranks: PushSum, server averaging and ring passing over MPI.

A model crosses ranks as one contiguous float32 buffer (its parameters flattened in
``model.parameters()`` order) through mpi4py's buffer calls (``Sendrecv``, ``Isend`` /
``Irecv``, ``Send`` / ``Recv``, ``Bcast``): no pickling. Only the model handed to these functions
ever leaves a rank; the trainer hands them the proxy (or the shared model of a baseline),
never a private model. Every send is recorded in a :class:`SendLog` (round, kind, peer,
number of values, BLAKE2b digest of the exact bytes), which the run writes per rank.

PushSum (Kempe et al. 2003; Nedić & Olshevsky 2016; Assran et al. 2019). A client holds
its de-biased parameters θ_k and a weight w_k (1 at the start). With a column-stochastic
``P(t)`` over the round's members it sends ``P[j,k]·(w_k θ_k)`` and ``P[j,k]·w_k`` to each
out-neighbour j and keeps ``P[k,k]`` of both, then

    z_k ← Σ_j P[k,j] · w_j θ_j,    w_k ← Σ_j P[k,j] · w_j,    θ_k ← z_k / w_k.

The mass ``Σ_k w_k θ_k`` and ``Σ_k w_k`` are conserved, so θ_k tends to the plain average of
the initial θ's. Algorithm 1 of the paper writes the sent message as ``P[j,k]·θ_k``; it is
the same thing for the paper's permutation graph (w stays 1), and sending the numerator
``w_k θ_k`` is what keeps the de-biasing exact for any column-stochastic P.

Server averaging (FedAvg, FML): rank 0 also plays the server. Each member sends it its
buffer; it adds them in the members' order and divides by their number, in float32,

    s ← θ_{m_1},    s ← s + θ_{m_j} for j = 2..n,    θ̄ = s / n,

and sends θ̄ back to each member. The order is part of the definition: float addition is not
associative, and MPI's ``Reduce`` chooses its tree by message and world size (four members:
(θ_1+θ_2)+(θ_3+θ_4)), so a sum left to the transport would give other last bits over
another transport (:mod:`proxyfl.comm.flare`) or another placement of the clients.

PrivateKT: rank 0, the server, ``Bcast``s the global model, the round's knowledge-transfer
item indices and the selected clients to every rank (:meth:`Communicator.broadcast`);
each selected client other than rank 0 sends the server exactly its K perturbed labels
(int64) with one ``Send`` (:meth:`Communicator.gather_labels`), and nothing else.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

MODEL_TAG = 101
WEIGHT_TAG = 102
LABELS_TAG = 103
AVERAGE_TAG = 104
SERVER_RANK = 0


def flatten_parameters(model: nn.Module) -> np.ndarray:
    """All parameters of ``model`` as one contiguous float32 numpy vector (a copy, on CPU),
    in ``model.parameters()`` order: the MPI buffer of a model."""
    with torch.no_grad():
        flat = parameters_to_vector(model.parameters()).float().cpu()
    # parameters_to_vector concatenates into a new tensor, so the array shares nothing
    # with the model even when .float() and .cpu() are no-ops.
    return np.ascontiguousarray(flat.numpy(), dtype=np.float32)


def assign_flat_parameters(model: nn.Module, flat: np.ndarray) -> None:
    """Set ``model``'s parameters to ``flat`` (as produced by :func:`flatten_parameters`),
    converted to the parameters' dtype and device; ``flat`` is not kept."""
    values = np.asarray(flat)
    expected = sum(p.numel() for p in model.parameters())
    if values.size != expected:
        raise ValueError(f"buffer has {values.size} values, model has {expected}")
    first = next(model.parameters(), None)
    if first is None:
        return
    # vector_to_parameters makes each parameter a view of the vector it is given: hand it a
    # fresh copy (torch.tensor copies), never memory the caller's array or MPI still holds.
    vector = torch.tensor(values.reshape(-1), dtype=first.dtype, device=first.device)
    with torch.no_grad():
        vector_to_parameters(vector, model.parameters())


def digest(buffer: np.ndarray) -> str:
    """BLAKE2b-128 of a contiguous array's bytes."""
    return hashlib.blake2b(memoryview(np.ascontiguousarray(buffer)), digest_size=16).hexdigest()


@dataclass
class SendLog:
    """What this rank has sent: one entry per message."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    with_digests: bool = True

    def record(self, round_number: int, kind: str, peer: int | str, buffer: np.ndarray) -> None:
        self.entries.append(
            {
                "round": round_number,
                "kind": kind,
                "peer": peer,
                "values": int(buffer.size),
                "dtype": str(buffer.dtype),
                "digest": digest(buffer) if self.with_digests else None,
            }
        )


class Communicator:
    """Model exchanges over an mpi4py communicator; returns the seconds spent in MPI calls."""

    def __init__(self, comm: Any, log: SendLog | None = None) -> None:
        self.comm = comm
        self.rank: int = comm.Get_rank()
        self.size: int = comm.Get_size()
        self.log = log if log is not None else SendLog()

    # -- PushSum -------------------------------------------------------------------------
    def push_sum(
        self,
        theta: np.ndarray,
        weight: float,
        matrix: np.ndarray,
        members: list[int],
        round_number: int,
    ) -> tuple[np.ndarray, float, float]:
        """One PushSum round; returns ``(θ_new, w_new, seconds)``. Non-members must not call."""
        me = members.index(self.rank)
        numerator = np.ascontiguousarray(theta * np.float32(weight), dtype=np.float32)
        sends: list[tuple[int, np.ndarray, np.ndarray]] = []
        for j, peer in enumerate(members):
            if j != me and matrix[j, me] != 0.0:
                share = np.float32(matrix[j, me])
                buffer = numerator if share == 1.0 else np.ascontiguousarray(numerator * share)
                sends.append((peer, buffer, np.array([matrix[j, me] * weight], dtype=np.float64)))
        sources = [peer for j, peer in enumerate(members) if j != me and matrix[me, j] != 0.0]
        received = [np.empty_like(numerator) for _ in sources]
        received_weights = [np.empty(1, dtype=np.float64) for _ in sources]
        for peer, buffer, weight_buffer in sends:
            self.log.record(round_number, "model", peer, buffer)
            self.log.record(round_number, "weight", peer, weight_buffer)

        start = time.perf_counter()
        if len(sends) == 1 and len(sources) == 1:
            peer, buffer, weight_buffer = sends[0]
            self.comm.Sendrecv(
                buffer, dest=peer, sendtag=MODEL_TAG,
                recvbuf=received[0], source=sources[0], recvtag=MODEL_TAG,
            )  # fmt: skip
            self.comm.Sendrecv(
                weight_buffer, dest=peer, sendtag=WEIGHT_TAG,
                recvbuf=received_weights[0], source=sources[0], recvtag=WEIGHT_TAG,
            )  # fmt: skip
        else:
            requests = []
            for source, buffer, weight_buffer in zip(
                sources, received, received_weights, strict=True
            ):
                requests.append(self.comm.Irecv(buffer, source=source, tag=MODEL_TAG))
                requests.append(self.comm.Irecv(weight_buffer, source=source, tag=WEIGHT_TAG))
            for peer, buffer, weight_buffer in sends:
                requests.append(self.comm.Isend(buffer, dest=peer, tag=MODEL_TAG))
                requests.append(self.comm.Isend(weight_buffer, dest=peer, tag=WEIGHT_TAG))
            if requests:
                requests[0].Waitall(requests)
        seconds = time.perf_counter() - start

        keep = float(matrix[me, me])
        total = numerator * np.float32(keep) if keep != 0.0 else np.zeros_like(numerator)
        new_weight = keep * weight
        for buffer, weight_buffer in zip(received, received_weights, strict=True):
            total += buffer
            new_weight += float(weight_buffer[0])
        theta_new = np.ascontiguousarray(total / np.float32(new_weight), dtype=np.float32)
        return theta_new, new_weight, seconds

    # -- server average ------------------------------------------------------------------
    def server_average(
        self, theta: np.ndarray, members: list[int], round_number: int
    ) -> tuple[np.ndarray | None, float]:
        """Average of the members' buffers, summed by rank 0 in the members' order (module
        doc); called by the members and the server.

        Returns ``(average, seconds)`` on members and the server, ``(None, 0.0)`` elsewhere.
        """
        if self.rank not in members and self.rank != SERVER_RANK:
            return None, 0.0
        own = np.ascontiguousarray(theta, dtype=np.float32)
        start = time.perf_counter()
        if self.rank != SERVER_RANK:
            self.log.record(round_number, "model", SERVER_RANK, own)
            self.comm.Send(own, dest=SERVER_RANK, tag=MODEL_TAG)
            average = np.empty_like(own)
            self.comm.Recv(average, source=SERVER_RANK, tag=AVERAGE_TAG)
            return average, time.perf_counter() - start
        total: np.ndarray | None = None
        received = np.empty_like(own)
        for member in members:
            if member == SERVER_RANK:
                part = own
            else:
                self.comm.Recv(received, source=member, tag=MODEL_TAG)
                part = received
            if total is None:
                total = part.copy()
            else:
                total += part
        average = total / np.float32(max(len(members), 1)) if total is not None else own.copy()
        self.log.record(round_number, "server_average", "members", average)
        for member in members:
            if member != SERVER_RANK:
                self.comm.Send(average, dest=member, tag=AVERAGE_TAG)
        return average, time.perf_counter() - start

    # -- ring (cyclical weight transfer) -------------------------------------------------
    def ring_pass(
        self, theta: np.ndarray, members: list[int], round_number: int
    ) -> tuple[np.ndarray, float]:
        """Send ``theta`` to the next member, receive the previous member's."""
        if len(members) < 2:
            return theta, 0.0
        me = members.index(self.rank)
        dest = members[(me + 1) % len(members)]
        source = members[(me - 1) % len(members)]
        send = np.ascontiguousarray(theta, dtype=np.float32)
        received = np.empty_like(send)
        self.log.record(round_number, "model", dest, send)
        start = time.perf_counter()
        self.comm.Sendrecv(
            send, dest=dest, sendtag=MODEL_TAG, recvbuf=received, source=source, recvtag=MODEL_TAG
        )
        return received, time.perf_counter() - start

    # -- server broadcast and label upload (PrivateKT) ------------------------------------
    def broadcast(self, buffer: np.ndarray, round_number: int, kind: str) -> float:
        """``Bcast`` ``buffer`` from the server to every rank, in place; every rank must call.
        The server's send is logged as ``kind`` to peer ``"all"``."""
        if not buffer.flags.c_contiguous:
            raise ValueError("broadcast needs a C-contiguous buffer")
        if self.rank == SERVER_RANK:
            self.log.record(round_number, kind, "all", buffer)
        start = time.perf_counter()
        self.comm.Bcast(buffer, root=SERVER_RANK)
        return time.perf_counter() - start

    def gather_labels(
        self, labels: np.ndarray | None, reporters: list[int], k: int, round_number: int
    ) -> tuple[np.ndarray | None, float]:
        """The ``reporters``' K int64 labels at the server, one row per reporter in the order
        of ``reporters``: ``(rows, seconds)`` on the server, ``(None, seconds)`` elsewhere.

        A reporter passes its ``labels`` (K int64); the server's own row, when it reports,
        never crosses MPI. Ranks that neither report nor serve do nothing.
        """
        start = time.perf_counter()
        if self.rank != SERVER_RANK:
            if self.rank in reporters:
                send = np.ascontiguousarray(labels, dtype=np.int64)
                if send.shape != (k,):
                    raise ValueError(f"a client sends exactly {k} labels, got shape {send.shape}")
                self.log.record(round_number, "labels", SERVER_RANK, send)
                self.comm.Send(send, dest=SERVER_RANK, tag=LABELS_TAG)
            return None, time.perf_counter() - start
        rows = np.empty((len(reporters), k), dtype=np.int64)
        requests = []
        for row, reporter in enumerate(reporters):
            if reporter == SERVER_RANK:
                rows[row] = np.asarray(labels, dtype=np.int64)
            else:
                requests.append(self.comm.Irecv(rows[row], source=reporter, tag=LABELS_TAG))
        if requests:
            requests[0].Waitall(requests)
        return rows, time.perf_counter() - start
