"""A job submitted to a running federation: what each site keeps, and what leaves it.

Under ``train.launcher: flare`` on one machine every rank runs in the launch's folder, its
stores and its run directory shared. Across hospitals there is no shared folder: each
site is started (``camelyon-proxyfl sites start KIT``) with its own :class:`SiteFolders`,
the folder of its centre's store and the folder its runs land in. The job carries its
configuration as JSON (:data:`CONFIG`), validated again at each site, and the run's name
(``ALGORITHM/seed_S``, :data:`RUN_NAME`); a site trains its rank in ``RUNS/RUN_NAME``
with ``data`` its own.

What leaves a site once its rank has ended is :func:`results_that_leave`: the run's
records and the rank's, which hold numbers and names only (metrics, ε, every message's
digest, the machine's timings, a failure's one line). The models, the predictions (one
line per test patch), the checkpoints and the store stay at the site.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from plumbing.atomic import write_bytes
from proxyfl.comm.graphs import (
    graph_matrices,
    matrices_digest,
    matrices_json,
    matrices_lists,
    parse_schedule_spec,
)
from proxyfl.config import TrainConfig
from proxyfl.engine.validation import FAILURES_DIR
from proxyfl.launch.rundir import CONFIG_FILE, write_config
from proxyfl.results import MACHINE_FILE, METRICS_FILE, RUN_FILE

# the task's keys of a federation job (in place of the local launcher's arguments)
CONFIG = "config"  # the run's TrainConfig as JSON; its data and run_dir are the site's
RUN_NAME = "run_name"  # the run directory under each site's runs folder
RESULTS = "results"  # a site's answer: {relative path: bytes} of results_that_leave
REPLACE = "replace"  # the site's run of that name, of another configuration, trained anew
# a `file:` graph's matrices, read where the job was submitted: a site reads no file a job
# names (its path is the administrator's), but writes them into its own runs folder
GRAPH = "graph"
GRAPHS_FOLDER = ".graphs"  # RUNS/.graphs/SHA256.json: the graphs of the jobs a site ran
# how `sites start` tells a site's FLARE processes (and so their job processes) its folders
DATA_ENV = "PROXYFL_SITE_DATA"
RUNS_ENV = "PROXYFL_SITE_RUNS"
_NAME_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
_RANK_IN_NAME = re.compile(r"/rank_(\d+)\.")  # ranks/rank_1.json, failures/rank_1.json
_DIGESTED = (RUN_FILE, METRICS_FILE)  # each with its NAME.sha256 (plumbing.verified)


class FederationError(ValueError):
    """A federation task this site cannot run: the line says why."""


def checked_run_name(name: str) -> str:
    """``name`` if it is a relative path of plain parts (``FedAvg/seed_0``): a run name from
    the server never points outside the site's runs folder."""
    parts = name.split("/")
    if not name or not all(_NAME_PART.fullmatch(part) for part in parts):
        raise FederationError(f"{name!r} is not a run name (ALGORITHM/seed_S: plain names "
                              "joined by /)")  # fmt: skip
    return name


def carried_graph(config: TrainConfig) -> list[list[list[float]]] | None:
    """What a federation's job carries of ``config``'s graph (:data:`GRAPH`): a ``file:``
    graph's matrices, read on the submitting machine; ``None`` for a built-in graph."""
    if not config.graph.startswith("file:"):
        return None
    return matrices_lists(parse_schedule_spec(config.graph).matrices)


