"""Each DVC stage depends on exactly the code it runs and the parameter keys it reads.

The code a stage runs is the closure of the project modules its command imports, found
from the source (every ``import`` statement, also those inside functions, which run later;
not those under ``if TYPE_CHECKING:``). The training stage also runs the MPI job's entry
point, ``proxyfl.run``. A second test edits files of a recorded project and asks
``dvc status`` which stages became stale.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.pipeline.conftest import CODE, REPO, dvc_project, tiny_params

PACKAGES = CODE  # the project's packages
ENTRY_POINTS = {  # stage -> the modules its command runs
    "synth": ("wsi.synth.__main__",),
    "preprocess": ("flows.preprocess",),
    "train": ("plumbing.kernels", "flows.train", "proxyfl.run"),
    "canary": ("plumbing.kernels", "flows.canary", "proxyfl.run"),
    "audit": ("plumbing.kernels", "flows.audit"),
    "stage": ("plumbing.kernels", "flows.stage"),
    "staging": ("plumbing.kernels", "flows.stage"),
    "report": ("plumbing.kernels", "flows.report"),
}


def _module_file(name: str) -> Path | None:
    base = REPO.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (never run)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                skipped |= {id(n) for n in ast.walk(inner)}
    return skipped


def _imports(name: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    skipped = _type_checking_only(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names}  # submodules
            homes = _lazy_homes(module)
            found |= {homes[alias.name] for alias in node.names if alias.name in homes}
    return found


def _lazy_homes(package: str) -> dict[str, str]:
    """A package's ``_HOMES`` (name -> the module that defines it, loaded on first use,
    PEP 562), so that ``from package import name`` counts as importing that module."""
    path = _module_file(package)
    if path is None or path.name != "__init__.py" or "_HOMES" not in path.read_text():
        return {}
    return dict(importlib.import_module(package)._HOMES)


def code_closure(roots: tuple[str, ...]) -> set[str]:
    """Repository paths of the project modules ``roots`` import, directly or not."""
    seen: set[str] = set()
    todo = [part for root in roots for part in _with_parents(root)]
    while todo:
        name = todo.pop()
        if name in seen or name.split(".")[0] not in PACKAGES:
            continue
        path = _module_file(name)
        if path is None:  # a name imported from a module, not a module
            continue
        seen.add(name)
        for imported in _imports(name, path):
            todo += _with_parents(imported)
    return {
        str(path.relative_to(REPO)) for name in seen if (path := _module_file(name)) is not None
    }


def _stages() -> dict[str, dict]:
    return yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]


def _code_deps(stage: dict) -> set[str]:
    body = stage.get("do", stage)
    return {dep for dep in body["deps"] if dep.split("/")[0] in PACKAGES}


@pytest.mark.parametrize("stage", sorted(ENTRY_POINTS))
def test_each_stage_depends_on_exactly_the_code_it_runs(stage: str) -> None:
    declared = _code_deps(_stages()[stage])
    runs = code_closure(ENTRY_POINTS[stage])
    assert declared == runs, (
        f"dvc.yaml stage {stage}: missing {sorted(runs - declared)}, "
        f"not run {sorted(declared - runs)}"
    )


def test_the_closure_follows_imports_inside_functions() -> None:
    train = code_closure(ENTRY_POINTS["train"])
    # proxyfl.run imports the trainer inside main(), and the trainer imports the rest
    assert {"proxyfl/trainer.py", "proxyfl/algorithms/strategies.py",
            "wsi/store/reader.py"} <= train  # fmt: skip
    report = code_closure(ENTRY_POINTS["report"])
    assert "proxyfl/results.py" in report
    assert not {path for path in train if path.startswith("analysis/report")}
    # the report reads the centre reports (wsi/summary.py): no image code
    light = {"wsi/__init__.py", "wsi/params.py", "wsi/catalogue.py", "wsi/nodes.py",
             "wsi/summary.py"}  # fmt: skip
    assert {path for path in report if path.startswith("wsi/")} <= light
    # each stage reads its own sections of params.yaml: no training code in the stores'
    # stages, no synthetic-data settings in training's
    preprocess = code_closure(ENTRY_POINTS["preprocess"])
    assert not {path for path in preprocess if path.startswith("proxyfl/")}
    assert not {path for path in train | report if path.startswith("wsi/synth/")}
    # the audit reads kept models and stores: it launches no job, trains no federation
    audit = code_closure(ENTRY_POINTS["audit"])
    assert not {
        path
        for path in audit
        if path.startswith(
            ("proxyfl/launch", "proxyfl/comm/exch", "proxyfl/trainer", "tasks/train")
        )
    }


# the packages in layers: a module imports its own layer's and those below, never above;
# the federated-learning library (proxyfl) below what reads its runs (analysis)
LAYERS = {"plumbing": 0, "wsi": 1, "proxyfl": 2, "analysis": 3, "camelyon_proxyfl": 4,
          "tasks": 5, "flows": 6, "bench": 7}  # fmt: skip
# and proxyfl's rooms (a module of the package itself is its own room)
ROOMS = {
    "comm": 0, "names": 0, "results": 1, "kept": 1, "config": 1, "rules": 1, "canaries": 1,
    "privacy": 2, "engine": 2, "algorithms": 3, "launch": 3, "trainer": 4, "rank_inputs": 4,
    "records": 5, "loop": 6, "hosted": 6, "run": 7, "sites": 8,
}  # fmt: skip


def _modules(package: str) -> list[tuple[str, Path]]:
    return [(".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"),
             path) for path in sorted((REPO / package).rglob("*.py"))]  # fmt: skip


def _room(name: str) -> int | None:
    parts = name.split(".")
    return ROOMS.get(parts[1]) if parts[0] == "proxyfl" and len(parts) > 1 else None


def test_no_module_imports_from_a_layer_above_it() -> None:
    upward = []
    for package, layer in LAYERS.items():
        for name, path in _modules(package):
            above = {imported for imported in _imports(name, path)
                     if LAYERS.get(imported.split(".")[0], -1) > layer}  # fmt: skip
            upward += [f"{name} -> {module}" for module in sorted(above)]
    assert not upward, upward


def test_every_package_has_a_layer() -> None:
    assert {path.parent.name for path in REPO.glob("*/__init__.py")} == set(LAYERS)


def test_the_library_holds_nothing_that_reads_finished_runs() -> None:
    """The report, the audit and the staging are analysis', above proxyfl; what both need
    (a run's files, the canary plan) is proxyfl's. Not even a ``TYPE_CHECKING`` import."""
    assert not [
        room for room in ("report", "audit", "staging") if (REPO / "proxyfl" / room).exists()
    ]
    upward = [
        f"{name} -> {node.module}"
        for name, path in _modules("proxyfl")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "analysis"
    ] + [
        f"{name} -> {alias.name}"
        for name, path in _modules("proxyfl")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name.split(".")[0] == "analysis"
    ]
    assert not upward, upward


def test_every_proxyfl_room_imports_only_rooms_below_it() -> None:
    """contracts (names, results, config, rules, the canary plan) and comm; privacy and the
    engine; algorithms and the launcher; a client's set-up (trainer) and a rank's inputs,
    its records, the loop and the host of several clients; a rank's entry point; the FLARE
    site that hosts it."""
    modules = _modules("proxyfl")
    assert all(_room(name) is not None for name, _ in modules if name != "proxyfl")
    upward = []
    for name, path in modules:
        room = _room(name)
        if room is None:
            continue
        above = {imported for imported in _imports(name, path)
                 if (other := _room(imported)) is not None and other > room}  # fmt: skip
        upward += [f"{name} -> {module}" for module in sorted(above)]
    assert not upward, upward


def test_per_centre_parameters_are_per_centre_in_both_parameter_files() -> None:
    """preprocess@c reads preprocess.patches_per_class.c, so both files give one per centre
    built (params-paper.yaml also gives centre 4's, used when PrivateKT is listed)."""
    params = _stages()["preprocess"]["do"]["params"]
    assert "preprocess.patches_per_class.${item}" in params
    for name in ("params.yaml", "params-paper.yaml"):
        preprocess = yaml.safe_load((REPO / name).read_text())["preprocess"]
        assert set(preprocess["patches_per_class"]) >= set(preprocess["centers"]), name


@pytest.fixture()
def recorded(tmp_path: Path, tool_env: dict[str, str]) -> Path:
    """A git + DVC project of this repository's code whose stages are recorded as done
    (``dvc commit`` over placeholder outputs: staleness needs no real run)."""
    params = tiny_params()
    root = dvc_project(tmp_path / "project", params, tool_env)
    data = root / params["data"]["root"]
    for center in params["preprocess"]["centers"]:
        (data / f"center_{center}").mkdir(parents=True)
        (data / f"center_{center}" / "slide.tif").write_text("placeholder")
        for suffix in ("h5", "json"):
            path = root / params["preprocess"]["out"] / f"center_{center}.{suffix}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("placeholder")
    (data / "lesion_annotations").mkdir()
    (data / "stage_labels.csv").write_text("patient,stage\n")
    for algorithm in params["train"]["algorithms"]:
        for seed in params["train"]["seeds"]:
            run = root / params["train"]["runs"] / algorithm / f"seed_{seed}"
            run.mkdir(parents=True)
            (run / "run.json").write_text("{}")
    for algorithm in params["audit"]["canary"]["algorithms"]:
        canary = root / params["audit"]["canary_runs"] / algorithm
        canary.mkdir(parents=True)
        (canary / "canaries.json").write_text("{}")
    results = root / params["report"]["out"]
    (results / "audit.json").parent.mkdir(parents=True, exist_ok=True)
    (root / params["audit"]["out"]).write_text("{}")
    for center in params["train"]["centers"]:
        calls = root / params["stage"]["out"] / f"center_{center}" / "calls.json"
        calls.parent.mkdir(parents=True)
        calls.write_text("{}")
    (root / params["stage"]["summary"]).write_text("{}")
    for name in ("tables", "plots", "curves"):
        (results / name).mkdir(parents=True)
        (results / name / "placeholder").write_text("")
    (results / "metrics.json").write_text("{}")
    (results / "report.html").write_text("")
    subprocess.run(["dvc", "commit", "--force", "-q"], cwd=root, env=tool_env, check=True,
                   capture_output=True)  # fmt: skip
    return root


def _stale(project: Path) -> set[str]:
    """The stages ``dvc status`` names, asked of DVC's own ``Repo`` in this process (from
    the project's folder, as the command: it names stages relative to it): the command's
    code, without its 1.5-2.5 s of CPU to start, once per edit."""
    from dvc.repo import Repo

    with contextlib.chdir(project), Repo() as repo:
        return set(repo.status())


def test_editing_code_makes_stale_exactly_the_stages_that_run_it(recorded: Path) -> None:
    assert _stale(recorded) == set()

    def edit(relative: str) -> set[str]:
        path = recorded / relative
        original = path.read_text()
        path.write_text(original + "\n# an edit\n")
        try:
            return _stale(recorded)
        finally:
            path.write_text(original)

    trains = {"train@ProxyFL-0", "train@Joint-0"}
    canary, audit = {"canary@ProxyFL"}, {"audit"}
    preprocess = {"preprocess@0", "preprocess@1"}
    maps, staging = {"stage@0", "stage@1"}, {"staging"}
    # the report's formatting: the report alone, no training run
    assert edit("analysis/report/render.py") == {"report"}
    # the store schema: every training run (and the stores' writers, and the staging that
    # reads their splits); its writer: the stores only
    assert edit("wsi/store/schema.py") == trains | canary | audit | preprocess | maps | staging
    assert edit("wsi/store/writer.py") == preprocess
    # the trainer: training only, the canary run's included
    assert edit("proxyfl/trainer.py") == trains | canary
    # the attacks: the audit alone; the canary plan: every run that may train on one
    assert edit("analysis/audit/membership.py") == audit
    assert edit("proxyfl/canaries.py") == trains | canary | audit | {"report"}
    # the masks: the stores and the maps (whose cells are the stores' candidates); the
    # lesions of a map: the staging alone; its measures: the staging's summary too
    assert edit("wsi/masks.py") == preprocess | maps | staging
    assert edit("wsi/lesions.py") == maps | staging
    assert edit("analysis/report/staging.py") == maps | staging | {"report"}
    # the pictures: the staging's stages (one command), not the report, which embeds them
    assert edit("analysis/staging/pictures.py") == maps | staging
    # each stage validates only its own sections of params.yaml: the PushSum graphs (the
    # train section's) leave the stores up to date, the synthetic data's settings (the
    # data section's) every training run and the report; the staging validates train: too
    assert edit("proxyfl/comm/graphs.py") == trains | canary | audit | maps | staging | {"report"}
    assert not edit("wsi/synth/config.py") & (trains | {"report"})
    # the preprocess section: the stores, and the staging (which reads their geometry)
    assert edit("camelyon_proxyfl/params/preprocess.py") == preprocess | maps | staging
    assert _stale(recorded) == set()


def test_a_centres_staging_record_holds_what_its_stage_depends_on() -> None:
    """The Prefect path keeps a centre's staging by its record (analysis.staging.freshness):
    the settings it records are stage@c's parameters, less the paths whose content the
    record holds instead (the slides, the store, the models) or that only say where, and
    the kernels' setting, whose pin in effect it records (its ``kernels``)."""
    from camelyon_proxyfl.params.staging import StagingParams

    stage = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["stage"]["do"]
    paths = {"data.root", "preprocess.out", "train.runs", "train.algorithms", "train.seeds",
             "stage.out"}  # fmt: skip
    assert set(StagingParams().centre_settings()) == set(stage["params"]) - paths - {
        "machine.cpu_kernels"
    }
    from analysis.staging.freshness import CentreInputs

    assert "kernels" in CentreInputs.__dataclass_fields__
