"""What a run directory holds, and what a launch may do with it.

A run directory ``RUNS/{algorithm}/seed_{s}`` is one run: ``run.json`` records the
configuration that made it (:meth:`~proxyfl.config.TrainConfig.fingerprint` and its
digest), ``inputs.json`` the stores it was launched on (and a canary run's plan), by
content (:func:`run_inputs`, written by the launcher: no rank reads another centre's
training split, nor any label of PrivateKT's public pool). Before a job is launched into
it, :func:`plan_launch` compares that record with the job:

- nothing there: **start**;
- an unfinished run of the same configuration: **resume** it (its stores changed since:
  start over, its checkpoints were trained on the old ones);
- a finished run of the same configuration and stores: **keep** it, no job (with
  ``replace``: train it again beside it, then swap);
- a finished run of the same configuration whose stores changed, or whose kept models
  no longer match the digests recorded when they were written (:mod:`proxyfl.kept`):
  train it again beside it, then swap (it is stale, or damaged);
- a run of another configuration, or one that recorded none: **refuse**
  (:class:`RunConflict`); with ``replace``, a finished one is trained again beside it and
  swapped, an unfinished one starts over.

"Beside it" is ``.seed_{s}.next`` in the same folder: the finished run stays whole and
reportable until the new one has finished, and :func:`publish_staged` then swaps the two
(a swap cut short is completed by the next :func:`plan_launch`). A launch that fails its
checks therefore never touches a finished run. No torch here: the flows import it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from plumbing.atomic import parse_temporary, remove_stale_temporaries, write_json, write_text
from plumbing.errors import PipelineError
from plumbing.locks import exclusive
from plumbing.verified import DamagedFileError, record_digest, verify
from proxyfl.config import TrainConfig, fingerprint_changes
from proxyfl.kept import damaged_files
from proxyfl.results import RUN_FILE, json_safe
from wsi.store.digest import store_digest
from wsi.store.schema import StoreError, store_path

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
INPUTS_FILE = "inputs.json"


class RunState(Enum):
    ABSENT = "absent"
    UNFINISHED = "unfinished"
    FINISHED = "finished"


@dataclass(frozen=True)
class RecordedRun:
    """What a run directory says of itself: its state, the configuration fingerprint and
    inputs it recorded (``None`` where it recorded none)."""

    path: Path
    state: RunState
    fingerprint: dict[str, Any] | None = None
    inputs: dict[str, str] | None = None


class RunConflict(PipelineError):
    """A launch would replace a run made with another configuration; the message names the
    directory, the keys that differ and the two ways on."""


class Action(Enum):
    START = "start"  # nothing there: train from round 1
    RESUME = "resume"  # the same configuration, unfinished: continue
    KEEP = "keep"  # finished with this configuration and these inputs: nothing to do
    REPLACE = "replace"  # train beside the finished run, swap on success
    RESTART = "restart"  # an unfinished run of another configuration, replaced: start over


@dataclass(frozen=True)
class LaunchPlan:
    """What to do with ``run_dir``: ``action``, the directory the job trains in (``work``:
    the run directory, or its staging directory for REPLACE), why, in one sentence, and
    the job's inputs (:func:`run_inputs`), which :func:`prepare` records there."""

    run_dir: Path
    action: Action
    work: Path
    reason: str
    inputs: dict[str, str] = field(default_factory=dict)


def staging_dir(run_dir: Path) -> Path:
    """Where a replacement of ``run_dir`` trains: ``.{name}.next`` beside it."""
    return run_dir.parent / f".{run_dir.name}.next"


def pending_replacement(run_dir: Path) -> str:
    """A note on a replacement of ``run_dir`` that was interrupted and waits beside it
    (``.seed_s.next``, checkpoints and all: ~2 GB at the paper's scale), or ``""``."""
    staged = staging_dir(run_dir)
    if not staged.is_dir():
        return ""
    size = _megabytes(staged)
    return (f"; an interrupted replacement of it waits in {staged} ({size:.1f} MB): "
            f"--replace resumes it, --discard-staged deletes it")  # fmt: skip


