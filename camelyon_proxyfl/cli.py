"""``camelyon-proxyfl``: every command of the pipeline under one name.

    camelyon-proxyfl pipeline [--config params.yaml]     slides -> stores -> runs -> tables
    camelyon-proxyfl preprocess | train | canary | audit | stage | report   one stage each
    camelyon-proxyfl serve                               Prefect deployments, served
    camelyon-proxyfl synth | tile | privacy | job | server | sbatch | sites ...

Each subcommand is the ``main`` of one module, which also runs as ``python -m MODULE``
with the same arguments; ``camelyon-proxyfl COMMAND --help`` lists them. Only the chosen
command's module is imported (Prefect and torch load only where they are needed).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Sequence

from plumbing.collector import imports_uncollected
from plumbing.processes import start_command

COMMANDS: dict[str, tuple[str, str]] = {
    "pipeline": ("flows.pipeline", "the whole pipeline (preprocess, train, audit, stage, report)"),
    "preprocess": ("flows.preprocess", "slides -> balanced, patient-disjoint stores per centre"),
    "train": ("flows.train", "one MPI job per method and seed, a rank per centre or train.ranks"),
    "canary": ("flows.canary", "a method trained once more with canaries, for the audit"),
    "audit": ("flows.audit", "membership inference and ε lower bounds on the kept models"),
    "stage": ("flows.stage", "heatmaps, node classes and pN stages of the test patients"),
    "report": ("flows.report", "accuracy, macro-accuracy and ε tables, curves and plots"),
    "synth": ("wsi.synth", "write the synthetic Camelyon-17 dataset"),
    "tile": ("wsi.tile", "one slide's candidates and labels, and a picture of them"),
    "privacy": ("proxyfl.privacy.planned", "the ε each client will spend, before training"),
    "job": ("proxyfl.run", "one training job's ranks (run under mpiexec -n K)"),
    "serve": ("flows.serve", "Prefect server, work pool, deployments and a worker, in one"),
    "server": ("flows.server", "run a command with a Prefect server shared by its flows"),
    "sbatch": ("camelyon_proxyfl.sbatch", "the Slurm batch script of the training, checked"),
    "sites": ("camelyon_proxyfl.sites", "FLARE kits for the centres; a server or site started"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items()]
    return (
        "usage: camelyon-proxyfl COMMAND [ARGS...]   (camelyon-proxyfl COMMAND --help)\n\n"
        "commands:\n" + "\n".join(lines)
    )


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:  # the console script: a killed parent (dvc repro) takes us with it
        start_command()
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    # a command of its own: no collection walks its imports (plumbing.collector); called
    # in-process (argv given), the caller's collector is left as it is
    with imports_uncollected() if argv is None else contextlib.nullcontext():
        module = importlib.import_module(COMMANDS[name][0])
    sys.argv[0] = f"camelyon-proxyfl {name}"
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
