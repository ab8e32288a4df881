"""A waiting client's state off the device (proxyfl.engine.residency, proxyfl.hosted's turns).

The moves themselves need a second device: their tests run where CUDA is (the GPU session's
device check runs this file with ``--noconftest``); on a CPU the turns' bookkeeping and the
CPU run's "nothing to move" are tested.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from proxyfl.engine.residency import DeviceResidency
from proxyfl.hosted import DeviceTurns

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _model_and_adam(device: str, seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.GroupNorm(2, 8), nn.ReLU(),
                          nn.Flatten(), nn.LazyLinear(2)).to(device)  # fmt: skip
    model(torch.zeros(1, 3, 8, 8, device=device))  # the lazy layer's shape
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def _steps(model: nn.Module, optimizer: torch.optim.Optimizer, count: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    for _ in range(count):
        x = torch.randn(4, 3, 8, 8, generator=generator).to(device)
        y = torch.randint(0, 2, (4,), generator=generator).to(device)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


def _state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[bytes]:
    tensors = [*model.parameters(), *(p.grad for p in model.parameters()),
               *(v for s in optimizer.state.values() for v in s.values())]  # fmt: skip
    return [t.detach().cpu().numpy().tobytes() for t in tensors]


def test_a_cpu_run_moves_nothing_and_keeps_every_tensor_where_it_is() -> None:
    model, optimizer = _model_and_adam("cpu")
    _steps(model, optimizer, 2, seed=1)
    before = [p.data_ptr() for p in model.parameters()]
    residency = DeviceResidency(torch.device("cpu"), [model, optimizer])
    residency.to_host()
    residency.to_device()
    assert not residency.moves_anything
    assert [p.data_ptr() for p in model.parameters()] == before
    assert (residency.moves, residency.bytes_moved) == (0, 0)


def test_turns_move_the_client_that_was_on_the_device_only_when_another_takes_its_turn() -> None:
    cpu = torch.device("cpu")
    a, b = DeviceResidency(cpu, []), DeviceResidency(cpu, [])
    turns = DeviceTurns()
    turns.take(a)
    assert a.on_device
    turns.take(a)  # a had the baton back before any other: nothing moves
    assert a.on_device
    turns.take(None)  # a client whose models do not exist yet
    assert not a.on_device
    turns.take(b)
    turns.take(a)
    assert (a.on_device, b.on_device) == (True, False)
    turns.leave(a)  # a ended: its state leaves the device at once, and stays off it
    assert not a.on_device
    turns.take(b)
    assert (a.on_device, b.on_device) == (False, True)


@cuda
def test_off_the_device_the_client_holds_no_device_memory_and_comes_back_byte_for_byte() -> None:
    model, optimizer = _model_and_adam("cuda")
    _steps(model, optimizer, 3, seed=1)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    before = _state_bytes(model, optimizer)
    parameters = list(model.parameters())
    residency = DeviceResidency(torch.device("cuda"), [model, optimizer, None])

    residency.to_host()
    assert all(p.device.type == "cpu" and p.grad.device.type == "cpu" for p in parameters)
    moments = [v for s in optimizer.state.values() for k, v in s.items() if k != "step"]
    assert moments and all(v.device.type == "cpu" for v in moments)
    assert torch.cuda.memory_allocated() < held
    assert residency.bytes_moved > 0

    residency.to_device()
    assert list(model.parameters()) == parameters  # the same parameters, by identity
    assert all(p.device.type == "cuda" for p in model.parameters())
    assert all(value.device.type == "cuda" for state in optimizer.state.values()
               for key, value in state.items() if key != "step")  # fmt: skip
    # Adam's step counts stay where Adam keeps them (the host, unless capturable)
    assert all(s["step"].device.type == "cpu" for s in optimizer.state.values())
    assert _state_bytes(model, optimizer) == before
    record = residency.record()
    assert record["moves"] == 2 and record["state_gb"] > 0


@cuda
def test_training_after_a_turn_off_the_device_is_the_training_without_one() -> None:
    stayed, stayed_optimizer = _model_and_adam("cuda")
    moved, moved_optimizer = _model_and_adam("cuda")
    _steps(stayed, stayed_optimizer, 2, seed=1)
    _steps(moved, moved_optimizer, 2, seed=1)
    residency = DeviceResidency(torch.device("cuda"), [moved, moved_optimizer])
    residency.to_host()
    residency.to_device()
    _steps(stayed, stayed_optimizer, 3, seed=2)
    _steps(moved, moved_optimizer, 3, seed=2)
    assert _state_bytes(moved, moved_optimizer) == _state_bytes(stayed, stayed_optimizer)


@cuda
def test_a_tensor_a_dp_engine_left_on_a_parameter_moves_with_it() -> None:
    model, optimizer = _model_and_adam("cuda")
    weight = next(model.parameters())
    weight.summed_grad = torch.ones_like(weight)  # as Opacus' DPOptimizer leaves it
    residency = DeviceResidency(torch.device("cuda"), [model, optimizer])
    residency.to_host()
    assert weight.summed_grad.device.type == "cpu"
    residency.to_device()
    assert weight.summed_grad.device.type == "cuda"
    assert torch.equal(weight.summed_grad, torch.ones_like(weight))


@cuda
def test_a_turn_s_record_says_what_the_device_held_before_and_after_the_state_came_back() -> None:
    """As a client's turn begins, the device holds what no client's state accounts for
    (``device_gb_between_turns``: here the other client's state has left, and what is
    left is the test's own tensor and whatever CUDA's libraries keep), then that plus the
    client's state (``device_gb_at_turn``)."""
    a, a_optimizer = _model_and_adam("cuda", seed=0)
    b, b_optimizer = _model_and_adam("cuda", seed=1)
    _steps(a, a_optimizer, 2, seed=1)
    _steps(b, b_optimizer, 2, seed=2)
    kept = torch.ones(2**20, device="cuda")  # 4 MiB of nobody's state
    first, second = (DeviceResidency(torch.device("cuda"), [a, a_optimizer]),
                     DeviceResidency(torch.device("cuda"), [b, b_optimizer]))  # fmt: skip
    turns = DeviceTurns()
    turns.take(second)
    turns.take(first)  # b leaves; a never had: nothing to measure
    assert first.record()["device_gb_between_turns"] == 0
    turns.take(second)  # a leaves, b comes back
    first_state = first.state_bytes
    turns.take(None)  # b leaves: neither state is on the device
    nobody = torch.cuda.memory_allocated()
    assert nobody >= kept.nbytes
    turns.take(first)  # a comes back
    record = first.record()
    assert record["device_gb_between_turns"] == round(nobody / 1e9, 3), record
    arrived = torch.cuda.memory_allocated() - nobody  # a's state, in the allocator's blocks
    assert first_state <= arrived < first_state + 2**20, (arrived, first_state)
    assert record["device_gb_at_turn"] == round((nobody + arrived) / 1e9, 3), record


class _MoveFails(DeviceResidency):
    """A residency whose move to the host fails, as a CUDA error would make it (a CPU's
    moves cannot fail): the fault injected, not the device."""

    def to_host(self) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_an_ended_clients_failed_move_decides_nothing_and_leaves_it_nobodys(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client ends (returned, or raised its exit) and its state's move off the device
    fails: ending says so in the log and raises nothing, so the client's outcome stands;
    the client is nobody's to move again, and the next client takes its turn."""
    from proxyfl.hosted import HostedClientState

    cpu = torch.device("cpu")
    turns = DeviceTurns()
    ended, nxt = _MoveFails(cpu, []), DeviceResidency(cpu, [])
    state = HostedClientState(torch.get_rng_state(), turns)
    state.hold(ended)
    with caplog.at_level("WARNING", logger="proxyfl.hosted"):
        state.end()
    assert state.residency is None
    assert "could not leave the device: CUDA error" in caplog.text
    turns.take(nxt)  # would raise, were the ended client still counted on the device
    assert nxt.on_device
