"""What a client's privacy has cost so far, in the notion its method guarantees.

Two notions, never mixed in one number (docs/algorithms.md §4):

- ``sample_dp``: sample-level (record-level) (ε, δ)-DP of DP-SGD with respect to one
  training patch of the client, from the RDP accountant (:mod:`proxyfl.privacy.accounting`): every
  method but PrivateKT. ε after a round is cumulative (RDP composition, not per-round sums).
- ``label_ldp``: label-level ε-LDP of PrivateKT's randomized response (:mod:`proxyfl.privacy.ldp`):
  ε per round, and ``releases · ε`` over the rounds by basic sequential composition.

A ledger answers the trainer's three questions (ε so far, ε after one more round, for a
budget check; its state for a checkpoint); the metrics say which notion it is.
"""

from __future__ import annotations

from typing import Any, Protocol

from opacus.accountants import RDPAccountant

from proxyfl.privacy.accounting import epsilon_from_history
from proxyfl.privacy.dp import accountant_after
from proxyfl.privacy.ldp import LABEL_LDP, LDPLedger
from proxyfl.results import PRIVACY_NOTIONS, SAMPLE_DP


class PrivacyLedger(Protocol):
    notion: str
    delta: float

    @property
    def epsilon_per_round(self) -> float | None: ...

    def epsilon(self) -> float: ...

    def epsilon_after_next_round(self) -> float: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class DPSGDLedger:
    """Sample-level (ε, δ) of the DP-SGD steps Opacus' RDP accountant has counted."""

    notion = SAMPLE_DP

    def __init__(
        self,
        accountant: RDPAccountant,
        *,
        sigma: float,
        sample_rate: float,
        steps_per_round: int,
        delta: float,
    ) -> None:
        self.accountant = accountant
        self.sigma = sigma
        self.sample_rate = sample_rate
        self.steps_per_round = steps_per_round
        self.delta = delta

    @property
    def epsilon_per_round(self) -> float | None:
        """None: DP-SGD's ε composes through RDP, not as a sum of per-round figures."""
        return None

    def epsilon(self) -> float:
        return epsilon_from_history(self.accountant.history, self.delta)

    def epsilon_after_next_round(self) -> float:
        planned = accountant_after(
            self.accountant,
            sigma=self.sigma,
            sample_rate=self.sample_rate,
            steps=self.steps_per_round,
        )
        return epsilon_from_history(planned.history, self.delta)

    def state_dict(self) -> dict[str, Any]:
        return self.accountant.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.accountant.load_state_dict(state)


__all__ = ["LABEL_LDP", "PRIVACY_NOTIONS", "SAMPLE_DP", "DPSGDLedger", "LDPLedger", "PrivacyLedger"]
