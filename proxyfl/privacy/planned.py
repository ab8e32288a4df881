"""The (ε, δ) each client and Joint will spend, before training (``python -m proxyfl.privacy``).

    python -m proxyfl.privacy --train-sizes 2338 2726 2937 2841 --sigma 1.4 \\
        --batch-size 32 --epochs 30 --delta 1e-5 [--json]

``--epochs`` is the number of passes over a client's data (rounds × local epochs). Joint's
ε is for the pooled size. The figures come from :func:`proxyfl.privacy.accounting.planned_epsilon`,
the same function training reads its ε through.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from plumbing.cli import add_model_flags, exit_on_bad_parameters, given, validate
from proxyfl.config import TrainOptions
from proxyfl.privacy.accounting import planned_epsilon, poisson_schedule


def privacy_report(
    train_sizes: Sequence[int], sigma: float, batch_size: int, epochs: int, delta: float
) -> dict[str, Any]:
    """``{"clients": [{"client", "n_train", "epsilon"}...], "joint": {"n_train", "epsilon"}}``."""

    def entry(n_train: int) -> dict[str, Any]:
        sample_rate, steps = poisson_schedule(n_train, batch_size)
        epsilon = planned_epsilon(n_train, batch_size, sigma, epochs, delta)
        return {
            "n_train": n_train,
            "epsilon": epsilon if math.isfinite(epsilon) else None,
            "sample_rate": sample_rate,
            "steps": steps * epochs,
        }

    clients = [{"client": index, **entry(n)} for index, n in enumerate(train_sizes)]
    return {
        "sigma": sigma,
        "delta": delta,
        "batch_size": batch_size,
        "epochs": epochs,
        "clients": clients,
        "joint": entry(sum(train_sizes)),
    }


def _format_table(report: dict[str, Any]) -> str:
    lines = [
        f"σ = {report['sigma']}, δ = {report['delta']}, B = {report['batch_size']}, "
        f"epochs = {report['epochs']}",
        f"{'client':>8} {'n_train':>8} {'steps':>7} {'epsilon':>9}",
    ]

    def fmt(value: float | None) -> str:
        return "inf" if value is None else f"{value:.3f}"

    for item in report["clients"]:
        lines.append(
            f"{item['client']:>8} {item['n_train']:>8} {item['steps']:>7} {fmt(item['epsilon']):>9}"
        )
    joint = report["joint"]
    lines.append(
        f"{'Joint':>8} {joint['n_train']:>8} {joint['steps']:>7} {fmt(joint['epsilon']):>9}"
    )
    return "\n".join(lines)


class PrivacyQuestion(BaseModel):
    """What :func:`privacy_report` is asked: the clients' sizes and the DP-SGD schedule
    (σ, B and δ are training's own options, with their defaults)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    train_sizes: list[Annotated[int, Field(ge=1)]] = Field(
        min_length=1, description="training patches of each client"
    )
    sigma: float = TrainOptions.model_fields["sigma"]
    batch_size: int = TrainOptions.model_fields["batch_size"]
    epochs: int = Field(
        TrainOptions.model_fields["rounds"].default, ge=0,
        description="passes over a client's data: rounds × local epochs",
    )  # fmt: skip
    delta: float = TrainOptions.model_fields["delta"]


@exit_on_bad_parameters
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m proxyfl.privacy",
        description="Per-client and Joint ε of DP-SGD training (record-level (ε, δ)-DP, "
        "RDP accountant).",
    )
    flags = add_model_flags(parser, PrivacyQuestion)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    values = given(args, flags)
    question = validate(PrivacyQuestion, {f.key[0]: v for f, v in values.items()},
                        "command line", values)  # fmt: skip
    report = privacy_report(question.train_sizes, question.sigma, question.batch_size,
                            question.epochs, question.delta)  # fmt: skip
    if args.json:
        print(json.dumps(report))
    else:
        print(_format_table(report))
    return 0
