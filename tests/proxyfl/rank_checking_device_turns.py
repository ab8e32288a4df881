"""A rank of ``python -m mpi4py -m proxyfl.run`` that checks, as each of its hosted clients
builds its trainer, that every client built before it has its state off the device
(:mod:`proxyfl.engine.residency`): one line per build on stderr, naming the clients whose
models were still there. On a CPU the state stays where it is, but each residency's
``on_device`` is kept as it would be on a GPU."""

import runpy
import sys
import threading

from proxyfl.trainer import ClientTrainer

_built: list[ClientTrainer] = []
_lock = threading.Lock()
_build = ClientTrainer.__init__


def _checked_build(self: ClientTrainer, *args: object, **kwargs: object) -> None:
    with _lock:
        still_on_device = [trainer.data.client for trainer in _built
                           if trainer.residency is None or trainer.residency.on_device]  # fmt: skip
        print(
            f"device turns: a client built after {len(_built)}, on the device: {still_on_device}",
            file=sys.stderr,
            flush=True,
        )
        _built.append(self)
    _build(self, *args, **kwargs)


ClientTrainer.__init__ = _checked_build  # type: ignore[method-assign]
runpy.run_module("proxyfl.run", run_name="__main__", alter_sys=True)
