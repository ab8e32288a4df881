"""A Slurm cluster of this machine for the tests of this folder (:mod:`tests.slurm.cluster`),
started once per test process, where Debian's ``slurm-wlm`` and ``munge`` are installed;
elsewhere every test here skips and says how to install them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pipeline.conftest import BIN
from tests.slurm.cluster import INSTALL_HINT, SlurmCluster, missing_programs, start


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    missing = missing_programs()
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)}: {INSTALL_HINT}")
    cluster = start(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[str]:
    """One Prefect server for every flow the jobs of these tests run (each would otherwise
    start its own)."""
    from flows.server import prefect_server

    with prefect_server() as api_url:
        yield api_url


@pytest.fixture()
def slurm_env(slurm: SlurmCluster, prefect_api: str, tmp_path: Path) -> dict[str, str]:
    """A shell's environment after `source .venv/bin/activate`, with this cluster's
    SLURM_CONF and the Prefect server: what sbatch passes on to a job (--export=ALL)."""
    env = dict(os.environ)
    env.update(slurm.env)
    env.update({"PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "DO_NOT_TRACK": "1",
                "PREFECT_API_URL": prefect_api, "PREFECT_HOME": str(tmp_path / "prefect-home"),
                "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"})  # fmt: skip
    for name in [name for name in env if name.startswith(("SLURM_", "SRUN_", "SBATCH_"))]:
        if name != "SLURM_CONF":  # a test run inside an allocation: not these jobs'
            env.pop(name)
    return env
