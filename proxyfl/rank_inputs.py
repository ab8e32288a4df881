"""A rank's inputs, checked before any training and then opened: the job's shape against
the configuration (:func:`check_world`), the client's store and the merged test splits
(:func:`check_stores`), PrivateKT's public pool (:func:`check_public_pool`), a run resumed
with the configuration it started with (:func:`check_resumable`); then the client's data
(:func:`open_client_data`). Each check raises :class:`~proxyfl.engine.validation.SetupError`
with the message the rank reports; :mod:`proxyfl.run` runs them in turn and agrees on
them across ranks. Torch and Opacus load only once the input has been checked.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from proxyfl.config import TrainConfig, fingerprint_changes
from proxyfl.engine.access import AccessLog
from proxyfl.engine.validation import SetupError
from proxyfl.names import JOINT_CENTER
from proxyfl.results import RUN_FILE
from proxyfl.rules import (
    SHUFFLED_BATCHES,
    batch_size_problem,
    held_out_count,
    public_pool_problems,
    share_pool_name,
)
from wsi.store.reader import read_store_info
from wsi.store.schema import StoreError, rebuild_hint, store_path

if TYPE_CHECKING:
    from proxyfl.algorithms.privatekt.public_pool import PublicPool
    from proxyfl.trainer import ClientData

# the entry point's logger: what these checks say is the rank's, as before they moved here
logger = logging.getLogger("proxyfl.run")
_UNLOGGED = AccessLog()  # checks before training open nothing that the rank records


def check_world(config: TrainConfig, size: int) -> None:
    """The job's shape against the configuration."""
    centers = config.client_centers(size)
    if config.algorithm == "Joint":
        if config.centers is None:
            raise SetupError("Joint pools the training splits of --centers: list them")
        if size != 1:
            raise SetupError(
                f"Joint trains one model on pooled data as one rank; launch it with "
                f"mpiexec -n 1 (got {size} ranks)"
            )
        if len(config.private_model) not in (1, len(centers)):
            raise SetupError("--private-model must list one name or one per centre")
        return
    if size > len(centers):
        raise SetupError(
            f"{size} ranks but only {len(centers)} centre(s) listed ({centers}); "
            f"launch at most one rank per centre"
        )
    if size < len(centers):  # proxyfl.run hosts several clients a rank instead
        raise SetupError(f"{len(centers)} clients on {size} ranks: a world of clients needed")
    if len(config.private_model) not in (1, size):
        raise SetupError(
            f"--private-model lists {len(config.private_model)} models for {size} clients"
        )
    if (config.algorithm == "PrivateKT" and config.public_pool == "center"
            and config.public_center in centers):  # fmt: skip
        raise SetupError(
            f"--public-center {config.public_center} is also a client's centre ({centers}); "
            f"PrivateKT's public pool must be a centre no client trains on"
        )


@dataclass(frozen=True)
class StorePlan:
    """What a rank will read, checked against the stores' metadata."""

    client: int
    center: int
    train_centers: list[int]
    test_centers: list[int]
    n_classes: int
    patch_size: int
    public_pool: str | None = None  # PrivateKT's: "share" or "center"
    clients: tuple[int, ...] = ()  # every client's centre (the share pool's centres)


def open_public_pool(
    config: TrainConfig, clients: Sequence[int], log: AccessLog | None = None
) -> PublicPool:
    """PrivateKT's public pool of ``config.public_pool``: a share of the ``clients``'
    training splits, or the public centre's store."""
    from proxyfl.algorithms.privatekt.public_pool import PublicPool

    data_dir, _ = config.require_paths()
    logged = {} if log is None else {"log": log}
    if config.public_pool == "share":
        return PublicPool.held_out_shares(
            data_dir, clients, config.public_share, config.seed, **logged
        )
    return PublicPool.of_center(data_dir, config.public_center, **logged)


def check_public_pool(
    config: TrainConfig, patch_size: int, n_classes: int, clients: Sequence[int]
) -> int:
    """PrivateKT's public pool: its stores present, like the clients' stores, and large
    enough for K and M. Returns its number of items. Its labels are not read
    (:mod:`~proxyfl.algorithms.privatekt.public_pool`)."""
    if config.public_pool == "share":  # the clients' own stores, already checked
        where = share_pool_name(config.public_share, clients)
        try:
            pool = open_public_pool(config, clients, _UNLOGGED)
        except StoreError as error:
            raise SetupError(f"the public share: {error.path}: {error.reason}") from None
    else:
        data_dir, _ = config.require_paths()
        center = config.public_center
        where = f"centre {center}"
        path = store_path(data_dir, center)
        if not path.is_file():
            raise SetupError(
                f"PrivateKT's public pool: no store {path} for --public-center {center}"
            )
        try:
            pool = open_public_pool(config, clients, _UNLOGGED)
        except StoreError as error:
            raise SetupError(f"public centre {center}: {error.path}: {error.reason}") from None
        if (pool.patch_size, pool.n_classes) != (patch_size, n_classes):
            raise SetupError(
                f"public centre {center}: patch size {pool.patch_size} and {pool.n_classes} "
                f"classes, the clients' stores have {patch_size} and {n_classes}"
            )
    problems = public_pool_problems(config.kt_samples, config.self_train_samples, len(pool), where)
    if problems:
        raise SetupError("; ".join(f"--{key.replace('_', '-')} {reason}"
                                   for key, reason in problems.items()))  # fmt: skip
    return len(pool)


