"""The eight algorithms as small strategy objects over one training loop.

What differs between them is only: whether a client also trains a private, non-DP model
by mutual learning with the DP one (ProxyFL, FML); how the DP model is mixed after local
training (PushSum, server average, ring pass, knowledge transfer, or not at all); what the
DP model is called when it is evaluated; whether the data are pooled (Joint). Every
algorithm of the ProxyFL paper trains exactly one model with DP-SGD — the one that is (or
could be) shared: the proxy of ProxyFL and FML, the local/central model of the baselines
(docs/algorithms.md §4, after the paper). PrivateKT trains the global model locally without DP
and protects what leaves the client instead: K randomized-response labels a round
(:mod:`proxyfl.algorithms.privatekt.strategy`).

| algorithm | private model | exchange of the DP model      | evaluated (primary first) |
|-----------|---------------|-------------------------------|---------------------------|
| ProxyFL   | yes, DML      | PushSum (``--graph``)         | private, proxy            |
| FML       | yes, DML      | server average (rank 0)       | private, proxy            |
| FedAvg    | no            | server average (rank 0)       | central                   |
| AvgPush   | no            | PushSum (``--graph``)         | local                     |
| CWT       | no            | pass to the next client (ring)| local                     |
| Regular   | no            | none                          | local                     |
| Joint     | no (one rank, pooled data) | none             | local                     |
| PrivateKT | no (no DP: LDP labels)| knowledge transfer (rank 0)   | central                   |

A round is: ``distribute`` (before local training: what the server hands out, and whether
this client trains), local training, ``exchange`` (after it). Only PrivateKT distributes
anything; the others' ``distribute`` keeps the model and lets every member train.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from proxyfl.comm.exchange import SERVER_RANK, Communicator
from proxyfl.comm.graphs import Schedule

if TYPE_CHECKING:
    import torch
    from torch import nn

ExchangeKind = Literal["none", "push_sum", "server_average", "ring", "knowledge_transfer"]


@dataclass(frozen=True)
class Distribution:
    """What a client holds before local training: a model handed out by the server (or
    ``None`` to keep its own), whether it trains this round, seconds communicating."""

    theta: np.ndarray | None = None
    trains: bool = True
    seconds: float = 0.0


class Exchange(Protocol):
    """Mixes the shared models of a round's members; every rank calls it every round."""

    def distribute(
        self, comm: Communicator, theta: np.ndarray, members: list[int], round_number: int
    ) -> Distribution:
        """Before local training (rounds from 1)."""
        ...

    def exchange(
        self, comm: Communicator, theta: np.ndarray, members: list[int], round_number: int
    ) -> tuple[np.ndarray | None, float]:
        """``(new θ or None to keep the current one, seconds communicating)``; rounds from 1."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def device_holders(self) -> list[nn.Module | torch.optim.Optimizer]:
        """The models and optimisers of its own that it keeps on the device (a server's),
        beside the client's (:mod:`proxyfl.engine.residency`)."""
        ...


class ModelExchange:
    """The methods that hand nothing out before training: every member trains."""

    def distribute(
        self, comm: Communicator, theta: np.ndarray, members: list[int], round_number: int
    ) -> Distribution:
        return Distribution()

    def device_holders(self) -> list[nn.Module | torch.optim.Optimizer]:
        return []


class NoExchange(ModelExchange):
    """Regular and Joint: nothing leaves the client."""

    def exchange(
        self, comm: Communicator, theta: np.ndarray, members: list[int], round_number: int
    ) -> tuple[np.ndarray | None, float]:
        return None, 0.0

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


@dataclass
class PushSumExchange(ModelExchange):
    """PushSum over ``schedule`` with this client's de-biasing weight ``w`` (starts at 1)."""

    schedule: Schedule
    weight: float = 1.0

    def exchange(
        self, comm: Communicator, theta: np.ndarray, members: list[int], round_number: int
    ) -> tuple[np.ndarray | None, float]:
        if comm.rank not in members or len(members) < 2:
            return None, 0.0
        matrix = self.schedule.matrix(round_number - 1, members, comm.size)
        theta_new, self.weight, seconds = comm.push_sum(
            theta, self.weight, matrix, members, round_number
        )
        return theta_new, seconds

    def state_dict(self) -> dict[str, Any]:
        return {"weight": self.weight}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.weight = float(state["weight"])


class ServerAverageExchange(ModelExchange):
    """FedAvg / FML: rank 0, also a client, averages the members' models and broadcasts."""

    def exchange(
        self, comm: Communicator, theta: np.ndarray, members: list[int], round_number: int
    ) -> tuple[np.ndarray | None, float]:
        if not members:
            return None, 0.0
        average, seconds = comm.server_average(theta, members, round_number)
        if comm.rank not in members:
            return None, seconds if comm.rank == SERVER_RANK else 0.0
        return average, seconds

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


class RingExchange(ModelExchange):
    """CWT: each member passes the model it trained to the next member of the ring."""

    def exchange(
        self, comm: Communicator, theta: np.ndarray, members: list[int], round_number: int
    ) -> tuple[np.ndarray | None, float]:
        if comm.rank not in members or len(members) < 2:
            return None, 0.0
        received, seconds = comm.ring_pass(theta, members, round_number)
        return received, seconds

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


@dataclass(frozen=True)
class Strategy:
    """What one algorithm does differently from the others."""

    name: str
    mutual_learning: bool
    exchange_kind: ExchangeKind
    shared_label: str  # the DP model's name in metrics: "proxy", "central" or "local"
    primary_label: str  # the model the paper reports
    pooled_data: bool = False
    dp_training: bool = True  # False: the shared model trains without DP (PrivateKT)
    notes: tuple[str, ...] = field(default_factory=tuple)

    def make_exchange(
        self, schedule: Schedule, knowledge_transfer: Callable[[], Exchange] | None = None
    ) -> Exchange:
        """The strategy's exchange; PrivateKT's is built by ``knowledge_transfer`` (it needs
        the model, the public pool and the privacy ledger, which the trainer holds)."""
        if self.exchange_kind == "knowledge_transfer":
            if knowledge_transfer is None:
                raise ValueError(f"{self.name} needs its knowledge-transfer exchange")
            return knowledge_transfer()
        if self.exchange_kind == "push_sum":
            return PushSumExchange(schedule)
        if self.exchange_kind == "server_average":
            return ServerAverageExchange()
        if self.exchange_kind == "ring":
            return RingExchange()
        return NoExchange()

    @property
    def evaluated_labels(self) -> tuple[str, ...]:
        """Labels of the evaluated models, primary first."""
        labels = ("private", self.shared_label) if self.mutual_learning else (self.shared_label,)
        return tuple(sorted(labels, key=lambda label: label != self.primary_label))


STRATEGIES: dict[str, Strategy] = {
    "ProxyFL": Strategy("ProxyFL", True, "push_sum", "proxy", "private"),
    "FML": Strategy("FML", True, "server_average", "proxy", "private"),
    "FedAvg": Strategy("FedAvg", False, "server_average", "central", "central"),
    "AvgPush": Strategy("AvgPush", False, "push_sum", "local", "local"),
    "CWT": Strategy("CWT", False, "ring", "local", "local"),
    "Regular": Strategy("Regular", False, "none", "local", "local"),
    "Joint": Strategy("Joint", False, "none", "local", "local", pooled_data=True),
    "PrivateKT": Strategy(
        "PrivateKT", False, "knowledge_transfer", "central", "central", dp_training=False
    ),
}


def strategy_for(algorithm: str) -> Strategy:
    """The :class:`Strategy` of ``algorithm`` (a ``KeyError`` naming the choices)."""
    try:
        return STRATEGIES[algorithm]
    except KeyError:
        raise KeyError(
            f"unknown algorithm {algorithm!r}; choose one of {', '.join(STRATEGIES)}"
        ) from None
