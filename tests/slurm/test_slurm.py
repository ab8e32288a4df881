"""Training under Slurm, on a one-node cluster of this machine (tests/slurm/cluster.py): the
script ``camelyon-proxyfl sbatch`` writes, submitted with ``sbatch``, runs the Prefect train
flow with ``--launcher srun`` inside its allocation and writes the bytes of the default
launcher; a rank killed with SIGKILL is named with its signal, and the rerun resumes to the
same bytes; an allocation or a queue that cannot hold the job is said before any work."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.pipeline.conftest import BIN
from tests.proxyfl.conftest import dvc_hashed_files, write_stores
from tests.slurm.cluster import SlurmCluster

REPO = Path(__file__).resolve().parents[2]
ROUNDS = 30  # long enough to kill a rank between two rounds
# what a job may take from the kill of a rank to its end: srun's --kill-on-bad-exit stops
# the others at once (SIGTERM; SIGKILL KillWait=5 s later), the flow records the failure
ENDS_WITHIN_S = 30.0


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_stores(tmp_path_factory.mktemp("slurm-stores"), centers=(0, 1))


@pytest.fixture()
def project(stores: Path, tmp_path: Path) -> Path:
    """A project as a user has it on a cluster's shared filesystem: params.yaml training
    ProxyFL (no retries) on two centres' stores, with relative paths, and the virtual
    environment (this repository's, whose code it imports)."""
    return _project(tmp_path / "project", stores)


def _project(root: Path, stores: Path) -> Path:
    shutil.copytree(stores, root / "data" / "patches")
    (root / ".venv").symlink_to(BIN.parent)
    params = {"train": {
        "algorithms": ["ProxyFL"], "seeds": [0], "centers": [0, 1], "retries": 0,
        "options": {"rounds": ROUNDS, "batch_size": 8, "proxy_model": "cnn1",
                    "private_model": ["mlp"], "device": "cpu", "input_size": 16},
    }}  # fmt: skip
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    return root


RUN = Path("runs") / "ProxyFL" / "seed_0"  # train.runs' default, as params.yaml has it


@pytest.fixture(scope="module")
def reference(
    stores: Path, tmp_path_factory: pytest.TempPathFactory, prefect_api: str
) -> dict[str, bytes]:
    """The same project's run with the default launcher (mpiexec on this machine): every
    file DVC hashes."""
    project = _project(tmp_path_factory.mktemp("reference") / "project", stores)
    env = {
        **os.environ,
        "PREFECT_API_URL": prefect_api,
        "PYTHONWARNINGS": "ignore",
        "OMP_NUM_THREADS": "1",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    trained = subprocess.run([sys.executable, "-m", "flows.train"], cwd=project, env=env,
                             capture_output=True, text=True, timeout=600)  # fmt: skip
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    return dvc_hashed_files(project / RUN)


def _write_script(project: Path, env: dict[str, str], *options: str) -> Path:
    """The script ``camelyon-proxyfl sbatch`` writes in ``project``, as the docs say to
    (its default command: the train flow, with --launcher srun)."""
    path = project / "train.sh"
    written = subprocess.run(
        ["camelyon-proxyfl", "sbatch", "--time", "00:15:00", *options, "-o", str(path)],
        cwd=project, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert written.returncode == 0, written.stderr
    return path


def _export_after_options(script: Path, line: str) -> None:
    """``line`` in ``script`` after its ``#SBATCH`` options, as a site's template has it."""
    lines = script.read_text().splitlines()
    last_option = max(i for i, text in enumerate(lines) if text.startswith("#SBATCH"))
    lines.insert(last_option + 1, line)
    script.write_text("\n".join(lines) + "\n")


def _submit(project: Path, env: dict[str, str], script: Path, *options: str, wait: bool = True
            ) -> tuple[str, int, str]:  # fmt: skip
    """``sbatch OPTIONS SCRIPT`` from ``project``: the job's id, then, with ``wait``, the
    job's exit status and its output (``slurm-%j.out``) once it has ended; else sbatch's
    exit status. The job's, as slurmctld records it (:func:`_exit_status`, polled every
    0.5 s), not ``sbatch --wait``'s: a job record purged before sbatch's next poll (2 s
    apart) reads to it as a job that exited 0, and under load (make test beside a hog of
    half a core, Slurm 22.05.8) a refused job, logged ``WEXITSTATUS 2``, once did."""
    submitted = subprocess.run(
        ["sbatch", "--parsable", *options, str(script)],
        cwd=project, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    job = submitted.stdout.strip().split(";")[0].splitlines()[0] if submitted.stdout else ""
    assert job.isdigit(), submitted.stdout + submitted.stderr
    if not wait:
        return job, submitted.returncode, ""
    return job, _exit_status(job, env), (project / f"slurm-{job}.out").read_text()


def _exit_status(job: str, env: dict[str, str], timeout_s: float = 900) -> int:
    """Job ``job``'s exit status once it has ended (the cluster keeps every finished job's
    record: ``MinJobAge=3600``), as sbatch maps it: the script's, else 1 for a signal."""
    deadline = time.monotonic() + timeout_s
    while True:
        shown = subprocess.run(["scontrol", "show", "job", "--oneliner", job], env=env,
                               capture_output=True, text=True, timeout=60)  # fmt: skip
        fields = _job_fields(shown.stdout)
        state = fields.get("JobState")
        code = re.fullmatch(r"(\d+):(\d+)", fields.get("ExitCode", ""))
        if state and code and state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING",
                                            "SUSPENDED"):  # fmt: skip
            status, signal_number = int(code.group(1)), int(code.group(2))
            return 1 if signal_number else status
        assert time.monotonic() < deadline, f"job {job} not ended: {shown.stdout}{shown.stderr}"
        time.sleep(0.5)


def _job_fields(shown: str) -> dict[str, str]:
    """The ``Key=value`` fields of ``scontrol show job --oneliner``'s line (none once
    slurmctld has forgotten the job)."""
    return dict(re.findall(r"(\w+)=(\S*)", shown))


def _job_state(slurm: SlurmCluster, job: str) -> str:
    shown = slurm.client("scontrol", "show", "job", "--oneliner", job)
    return _job_fields(shown.stdout).get("JobState", "GONE")


def _rank_pid(job: str, rank: int, timeout_s: float = 300) -> int:
    """The process of ``rank`` of the training step of Slurm job ``job``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if (f"SLURM_JOB_ID={job}".encode() in environ and b"proxyfl.run" in command
                    and f"SLURM_PROCID={rank}".encode() in environ):  # fmt: skip
                return int(entry.name)
        time.sleep(0.2)
    raise AssertionError(f"no rank {rank} of job {job} within {timeout_s:.0f} s")


def _resumable(run: Path) -> bool:
    """Both ranks have checkpointed a round, and rank 0 has recorded two."""
    metrics = run / "metrics.jsonl"
    rounds = len(metrics.read_text().splitlines()) if metrics.is_file() else 0
    checkpoints = [run / "checkpoints" / f"rank_{rank}" for rank in (0, 1)]
    return rounds >= 2 and all(any(folder.glob("round_*.pt")) for folder in checkpoints)


def test_the_written_script_runs_the_train_flow_under_srun_to_the_default_launchers_bytes(
    project: Path, slurm_env: dict[str, str], reference: dict[str, bytes]
) -> None:
    """With --cpus-per-task (the killed rank's test runs the script without it)."""
    cpus_per_task = 1
    script = _write_script(project, slurm_env, "--cpus-per-task", str(cpus_per_task))
    assert f"#SBATCH --cpus-per-task={cpus_per_task}" in script.read_text()
    _, status, output = _submit(project, slurm_env, script)
    assert status == 0, output[-5000:]
    # the allocation's --cpus-per-task passed on to srun (Slurm 22.05-23.02's does not take it)
    srun = f"launch command: srun --ntasks=2 --cpus-per-task={cpus_per_task} --mpi=pmi2"
    assert srun in output, output[-5000:]
    assert "Finished in state Completed" in output, output[-5000:]
    run = project / RUN
    written = dvc_hashed_files(run)
    assert written.keys() == reference.keys()
    assert [path for path in written if written[path] != reference[path]] == []
    # each rank was a task of the job's step, not a process of the launcher
    machine = yaml.safe_load((run / "machine.json").read_text())
    assert machine["timings"]["launcher"]["warm_server"] is None


def test_a_killed_rank_is_named_with_its_signal_and_the_rerun_resumes_to_the_same_bytes(
    project: Path, slurm: SlurmCluster, slurm_env: dict[str, str], reference: dict[str, bytes]
) -> None:
    script = _write_script(project, slurm_env)  # Slurm's one CPU a task
    assert "--cpus-per-task" not in script.read_text()
    # many sites' templates pass the allocation's on: without --cpus-per-task it is empty,
    # and the job runs as if it were unset
    _export_after_options(script, "export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK")
    run = project / RUN
    job, status, _ = _submit(project, slurm_env, script, wait=False)
    assert status == 0
    pid = _rank_pid(job, 1)
    deadline = time.monotonic() + 300
    while not _resumable(run):  # a round every rank has checkpointed, then the kill
        assert time.monotonic() < deadline and _job_state(slurm, job) in ("PENDING", "RUNNING")
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    while _job_state(slurm, job) in ("PENDING", "RUNNING", "COMPLETING"):
        assert time.monotonic() - killed < ENDS_WITHIN_S, f"job {job} still runs"
        time.sleep(0.2)
    output = (project / f"slurm-{job}.out").read_text()
    assert _job_state(slurm, job) == "FAILED", output[-5000:]  # its record is kept
    assert ("failed with exit code 137; rank 1 (centre 1) failed at training: ended by signal "
            "SIGKILL") in output, output[-5000:]  # fmt: skip
    rounds_done = len((run / "metrics.jsonl").read_text().splitlines())
    assert 0 < rounds_done < ROUNDS

    _, status, output = _submit(project, slurm_env, script)
    assert status == 0, output[-5000:]
    assert "launch command: srun --ntasks=2 --mpi=pmi2" in output, output[-5000:]
    assert re.search(r"resuming after round [1-9]", output), output[-5000:]
    written = dvc_hashed_files(run)
    assert written.keys() == reference.keys()
    assert [path for path in written if written[path] != reference[path]] == []


def test_an_allocation_too_small_for_the_job_is_refused_before_any_work(
    project: Path, slurm_env: dict[str, str]
) -> None:
    script = _write_script(project, slurm_env)
    started = time.monotonic()
    _, status, output = _submit(project, slurm_env, script, "--ntasks=1")  # not the 2 it asks
    assert status != 0
    assert "room for 1 task(s) of 1 CPU(s), and a training job needs 2" in output, output
    assert "Ask for --ntasks=2" in output and "Traceback" not in output, output
    assert not (project / "runs").exists()
    assert time.monotonic() - started < 120


def test_the_script_writer_says_when_no_node_could_ever_start_the_job(
    project: Path, slurm: SlurmCluster, slurm_env: dict[str, str]
) -> None:
    """Slurm queues a job that no node can hold for ever; the writer asks sinfo first."""
    too_many = ["--cpus-per-task", str(slurm.cpus)]  # two ranks of every CPU of the node
    refused = subprocess.run(
        ["camelyon-proxyfl", "sbatch", *too_many],
        cwd=project, env=slurm_env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"a node of the job needs {2 * slurm.cpus} CPU(s)" in refused.stderr
    assert "queue the job for ever" in refused.stderr and "--overcommit" in refused.stderr
    shared = subprocess.run(
        ["camelyon-proxyfl", "sbatch", *too_many, "--overcommit"],
        cwd=project, env=slurm_env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert shared.returncode == 0, shared.stderr
    assert "#SBATCH --overcommit" in shared.stdout
