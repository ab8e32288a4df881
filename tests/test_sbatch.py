"""``camelyon-proxyfl sbatch``: the batch script of the training, from params.yaml and the
cluster's shape; tests/slurm/test_slurm.py submits what it writes to a Slurm cluster."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from camelyon_proxyfl.sbatch import (
    BatchShape,
    ScriptError,
    cluster_problems,
    main,
    script,
    with_launcher,
)

REPO = Path(__file__).resolve().parents[1]


def test_one_gpu_a_rank_is_bound_by_slurm_and_shared_gpus_are_asked_per_node() -> None:
    bound = BatchShape(ranks=4, gpus_per_node=4).directives()
    assert "#SBATCH --gpus-per-task=1" in bound and "#SBATCH --ntasks=4" in bound
    shared = BatchShape(ranks=4, gpus_per_node=2, ranks_per_gpu=2).directives()
    assert "#SBATCH --gpus-per-node=2" in shared and not any("per-task" in d for d in shared)
    spread = BatchShape(ranks=5, nodes=2, gpus_per_node=4)
    assert spread.tasks_per_node == 3 and "#SBATCH --ntasks-per-node=3" in spread.directives()
    cpu = BatchShape(ranks=4).directives()
    assert not any("gpu" in d for d in cpu) and not any("cpus-per-task" in d for d in cpu)


@pytest.mark.parametrize(
    ("shape", "said"),
    [(BatchShape(ranks=4, gpus_per_node=2), "need 4 GPU(s) a node, and a node has 2"),
     (BatchShape(ranks=2, nodes=3), "--nodes 3 for 2 rank(s)"),
     (BatchShape(ranks=2, time="12h"), "--time '12h'")],
)  # fmt: skip
def test_a_shape_slurm_could_not_start_is_refused(shape: BatchShape, said: str) -> None:
    assert any(said in problem for problem in shape.problems()), shape.problems()


def test_the_cluster_check_counts_the_nodes_that_hold_a_node_of_the_job() -> None:
    shape = BatchShape(ranks=4, nodes=2, gpus_per_node=2, cpus_per_task=8)  # 16 CPUs, 2 GPUs
    assert cluster_problems(shape, [(16, 2), (32, 4)]) == []
    refused = cluster_problems(shape, [(16, 2), (8, 4)])
    assert refused and "1 of the 2 node(s)" in refused[0] and "for ever" in refused[0]
    overcommitted = BatchShape(ranks=4, nodes=2, gpus_per_node=2, cpus_per_task=8,
                               overcommit=True)  # fmt: skip
    assert cluster_problems(overcommitted, [(2, 2), (2, 2)]) == []
    assert "no node" in cluster_problems(shape, [])[0]


def test_the_train_flow_gets_srun_and_other_commands_need_it_in_the_parameters() -> None:
    assert with_launcher(["python", "-m", "flows.train"], "mpiexec") == [
        "python", "-m", "flows.train", "--launcher", "srun"]  # fmt: skip
    given = ["camelyon-proxyfl", "train", "--launcher", "srun"]
    assert with_launcher(given, "mpiexec") == given
    assert with_launcher(["dvc", "repro"], "srun") == ["dvc", "repro"]
    with pytest.raises(ScriptError, match=r"set train\.launcher: srun"):
        with_launcher(["dvc", "repro"], "mpiexec")


def test_the_docs_show_the_script_the_writer_writes_for_the_papers_configuration() -> None:
    page = (REPO / "docs" / "clusters.md").read_text()
    shown = re.search(r"which writes .*?```bash\n(.*?)```", page, re.S)
    assert shown is not None
    documented = "".join(line.removeprefix("  ") for line in shown.group(1).splitlines(True))
    written = script(BatchShape(ranks=4, gpus_per_node=4, cpus_per_task=8),
                     Path("/shared/camelyon-proxyfl"),
                     with_launcher(["python", "-m", "flows.train"], "mpiexec"))  # fmt: skip
    assert documented == written


def test_bad_options_and_a_missing_parameters_file_are_one_line_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "params.yaml").write_text("")  # an empty one: the built-in defaults, four centres
    monkeypatch.chdir(tmp_path)
    assert main(["--nodes", "0"]) == 2
    assert "--nodes must be at least 1" in capsys.readouterr().err
    assert main(["--gpus-per-node", "1", "--no-cluster-check"]) == 2
    assert "need 4 GPU(s) a node" in capsys.readouterr().err
    assert main(["--config", str(tmp_path / "none.yaml")]) == 2
    assert "none.yaml" in capsys.readouterr().err
    assert main(["--no-cluster-check", "-o", str(tmp_path / "train.sh")]) == 0
    written = (tmp_path / "train.sh").read_text()
    assert "#SBATCH --ntasks=4" in written and written.endswith(
        "python -m flows.train --launcher srun\n")  # fmt: skip
    assert (tmp_path / "train.sh").stat().st_mode & 0o100


def test_from_a_subfolder_the_script_is_the_projects_and_typed_paths_are_the_folders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started below the project's folder, the command reads its params.yaml and runs the
    job there, as from that folder (git's and DVC's walk up); ``-o`` names a file of the
    folder it was typed in. Outside any project it says where it looked, in one line."""
    project = tmp_path / "project"
    (project / "results" / "deeper").mkdir(parents=True)
    (project / "params.yaml").write_text("train:\n  centers: [0, 1]\n")
    monkeypatch.chdir(project)
    assert main(["--no-cluster-check", "-o", "root.sh"]) == 0
    monkeypatch.chdir(project / "results" / "deeper")
    assert main(["--no-cluster-check", "-o", "sub.sh"]) == 0
    written = (project / "results" / "deeper" / "sub.sh").read_text()
    assert written == (project / "root.sh").read_text()
    assert "#SBATCH --ntasks=2" in written and f"cd {project}" in written
    capsys.readouterr()

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    monkeypatch.chdir(outside)
    assert main(["--no-cluster-check"]) == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and str(outside) in said[0] and "params.yaml" in said[0], said
