"""MPICH's start on ranks whose process IDs differ in length
(:mod:`proxyfl.launch.address_exchange`): the failure CI met, made certain in a PID
namespace whose counter is set just below a power of ten, and the job's relaunch."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from proxyfl.config import TrainConfig
from proxyfl.launch.address_exchange import (
    EXCHANGE_FRAME,
    AddressExchangeWatch,
    relaunched_on_unequal_addresses,
)
from proxyfl.launch.job import JOB_LOG
from proxyfl.results import RUN_FILE

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("launch_at_pid.py")
# the job's processes after the counter's setting: the tree bound supervisor, MPICH's fork
# launcher, then its ranks (launch_at_pid.py); 4 ranks from 9998: 9998, 9999, 10000, 10001,
# across 10^4 even were one process more or fewer forked before them
COUNTER = 9995
# and for a second launch that fails so too: 998, 999, 1000, 1001
COUNTER_AGAIN = 995
# what CI's launch printed (2026-11-30, tests/proxyfl/test_flare.py's reference run)
CI_LINES = [
    "Abort(208291214) on node 0: Fatal error in internal_Init_thread: Message truncated, "
    "error stack:",
    "internal_Init_thread(71)...............: MPI_Init_thread(argc=(nil), argv=(nil), "
    "required=3, provided=0x7fffa2b404a0) failed",
    "MPII_Init_thread(333)..................: ",
    "MPIR_init_comm_world(37)...............: ",
    "MPID_Comm_commit_pre_hook(163).........: ",
    "MPIDI_OFI_mpi_comm_commit_pre_hook(123): ",
    "MPIDI_OFI_comm_addr_exchange(88).......: ",
    "MPIR_Allgather_impl(2268)..............: ",
    "MPIC_Wait(99)..........................: ",
    "MPIDIG_recv_type_init(74)..............: Message from rank 1 and tag 7 truncated; "
    "22 bytes received but buffer size is 23",
    "[0]0:Return code = 142",
    "[0]1:Return code = 0, signaled with Quit",
]


def _watched(lines: list[str]) -> bool:
    watch = AddressExchangeWatch()
    for line in lines:
        watch.add(line)
    return watch.failed


def test_the_watch_knows_the_exchange_s_truncation_and_nothing_else() -> None:
    """CI's lines: the failure. MPI_Init failing otherwise (UCX's exchange, another frame's
    truncation), or a rank's own line that says "truncated": not it."""
    assert _watched(CI_LINES)
    ucx = [line.replace("MPIDI_OFI_comm_addr_exchange", "MPIDI_UCX_comm_addr_exchange")
           for line in CI_LINES]  # fmt: skip
    assert not _watched(ucx)
    assert not _watched([line for line in CI_LINES if "truncated;" not in line])
    assert not _watched(["[rank 0] a record was truncated", "[rank 1] round 1/2"])


def test_a_launch_of_its_own_is_launched_again_on_that_failure_alone() -> None:
    """``relaunched_on_unequal_addresses`` (a benchmark's or a test's own MPI launch): a
    launch that printed CI's lines and failed is launched once more, its second outcome
    returned; any other failure, or a success, is returned as it came, launched once."""

    def launches(*outcomes: tuple[str, int]) -> tuple[list[int], Any]:
        calls: list[int] = []

        def launch() -> subprocess.CompletedProcess[str]:
            said, code = outcomes[len(calls)]
            calls.append(code)
            return subprocess.run([sys.executable, "-c", f"import sys; sys.stderr.write("
                                   f"{said!r}); sys.exit({code})"],
                                  capture_output=True, text=True)  # fmt: skip

        return calls, launch

    ci = "\n".join(CI_LINES)
    calls, launch = launches((ci, 142), ("", 0))
    assert relaunched_on_unequal_addresses(launch).returncode == 0 and calls == [142, 0]
    calls, launch = launches(("Abort(1) on node 0: a rank's own failure", 1), ("", 0))
    assert relaunched_on_unequal_addresses(launch).returncode == 1 and calls == [1]
    calls, launch = launches((ci, 142), (ci, 142), ("", 0))
    assert relaunched_on_unequal_addresses(launch).returncode == 142 and calls == [142, 142]


