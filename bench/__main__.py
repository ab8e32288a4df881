"""Run the benchmarks: ``python -m bench [NAME ...]``.

Every module ``bench/bench_<name>.py`` with a ``main()`` is a benchmark; with no names all
of them run in turn (sorted by name) except those that set ``IN_DEFAULT_RUN = False``
(``fidelity``: half an hour of training, ``make fidelity``; ``collaboration``: needs the
demo's stores; ``preprocess_flow``: 15 GB of real-size slides), otherwise only those named
(``preprocess`` or ``bench_preprocess``). Each named benchmark runs with its defaults, or
with the options that follow a single name (``python -m bench gpu --smoke``).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

PREFIX = "bench_"

log = logging.getLogger("bench")


def available() -> list[str]:
    """Names (without the ``bench_`` prefix) of the benchmark modules in this folder."""
    folder = Path(__file__).resolve().parent
    return sorted(path.stem[len(PREFIX) :] for path in folder.glob(f"{PREFIX}*.py"))


def default_run(known: Sequence[str]) -> list[str]:
    """The benchmarks ``python -m bench`` runs without names."""
    return [
        name
        for name in known
        if getattr(importlib.import_module(f"{__package__ or 'bench'}.{PREFIX}{name}"),
                   "IN_DEFAULT_RUN", True)
    ]  # fmt: skip


def run(names: Sequence[str] | None = None, options: Sequence[str] = ()) -> int:
    known = available()
    chosen = [name.removeprefix(PREFIX) for name in names] if names else default_run(known)
    unknown = [name for name in chosen if name not in known]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; available: {known}", file=sys.stderr)
        return 2
    status = 0
    for name in chosen:
        module = importlib.import_module(f"{__package__ or 'bench'}.{PREFIX}{name}")
        print(f"== bench {name} ==", flush=True)
        start = time.perf_counter()
        # A benchmark's own options are its defaults here, not this command line's names,
        # unless options follow a single name (`python -m bench gpu --smoke`).
        takes_argv = bool(inspect.signature(module.main).parameters)
        result = module.main(list(options)) if takes_argv else module.main()
        print(f"== bench {name}: {time.perf_counter() - start:.1f} s ==", flush=True)
        if isinstance(result, int) and result:
            status = result
    return status


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"benchmarks to run (default all: {available()})")
    args, options = parser.parse_known_args(argv)
    if options and len(args.names) != 1:
        parser.error(f"options {options} need exactly one benchmark named before them")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return run(args.names, options)


if __name__ == "__main__":
    sys.exit(main())