def _megabytes(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e6


def discard_staged(run_dir: Path) -> float | None:
    """Delete the interrupted replacement of ``run_dir`` waiting beside it, holding the run
    directory's lock (:class:`~plumbing.locks.Busy` while a launch trains into it); the
    megabytes freed, or ``None`` when none waits."""
    staged = staging_dir(run_dir)
    if not staged.is_dir():
        return None
    with exclusive([run_dir], "discarding the interrupted replacement of"):
        size = _megabytes(staged)
        shutil.rmtree(staged)
    return size


def _retired_dir(run_dir: Path) -> Path:
    return run_dir.parent / f".{run_dir.name}.old"


def read_centers(config: TrainConfig) -> list[int]:
    """Every centre whose store the job reads: the clients', those evaluated on only
    (``eval_centers``) and PrivateKT's public pool."""
    centers = [*(config.centers or []), *(config.eval_centers or [])]
    public = config.public_store_center
    if public is not None and public not in centers:
        centers.append(public)
    return centers


def run_inputs(config: TrainConfig) -> dict[str, str]:
    """What the job trains on, by content: ``{"center_{c}": store_digest}`` of every
    store it reads, PrivateKT's public pool without its labels, and for a canary run
    ``{"canaries": digest}`` of its plan (:class:`~wsi.store.schema.StoreError` if a store
    cannot be read)."""
    data, _ = config.require_paths()
    public = config.public_store_center
    inputs = {}
    for center in read_centers(config):
        try:
            inputs[f"center_{center}"] = store_digest(store_path(data, center), center != public)
        except StoreError as error:
            raise error.with_rebuild_hint(center) from None
    # a canary plan's path is in the fingerprint, its content here (one that does not
    # read is left to the ranks, which fail on it naming the file)
    if config.canaries is not None and Path(config.canaries).is_file():
        plan = Path(config.canaries).read_bytes()
        inputs["canaries"] = "sha256:" + hashlib.sha256(plan).hexdigest()
    return inputs


def holds_another_configuration(config: TrainConfig) -> bool:
    """Whether ``config.run_dir`` holds a run (finished or not) of another configuration,
    or one that recorded none: what a launch without ``replace`` refuses."""
    _, run_dir = config.require_paths()
    recorded = read_recorded_run(run_dir)
    return recorded.state is not RunState.ABSENT and configuration_changes(recorded, config) != {}


def read_recorded_run(run_dir: Path) -> RecordedRun:
    """The state of ``run_dir`` from its ``run.json`` (else its ``config.json``: a launch
    whose ranks never started training); an empty or absent directory is ABSENT."""
    run_dir = Path(run_dir)
    # a launch cut short before its job wrote anything leaves its inputs.json alone, and
    # one killed inside an atomic write (of inputs.json, config.json) a temporary: neither
    # records a run (the launch that resumes here removes the dead writers' temporaries)
    if not run_dir.is_dir() or _records(run_dir) <= {INPUTS_FILE}:
        return RecordedRun(run_dir, RunState.ABSENT)
    inputs = _json_object(run_dir / INPUTS_FILE)
    run = _json_object(run_dir / RUN_FILE)
    if run is not None:
        state = RunState.FINISHED if run.get("status") == "finished" else RunState.UNFINISHED
        fingerprint = run.get("fingerprint")
        return RecordedRun(
            run_dir, state, fingerprint if isinstance(fingerprint, dict) else None, inputs
        )
    config = _json_object(run_dir / CONFIG_FILE)
    fingerprint = None
    if config is not None:
        try:
            fingerprint = TrainConfig.model_validate(config).fingerprint()
        except ValueError:
            fingerprint = None
    return RecordedRun(run_dir, RunState.UNFINISHED, fingerprint, inputs)


def _records(run_dir: Path) -> set[str]:
    """The names in ``run_dir`` but the temporaries of atomic writes."""
    return {p.name for p in run_dir.iterdir() if parse_temporary(p) is None}


def _json_object(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def describe_changes(changes: dict[str, tuple[Any, Any]]) -> str:
    """``rounds 10 -> 5, sigma 1.4 -> 1.0`` (recorded -> asked)."""
    return ", ".join(f"{key} {json.dumps(old)} -> {json.dumps(new)}"
                     for key, (old, new) in changes.items())  # fmt: skip


def configuration_changes(recorded: RecordedRun, config: TrainConfig) -> dict[str, Any] | None:
    """The keys in which ``config`` differs from the recorded run (``None``: the run
    recorded no configuration that can be compared)."""
    if recorded.fingerprint is None:
        return None
    current = json.loads(json.dumps(config.fingerprint()))
    return fingerprint_changes(recorded.fingerprint, current)


def conflict_message(state: RunState, changes: dict[str, Any] | None) -> str:
    """Why a launch is refused (the subject, the run directory, is the error's)."""
    what = "a finished run" if state is RunState.FINISHED else "an unfinished run"
    differs = (
        f"made with another configuration ({describe_changes(changes)}; recorded -> asked)"
        if changes
        else "whose configuration was not recorded"
    )
    return (
        f"holds {what} {differs}; it is left as it is. Either train into another runs "
        f"directory (--runs DIR, train.runs), or replace it with --replace (a finished run "
        f"stays until the new one has finished)"
    )


def check_launch(config: TrainConfig, replace: bool) -> RecordedRun:
    """The run directory's record, or :class:`RunConflict` when the job would replace a
    run of another configuration without ``replace``. Reads no store."""
    _, run_dir = config.require_paths()
    recorded = read_recorded_run(run_dir)
    if recorded.state is RunState.ABSENT or replace:
        return recorded
    changes = configuration_changes(recorded, config)
    if changes is None or changes:
        raise RunConflict(run_dir, conflict_message(recorded.state, changes))
    return recorded


def plan_launch(config: TrainConfig, replace: bool = False) -> LaunchPlan:
    """What a launch of ``config`` does with its run directory (the table above).

    Raises :class:`RunConflict` for a run of another configuration without ``replace``,
    and :class:`~wsi.store.schema.StoreError` when a store the job reads cannot be read."""
    _, run_dir = config.require_paths()
    _complete_interrupted_swap(run_dir)
    recorded = check_launch(config, replace)
    if recorded.state is RunState.ABSENT:
        return LaunchPlan(run_dir, Action.START, run_dir,
                          "no run there yet" + pending_replacement(run_dir),
                          run_inputs(config))  # fmt: skip
    changes = configuration_changes(recorded, config)
    same = changes == {}
    inputs = run_inputs(config)
    if recorded.state is RunState.UNFINISHED:
        if same and recorded.inputs in (None, inputs):
            return LaunchPlan(run_dir, Action.RESUME, run_dir, "an unfinished run of this "
                              "configuration: resuming it", inputs)  # fmt: skip
        if same:
            stale = _changed_inputs(recorded.inputs, inputs)
            reason = f"an unfinished run whose stores have changed since ({stale}): starting over"
        else:
            reason = "an unfinished run of another configuration, replaced: starting over"
        return LaunchPlan(run_dir, Action.RESTART, run_dir, reason, inputs)
    if changes is None:
        reason = "replacing a finished run whose configuration was not recorded"
    elif changes:
        reason = f"replacing a finished run of another configuration ({describe_changes(changes)})"
    elif recorded.inputs != inputs:
        stale = _changed_inputs(recorded.inputs, inputs)
        reason = f"the stores it was trained on have changed since ({stale}): training it again"
    elif replace:
        reason = "finished with this configuration; training it again (--replace)"
    elif damaged := damaged_files(run_dir):
        reason = f"finished, but its files do not verify ({damaged[0]}): training it again"
    else:
        reason = ("finished with this configuration and these stores: kept (--replace trains "
                  "it again)" + pending_replacement(run_dir))  # fmt: skip
        return LaunchPlan(run_dir, Action.KEEP, run_dir, reason, inputs)
    reason += "; the finished run stays until the new one has finished"
    return LaunchPlan(run_dir, Action.REPLACE, staging_dir(run_dir), reason, inputs)


def _changed_inputs(recorded: dict[str, str] | None, current: dict[str, str]) -> str:
    if recorded is None:
        return "the run recorded none"
    changed = sorted(k for k in set(recorded) | set(current) if recorded.get(k) != current.get(k))
    return ", ".join(changed)


def prepare(plan: LaunchPlan, config: TrainConfig) -> None:
    """Make ``plan.work`` ready for the job: emptied where the job starts over (RESTART; a
    REPLACE whose staging directory holds anything but an unfinished run of ``config``,
    which resumes: a replacement interrupted and launched again continues)."""
    if plan.action is Action.RESTART:
        shutil.rmtree(plan.work)
    elif plan.action is Action.REPLACE and plan.work.exists():
        staged = read_recorded_run(plan.work)
        resumable = staged.state is RunState.UNFINISHED and staged.inputs in (None, plan.inputs)
        if not resumable or configuration_changes(staged, config) != {}:
            shutil.rmtree(plan.work)
    plan.work.mkdir(parents=True, exist_ok=True)
    # A job killed part-way may have been inside an atomic write (a rank's record, the
    # metrics, a model): its temporary would outlive the run that resumes here
    for directory in [plan.work, *sorted(d for d in plan.work.rglob("*") if d.is_dir())]:
        remove_stale_temporaries(directory)
    write_json(plan.work / INPUTS_FILE, plan.inputs, sort_keys=True)


def write_config(config: TrainConfig) -> Path:
    """``run_dir/config.json``: the configuration the job's ranks run with."""
    _, run_dir = config.require_paths()
    path = run_dir / CONFIG_FILE
    write_text(path, config.model_dump_json(indent=2) + "\n")
    return path


def publish_staged(run_dir: Path) -> None:
    """Swap a finished staged run into ``run_dir``: the old run is renamed aside, the new
    one into place, then the old one removed. Its files are rewritten to name their
    directory. A swap cut short is completed by :func:`plan_launch`."""
    staged, retired = staging_dir(run_dir), _retired_dir(run_dir)
    if retired.exists():
        shutil.rmtree(retired)
    if run_dir.exists():
        os.replace(run_dir, retired)
    os.replace(staged, run_dir)
    _relocate(run_dir)
    shutil.rmtree(retired, ignore_errors=True)
    logger.info("%s: the new run is in place", run_dir)


def _complete_interrupted_swap(run_dir: Path) -> None:
    staged, retired = staging_dir(run_dir), _retired_dir(run_dir)
    if not run_dir.exists() and staged.is_dir():
        if read_recorded_run(staged).state is RunState.FINISHED:
            logger.warning("%s: completing a replacement that was cut short", run_dir)
            os.replace(staged, run_dir)
            _relocate(run_dir)
        elif retired.is_dir():  # the old run was moved aside before the new one finished
            os.replace(retired, run_dir)
    if run_dir.exists() and retired.exists():
        shutil.rmtree(retired, ignore_errors=True)


def _relocate(run_dir: Path) -> None:
    """Point a moved run's ``config.json`` and ``run.json`` at ``run_dir``."""
    config = _json_object(run_dir / CONFIG_FILE)
    if config is not None:
        try:
            write_config(TrainConfig.model_validate({**config, "run_dir": str(run_dir)}))
        except ValueError:
            logger.warning("%s: not a job configuration, left as it is", run_dir / CONFIG_FILE)
    path = run_dir / RUN_FILE
    run = _json_object(path)
    if run is not None and isinstance(run.get("config"), dict):
        # its digest follows the rewrite only if the file verified before it: a damaged
        # record stays one
        try:
            verify(path, "")
            intact = True
        except DamagedFileError:  # no record, or not the bytes recorded
            intact = False
        run["config"].pop("out", None)  # run_dir's former name
        run["config"]["run_dir"] = str(run_dir)
        write_json(path, json_safe(run))
        if intact:
            record_digest(path)
