"""The documentation: the site builds with ``--strict`` (no broken link, reference or
docstring), every command a page marks runnable runs and exits as the page says, and the
configuration reference holds every key of the parameters files, each explained."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel, Field

from camelyon_proxyfl.params.reference import (
    key_references,
    reference_markdown,
    type_name,
    undocumented_keys,
)
from camelyon_proxyfl.params.whole import Params

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
# a runnable block: the marker line, then a ```bash fence; "exit N" when it must fail so
RUNNABLE = re.compile(r"<!-- runnable(?:: exit (\d+))? -->\n```bash\n(.*?)\n```", re.S)
BIN = str(Path(sys.executable).parent)


def runnable_blocks() -> list[tuple[str, int, str]]:
    """(page: line, expected exit status, commands) of every runnable block of the docs."""
    blocks = []
    for page in PAGES:
        text = page.read_text()
        for match in RUNNABLE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            expected = int(match.group(1) or 0)
            blocks.append((f"{page.relative_to(ROOT)}:{line}", expected, match.group(2)))
    return blocks


def test_pages_mark_commands_runnable() -> None:
    # the pages' own examples, not an empty parametrisation that would pass unseen
    blocks = BLOCKS
    assert len(blocks) >= 5
    assert {expected for _, expected, _ in blocks} == {0, 2}
    marked = sum(text.count("<!-- runnable") for text in (p.read_text() for p in PAGES))
    assert marked == len(blocks), "a marker not followed by a ```bash block"


def _git_status() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout  # fmt: skip


BLOCKS = runnable_blocks()


@pytest.mark.slow
@pytest.mark.parametrize(("where", "expected", "commands"), BLOCKS,
                         ids=[where for where, _, _ in BLOCKS])  # fmt: skip
def test_a_runnable_block_runs_as_the_page_says(where: str, expected: int, commands: str) -> None:
    """Run from the repository's root with .venv's commands first on PATH, as a reader with
    the environment activated would; each block leaves the checkout as it found it."""
    before = _git_status()
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    script = ("set -e\n" if expected == 0 else "") + commands
    done = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == expected, f"{where}: exit {done.returncode}\n{output[-3000:]}"
    if expected:
        assert "error:" in output.lower() and "Traceback" not in output, output[-3000:]
    assert _git_status() == before, f"{where} changed the checkout"


@pytest.mark.slow
def test_the_site_builds_strict_offline(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([f"{BIN}/mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-5000:]
    page = (tmp_path / "configuration" / "index.html").read_text()
    for key in _file_keys(ROOT / "params.yaml"):
        assert f"<code>{key}</code>" in page or f"<code>{key}:</code>" in page, key
    # the API reference is generated from the docstrings, not empty
    api = (tmp_path / "api" / "proxyfl" / "index.html").read_text()
    assert "proxyfl.privacy.accounting" in api and "epsilon" in api
    assert ":func:<code>" not in api and ":mod:<code>" not in api  # Sphinx roles read as code
    # nothing fetched from the network when the page is opened
    home = (tmp_path / "index.html").read_text()
    assert "fonts.googleapis.com" not in home


def _file_keys(path: Path) -> list[str]:
    """Every key of a parameters file, dotted, sections included."""

    def walk(mapping: dict[str, object], at: tuple[str, ...]) -> list[str]:
        keys = []
        for name, value in mapping.items():
            key = (*at, str(name))
            keys.append(".".join(key))
            # a mapping of centres (patches_per_class: {0: 1517, ...}) is a value, not keys
            if isinstance(value, dict) and all(isinstance(k, str) for k in value):
                keys += walk(value, key)
        return keys

    return walk(yaml.safe_load(path.read_text()), ())


@pytest.mark.parametrize("name", ["params.yaml", "params-paper.yaml"])
def test_every_key_of_the_parameters_files_is_in_the_reference(name: str) -> None:
    reference = reference_markdown()
    keys = _file_keys(ROOT / name)
    assert "train.options.sigma" in keys and len(keys) > 50
    # a section its own heading, every key below it an item
    missing = [key for key in keys
               if f"- **`{key}`** (" not in reference
               and f"# `{key}:`" not in reference]  # fmt: skip
    assert not missing, f"{name}: not in the configuration reference: {missing}"


def test_every_key_the_models_accept_says_what_it_sets() -> None:
    assert undocumented_keys(Params) == []
    keys = [ref.key for ref in key_references(Params)]
    assert len(keys) == len(set(keys)) and "stage.thresholds" in keys


def test_an_undocumented_key_is_named() -> None:
    class Inner(BaseModel):
        """An inner section."""

        told: int = Field(1, description="what it sets")
        untold: float = 0.5

    class Outer(BaseModel):
        inner: Inner = Field(default_factory=Inner)

    assert undocumented_keys(Outer) == ["inner.untold"]
    rows = {ref.key: ref for ref in key_references(Outer)}
    assert rows["inner"].help == "An inner section." and rows["inner"].section
    assert (rows["inner.told"].type, rows["inner.told"].default) == ("int", "1")


def test_types_read_as_a_parameters_file_writes_them() -> None:
    from typing import Annotated, Literal

    from pydantic import Field as F

    assert type_name(list[Literal["a", "b"]]) == "list['a' | 'b']"
    assert type_name(int | None) == "int | None"
    assert type_name(Annotated[int, F(ge=1)] | dict[int, int]) == "int | dict[int, int]"
    assert type_name(Path) == "path"


def test_the_readmes_links_and_pictures_are_there() -> None:
    """The README is not part of the site (whose --strict build checks its pages' links):
    its relative links and pictures are checked here."""
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if "://" not in t]
    assert len(local) >= 10
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README links to what is not there: {missing}"
    assert len(text.splitlines()) <= 200  # a front page
