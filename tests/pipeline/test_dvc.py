"""`dvc repro` of the real dvc.yaml on tiny parameters: the DAG, the no-op, per-stage reruns."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.pipeline.conftest import dvc_project, tiny_params


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def project(tmp_path: Path, tool_env: dict[str, str]) -> Path:
    """A git + DVC project holding this repository's code, dvc.yaml and tiny params, with
    PrivateKT beside ProxyFL and Joint: centre 2 is written and preprocessed as its pool."""
    params = tiny_params()
    params["data"]["synth"]["num_centers"] = 3
    params["preprocess"].update({"centers": [0, 1, 2], "patches_per_class": {0: 6, 1: 6, 2: 6}})
    params["train"]["algorithms"] = ["ProxyFL", "Joint", "PrivateKT"]
    params["train"]["options"].update(
        {"public_pool": "center", "public_center": 2, "self_train_samples": 4}
    )
    return dvc_project(tmp_path / "project", params, tool_env)


def _dvc(project: Path, env: dict[str, str], *args: str) -> str:
    result = subprocess.run(["dvc", *args], cwd=project, env=env, capture_output=True,
                            text=True, timeout=900)  # fmt: skip
    assert result.returncode == 0, f"dvc {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def _git(project: Path, env: dict[str, str], *args: str) -> str:
    result = subprocess.run(["git", *args], cwd=project, env=env, capture_output=True,
                            text=True, check=True)  # fmt: skip
    return result.stdout


# the suite's longest test: 648-716 s in make test on the slower machine kind (AMD EPYC
# without AVX-512), and past the suite's 900 s guard against a hang (pyproject.toml) where
# that machine ran a demo beside it (2026-11-29); its own steps keep their timeouts
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_dvc_repro_builds_everything_then_is_a_no_op(
    project: Path, tool_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = subprocess.run(
        ["python", "-m", "flows.shared", "--", "dvc", "repro"],  # as make demo
        cwd=project, env=tool_env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert first.returncode == 0, first.stdout[-5000:] + first.stderr[-5000:]
    for stage in ("synth", "preprocess@0", "preprocess@1", "preprocess@2", "train@ProxyFL-0",
                  "train@Joint-0", "train@PrivateKT-0", "canary@ProxyFL", "audit",
                  "stage@0", "stage@1", "staging", "report"):  # fmt: skip
        assert f"Running stage '{stage}'" in first.stdout
    # every training job's ranks forked from flows.shared's one warm server, the kernels'
    # pin of the stages included (a server per stage otherwise: 2-3 s of start-up a job)
    canary_runs = yaml.safe_load((project / "params.yaml").read_text())["audit"]["canary_runs"]
    for run in ("runs/ProxyFL/seed_0", "runs/Joint/seed_0", "runs/PrivateKT/seed_0",
                f"{canary_runs}/ProxyFL/run"):  # fmt: skip
        machine = json.loads((project / run / "machine.json").read_text())
        assert machine["timings"]["launcher"]["warm_server"] == "shared", run
    # the staging: every method's test patients staged, each centre within its own folder
    staging = json.loads((project / "results" / "staging.json").read_text())
    assert set(staging["methods"]) == {"ProxyFL/seed_0", "Joint/seed_0", "PrivateKT/seed_0"}
    for entry in staging["methods"].values():
        assert entry["n_slides"] == 5 * entry["n_patients"] > 0
        assert sum(map(sum, entry["node_confusion"])) == entry["n_slides"]
    for center in (0, 1):
        pictures = staging["pictures"][str(center)]
        assert pictures and all((project / "staging" / f"center_{center}" / p).is_file()
                                for p in pictures.values())  # fmt: skip
    assert "| ProxyFL/seed_0 |" in (project / "results" / "tables" / "staging.md").read_text()
    page = (project / "results" / "report.html").read_text()
    assert page.count('<figure class="staging">') == sum(
        len(p) for p in staging["pictures"].values()
    )
    # the audit: every run's kept models attacked, and the canary run's bound beside its ε
    audit = json.loads((project / "results" / "audit.json").read_text())
    kinds = {(row["method"], row["evaluated_model"], row["run"]) for row in audit["rows"]}
    assert kinds == {("ProxyFL", "private", "training"), ("ProxyFL", "proxy", "training"),
                     ("Joint", "local", "training"), ("PrivateKT", "central", "training"),
                     ("ProxyFL", "private", "canary"), ("ProxyFL", "proxy", "canary")}  # fmt: skip
    assert audit["violations"] == []
    plan = json.loads((project / "runs" / "canary" / "ProxyFL" / "canaries.json").read_text())
    assert {len(canaries["included"]) for canaries in plan["centers"].values()} == {4}
    assert "Empirical privacy audit" in (project / "results" / "report.html").read_text()
    tables = project / "results" / "tables"
    accuracy = (tables / "accuracy.md").read_text()
    assert "| ProxyFL |" in accuracy and "| Joint |" in accuracy and "| PrivateKT |" in accuracy
    privacy = (tables / "privacy.csv").read_text().splitlines()
    assert len(privacy) == 1 + 2 + 1 + 2  # header, two clients, Joint, PrivateKT's two
    assert sum(line.endswith("label_ldp,5.0") for line in privacy) == 2, privacy
    assert (project / "results" / "plots" / "accuracy.png").stat().st_size > 0
    assert "public pool (PrivateKT; labels unused)" in (
        project / "results" / "report.html").read_text()  # fmt: skip

    metrics = json.loads(_dvc(project, tool_env, "metrics", "show", "--json"))
    shown = metrics[""]["data"]["results/metrics.json"]["data"]  # "": the workspace
    assert set(shown) == {"ProxyFL", "Joint", "PrivateKT", "max_epsilon", "max_epsilon_label_ldp",
                          "majority_class"}  # fmt: skip
    assert 0.0 <= shown["ProxyFL"]["accuracy"] <= 1.0 and shown["max_epsilon"] > 0
    assert shown["max_epsilon_label_ldp"] == 5.0  # one round of ε = 5
    _dvc(project, tool_env, "plots", "show", "-o", str(project / "dvc_plots"))
    page = (project / "dvc_plots" / "index.html").read_text()
    assert "<img" in page and "cdn" not in page.lower()  # renders offline

    second = _dvc(project, tool_env, "repro")
    assert "Running stage" not in second and "up to date" in second

    # the switch to a data root that is not there (params-paper.yaml without the slides):
    # dvc repro fails naming it, and every store and centre report stays as it was
    outputs = sorted((project / "data" / "patches").glob("center_[0-9].[hj][5s]*"))
    assert len(outputs) == 6
    before_switch = {path.name: _sha(path) for path in outputs}
    params_file = project / "params.yaml"
    demo_params = params_file.read_text()
    switched = yaml.safe_load(demo_params)
    switched["data"]["root"] = "data/camelyon17"
    params_file.write_text(yaml.safe_dump(switched, sort_keys=False))
    failed = subprocess.run(["dvc", "repro"], cwd=project, env=tool_env, capture_output=True,
                            text=True, timeout=900)  # fmt: skip
    assert failed.returncode != 0
    assert "data/camelyon17/center_" in failed.stdout + failed.stderr, failed.stderr
    assert {path.name: _sha(path) for path in outputs} == before_switch
    params_file.write_text(demo_params)
    assert "up to date" in _dvc(project, tool_env, "status")

    # the commands that follow, as a user runs them beside a server of their own (`make
    # serve`): each flow reports to it, and none starts its own (5 servers, 3-4 s of CPU each)
    from flows.server import prefect_server

    monkeypatch.setenv("PREFECT_HOME", tool_env["PREFECT_HOME"])  # migrated: no 4 s again
    with prefect_server() as api_url:
        _after_dvc(project, {**tool_env, "PREFECT_API_URL": api_url}, outputs, before_switch,
                   demo_params)  # fmt: skip


def _after_dvc(
    project: Path,
    tool_env: dict[str, str],
    outputs: list[Path],
    before_switch: dict[str, str],
    demo_params: str,
) -> None:
    """What follows a built project: the Prefect path, the report from a subfolder, one
    centre and one slide again, a parameter's stale stages, an experiment."""
    params_file = project / "params.yaml"
    # the Prefect path after DVC's: it keeps what DVC built (stores, runs, the canary run),
    # saying so, and writes the same bytes, so DVC finds nothing to do
    stores_before = {path: path.stat().st_mtime_ns for path in outputs}
    prefect_path = subprocess.run(["python", "-m", "flows.pipeline"], cwd=project, env=tool_env,
                                  capture_output=True, text=True, timeout=900)  # fmt: skip
    said = prefect_path.stdout + prefect_path.stderr
    assert prefect_path.returncode == 0, said[-6000:]
    assert "every store is up to date: preprocessing skipped" in said, said[-6000:]
    assert "for flow 'preprocess'" not in said
    assert said.count("and these stores: kept") == 4, said[-6000:]  # 3 runs and the canary run
    # the audit too, its runs and stores the bytes DVC cached (analysis.audit.freshness)
    assert "results/audit.json: up to date" in said, said[-6000:]
    assert "membership inference:" not in said
    # and every centre's staging (analysis.staging.freshness): no slide mapped again
    assert all(f"staging/center_{c}: up to date" in said for c in (0, 1)), said[-6000:]
    assert "slides mapped" not in said
    assert {path: path.stat().st_mtime_ns for path in outputs} == stores_before, "not rewritten"
    assert {path.name: _sha(path) for path in outputs} == before_switch
    assert "up to date" in _dvc(project, tool_env, "status")

    # from a subfolder, as from the project's: the report of the same runs, byte for byte
    below = subprocess.run(["camelyon-proxyfl", "report"], cwd=project / "results" / "tables",
                           env=tool_env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert below.returncode == 0, below.stdout[-3000:] + below.stderr[-3000:]
    assert "up to date" in _dvc(project, tool_env, "status")

    # one centre alone: forced, it rebuilds the same bytes and nothing else runs
    store = project / "data" / "patches" / "center_1.h5"
    before = _sha(store)
    forced = _dvc(project, tool_env, "repro", "--force", "--single-item", "preprocess@1")
    assert "Running stage 'preprocess@1'" in forced
    assert forced.count("Running stage") == 1
    assert _sha(store) == before
    assert "up to date" in _dvc(project, tool_env, "status")

    # one slide, as the README has it: redo, then record the rebuilt store
    redo = subprocess.run(
        ["python", "-m", "flows.preprocess", "--centers", "1",
         "--redo-slides", "patient_020_node_0"],
        cwd=project, env=tool_env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert redo.returncode == 0, redo.stdout[-3000:] + redo.stderr[-3000:]
    assert "redo patient_020_node_0: removed" in redo.stdout + redo.stderr
    _dvc(project, tool_env, "commit", "--force", "preprocess@1")
    assert _sha(store) == before
    assert "up to date" in _dvc(project, tool_env, "status")

    # a training option is a parameter of exactly the stages that read it: the runs, the
    # canary run and the report go stale, not the preprocessing (the audit and the staging
    # follow from the runs they read); `--dry` says so without training
    params_file.write_text(demo_params.replace("    rounds: 1\n", "    rounds: 3\n", 1))
    dry = _dvc(project, tool_env, "repro", "--dry")
    assert set(re.findall(r"Running stage '([^']+)'", dry)) == {
        "train@ProxyFL-0", "train@Joint-0", "train@PrivateKT-0", "canary@ProxyFL", "report"
    }, dry  # fmt: skip
    params_file.write_text(demo_params)

    # the baseline committed, an experiment (on the report's option, which reruns the report
    # alone): params.yaml changes by that line only; both rows of `dvc exp show` hold the
    # parameters and the metrics
    env = {**tool_env, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    _git(project, env, "add", "-A")
    _git(project, env, "commit", "-qm", "baseline")
    assert "results/metrics.json" in _git(project, env, "ls-files", "results")
    experiment = _dvc(project, env, "exp", "run", "-n", "fewer-pictures", "-S",
                      "report.staging_pictures_mb=0.5")  # fmt: skip
    ran = set(re.findall(r"Running stage '([^']+)'", experiment))
    assert ran == {"report"}, experiment
    diff = _git(project, env, "diff", "-U0", "params.yaml").splitlines()
    changed = [line for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert changed == ["-  staging_pictures_mb: 6.0", "+  staging_pictures_mb: 0.5"], diff

    shown = json.loads(_dvc(project, env, "exp", "show", "--json"))
    rows = {}
    for commit in shown:
        for entry in [commit, *(e for exp in commit.get("experiments") or []
                                for e in exp.get("revs", []))]:  # fmt: skip
            data = entry["data"]
            metrics = data["metrics"]["results/metrics.json"]["data"]
            rows[entry.get("name") or entry["rev"]] = (
                data["params"]["params.yaml"]["data"]["report"]["staging_pictures_mb"],
                metrics["ProxyFL"]["accuracy"],
            )
    assert {megabytes for megabytes, _ in rows.values()} >= {6.0, 0.5}, rows
    assert all(isinstance(accuracy, float) for _, accuracy in rows.values()), rows
    assert "failed to load" not in _dvc(project, env, "metrics", "diff")
