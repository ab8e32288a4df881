"""An audit file is kept only while everything that decided its bytes is as recorded
(analysis.audit.freshness): real files, real stores; any change names itself."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import h5py
import pytest

from analysis.audit.freshness import (
    AuditInputs,
    forget_inputs,
    inputs_path,
    record_inputs,
    stale_reason,
)
from analysis.audit.options import AuditOptions
from plumbing.kernels import in_effect


@pytest.fixture
def audited(tmp_path: Path, helpers: Any) -> dict[str, Any]:
    """Two runs and a canary run (a few files each), stores, and an audit written from them
    with its inputs recorded."""
    data = helpers.write_stores(tmp_path / "stores", centers=(0, 1))
    runs = [tmp_path / "runs" / name / "seed_0" for name in ("ProxyFL", "FML")]
    canary = tmp_path / "runs" / "canary" / "ProxyFL"
    for directory in (*runs, canary):
        (directory / "models" / "client_0").mkdir(parents=True)
        (directory / "models" / "client_0" / "private.safetensors").write_bytes(b"weights")
        (directory / "run.json").write_text('{"status": "finished"}')
    out = tmp_path / "results" / "audit.json"
    out.parent.mkdir()
    out.write_text('{"rows": []}')
    options = AuditOptions(reference_models=2)
    record_inputs(out, AuditInputs.now(options, runs, [canary], data))
    return {"data": data, "runs": runs, "canary": canary, "out": out, "options": options}


def _now(audited: dict[str, Any], **changes: Any) -> AuditInputs:
    given = {"options": audited["options"], "runs": audited["runs"],
             "canary_runs": [audited["canary"]], "data": audited["data"], **changes}  # fmt: skip
    return AuditInputs.now(**given)


def test_an_audit_whose_inputs_are_as_recorded_is_kept(audited: dict[str, Any]) -> None:
    assert inputs_path(audited["out"]).name == "audit.inputs.json"
    assert stale_reason(audited["out"], _now(audited)) is None


def test_a_copy_of_the_runs_and_stores_with_new_times_keeps_it(audited: dict[str, Any]) -> None:
    """What DVC does to its outputs (into its cache and back): the same bytes, new times."""
    for path in [*audited["data"].glob("*.h5"), *audited["runs"][0].rglob("*.safetensors")]:
        copy = path.with_name(path.name + ".copy")
        shutil.copy(path, copy)
        os.replace(copy, path)
        os.utime(path, ns=(1, 1))
    assert stale_reason(audited["out"], _now(audited)) is None


def test_a_kept_model_changed_computes_it_again(audited: dict[str, Any]) -> None:
    model = audited["canary"] / "models" / "client_0" / "private.safetensors"
    model.write_bytes(b"other weights")
    reason = stale_reason(audited["out"], _now(audited))
    assert reason == f"the files of {audited['canary']} changed"


def test_a_new_file_in_a_run_computes_it_again(audited: dict[str, Any]) -> None:
    (audited["runs"][1] / "models" / "client_1").mkdir()
    (audited["runs"][1] / "models" / "client_1" / "proxy.safetensors").write_bytes(b"w")
    assert stale_reason(audited["out"], _now(audited)) == (
        f"the files of {audited['runs'][1]} changed")  # fmt: skip


def test_a_store_relabelled_computes_it_again(audited: dict[str, Any]) -> None:
    store = next(audited["data"].glob("*.h5"))
    with h5py.File(store, "a") as h5:
        labels = h5["train"]["labels"]
        labels[0] = 1 - labels[0]
    assert stale_reason(audited["out"], _now(audited)) == "its stores changed"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"options": AuditOptions(reference_models=4)}, "its options changed"),
        ({"canary_runs": []}, "its runs changed"),
    ],
)
def test_other_settings_or_runs_compute_it_again(
    audited: dict[str, Any], change: dict[str, Any], reason: str
) -> None:
    assert stale_reason(audited["out"], _now(audited, **change)) == reason


def test_an_audit_file_not_the_recorded_one_or_unrecorded_is_computed_again(
    audited: dict[str, Any],
) -> None:
    out = audited["out"]
    out.write_text('{"rows": [1]}')
    assert stale_reason(out, _now(audited)) == f"{out} is not the file its record describes"
    forget_inputs(out)
    assert not inputs_path(out).exists()
    assert "no readable record" in str(stale_reason(out, _now(audited)))
    out.unlink()
    assert stale_reason(out, _now(audited)) == f"no {out} yet"


def test_the_record_names_what_decided_the_audit(audited: dict[str, Any]) -> None:
    record = json.loads(inputs_path(audited["out"]).read_text())
    inputs = record["inputs"]
    assert set(inputs) == {"options", "runs", "files", "stores", "code", "libraries", "kernels"}
    assert inputs["kernels"] == in_effect()  # this process's pin ({}: native)
    assert inputs["runs"] == [*map(str, audited["runs"]), str(audited["canary"])]
    assert inputs["libraries"]["torch"] and len(inputs["stores"]) == 2
    assert record["audit"].startswith("sha256:")


def test_an_audit_that_found_a_violation_is_never_kept(audited: dict[str, Any]) -> None:
    """Its inputs go unrecorded, so the next run computes it again and fails again, where a
    kept one would pass in silence; a clean one is recorded."""
    from analysis.audit.runs import AuditViolation
    from camelyon_proxyfl.params.audit import AuditSection
    from tasks.audit import audit_file

    section = AuditSection(out=audited["out"], reference_models=2)
    row = {"run": "canary", "method": "ProxyFL", "seed": 0, "client": 0,
           "evaluated_model": "proxy", "privacy_notion": "sample_dp",
           "epsilon_lower_bound": 3.0, "epsilon_accounted": 2.0}  # fmt: skip
    with pytest.raises(AuditViolation):
        audit_file.fn([row], section, _now(audited))
    assert json.loads(audited["out"].read_text())["violations"]  # the evidence, kept
    assert stale_reason(audited["out"], _now(audited)) is not None
    audit_file.fn([{**row, "epsilon_lower_bound": 1.0}], section, _now(audited))
    assert stale_reason(audited["out"], _now(audited)) is None


def test_the_report_says_an_audit_is_stale_when_a_run_it_read_changed(
    audited: dict[str, Any],
) -> None:
    """The issue's case: a kept model changed (or a run record, or gone) after the audit
    was written; the report's audit section says it is stale, naming the file, instead of
    showing the old verdict as current. A run's log growing is not a change of what the
    audit read."""
    from analysis.audit.record import changed_since_audit
    from analysis.report.audit import audit_markdown
    from analysis.report.write import _read_audit

    out, run = audited["out"], audited["runs"][0]
    (run / "job.log").write_text("=== another launch, which kept the run ===\n")
    assert changed_since_audit(out) is None
    current = _read_audit(out)
    assert current is not None and current.stale is None
    assert "Stale" not in audit_markdown(current)

    model = run / "models" / "client_0" / "private.safetensors"
    model.write_bytes(b"retrained")
    assert changed_since_audit(out) == f"{model} changed since the audit"
    stale = _read_audit(out)
    assert stale is not None and stale.stale == f"{model} changed since the audit"
    said = (f"**Stale**: {model} changed since the audit: its rows are of the runs as they "
            "were; run the audit again (`python -m flows.audit`)")  # fmt: skip
    assert said in audit_markdown(stale)
    model.unlink()
    assert changed_since_audit(out) == f"{model} is gone since the audit"
    model.write_bytes(b"weights")
    (run / "run.json").write_text('{"status": "finished", "world_size": 5}')
    assert changed_since_audit(out) == f"{run / 'run.json'} changed since the audit"
    (run / "run.json").write_text('{"status": "finished"}')
    assert changed_since_audit(out) is None
    out.write_text('{"rows": [], "notes": {}}')
    assert (
        changed_since_audit(out)
        == f"{out} is not the file its record ({inputs_path(out)}) describes"
    )
