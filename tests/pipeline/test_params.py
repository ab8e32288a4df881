"""The two configurations: same keys, both valid; the pipeline refuses bad ones up front."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from camelyon_proxyfl.params.whole import load_params
from flows.pipeline import main
from tests.pipeline.conftest import REPO, tiny_params, tiny_params_under, write_params
from wsi.synth import SynthManifest


def _keys(mapping: dict[str, Any], prefix: str = "") -> set[str]:
    keys = set()
    for key, value in mapping.items():
        keys.add(prefix + key)
        if isinstance(value, dict) and all(isinstance(k, str) for k in value):  # a section
            keys |= _keys(value, f"{prefix}{key}.")
    return keys


def test_paper_and_demo_parameters_have_the_same_keys_and_both_validate() -> None:
    demo = yaml.safe_load((REPO / "params.yaml").read_text())
    paper = yaml.safe_load((REPO / "params-paper.yaml").read_text())
    assert _keys(demo) == _keys(paper)
    # the switch does not rebuild the synthetic slides (dvc repro's synth stage)
    assert paper["data"]["synth"] == demo["data"]["synth"]
    load_params(REPO / "params.yaml").check_pipeline("params.yaml")
    config = load_params(REPO / "params-paper.yaml")
    config.check_pipeline("params-paper.yaml")
    # the paper's histopathology setting (docs/algorithms.md §4)
    options = config.train.options
    assert (options.rounds, options.batch_size, options.lr) == (30, 32, 1e-3)
    assert (options.sigma, options.clip, options.delta) == (1.4, 0.7, 1e-5)
    assert options.dml_alpha == options.dml_beta == 0.3 and options.input_size is None
    assert config.preprocess.patch_size == 512 and len(config.train.seeds) == 15
    # Table 1 of the paper: train + test patches per class, per client
    per_class = config.preprocess.patches_per_class
    assert {c: per_class[c] for c in range(4)} == {0: 1517, 1: 1701, 2: 1834, 3: 1861}
    assert config.train.centers == config.preprocess.centers == [0, 1, 2, 3]
    assert "PrivateKT" not in config.train.algorithms  # the paper's seven


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda p: p["train"]["options"].update(sigma=-1.0), "sigma"),
        (lambda p: p["train"].update(algorithms=["FedProx"]), "algorithms"),
        (lambda p: p["train"].update(centers=[0, 5]), "train.centers"),
        (lambda p: p["train"].update(data="elsewhere"), "preprocess.out"),
        (lambda p: p["preprocess"].update(patch_size=2), "patch_size"),
        (lambda p: p["preprocess"].update(patches_per_class={0: 5}), "no number for centre"),
        (lambda p: p["preprocess"].update(shortfall="shrug"), "shortfall"),
        (
            lambda p: (
                p["train"].update(algorithms=["PrivateKT"]),
                p["train"]["options"].update(public_pool="center"),
            ),
            "public pool",
        ),
    ],
)
def test_the_pipeline_refuses_bad_parameters_before_any_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: Any, expected: str
) -> None:
    params = tiny_params(preprocess__out=tmp_path / "patches", train__data=tmp_path / "patches")
    change(params)
    params_file = write_params(tmp_path / "params.yaml", params)
    assert main(["--config", str(params_file)]) == 2
    error = capsys.readouterr().err
    assert str(params_file) in error and expected in error
    assert not (tmp_path / "patches").exists()


def test_a_missing_parameters_file_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--config", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml: no such parameters file" in capsys.readouterr().err


def test_a_missing_real_data_root_is_named_with_its_fix_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flows.preprocess import main as preprocess_main

    root = tmp_path / "camelyon17"  # not data/synthetic: nothing writes it for the user
    out = tmp_path / "patches"
    assert preprocess_main(["--data-root", str(root), "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert f"{root}: no such directory" in error and "set data.root" in error
    assert not out.exists()


@pytest.mark.slow
def test_a_centre_that_falls_short_stops_the_pipeline_before_training(
    synthetic_dataset: SynthManifest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    params = tiny_params_under(tmp_path, synthetic_dataset.root)
    params["preprocess"]["patches_per_class"] = 100_000
    assert main(["--config", str(write_params(tmp_path / "params.yaml", params))]) == 1
    assert "centre 0" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results").exists()
