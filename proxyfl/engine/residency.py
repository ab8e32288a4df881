"""Where a client's training state lives while it waits: off its device.

A rank that hosts several clients (:mod:`proxyfl.hosted`) trains them in turn. Unless moved,
each client's models, their gradients and their optimisers' states (Adam's two moments per
parameter) stay in the device's memory while the others train, so that a rank's device
memory grows with its clients: C clients of a model pair with P parameters hold about
``C · 2 · 4P`` floats (parameters, gradients, two moments, both models).

A :class:`DeviceResidency` holds one client's modules and optimisers. :meth:`to_host` moves
every tensor of them that is on the client's device to the host (a module's parameters,
their gradients, any tensor a DP engine left on a parameter, its buffers; an optimiser's
state tensors), noting which; :meth:`to_device` moves them back (a module as a whole: a
client's modules live wholly on its device, so that is what was moved). A move is a copy
of the values, and a parameter keeps its identity (its ``.data`` changes place), so the
optimisers' references, the compiled graphs' inputs and every result are unchanged, byte
for byte. A state tensor that was on the host to begin with (Adam's step count) is left
where it is. A device that is the host (a CPU run) has nothing to move.

With its clients' residencies taking turns (:class:`proxyfl.hosted.DeviceTurns`), a rank's
device holds one client's state and one client's activations at a time, from the first
client's setup on (each client holds its residency as soon as its models exist, so the next
builds its own with this one's on the host), and its host memory grows by each waiting
client's state instead. Its peak is meant to be that of its largest client whatever their
number; not yet shown: on one H200 (2026-11-30), 8 clients of a GN-ResNet-18 pair at 128 px
on one rank peaked at 3.17 GB allocated against 1.62 GB on each of 8 ranks, 1.55 GB above
one client. Each client's record says what the device held as its turns started, before
its state came back (``device_gb_between_turns``: nobody's state, unless something escapes
the moves) and after (``device_gb_at_turn``); the next device run is to read them. On a CPU
(3 clients on one rank, ProxyFL with GN-ResNet-18 pairs, the first 116 turns), every tensor
object of 200 kB or more alive at a turn belonged to a client's modules or optimisers (or
was a checkpoint's copy on the host, being written), and none held an autograd graph; what
a CPU cannot show is the device's own memory kept per thread, and so per hosted client,
such as the cuBLAS workspace torch allocates for each thread's handle.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, MutableMapping
from typing import Any

import torch
from torch import nn

Holder = nn.Module | torch.optim.Optimizer


def _tensors_of_parameter(parameter: nn.Parameter) -> Iterable[str]:
    """The names of a parameter's extra tensor attributes (Opacus' ``grad_sample``,
    ``summed_grad``), which ``Module.to`` does not move."""
    return [name for name, value in vars(parameter).items() if isinstance(value, torch.Tensor)]


class DeviceResidency:
    """One client's modules and optimisers, on ``device`` or on ``host`` (module doc)."""

    def __init__(
        self,
        device: torch.device,
        holders: Iterable[Holder | None],
        host: torch.device | None = None,
    ) -> None:
        self.device = torch.device(device)
        self.host = torch.device("cpu") if host is None else torch.device(host)
        unique: dict[int, Holder] = {}
        for holder in holders:
            if holder is not None:
                unique.setdefault(id(holder), holder)
        self.modules = [h for h in unique.values() if isinstance(h, nn.Module)]
        self.optimizers = [h for h in unique.values() if isinstance(h, torch.optim.Optimizer)]
        self.on_device = True
        self.moves = 0  # to the host and back, each counted
        self.bytes_moved = 0
        self.seconds = 0.0
        self.state_bytes = 0  # what the last move to the host moved: the client's state
        # the device's allocated bytes as the client's turn starts: before its state comes
        # back (the one before it moved off: nobody's state, unless something escapes the
        # moves), and after (one client's state more)
        self.device_bytes_between_turns = 0
        self.device_bytes_at_turn = 0
        # optimiser state entries and parameter attributes moved to the host: their owners
        self._moved_states: list[tuple[MutableMapping[str, Any], str]] = []
        self._moved_attributes: list[tuple[nn.Parameter, str]] = []

    @property
    def moves_anything(self) -> bool:
        """Whether the device is not the host (a CPU run keeps its state where it is)."""
        return self.device.type != self.host.type

    def _on_device(self, tensor: Any) -> bool:
        return isinstance(tensor, torch.Tensor) and tensor.device.type == self.device.type

    def to_host(self) -> None:
        """Every tensor of the holders that is on the device, to the host."""
        if not self.on_device:
            return
        self.on_device = False
        if not self.moves_anything:
            return
        started, moved = time.perf_counter(), 0
        for module in self.modules:
            for parameter in module.parameters():
                for name in _tensors_of_parameter(parameter):
                    value = getattr(parameter, name)
                    if self._on_device(value):
                        setattr(parameter, name, value.to(self.host))
                        self._moved_attributes.append((parameter, name))
                        moved += value.nbytes
            moved += sum(t.nbytes for t in _module_tensors(module)
                         if self._on_device(t))  # fmt: skip
            module.to(self.host)
        for optimizer in self.optimizers:
            for state in optimizer.state.values():
                for key, value in state.items():
                    if self._on_device(value):
                        state[key] = value.to(self.host)
                        self._moved_states.append((state, key))
                        moved += value.nbytes
        self._count(moved, started)
        self.state_bytes = moved

    def to_device(self) -> None:
        """What :meth:`to_host` moved, back to the device."""
        if self.on_device:
            return
        self.on_device = True
        if not self.moves_anything:
            return
        if self.device.type == "cuda":
            between = torch.cuda.memory_allocated(self.device)
            self.device_bytes_between_turns = max(self.device_bytes_between_turns, between)
        started, moved = time.perf_counter(), 0
        for module in self.modules:
            module.to(self.device)
            moved += sum(t.nbytes for t in _module_tensors(module))
        for parameter, name in self._moved_attributes:
            value = getattr(parameter, name)
            if isinstance(value, torch.Tensor):
                setattr(parameter, name, value.to(self.device))
                moved += value.nbytes
        for state, key in self._moved_states:
            value = state[key]
            state[key] = value.to(self.device)
            moved += value.nbytes
        self._moved_attributes.clear()
        self._moved_states.clear()
        self._count(moved, started)
        if self.device.type == "cuda":
            allocated = torch.cuda.memory_allocated(self.device)
            self.device_bytes_at_turn = max(self.device_bytes_at_turn, allocated)

    def _count(self, moved: int, started: float) -> None:
        self.moves += 1
        self.bytes_moved += moved
        self.seconds += time.perf_counter() - started

    def record(self) -> dict[str, Any]:
        """What the moves cost (a rank's ``machine.json``): their number, GB, seconds; the
        client's state in GB; the device's allocated GB as its turns started, at most,
        before its state came back and after."""
        return {"moves": self.moves, "gb_moved": round(self.bytes_moved / 1e9, 3),
                "seconds": round(self.seconds, 3), "state_gb": round(self.state_bytes / 1e9, 3),
                "device_gb_between_turns": round(self.device_bytes_between_turns / 1e9, 3),
                "device_gb_at_turn": round(self.device_bytes_at_turn / 1e9, 3)}  # fmt: skip


def _module_tensors(module: nn.Module) -> Iterable[torch.Tensor]:
    """A module's parameters, their gradients and its buffers."""
    for parameter in module.parameters():
        yield parameter
        if parameter.grad is not None:
            yield parameter.grad
    yield from module.buffers()
