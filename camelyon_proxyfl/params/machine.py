"""``machine:``: what of the machine a result may depend on: the CPU kernels it uses."""

from __future__ import annotations

from pydantic import Field

from camelyon_proxyfl.params.base import Section, StageParams
from plumbing.kernels import CpuKernels


class MachineSection(Section):
    """``machine:``: the CPU kernels of every process that computes a result (plumbing.kernels)."""

    cpu_kernels: CpuKernels = Field(
        "native",
        description="native: each library uses the best the CPU has (speed first); avx2: "
        "torch, oneDNN, MKL and OpenBLAS capped at AVX2, so that an AVX2 and an AVX-512 "
        "machine give the same bytes (the demo's, whose committed dvc.lock holds them)",
    )


class MachineParams(StageParams):
    """The one section a command that starts the stages' shared servers reads
    (``python -m flows.shared``): the kernels the stages' ranks run with."""

    machine: MachineSection = Field(default_factory=MachineSection)