@dataclass(frozen=True)
class SiteFolders:
    """A site's own folders, absolute: ``data`` holds its centre's store, ``runs`` the
    runs it takes part in."""

    data: Path
    runs: Path

    def environment(self) -> dict[str, str]:
        return {DATA_ENV: str(self.data), RUNS_ENV: str(self.runs)}

    @classmethod
    def from_environment(cls, env: Mapping[str, str] = os.environ) -> SiteFolders:
        if not env.get(DATA_ENV) or not env.get(RUNS_ENV):
            raise FederationError(
                "this site was started without its folders: start it with `camelyon-proxyfl "
                "sites start KIT` in its project (or give --data and --runs)"
            )  # fmt: skip
        return cls(Path(env[DATA_ENV]), Path(env[RUNS_ENV]))

    def run_config(self, config_json: str, run_name: str, graph: object = None) -> TrainConfig:
        """The job's configuration at this site: ``config_json`` validated, every path in
        it this site's: its stores, its run directory (one run's, neither inside another
        run nor holding one) and torch.compile's cache (the default, in the site's
        project) whatever the job said. A ``file:`` graph is the matrices the job carries
        (``graph``, :func:`carried_graph`), written into this site's runs folder: the
        path the job names is never read here. A canary plan, a file of the
        administrator's, is refused (a canary run has no federated form)."""
        values = json.loads(config_json)
        if not isinstance(values, dict):
            raise FederationError("the job's configuration is not a JSON object")
        if values.get("canaries") is not None:
            raise FederationError("the job names a canary plan (a file of the administrator's):"
                                  " a canary run has no federated form")  # fmt: skip
        values.pop("compile_cache", None)
        run_dir = self._one_runs_folder(checked_run_name(run_name))
        spec = values.get("graph")
        if isinstance(spec, str) and spec.startswith("file:"):
            if graph is None:
                raise FederationError(
                    f"the job's graph is a file of the administrator's ({spec}) and the job "
                    "carries no matrices: a site reads no file a job names (`sites submit` "
                    "carries them)"
                )  # fmt: skip
            values["graph"] = f"file:{self._graph_file(graph)}"
        elif graph is not None:
            raise FederationError(f"the job carries a graph's matrices for the graph {spec!r}")
        values.update(data=str(self.data), run_dir=str(run_dir))
        return TrainConfig.model_validate(values)

    def _one_runs_folder(self, run_name: str) -> Path:
        """``RUNS/RUN_NAME``, unless it lies in another run's folder or holds other runs
        (a run name of one part, ``ProxyFL``, would mix its rank's files with every seed's,
        and ``replace`` would delete them all)."""
        run_dir = self.runs / run_name
        for folder in Path(run_name).parents:
            if folder != Path(".") and (self.runs / folder / CONFIG_FILE).is_file():
                raise FederationError(f"{run_name!r} lies in this site's run {folder}: a run "
                                      "name names a run folder of its own")  # fmt: skip
        if run_dir.is_dir():
            inner = next((found.parent for found in run_dir.rglob(CONFIG_FILE)
                          if found.parent != run_dir), None)  # fmt: skip
            if inner is not None:
                raise FederationError(
                    f"{run_name!r} holds this site's run {inner.relative_to(self.runs)}: a run "
                    "name names one run (ALGORITHM/seed_S)"
                )  # fmt: skip
        return run_dir

    def _graph_file(self, graph: object) -> Path:
        """The job's carried graph matrices, checked as a graph file's are, in
        ``RUNS/.graphs/SHA256.json`` (:func:`~proxyfl.comm.graphs.matrices_digest`: a
        resumed job's is the same file)."""
        try:
            matrices = graph_matrices(graph, "the job's graph")
        except ValueError as error:
            raise FederationError(str(error)) from error
        path = self.runs / GRAPHS_FOLDER / f"{matrices_digest(matrices)}.json"
        if not path.is_file():
            write_bytes(path, matrices_json(matrices).encode())
        return path

    @staticmethod
    def configured(env: Mapping[str, str] = os.environ) -> bool:
        """Whether this process is a federation's site (``sites start`` gave it folders)."""
        return bool(env.get(DATA_ENV) and env.get(RUNS_ENV))

    def write_run_config(
        self, config_json: str, run_name: str, replace: bool = False, graph: object = None
    ) -> Path:
        """``RUNS/RUN_NAME/config.json`` of :meth:`run_config`, for the rank program;
        ``replace``: whatever the site's run of that name held is deleted first (else a run
        of another configuration is refused by the rank, and an unfinished one resumes)."""
        config = self.run_config(config_json, run_name, graph)
        if replace and config.run_dir is not None:
            shutil.rmtree(config.run_dir, ignore_errors=True)
        return write_config(config)


def names_that_leave(rank: int) -> list[str]:
    """The files, relative to the run directory, that rank ``rank``'s site may send back
    (module doc): the rank's ``ranks/rank_R.json`` and ``.machine.json`` and its failure
    record; rank 0's also ``run.json``, ``metrics.jsonl`` (each with its digest) and
    ``machine.json``, which rank 0 writes for the run."""
    names = [f"ranks/rank_{rank}.json", f"ranks/rank_{rank}.machine.json",
             f"{FAILURES_DIR}/rank_{rank}.json"]  # fmt: skip
    if rank == 0:
        names += [MACHINE_FILE, *_DIGESTED, *(f"{name}.sha256" for name in _DIGESTED)]
    return sorted(names)


def results_that_leave(run_dir: Path, rank: int, finished: bool = True) -> dict[str, bytes]:
    """The files of ``run_dir`` among :func:`names_that_leave` that exist, by name; of a
    rank that did not finish, its failure record alone: the run's other records at the
    site may be an earlier run's (one of another configuration, which the rank refused),
    and would be written beside this job's configuration."""
    names = names_that_leave(rank) if finished else [f"{FAILURES_DIR}/rank_{rank}.json"]
    return {name: (run_dir / name).read_bytes() for name in names
            if (run_dir / name).is_file()}  # fmt: skip


def checked_results(results: Mapping[str, bytes], rank: int) -> dict[str, bytes]:
    """``results`` as rank ``rank``'s site sent them, each a file that rank may send
    (:func:`names_that_leave`): a site never writes another rank's records."""
    allowed = set(names_that_leave(rank))
    if not isinstance(results, Mapping) or not all(
        isinstance(name, str) and name in allowed and isinstance(data, bytes)
        for name, data in results.items()
    ):  # fmt: skip
        raise FederationError(f"rank {rank}'s site sent back files it does not write: "
                              f"{sorted(map(str, results))[:5]}")  # fmt: skip
    return dict(results)


def write_results(run_dir: Path, results: Mapping[str, bytes]) -> list[str]:
    """Each of ``results`` (:func:`results_that_leave`, from the sites) written into
    ``run_dir``, atomically; the names written. A name that no rank's site sends
    (:func:`names_that_leave` of the rank it names, else of rank 0) is refused."""
    for name in results:
        named = _RANK_IN_NAME.search(name)
        if name not in names_that_leave(int(named.group(1)) if named else 0):
            raise FederationError(f"{name!r} is not a file a site sends back")
    for name, data in sorted(results.items()):
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        write_bytes(run_dir / name, data)
    return sorted(results)
