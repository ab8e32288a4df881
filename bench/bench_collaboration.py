"""Does collaboration matter on these stores? Each centre alone against all pooled, no DP.

The premise of federated learning across hospitals: a model trained on one centre
generalises worse to the merged multi-centre test set than one trained on all centres.
This trains the demo's private model (``train.options.private_model``, plain Adam, no DP)
for ``--epochs`` on each centre's training split alone and on their union, with the same
seed, batch and learning rate, and prints each model's accuracy and macro-accuracy on the
merged test set and on every centre's test split, then the gap (pooled − mean local).

    python -m bench.bench_collaboration [--data DIR] [--epochs E]

Needs the stores of ``train.data`` (``make demo`` or ``dvc repro preprocess``). About a
minute on 2 CPU cores with the demo's stores.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from proxyfl.config import TrainConfig
from wsi.store.reader import PatchSplitReader
from wsi.store.schema import store_path

REPO = Path(__file__).resolve().parents[1]
IN_DEFAULT_RUN = False  # needs the demo's stores: run it after `make demo`


def _tensors(data: Path, center: int, split: str) -> tuple[Any, Any]:  # torch tensors
    import torch

    from proxyfl.engine.data import prepare_images

    reader = PatchSplitReader(store_path(data, center), split)
    images = torch.from_numpy(np.ascontiguousarray(reader.images(slice(0, len(reader)))))
    x = prepare_images(images.permute(0, 3, 1, 2), torch.device("cpu"))
    return x, torch.from_numpy(reader.labels.astype(np.int64))


def train_and_score(
    model_name: str, train_sets: Sequence, tests: Sequence, epochs: int, lr: float, batch: int
) -> tuple[float, float, list[float]]:
    """(merged accuracy, merged macro-accuracy, accuracy per test split) of one model."""
    import torch
    import torch.nn.functional as F

    from proxyfl.engine.evaluate import confusion_matrix, scores_from_confusion
    from proxyfl.engine.models import build_model

    x = torch.cat([t[0] for t in train_sets])
    y = torch.cat([t[1] for t in train_sets])
    torch.manual_seed(0)
    model = build_model(model_name, 2, x.shape[-1])
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(epochs):
        for index in torch.randperm(len(y)).split(batch):
            optimizer.zero_grad()
            F.cross_entropy(model(x[index]), y[index]).backward()
            optimizer.step()
    model.eval()
    with torch.inference_mode():
        predictions = [model(test_x).argmax(1).numpy() for test_x, _ in tests]
    per_split = [float((p == t[1].numpy()).mean()) for p, t in zip(predictions, tests, strict=True)]
    merged = scores_from_confusion(
        confusion_matrix(np.concatenate(predictions), np.concatenate([t[1] for t in tests]), 2)
    )
    return merged.accuracy, merged.macro_accuracy, per_split


def main(argv: Sequence[str] | None = None) -> int:
    import torch

    params = yaml.safe_load((REPO / "params.yaml").read_text())["train"]
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_collaboration", description=__doc__
    )
    parser.add_argument("--data", type=Path, default=REPO / params["data"])
    parser.add_argument("--epochs", type=int, default=8)
    args = parser.parse_args(argv)
    options, centers = params["options"], list(params["centers"])
    missing = [c for c in centers if not store_path(args.data, c).is_file()]
    if missing:
        print(f"error: no stores for centres {missing} in {args.data}", file=sys.stderr)
        return 2
    torch.set_num_threads(2)
    model_name = options["private_model"][0]
    lr = TrainConfig(**options).private_learning_rate  # validates the options too
    trains = {c: _tensors(args.data, c, "train") for c in centers}
    tests = [_tensors(args.data, c, "test") for c in centers]
    labels = np.concatenate([t[1].numpy() for t in tests])
    majority = float(np.bincount(labels).max() / len(labels))
    print(
        f"{model_name}, Adam lr {lr}, batch {options['batch_size']}, {args.epochs} epochs, no DP; "
        f"merged test set of {len(labels)} patches (majority-class rate {majority:.3f})"
    )
    print(f"{'trained on':<12} {'accuracy':>8} {'macro':>6}  per test centre {centers}")
    local = []
    for name, train_sets in [*((f"centre {c}", [trains[c]]) for c in centers),
                             ("all pooled", list(trains.values()))]:  # fmt: skip
        accuracy, macro, per_split = train_and_score(
            model_name, train_sets, tests, args.epochs, lr, options["batch_size"]
        )
        print(f"{name:<12} {accuracy:8.3f} {macro:6.3f}  {' '.join(f'{a:.2f}' for a in per_split)}")
        if name != "all pooled":
            local.append(accuracy)
    print(
        f"pooled − mean local accuracy: {accuracy - statistics.mean(local):+.3f} "
        f"(local {min(local):.3f}–{max(local):.3f}, pooled {accuracy:.3f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
