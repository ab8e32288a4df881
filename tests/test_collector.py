"""plumbing.collector: the cyclic collector off while a command imports, its imports frozen
after, and nothing changed for a process that did not start as such a command."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# gc.get_freeze_count() is not 0 as CPython 3.12 starts (375 objects here): each process
# compares it with its own count at its start
PAUSED_IMPORTS = """\
import gc, json, sys
base = gc.get_freeze_count()
from plumbing import collector
if sys.argv[1] == "theirs":
    gc.disable()  # the program's own choice
collector.pause()
during = gc.isenabled()
import decimal, email.parser, xml.dom.minidom  # objects that live as long as the process
collector.imports_done()
collector.imports_done()  # a second time: nothing more
print(json.dumps({"during": during, "after": gc.isenabled(), "paused": collector.paused(),
                  "frozen": gc.get_freeze_count() - base}))
"""


@pytest.mark.parametrize("collector", ["on", "theirs"])
def test_a_pause_freezes_the_imports_and_leaves_the_collector_as_it_found_it(
    collector: str,
) -> None:
    done = subprocess.run([sys.executable, "-c", PAUSED_IMPORTS, collector], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    state = json.loads(done.stdout)
    assert state["during"] is False and state["paused"] is False
    if collector == "on":
        assert state["after"] is True
        assert state["frozen"] > 1000, state  # the imports' objects, the collector's no more
    else:  # turned off by the program: off it stays, and nothing is frozen
        assert state["after"] is False and state["frozen"] == 0, state


def test_imports_done_without_a_pause_changes_nothing() -> None:
    code = (
        "import gc, json\nbase = gc.get_freeze_count()\n"
        "from plumbing.collector import imports_done\nimport decimal\n"
        "imports_done()\nprint(json.dumps([gc.isenabled(), gc.get_freeze_count() - base]))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=True)  # fmt: skip
    assert json.loads(done.stdout) == [True, 0]


def _package(folder: Path) -> Path:
    """``pkg``, whose ``__init__`` pauses for a command, and ``pkg.cmd``, which says the
    collector's state as it imports and after its ``__main__``'s imports_done."""
    (folder / "pkg").mkdir(parents=True)
    (folder / "pkg" / "__init__.py").write_text(
        "import gc\nBASE = gc.get_freeze_count()\n"
        "from plumbing.collector import pause_while_a_command_imports\n"
        "pause_while_a_command_imports()\n"
    )
    (folder / "pkg" / "cmd.py").write_text(
        "import gc\nfrom pkg import BASE\nprint('importing', gc.isenabled())\n"
        "if __name__ == '__main__':\n"
        "    from plumbing.collector import imports_done\n"
        "    imports_done()\n"
        "print('after', gc.isenabled(), gc.get_freeze_count() > BASE)\n"
    )
    return folder


def test_python_m_pauses_in_the_package_and_a_plain_import_does_not(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{_package(tmp_path)}{os.pathsep}{REPO}"}
    as_command = subprocess.run([sys.executable, "-m", "pkg.cmd"], env=env, cwd=tmp_path,
                                capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    assert as_command.stdout.split("\n")[:2] == ["importing False", "after True True"]
    imported = subprocess.run([sys.executable, "-c", "import pkg.cmd"], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    assert imported.stdout.split("\n")[:2] == ["importing True", "after True False"]


def _main_block(tree: ast.Module) -> ast.If | None:
    for node in tree.body:
        test = node.test if isinstance(node, ast.If) else None
        if isinstance(test, ast.Compare) and ast.unparse(test.left) == "__name__":
            return node
    return None


def test_every_flows_command_ends_the_pause_before_anything_else() -> None:
    """``python -m flows.X`` runs with the collector paused from ``flows/__init__.py``
    until X's ``__main__`` ends it: each one's first statement does (start_command, or
    imports_done), else the command would run with no collector at all."""
    commands = []
    for path in sorted((REPO / "flows").glob("*.py")):
        block = _main_block(ast.parse(path.read_text()))
        if block is None:
            continue
        commands.append(path.stem)
        first = block.body[0]
        assert isinstance(first, ast.Expr) and isinstance(first.value, ast.Call), path
        called = first.value.func
        assert isinstance(called, ast.Name), path
        assert called.id in ("start_command", "imports_done"), f"{path}: {called.id}"
    assert {"train", "report", "pipeline", "server", "shared", "serve"} <= set(commands)


AT_EXIT = """\
import atexit, gc, json, os
BASE = gc.get_freeze_count()
def said():
    with open(os.environ["COLLECTOR_STATE"], "w") as out:
        json.dump({"enabled": gc.isenabled(), "frozen": gc.get_freeze_count() - BASE}, out)
atexit.register(said)
"""


@pytest.mark.parametrize("command", [["-m", "flows.report", "--help"], ["cli", "report", "--help"]])
def test_a_command_runs_with_the_collector_on_and_its_imports_frozen(
    tmp_path: Path, command: list[str]
) -> None:
    """The collector's state as the command exits (an exit handler from a sitecustomize
    of the test's): on, with Prefect's objects frozen (~130,000)."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(AT_EXIT)
    state = tmp_path / "state.json"
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "COLLECTOR_STATE": str(state)}
    argv = ([sys.executable, *command] if command[0] == "-m"
            else [str(BIN / "camelyon-proxyfl"), *command[1:]])  # fmt: skip
    subprocess.run(argv, cwd=REPO, env=env, capture_output=True, timeout=120, check=True)
    said = json.loads(state.read_text())
    assert said["enabled"] is True and said["frozen"] > 50_000, said
