"""The house's floors: each top-level package imports only those below it, so that the
federated-learning library (``proxyfl``) never reaches up into what reads its runs
(``analysis``), nor either into the pipeline's parameters, tasks or flows.

Every import statement counts, also those inside functions (they run later) and under
``if TYPE_CHECKING:`` (an arrow in the house all the same), found from the source.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# lowest first: a package may import itself and any package before it
FLOORS = ("plumbing", "wsi", "proxyfl", "analysis", "camelyon_proxyfl", "tasks", "flows", "bench")


def imported_packages(source: str, module: str) -> set[str]:
    """The top-level packages of this project that ``source`` (module ``module``, dotted)
    imports, relative imports resolved."""
    found: set[str] = set()
    package_parts = module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_parts[: len(package_parts) - node.level + 1]
                found.add(base[0] if base else module.split(".")[0])
            elif node.module:
                found.add(node.module.split(".")[0])
    return found & set(FLOORS)


def upward_imports(package: str) -> list[str]:
    """``module -> package`` for every import of ``package``'s modules that goes up a floor."""
    floor = FLOORS.index(package)
    upward = []
    for path in sorted((REPO / package).rglob("*.py")):
        relative = path.relative_to(REPO).with_suffix("")
        parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
        module = ".".join(parts) + (".__init__" if relative.name == "__init__" else "")
        for imported in imported_packages(path.read_text(), module):
            if FLOORS.index(imported) > floor:
                upward.append(f"{'.'.join(parts)} -> {imported}")
    return upward


@pytest.mark.parametrize("package", FLOORS)
def test_each_package_imports_only_the_floors_below_it(package: str) -> None:
    assert (REPO / package / "__init__.py").is_file()
    assert upward_imports(package) == [], f"{package} imports a package above it"


def test_every_package_of_the_project_has_a_floor() -> None:
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")}
    assert packages == set(FLOORS), sorted(packages ^ set(FLOORS))


def test_the_library_holds_no_report_audit_or_staging() -> None:
    assert not any((REPO / "proxyfl" / name).exists() for name in ("report", "audit", "staging"))


def test_an_arrow_up_is_found_wherever_it_is_written() -> None:
    """The check sees a lazy import in a function, a TYPE_CHECKING one and a relative one
    that climbs out of its package's subpackage; an import of a library is not ours."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "import torch\n"
        "if TYPE_CHECKING:\n"
        "    from analysis.report import load\n"
        "def later():\n"
        "    import flows.server\n"
        "from ..engine import data\n"
    )
    assert imported_packages(source, "proxyfl.comm.exchange") == {"analysis", "flows", "proxyfl"}
