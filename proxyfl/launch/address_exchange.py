"""MPICH's start on ranks whose process IDs differ in length: :class:`AddressExchangeWatch`.

On one machine the ranks talk through libfabric's shared-memory provider
(:data:`~proxyfl.launch.placement.SHARED_MEMORY_ONLY`), whose endpoint name is the string
``fi_shm://<pid>:<uid>:<endpoint>`` and its NUL: ``9 + d(pid) + d(uid) + d(endpoint) + 3``
bytes, ``d(n)`` the number of decimal digits of ``n``. ``MPI_Init`` then all-gathers every
rank's name (``MPIDI_OFI_comm_addr_exchange``, MPICH 5.0) in blocks of ``4 + L`` bytes,
``L`` the length of the *calling* rank's own name. Ranks whose PIDs have different numbers
of digits (9999 and 10000: ranks forked as the kernel's PID counter passed a power of ten)
so disagree on the block's size, and ``MPI_Init`` aborts on the first rank that receives a
longer block than its own (``Message from rank 1 and tag 7 truncated; 22 bytes received
but buffer size is 23``), before any rank has run a line of the program: nothing of the
run is written, and nothing is lost.

A relaunch starts clear of it: the PID counter only grows until it wraps at
``kernel.pid_max`` (32768 or 4194304), so the relaunch's ranks all lie past the power of
ten the failed launch straddled. A launch that failed so is launched once more
(:data:`RELAUNCHES`), with a warning that says why, by one loop
(:func:`launched_again_on_unequal_addresses`): :func:`~proxyfl.launch.job.run_job`'s, and,
through :func:`relaunched_on_unequal_addresses`, a program's that starts MPI ranks itself
(a benchmark's, a test's); any other failure stands as it is.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable
from typing import TypeVar

logger = logging.getLogger(__name__)
T = TypeVar("T")

# the address exchange's frame in MPICH's error stack, and the collective's complaint
EXCHANGE_FRAME = "MPIDI_OFI_comm_addr_exchange"
TRUNCATED = "truncated"
# launches after the first that a job gets for this failure (module doc: one is enough)
RELAUNCHES = 1


class AddressExchangeWatch:
    """Follows a launch's lines; :attr:`failed` once MPICH has said that ``MPI_Init`` failed
    in its address exchange on a message longer than its buffer (module doc)."""

    def __init__(self) -> None:
        self._in_exchange = False
        self._truncated = False

    def add(self, line: str) -> None:
        self._in_exchange = self._in_exchange or EXCHANGE_FRAME in line
        self._truncated = self._truncated or ("Message from rank" in line and TRUNCATED in line)

    @property
    def failed(self) -> bool:
        return self._in_exchange and self._truncated


class AddressesOfUnequalLength(RuntimeError):
    """A launch whose ``MPI_Init`` failed in MPICH's address exchange (module doc): its
    launcher's exit code and its last lines."""

    def __init__(self, exit_code: int, lines: list[str]) -> None:
        super().__init__(
            f"MPI_Init failed in MPICH's address exchange (exit code {exit_code}): the ranks' "
            "process IDs have different numbers of digits, so their shared-memory addresses "
            "differ in length"
        )
        self.exit_code, self.lines = exit_code, lines


def launched_again_on_unequal_addresses(launch: Callable[[], T], what: str) -> T:
    """What ``launch()`` gave, launched again, up to :data:`RELAUNCHES` times, while it
    raises :class:`AddressesOfUnequalLength` (module doc), with a warning naming ``what``
    each time; the last launch's failure is raised as it is."""
    for _ in range(RELAUNCHES):
        try:
            return launch()
        except AddressesOfUnequalLength as failed:  # no rank ran: nothing to lose
            logger.warning("%s: %s; launching it again", what, failed)
    return launch()


class _FailedLaunch(AddressesOfUnequalLength):
    """:class:`AddressesOfUnequalLength` of a captured launch, holding its result."""

    def __init__(self, result: subprocess.CompletedProcess[str]) -> None:
        super().__init__(result.returncode, [])
        self.result = result


def relaunched_on_unequal_addresses(
    launch: Callable[[], subprocess.CompletedProcess[str]],
) -> subprocess.CompletedProcess[str]:
    """What ``launch()`` (an MPI launch run to its end, its output captured) gave, launched
    again where its ``MPI_Init`` failed in the address exchange
    (:func:`launched_again_on_unequal_addresses`); the last launch's result, failed or not."""

    def checked() -> subprocess.CompletedProcess[str]:
        result = launch()
        watch = AddressExchangeWatch()
        for line in f"{result.stdout or ''}\n{result.stderr or ''}".splitlines():
            watch.add(line)
        if result.returncode != 0 and watch.failed:
            raise _FailedLaunch(result)
        return result

    try:
        return launched_again_on_unequal_addresses(checked, "an MPI launch")
    except _FailedLaunch as failed:
        return failed.result
