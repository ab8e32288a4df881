"""flows.processes: pool workers fork from one fork server per process, and start as spawned
ones would: the environment and working folder the pool was opened under, bound to the
process that opened it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prefect import flow, task

from flows.processes import ParentBoundProcessPool

MARK = "CAMELYON_PROXYFL_POOL_TEST"


@task
def where_am_i() -> dict[str, object]:
    return {"pid": os.getpid(), "parent": os.getppid(), "cwd": os.getcwd(),
            "mark": os.environ.get(MARK)}  # fmt: skip


@flow(task_runner=ParentBoundProcessPool(max_workers=2, preload=("json",)))
def two_workers() -> list[dict[str, object]]:
    futures = [where_am_i.submit() for _ in range(4)]
    return [future.result() for future in futures]


def test_workers_fork_from_one_server_with_the_environment_and_folder_of_their_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MARK, "first")
    first = two_workers()
    assert {row["mark"] for row in first} == {"first"}
    assert {row["cwd"] for row in first} == {os.getcwd()}
    assert os.getpid() not in {row["parent"] for row in first}  # forked by the server

    monkeypatch.delenv(MARK)  # after the server started: a worker must not see it
    monkeypatch.chdir(tmp_path)
    second = two_workers()
    assert {row["mark"] for row in second} == {None}
    assert {row["cwd"] for row in second} == {str(tmp_path)}
    # the server outlives the pool and serves the next (the start-up it saves)
    assert {row["parent"] for row in first} == {row["parent"] for row in second}
    assert len({row["pid"] for row in first + second}) >= 2