def _in_pid_namespace() -> list[str]:
    """The command prefix that runs a program as PID 1 of a new PID namespace, with /proc
    and /dev/shm of its own (its shared-memory clean-up sees only its own processes: it
    must not see, and remove, the segments of jobs running beside it), all of whose
    processes end when ``unshare`` does (a test's timeout kills ``unshare`` only: without
    ``--kill-child`` its namespace ran on, a hung job's ranks spinning); skips where the
    machine has no ``unshare`` or refuses namespaces."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no `unshare` (apt-get install util-linux) to make a PID namespace")
    as_root = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    command = [unshare, *as_root, "--pid", "--kill-child", "--mount-proc", "sh", "-c",
               'mount -t tmpfs -o size=512m tmpfs /dev/shm && exec "$@"', "sh"]  # fmt: skip
    probe = subprocess.run([*command, "true"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a PID namespace here: {probe.stderr.strip()}")
    return command


def _job_at_pid(
    stores: Path, tmp_path: Path, again: int | None = None
) -> tuple[dict[str, Any], Path, list[str]]:
    """A 4-rank job run by ``launch_at_pid.py`` in a PID namespace whose counter is set to
    :data:`COUNTER` (and to ``again`` before a relaunch): what the driver said, the run's
    folder, and the job log's launches."""
    prefix = _in_pid_namespace()
    run_dir = tmp_path / "ProxyFL" / "seed_0"
    config = TrainConfig(
        algorithm="ProxyFL", seed=0, data=stores, run_dir=run_dir, centers=[0, 1, 2, 3],
        rounds=1, batch_size=8, proxy_model="cnn1", private_model="mlp", device="cpu",
        sigma=1.0, clip=1.0, lr=1e-2,
    )  # fmt: skip
    config_file = tmp_path / "config.json"
    config_file.write_text(config.model_dump_json())
    env = {
        **os.environ,
        "PLUMBING_COLD_RANKS": "1",
        "PYTHONWARNINGS": "ignore",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    driver = [sys.executable, str(DRIVER), str(config_file), str(COUNTER)]
    if again is not None:
        driver.append(str(again))
    done = subprocess.run([*prefix, *driver], capture_output=True, text=True, env=env,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    log = (run_dir / JOB_LOG).read_text()
    return said, run_dir, re.split(r"^=== .* ===$", log, flags=re.MULTILINE)[1:]


def test_ranks_forked_across_a_power_of_ten_start_on_the_second_launch(
    stores: Path, tmp_path: Path
) -> None:
    """Ranks numbered 9998 to 10001 by the kernel: MPI_Init fails in the address exchange
    before any rank has run a line, as on CI; ``run_job`` says why and launches the job
    again, once, and it finishes (its ranks then all past 10^4)."""
    said, run_dir, attempts = _job_at_pid(stores, tmp_path)
    assert len(attempts) == 2, attempts
    first, second = attempts
    assert EXCHANGE_FRAME in first and "truncated" in first, first  # the launch straddled 10^4
    assert "[rank " not in first  # no rank ran a line of the program
    assert said["outcome"] == "finished", said
    assert [w for w in said["warnings"] if "address exchange" in w and "again" in w], said
    assert "[rank 3]" in second
    assert json.loads((run_dir / RUN_FILE).read_text())["status"] == "finished"


def test_a_job_whose_relaunch_fails_so_too_fails_naming_the_cause(
    stores: Path, tmp_path: Path
) -> None:
    """The first launch's ranks straddle 10^4, the second's 10^3 (the counter set again as
    ``run_job`` warns): no third launch; the job fails with the exchange's reason, not an
    unexplained exit code."""
    said, run_dir, attempts = _job_at_pid(stores, tmp_path, COUNTER_AGAIN)
    assert len(attempts) == 2, attempts
    for attempt in attempts:
        assert EXCHANGE_FRAME in attempt and "truncated" in attempt, attempt
        assert "[rank " not in attempt, attempt
    assert "MPI_Init failed in MPICH's address exchange" in said["outcome"], said
    assert "different numbers of digits" in said["outcome"], said
    assert len([w for w in said["warnings"] if "launching it again" in w]) == 1, said
    assert not (run_dir / RUN_FILE).exists() or json.loads(
        (run_dir / RUN_FILE).read_text())["status"] != "finished"  # fmt: skip
