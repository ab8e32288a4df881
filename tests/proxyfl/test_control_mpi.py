"""Ranks exchange control messages as JSON in buffers, never pickles (proxyfl.comm.control):
the values arrive whole on every rank under real mpiexec, and no module of proxyfl/
uses mpi4py's pickling calls (the source is scanned, as test_dvc_deps scans imports)."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).with_name("mpi_control_check.py")
PROXYFL = Path(__file__).resolve().parents[2] / "proxyfl"
# mpi4py's lower-case methods pickle their object; the buffer methods are capitalised
PICKLING = {"allgather", "gather", "bcast", "scatter", "send", "recv", "isend", "irecv",
            "sendrecv", "alltoall", "reduce", "allreduce", "ssend", "issend", "mprobe"}  # fmt: skip


def test_every_rank_receives_every_value_whole(helpers: Any, tmp_path: Path) -> None:
    ranks = 3
    result = helpers.run_mpi(ranks, [tmp_path], timeout=120, script=SCRIPT)
    assert result.returncode == 0, helpers.explain(result)
    for rank in range(ranks):
        received = json.loads((tmp_path / f"rank_{rank}.json").read_text())
        assert (received["gather"] is None) is (rank != 0)
        sources = [received["allgather"]] + ([received["gather"]] if rank == 0 else [])
        for values in sources:
            assert [v["rank"] for v in values] == list(range(ranks))
            for k, value in enumerate(values):
                assert value["text"] == "é" * k and value["numpy"] == 0.5 * k
                assert math.isnan(value["nan"]) and value["inf"] == math.inf
                assert value["pair"] == [k, None] and value["rounds"] == list(range(k))


def test_no_module_uses_a_pickling_mpi_call() -> None:
    found = []
    for path in sorted(PROXYFL.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in PICKLING
                and "comm" in ast.unparse(node.func.value)
            ):
                found.append(f"{path.relative_to(PROXYFL.parent)}:{node.lineno}: "
                             f"{ast.unparse(node)}")  # fmt: skip
    assert not found, "pickling MPI calls (use proxyfl.comm.control):\n" + "\n".join(found)
