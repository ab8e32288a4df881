"""One writer per artefact (plumbing.locks): a second run aimed at a store or run directory
another process is writing is refused at once, naming it; a killed holder leaves no lock.
Real processes: the holder is a separate interpreter, as a second command would be."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from camelyon_proxyfl.params.preprocess import PreprocessConfig
from flows.preprocess import run_preprocess
from plumbing.locks import Busy, exclusive, lock_path

REPO = Path(__file__).resolve().parents[1]
HOLD = (
    "import sys, time; from plumbing.locks import exclusive\n"
    "with exclusive([sys.argv[1]], 'writing'):\n"
    "    print('held', flush=True); time.sleep(60)\n"
)


def _holder(target: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(target)], cwd=REPO,
                               stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert process.stdout is not None and process.stdout.readline().strip() == "held"
    return process


def test_a_held_artefact_is_refused_by_name_and_freed_when_its_holder_dies(
    tmp_path: Path,
) -> None:
    target = tmp_path / "runs" / "FedAvg" / "seed_0"
    holder = _holder(target)
    try:
        with pytest.raises(Busy) as busy, exclusive([target], "training into"):
            pass
        assert str(target) in str(busy.value) and "training into it" in str(busy.value)
        assert str(lock_path(target)) in str(busy.value)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with exclusive([target], "training into"):  # the kernel released it with the holder
        pass


def test_a_second_preprocess_of_the_same_centre_is_refused_before_any_work(
    tmp_path: Path,
) -> None:
    out = tmp_path / "patches"
    holder = _holder(out / "center_1.h5")
    started = time.monotonic()
    try:
        config = PreprocessConfig(data_root=tmp_path / "no-data", out=out, centers=[0, 1])
        with pytest.raises(Busy, match=r"center_1\.h5: another run is building it"):
            run_preprocess(config)
    finally:
        holder.kill()
        holder.wait()
    assert time.monotonic() - started < 10 and not (out / "center_0.h5").exists()
