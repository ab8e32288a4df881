"""``torch.compile`` for a run: when it pays, where its cache lives, and what it compiled.

**When it pays** (``compile: auto``, :func:`compile_pays`). A compiled DML step saves
``s`` seconds on every step and costs ``c`` seconds of compilation once, so it pays when

    steps · s · (pixels of a batch / 512² · 32)  >  c

with ``steps`` the run's training steps (rounds · ⌈N/B⌉ · local epochs), the saving
scaled by the batch's pixels (the step's work) and ``c`` the cold or the warm figure (the
persistent cache below has served these graphs before, or not). The figures are the H100's
(``../shared/gpu``, 2026-11-26/27; GN-ResNet-18, 512 px, batch 32): the DML step eager
≈ 104 ms (plain 30.3 + func bf16 73.6) against 53.6 ms compiled (21.0 + 32.6), so
s = 50 ms, 41 ms for a DP-only method (73.6 - 32.6); a cold compilation of the DML step
took 120 s, the DP step's 54 s; served by the cache, a CPU's took 6.5 % of its cold time
(8.7 s of 133.6 s), counted here as 15 s. A paper run (30 rounds of ⌈2,937/32⌉ = 92 steps)
saves 138 s against 120 s and compiles; the GPU bench's 3-round job (51 steps) saves 2.6 s
and does not, unless told ``compile: on``. On a CPU ``auto`` never compiles (a C++
compiler is needed, and the demo's small models gain nothing measured).

**The cache** (:func:`use_compile_cache`): inductor's and Triton's caches under the run's
``compile_cache`` directory (``.cache/torch-compile`` of the project by default) instead of
``/tmp/torchinductor_<user>``, which every job of a user shares and a reboot empties: the
105 runs of Table 2 compile their graphs once per machine. A rank that compiled its graphs
leaves a marker (:func:`mark_cached`) named by what decides them (:func:`graph_key`), so
that the next job knows the cache can serve it (:func:`cache_serves`): its ranks compile side
by side instead of one after the other.

**What it compiled** (:func:`graphs_compiled`): torch._dynamo's count of the graphs it
compiled in this process. Every graph a run compiles is compiled in the pre-run check,
which runs the shapes training runs; the count after it (the rank record's ``recompiles``)
is 0 unless a shape or a guard changed mid-run.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

# the H100 figures above (../shared/gpu/README.md)
REFERENCE_BATCH_PIXELS = 32 * 512 * 512
SAVED_SECONDS_PER_STEP_DML = 0.050
SAVED_SECONDS_PER_STEP_DP = 0.041
COLD_COMPILE_SECONDS_DML = 120.0
COLD_COMPILE_SECONDS_DP = 54.0
WARM_COMPILE_SECONDS = 15.0

CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
TRITON_CACHE_ENV = "TRITON_CACHE_DIR"
_MARKERS = "graphs"


def compile_pays(
    steps: int, batch_pixels: int, *, mutual_learning: bool, cache_serves: bool
) -> bool:
    """Does compiling save more than it costs over ``steps`` steps of ``batch_pixels``
    pixels each (module doc)?"""
    saved = SAVED_SECONDS_PER_STEP_DML if mutual_learning else SAVED_SECONDS_PER_STEP_DP
    cost = WARM_COMPILE_SECONDS if cache_serves else (
        COLD_COMPILE_SECONDS_DML if mutual_learning else COLD_COMPILE_SECONDS_DP
    )  # fmt: skip
    return steps * saved * batch_pixels / REFERENCE_BATCH_PIXELS > cost


def use_compile_cache(directory: str | os.PathLike[str]) -> Path:
    """Point inductor's and Triton's caches at ``directory``/inductor and /triton (made
    absolute; created) by their environment variables, which both read when they use them;
    returns inductor's. The run's option decides, not a ``TORCHINDUCTOR_CACHE_DIR`` found in
    the environment: inductor writes its default there itself once it has looked."""
    root = Path(directory).resolve()
    os.environ[CACHE_ENV] = str(root / "inductor")
    os.environ[TRITON_CACHE_ENV] = str(root / "triton")
    (root / "inductor").mkdir(parents=True, exist_ok=True)
    return root / "inductor"


def graph_key(**decided_by: Any) -> str:
    """A name for the graphs that ``decided_by`` (models, sizes, precision, torch's
    version, the device's kernels...) determine: SHA-256 of it as canonical JSON."""
    import torch

    facts = {"torch": torch.__version__, **decided_by}
    text = json.dumps(facts, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cache_serves(cache: Path, key: str) -> bool:
    """Has a rank compiled the graphs of ``key`` into ``cache`` before?"""
    return (cache / _MARKERS / key).is_file()


def mark_cached(cache: Path, key: str, decided_by: dict[str, Any]) -> None:
    """Leave the marker that the graphs of ``key`` are in ``cache`` (what decided them, as
    JSON, for whoever looks). Several ranks may write it at once: each writes its own
    temporary file and renames it."""
    from plumbing.atomic import write_text

    directory = cache / _MARKERS
    directory.mkdir(parents=True, exist_ok=True)
    write_text(directory / key, json.dumps(decided_by, sort_keys=True, default=str))


def graphs_compiled() -> int:
    """Graphs torch._dynamo has compiled in this process so far (0 where it was never
    imported: importing it only to count costs a rank that compiles nothing ~1.5 s)."""
    if "torch._dynamo.utils" not in sys.modules:
        return 0
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
