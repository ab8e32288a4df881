"""Fixtures for proxyfl tests: tiny patch stores with a learnable signal, and MPI launching."""

from __future__ import annotations

import atexit
import contextlib
import functools
import io
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pathspec
import pytest

from plumbing.kernels import pinned_environment
from plumbing.output import passing_output
from plumbing.warm import WarmRanks, kept_warm_server
from proxyfl.launch.address_exchange import relaunched_on_unequal_addresses
from proxyfl.launch.job import RANK_IMPORTS
from proxyfl.launch.kits import Kits, Project, provision
from proxyfl.launch.placement import Placement
from wsi.store.schema import PatchBatch, StoreAttrs, store_path
from wsi.store.writer import write_patch_store

REPO = Path(__file__).resolve().parents[2]
PLACEMENT = Placement()  # the training jobs' launcher: this machine, shared memory
PATCH = 16
N_TRAIN = 40
N_TEST = 10


def make_split(
    rng: np.random.Generator, n: int, center: int, split: str, size: int, n_classes: int = 2
) -> PatchBatch:
    """Noisy patches whose class sets the mean of the red channel (a learnable signal)."""
    labels = np.arange(n) % n_classes
    rng.shuffle(labels)
    images = rng.integers(0, 120, size=(n, size, size, 3)).astype(np.int64)
    images[..., 0] += (labels * 110 // max(n_classes - 1, 1))[:, None, None]
    images[..., 2] += 20 * center
    patients = [f"patient_{center:02d}{split[:2]}{i % 3}" for i in range(n)]
    slides = [f"{p}_node_{i % 2}" for i, p in enumerate(patients)]
    coords = np.stack([np.arange(n) * size, np.zeros(n, dtype=np.int64)], axis=1)
    return PatchBatch(
        images=np.clip(images, 0, 255).astype(np.uint8),
        labels=labels,
        patients=patients,
        slides=slides,
        coords=coords,
    )


def write_stores(
    directory: Path,
    centers: Sequence[int] = (0, 1, 2, 3),
    n_train: int | Sequence[int] = N_TRAIN,
    n_test: int = N_TEST,
    size: int = PATCH,
    n_classes: int = 2,
    seed: int = 0,
) -> Path:
    """``center_{c}.h5`` stores in ``directory`` for each centre."""
    directory.mkdir(parents=True, exist_ok=True)
    sizes = [n_train] * len(centers) if isinstance(n_train, int) else list(n_train)
    for center, n in zip(centers, sizes, strict=True):
        rng = np.random.default_rng(seed * 100 + center)
        attrs = StoreAttrs(
            center=center, patch_size=size, level=0, mpp=0.25, n_classes=n_classes,
            params_hash="test",
        )  # fmt: skip
        write_patch_store(
            store_path(directory, center),
            attrs,
            {
                "train": make_split(rng, n, center, "train", size, n_classes),
                "test": make_split(rng, n_test, center, "test", size, n_classes),
            },
        )
    return directory


@pytest.fixture(scope="session")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four 16×16 RGB stores, 2 classes, 40 train / 10 test patches each."""
    return write_stores(tmp_path_factory.mktemp("stores"))


@pytest.fixture(scope="session")
def two_projects(tmp_path_factory: pytest.TempPathFactory) -> tuple[Kits, Kits]:
    """The kits of two FLARE projects (each its own root certificate) of the same names: a
    server ``localhost`` and the sites ``centre-0`` to ``centre-2``."""
    folder = tmp_path_factory.mktemp("kits")
    sites = ("centre-0", "centre-1", "centre-2")
    ours, theirs = (provision(Project(name, "localhost", 8002, sites), folder / name)
                    for name in ("ours", "theirs"))  # fmt: skip
    return ours, theirs


def mpi_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(PLACEMENT.environment())
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    env["PYTHONWARNINGS"] = "ignore"
    return env


_warm_servers = contextlib.ExitStack()
atexit.register(_warm_servers.close)


@functools.cache
def warm_ranks() -> WarmRanks | None:
    """One warm server (:mod:`plumbing.warm`) for every :func:`run_mpi` job of this test
    process, started at its first: the jobs' ranks are forked from an interpreter that
    imported torch, Opacus and the trainer once, as :func:`~proxyfl.launch.job.run_job`'s
    are, instead of each rank importing them (~3 s of CPU a rank). None where ranks start
    cold (``PLUMBING_COLD_RANKS=1``, not Linux)."""
    return _warm_servers.enter_context(kept_warm_server(mpi_env(), RANK_IMPORTS))


def run_mpi(
    n: int,
    module_args: Sequence[str],
    timeout: float = 240,
    script: Path | None = None,
    kernels: str = "native",
) -> subprocess.CompletedProcess[str]:
    """``mpiexec -n N python -m mpi4py -m proxyfl.run ARGS`` (or a script), with a timeout;
    the ranks forked from this test process's warm server (:func:`warm_ranks`), or, with
    ``kernels`` other than native, started cold with that CPU kernels' pin (as a stage of
    ``dvc.yaml`` runs them: :mod:`plumbing.kernels`)."""
    target = [str(script)] if script is not None else ["-m", "proxyfl.run"]
    program = [sys.executable, "-m", "mpi4py", *target, *map(str, module_args)]
    warm = warm_ranks() if kernels == "native" else None
    if warm is not None:
        program = warm.program(program)
    command = [*PLACEMENT.command_prefix(n), *program]
    # launched again where MPICH failed to start ranks whose PIDs differ in length, as
    # run_job does (proxyfl.launch.address_exchange)
    return relaunched_on_unequal_addresses(lambda: _run_mpi_once(command, timeout, kernels, warm))


def _run_mpi_once(
    command: list[str], timeout: float, kernels: str, warm: WarmRanks | None
) -> subprocess.CompletedProcess[str]:
    # appended to by the launcher and by every rank (proxyfl.run writes around the fork
    # launcher's relay: plumbing.output), so each write lands at the end
    with tempfile.TemporaryFile("a+b") as out, tempfile.TemporaryFile("a+b") as err:
        env = {
            **pinned_environment(kernels, mpi_env()),
            **passing_output(out.fileno(), err.fileno()),
        }
        if warm is not None:
            env.update(warm.environment())
        status = subprocess.run(
            command, cwd=REPO, env=env, stdout=out, stderr=err, timeout=timeout,
            pass_fds=(out.fileno(), err.fileno()),
        )  # fmt: skip
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(
            command, status.returncode,
            out.read().decode("utf-8", "replace"), err.read().decode("utf-8", "replace"),
        )  # fmt: skip


def option_flags(options: dict[str, Any]) -> list[str]:
    """``{"batch_size": 8, "resume": True, "centers": [0, 1]}`` ->
    ``--batch-size 8 --resume --centers 0 1``; ``None`` and ``False`` leave the default."""
    args: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif isinstance(value, list | tuple):
            args += [flag, *map(str, value)]
        elif value is not None and value is not False:
            args += [flag, str(value)]
    return args


def train_args(data: Path, out: Path, algorithm: str, **options: Any) -> list[str]:
    """CLI arguments for a small, fast CPU run (cnn1 proxy, mlp private, 2 rounds)."""
    settings: dict[str, Any] = {
        "rounds": 2, "batch_size": 8, "proxy_model": "cnn1", "private_model": "mlp",
        "device": "cpu", "seed": 0, "sigma": 1.0, "clip": 1.0, "lr": 1e-2,
        "keep_final_checkpoints": True,  # the tests inspect the models a run ended with
    }  # fmt: skip
    settings.update(options)
    return ["--algorithm", algorithm, "--data", str(data), "--run-dir", str(out),
            *option_flags(settings)]  # fmt: skip


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def dvc_hashed_files(run_dir: Path) -> dict[str, bytes]:
    """The files of ``run_dir`` that DVC hashes: all but what the repository's .dvcignore
    leaves out (gitignore patterns, as DVC reads them)."""
    ignore = pathspec.GitIgnoreSpec.from_lines((REPO / ".dvcignore").read_text().splitlines())
    return {
        str(path.relative_to(run_dir)): path.read_bytes()
        for path in sorted(run_dir.rglob("*"))
        if path.is_file() and not ignore.match_file(str(path.relative_to(run_dir)))
    }


def same_run(
    first: dict[str, bytes], second: dict[str, bytes], first_dir: Path, second_dir: Path
) -> None:
    """Two runs' files (:func:`dvc_hashed_files`) the same bytes, but for the times a
    checkpoint holds (its state compared without them) and the run directory config.json
    and run.json name (``first_dir``, ``second_dir``)."""
    import torch

    assert sorted(first) == sorted(second)
    for name in first:
        if name.startswith(("run.json", "config.json", "checkpoints/")):
            continue
        assert first[name] == second[name], name
    for name in ("run.json", "config.json"):
        if name not in first:  # config.json: a job a flow launched
            continue
        ours = json.loads(second[name].decode().replace(str(second_dir), str(first_dir)))
        assert ours == json.loads(first[name]), name
    checkpoints = [
        name for name in first if name.startswith("checkpoints/") and name.endswith(".pt")
    ]
    assert checkpoints
    for name in checkpoints:
        states = [torch.load(io.BytesIO(run[name]), weights_only=False) for run in (first, second)]
        for state in states:
            state.pop("timings")
        assert_same_state(states[0], states[1], name)


def assert_same_state(ours: Any, theirs: Any, where: str) -> None:
    """The same values, tensors bit for bit (dtype, shape, bytes)."""
    import torch

    assert type(ours) is type(theirs), where
    if isinstance(ours, dict):
        assert list(ours) == list(theirs), where
        for key in ours:
            assert_same_state(ours[key], theirs[key], f"{where}/{key}")
    elif isinstance(ours, list | tuple):
        assert len(ours) == len(theirs), where
        for index, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_same_state(a, b, f"{where}[{index}]")
    elif isinstance(ours, np.ndarray):
        assert ours.dtype == theirs.dtype and ours.tobytes() == theirs.tobytes(), where
    elif isinstance(ours, torch.Tensor):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, where
        assert ours.cpu().numpy().tobytes() == theirs.cpu().numpy().tobytes(), where
    else:
        assert ours == theirs, where


def explain(result: subprocess.CompletedProcess[str]) -> str:
    return (
        f"exit {result.returncode}\nSTDOUT:\n{result.stdout[-3000:]}\n"
        f"STDERR:\n{result.stderr[-6000:]}"
    )


def one_client(tmp_path: Path, **options: Any) -> Any:
    """One ProxyFL client in-process (cnn1 proxy, mlp private; one torch thread, as a test
    process had before) on a 30-patch store."""
    from mpi4py import MPI

    from proxyfl.algorithms.strategies import strategy_for
    from proxyfl.comm.graphs import parse_schedule_spec
    from proxyfl.config import TrainConfig
    from proxyfl.engine.data import PatchDataset, open_split
    from proxyfl.engine.runtime import make_runtime
    from proxyfl.trainer import ClientData, ClientTrainer

    stores = tmp_path / "stores"
    if not stores.exists():
        write_stores(stores, centers=(0,), n_train=30, n_test=4)
    settings: dict[str, Any] = {"batch_size": 1, "proxy_model": "cnn1",
                                "private_model": ["mlp"], "torch_threads": 1}  # fmt: skip
    settings.update(options)
    config = TrainConfig(algorithm="ProxyFL", data=stores, run_dir=tmp_path / "run",
                         device="cpu", **settings)  # fmt: skip
    data = ClientData(
        client=0, center=0, train=PatchDataset([open_split(stores, 0, "train")]),
        test_splits=[open_split(stores, 0, "test")], n_classes=2, patch_size=PATCH,
    )  # fmt: skip
    return ClientTrainer(
        config=config, runtime=make_runtime(MPI.COMM_WORLD, "cpu", config.torch_threads),
        strategy=strategy_for("ProxyFL"), data=data,
        schedule=parse_schedule_spec("exponential"), run_dir=tmp_path / "run",
    )  # fmt: skip


class Helpers:
    """The helpers above, for tests (``--import-mode=importlib`` cannot import conftest)."""

    run_mpi = staticmethod(run_mpi)
    train_args = staticmethod(train_args)
    read_jsonl = staticmethod(read_jsonl)
    explain = staticmethod(explain)
    write_stores = staticmethod(write_stores)
    dvc_hashed_files = staticmethod(dvc_hashed_files)
    same_run = staticmethod(same_run)
    one_client = staticmethod(one_client)
    repo = REPO


@pytest.fixture(scope="session")
def helpers() -> type[Helpers]:
    return Helpers
