"""CPU kernels pinned to one instruction set, so that a result's bytes do not depend on
which x86-64 machine computed it.

Float32 sums are not associative: torch's own kernels (ATen), oneDNN's convolutions, MKL's
BLAS and numpy's own loops each choose their code for the CPU they find,
and AVX-512 code sums in another order than AVX2 code (and numpy's float64 ``exp`` and
``log`` are other approximations there: the audit's scores differed in their last bits).
The same run then differs in its late digits between an AVX2 and an AVX-512 machine, and
so does everything computed from it. Each library has a switch that caps what it uses,
read once when it loads, so the pin must be in the environment before the process starts:

- ``native``: nothing is set; each library uses the best the CPU has (speed first: the
  paper's configuration);
- ``avx2``: each of those is capped at AVX2, which every x86-64 server of the last decade
  has (the demo's configuration): the same bytes on an AVX2 and an AVX-512 machine.
  Another architecture (ARM) has other kernels: another draw.

OpenBLAS (numpy's and scipy's BLAS) is left to choose: the one product it computes for a
result, the audit's bootstrap (:func:`analysis.audit.membership.resampled_metrics`), sums
multiples of ½ below 2⁵³, exactly, in any order, so its bits are every kernel's. Forcing
its core (``OPENBLAS_CORETYPE=Haswell``, the pin until 2026-12-02) crashed it: OpenBLAS
0.3.34 (numpy 2.5.2 to 2.5.5 bundle it) gives the GEMM blocking it tuned for AMD Zen 4
and 5 to a forced core too, which overruns the Haswell kernel's stack buffer once the
inner dimension exceeds about 300 (OpenBLAS issues 6021 and 6026): the audit died of
SIGSEGV on an AMD EPYC Zen 4.

``python -m plumbing.kernels KERNELS -- COMMAND ...`` runs ``COMMAND`` with the pin in its
environment (``exec``: the command is this process), as each stage of ``dvc.yaml`` does
with ``machine.cpu_kernels``; every process it starts (MPI ranks, workers) inherits it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Literal, get_args

CpuKernels = Literal["native", "avx2"]
CPU_KERNELS: tuple[str, ...] = get_args(CpuKernels)


def numpy_targets_above_avx2() -> str:
    """The targets of the installed numpy's own CPU dispatch above AVX2, as it names them
    (numpy 2.4: ``X86_V4 AVX512_ICL AVX512_SPR``; earlier ones ``AVX512F ... AVX512_SPR``):
    what ``NPY_DISABLE_CPU_FEATURES`` turns off. Read from the build, never guessed, since
    numpy refuses to start on a name it does not dispatch; one the CPU lacks it ignores."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__ as targets
    except ImportError:  # numpy 1.x
        try:
            from numpy.core._multiarray_umath import __cpu_dispatch__ as targets
        except ImportError:
            return ""
    return " ".join(name for name in targets if name.startswith("AVX512") or name == "X86_V4")


_NUMPY_ABOVE_AVX2 = numpy_targets_above_avx2()

PINS: Mapping[str, Mapping[str, str]] = {
    "native": {},
    "avx2": {
        "ATEN_CPU_CAPABILITY": "avx2",  # torch's own kernels (its CPU dispatch)
        "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN: torch's convolutions on a CPU
        "MKL_CBWR": "AVX2",  # MKL's conditional numerical reproducibility: torch's BLAS
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        # numpy's own loops (exp, log, sums, sorts): its AVX2 code, no AVX-512
        **({"NPY_DISABLE_CPU_FEATURES": _NUMPY_ABOVE_AVX2} if _NUMPY_ABOVE_AVX2 else {}),
    },
}
"""The variables each choice sets; those of every choice are the ones :func:`in_effect`
reports."""

PIN_VARIABLES: tuple[str, ...] = tuple(sorted({name for pin in PINS.values() for name in pin}))


def pinned_environment(kernels: str, environment: Mapping[str, str]) -> dict[str, str]:
    """``environment`` with ``kernels``' pin over it (``native``: as it is)."""
    if kernels not in PINS:
        raise ValueError(f"unknown CPU kernels {kernels!r}: one of {', '.join(CPU_KERNELS)}")
    return {**environment, **PINS[kernels]}


def in_effect(environment: Mapping[str, str] | None = None) -> dict[str, str]:
    """The pin variables set in ``environment`` (this process's by default): what a run
    records of the kernels it was computed with (``{}``: native)."""
    environment = os.environ if environment is None else environment
    return {name: environment[name] for name in PIN_VARIABLES if name in environment}


def pin_this_command(kernels: str) -> None:
    """Run this command again, in place, with ``kernels``' pin when its environment lacks
    it (``os.execv`` of the same interpreter and arguments: the libraries read the pin
    when they load, too late to set it in this process). For a command that computes
    results and reads the parameters itself (``python -m flows.pipeline``), so that it
    gives the bytes of the ``dvc repro`` stages, which ``python -m plumbing.kernels``
    starts pinned. Returns only when the pin is already in effect (``native``: always).
    Only for a command parsing its own command line (``main(argv=None)``): it replaces
    this process."""
    pin = PINS[kernels]
    if all(os.environ.get(name) == value for name, value in pin.items()):
        return
    argv = [sys.executable, *sys.orig_argv[1:]]
    os.execve(sys.executable, argv, pinned_environment(kernels, os.environ))


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m plumbing.kernels KERNELS -- COMMAND ...``: exec ``COMMAND`` pinned."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[1] != "--" or args[0] not in PINS:
        sys.exit(
            f"usage: python -m plumbing.kernels {{{','.join(CPU_KERNELS)}}} -- COMMAND [ARG ...]"
        )
    command = args[2:]
    try:
        os.execvpe(command[0], command, pinned_environment(args[0], os.environ))
    except OSError as error:
        sys.exit(f"error: {command[0]}: {error.strerror}")


if __name__ == "__main__":
    main()