def check_stores(config: TrainConfig, rank: int, size: int) -> StorePlan:
    """Check the stores this rank needs (schema, agreement, sizes) without opening images."""
    data_dir, _ = config.require_paths()
    if not data_dir.is_dir():
        raise SetupError(f"data directory {data_dir} does not exist")
    centers = config.client_centers(size)
    if config.algorithm == "Joint":
        train_centers, center, client = centers, JOINT_CENTER, 0
    else:
        train_centers, center, client = [centers[rank]], centers[rank], rank
    test_centers = config.test_centers(size)
    infos = {}
    for c in test_centers:
        try:
            # another client's training split stays unread, metadata included
            splits = ("train", "test") if c in train_centers else ("test",)
            infos[c] = read_store_info(store_path(data_dir, c), splits=splits, center=c)
        except StoreError as error:
            reason = f"centre {c}: {error.path}: {error.reason}; {rebuild_hint(c)}"
            raise SetupError(reason) from None
    sizes = {c: info.attrs.patch_size for c, info in infos.items()}
    classes = {c: info.attrs.n_classes for c, info in infos.items()}
    if len(set(sizes.values())) != 1:
        raise SetupError(f"stores disagree on the patch size: {sizes}")
    if len(set(classes.values())) != 1:
        raise SetupError(f"stores disagree on the number of classes: {classes}")
    n_classes = next(iter(classes.values()))
    if n_classes < 2:
        raise SetupError(f"stores declare {n_classes} class(es); at least 2 are needed")
    n_train = sum(len(infos[c].splits["train"]) for c in train_centers)
    if config.algorithm == "PrivateKT" and config.public_pool == "share":  # held out: public
        n_train -= sum(held_out_count(len(infos[c].splits["train"]), config.public_share)
                       for c in train_centers)  # fmt: skip
    if n_train == 0:
        raise SetupError(f"no training patches in centre(s) {train_centers} (a store of its "
                         "test split only, as `camelyon-proxyfl sites test-split` writes for "
                         "the other sites, cannot train)")  # fmt: skip
    problem = batch_size_problem(config.batch_size, n_train, f"centre(s) {train_centers}")
    if problem is not None and config.algorithm not in SHUFFLED_BATCHES:
        raise SetupError(f"--batch-size {problem}")
    if sum(len(infos[c].splits["test"]) for c in test_centers) == 0:
        raise SetupError(f"the test splits of centres {test_centers} are all empty")
    patch_size = next(iter(sizes.values()))
    public_pool = None
    if config.algorithm == "PrivateKT":  # the share pool: of the centres with a rank
        check_public_pool(config, patch_size, n_classes, centers)
        public_pool = config.public_pool
    return StorePlan(
        client=client,
        center=center,
        train_centers=list(train_centers),
        test_centers=test_centers,
        n_classes=n_classes,
        patch_size=patch_size,
        public_pool=public_pool,
        clients=tuple(centers),
    )


def open_client_data(config: TrainConfig, plan: StorePlan) -> ClientData:
    """Open this rank's training split(s) (less PrivateKT's held-out public share) and
    every listed centre's test split."""
    from proxyfl.algorithms.privatekt.public_pool import held_out_rows, kept_rows
    from proxyfl.engine.data import PatchDataset, open_split
    from proxyfl.trainer import ClientData

    data_dir, _ = config.require_paths()
    readers = [open_split(data_dir, c, "train") for c in plan.train_centers]
    rows = labels = None
    if plan.public_pool == "share":
        rows = [kept_rows(len(reader), held_out_rows(len(reader), config.public_share,
                                                     config.seed, center))
                for reader, center in zip(readers, plan.train_centers, strict=True)]  # fmt: skip
    extra = None
    if config.canaries is not None:  # the audit's canary run: its canaries in, or out
        import numpy as np

        from proxyfl.canaries import CanaryPlan

        canaries = CanaryPlan.read(config.canaries)
        chosen = [canaries.training_data(center, np.asarray(reader.labels))
                  for reader, center in zip(readers, plan.train_centers, strict=True)]  # fmt: skip
        rows, labels = [c.rows for c in chosen], [c.labels for c in chosen]
        noise = [c for c in chosen if c.extra_images is not None]
        if noise:
            extra = (np.concatenate([c.extra_images for c in noise]),
                     np.concatenate([c.extra_labels for c in noise]))  # fmt: skip
    return ClientData(
        client=plan.client,
        center=plan.center,
        train=PatchDataset(readers, rows, labels, extra),
        test_splits=[open_split(data_dir, c, "test") for c in plan.test_centers],
        n_classes=plan.n_classes,
        patch_size=plan.patch_size,
        public_pool=(
            open_public_pool(config, plan.clients) if plan.public_pool is not None else None
        ),
    )


def check_resumable(config: TrainConfig, run_dir: Path) -> None:
    """A run resumed from checkpoints must have the configuration it started with."""
    run_file = run_dir / RUN_FILE
    if not run_file.is_file():
        return
    saved = json.loads(run_file.read_text()).get("fingerprint")
    current = json.loads(json.dumps(config.fingerprint()))
    changed = fingerprint_changes(saved, current) if saved is not None else {}
    if changed:
        raise SetupError(
            f"the checkpoints in {run_dir} were made with another configuration (changed: "
            f"{', '.join(changed)}); restore it, or delete {run_dir} to start over"
        )
