"""requirements.lock: the versions `make setup` installs, for Python 3.11 and 3.12.

A store records the versions of the libraries that decide its bytes
(:data:`wsi.store.provenance.PIXEL_AND_FILE_LIBRARIES`) and dvc.lock records the store's
hash, so a release of any of them changes the bytes a fresh clone builds: imagecodecs
2026.11.11 did, with every pixel the same (docs/reproducibility.md, "The same versions").
These tests hold the lock to pyproject.toml and the suite's environment to the lock."""

from __future__ import annotations

import importlib.metadata
import platform
import sys
import tomllib

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import REPO
from wsi.store.provenance import PIXEL_AND_FILE_LIBRARIES

LOCK = REPO / "requirements.lock"
# the Pythons the Makefile builds with, on the platform CI and the GPU servers run
PYTHONS = ("3.11", "3.12")


def locked_requirements() -> list[Requirement]:
    """Every ``name==version ; marker`` line of the lock (uv's ``# via`` notes skipped)."""
    lines = LOCK.read_text().splitlines()
    return [Requirement(line) for line in lines if line.strip() and not line.startswith((" ", "#"))]


def linux_x86_64(python: str) -> dict[str, str]:
    """A marker environment of CPython ``python`` on Linux x86-64."""
    environment = default_environment()
    environment.update(python_version=python, python_full_version=f"{python}.0",
                       sys_platform="linux", platform_system="Linux",
                       platform_machine="x86_64", implementation_name="cpython")  # fmt: skip
    return environment


def pins_for(environment: dict[str, str]) -> dict[str, str]:
    """The locked version of each package ``environment`` installs, by canonical name."""
    pins: dict[str, str] = {}
    for requirement in locked_requirements():
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        (specifier,) = requirement.specifier
        assert specifier.operator == "==", f"{requirement} is not a pin"
        name = canonicalize_name(requirement.name)
        assert name not in pins, f"{name} pinned twice for {environment['python_version']}"
        pins[name] = specifier.version
    return pins


def project_requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    texts = project["dependencies"] + project["optional-dependencies"]["dev"]
    return [Requirement(text) for text in texts]


@pytest.mark.parametrize("python", PYTHONS)
def test_the_lock_pins_a_version_pyproject_allows_of_every_dependency(python: str) -> None:
    """Edit a range in pyproject.toml that the pin leaves and this fails until `make lock`."""
    environment = linux_x86_64(python)
    pins = pins_for(environment)
    wanted = [r for r in project_requirements()
              if r.marker is None or r.marker.evaluate(environment)]  # fmt: skip
    unpinned = [str(r) for r in wanted if canonicalize_name(r.name) not in pins]
    assert unpinned == [], f"not in requirements.lock for Python {python}: run `make lock`"
    outside = {
        str(r): pins[canonicalize_name(r.name)]
        for r in wanted
        if not r.specifier.contains(pins[canonicalize_name(r.name)], prereleases=True)
    }
    assert outside == {}, f"pinned outside pyproject.toml's ranges ({python}): run `make lock`"
    assert {canonicalize_name(name) for name in PIXEL_AND_FILE_LIBRARIES} <= set(pins)


def test_this_environment_holds_the_locked_versions() -> None:
    """The suite runs where `make setup` installed: every package the lock pins for this
    interpreter is there at its pinned version, so the bytes the tests compare with dvc.lock
    and the recorded references are the ones the lock's versions make."""
    if platform.machine() != "x86_64" or sys.platform != "linux":
        pytest.skip("the lock's pins are checked on Linux x86-64 (CI's and the GPU servers')")
    environment = default_environment()
    wrong: dict[str, tuple[str, str | None]] = {}
    for name, version in pins_for(environment).items():
        try:
            installed: str | None = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            installed = None
        if installed != version:
            wrong[name] = (version, installed)
    assert wrong == {}, f"(locked, installed) differ: `make setup` installs the lock ({sys.prefix})"
