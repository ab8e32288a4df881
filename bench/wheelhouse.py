"""The wheels a GPU server without internet needs to run the training and ``bench gpu``.

    python -m bench.wheelhouse [--python 3.12] [--platform manylinux_2_28_x86_64]
                               [--out wheelhouse] [--with-torch] [--present FILE]

Resolves the project's dependencies (``pyproject.toml``) less the orchestration (Prefect,
prefect-dask, fastapi, DVC: a rank and ``bench gpu`` import none of them) for that Python
and platform with uv, at requirements.lock's versions (``make setup``'s), then downloads
each pinned wheel, without its own dependencies, into ``--out`` with a ``requirements.txt``
listing them. torch, torchvision and their CUDA
libraries are left out unless ``--with-torch`` (GPU servers have a torch built for their
driver; its wheels are ~3 GB). On the server, in the project's folder:

    python3.12 -m venv --system-site-packages .venv
    .venv/bin/pip install --no-index --find-links wheelhouse -r wheelhouse/requirements.txt
    .venv/bin/python -m bench gpu

(A plain ``pip install`` keeps the mpich wheel's ``lib/`` beside its ``mpiexec``; ``pip
install --target`` drops it: ``bench/device.sh`` unpacks it.)

``--present FILE`` leaves out what the server already has: FILE names its packages, one a
line (``pip freeze``'s or ``pip list``'s output, or bare names; ``#`` starts a comment),
and only the wheels of the others are downloaded, MPI's excepted (:data:`ALWAYS`). A
server that has most of them (a GPU image with torch, numpy and scipy) then takes a few
tens of MB, not 160 (``bench/device/nvidia-h200.txt``: the device machines lent here).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# what the GPU bench does not run: the orchestration, and FLARE (its jobs are mpiexec's)
ORCHESTRATION = ("prefect", "prefect-dask", "fastapi", "dvc", "nvflare")
TORCH = re.compile(r"^(torch|torchvision|triton|nvidia-.*|cuda-.*)$")
# carried even where the server has them: mpi4py speaks to the MPI library it was built
# for or finds, and a server's own mpi4py may have none beside it (mpich's wheel is one)
ALWAYS = ("mpich", "mpi4py")
_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)")


def _name(requirement: str) -> str:
    match = _NAME.match(requirement.strip())
    return match.group(1).lower().replace("_", "-") if match else ""


def runtime_requirements() -> list[str]:
    """The project's dependencies less the orchestration."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [r for r in project["dependencies"] if _name(r) not in ORCHESTRATION]


_LEGACY = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


def _wheel_pin(filename: str) -> str:
    """``name==version`` of a wheel's file name (``name-version-...-platform.whl``)."""
    name, version = filename.split("-")[:2]
    return f"{_name(name)}=={version}"


def present_packages(listing: str) -> set[str]:
    """The normalised names a package listing holds: ``pip freeze`` (``name==1.0``), ``pip
    list`` (``name 1.0``, its two header lines skipped) or one name a line."""
    names = set()
    for line in listing.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-") or line.lower().startswith("package "):
            continue
        names.add(_name(line))
    return names - {""}


def lacking(pins: Sequence[str], present: set[str]) -> list[str]:
    """The pins (``name==version``) whose package is not in ``present``, and MPI's
    (:data:`ALWAYS`) whatever is there."""
    return [pin for pin in pins if _name(pin) not in present or _name(pin) in ALWAYS]


def compatible_platforms(platform: str) -> list[str]:
    """``manylinux_2_X_ARCH`` and every older manylinux tag a glibc-2.X system runs (pip's
    ``--platform`` matches the tags it is given, not the older ones it implies)."""
    match = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    if match is None:
        return [platform]
    newest, arch = int(match.group(1)), match.group(2)
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(newest, 4, -1)]
    return tags + [f"{_LEGACY[minor]}_{arch}" for minor in _LEGACY if minor <= newest]


def uv() -> str:
    found = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    if not Path(found).exists():
        raise SystemExit("bench.wheelhouse: needs uv (`pip install uv`)")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.wheelhouse",
                                     description=__doc__.splitlines()[0])  # fmt: skip
    parser.add_argument("--python", default="3.12", help="the server's Python (default 3.12)")
    parser.add_argument(
        "--platform",
        default="manylinux_2_28_x86_64",
        help="its wheel platform tag (default manylinux_2_28_x86_64)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "wheelhouse")
    parser.add_argument("--with-torch", action="store_true", help="torch's wheels too (~3 GB)")
    parser.add_argument(
        "--present",
        type=Path,
        default=None,
        help="a file naming the packages the server has (pip freeze or pip list): not downloaded",
    )
    args = parser.parse_args(argv)
    present = present_packages(args.present.read_text()) if args.present is not None else set()
    args.out.mkdir(parents=True, exist_ok=True)
    wanted = args.out / "wanted.in"
    wanted.write_text("\n".join(runtime_requirements()) + "\n")
    platform = args.platform.replace("manylinux_", "x86_64-manylinux_").removesuffix("_x86_64")
    pinned = subprocess.run(
        [uv(), "pip", "compile", str(wanted), "--python-version", args.python,
         "--python-platform", platform, "--constraint", str(REPO / "requirements.lock"),
         "--no-header", "--no-annotate", "--quiet"],
        check=True, capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    wanted_pins = [pin for pin in pinned
                   if "==" in pin and (args.with_torch or not TORCH.match(_name(pin)))]  # fmt: skip
    keep = lacking(wanted_pins, present)
    platforms = [flag for tag in compatible_platforms(args.platform)
                 for flag in ("--platform", tag)]  # fmt: skip
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
         "--python-version", args.python, *platforms, "--dest", str(args.out), *keep],
        check=True,
    )  # fmt: skip
    (args.out / "requirements.txt").write_text("\n".join(keep) + "\n")
    wanted.unlink()
    # an earlier call's wheels may lie beside them: the size is the requirements' alone
    kept = {f"{_name(pin)}=={pin.split('==', 1)[1]}" for pin in keep}
    size = sum(wheel.stat().st_size for wheel in args.out.glob("*.whl")
               if _wheel_pin(wheel.name) in kept) / 1e6  # fmt: skip
    left_out = len(wanted_pins) - len(keep)
    print(
        f"{len(keep)} wheels, {size:.0f} MB, in {args.out}"
        + (f" ({left_out} the server has left out)" if args.present is not None else "")
        + " (install: see `python -m bench.wheelhouse --help`)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
