"""When the machine says no, lose nothing: a randomized campaign of environment faults over
the pipeline's commands (the power-loss campaign's sibling, :mod:`bench.bench_crash`).

On a copy of a project with its outputs (as ``bench crash`` makes it), each command is run
once uninterrupted after its preparation (its outputs removed): the reference, its outputs'
content, its time and the bytes it wrote. Then, at each of ``--points`` points (seeded:
the command, the fault and the instant are drawn from ``--seed``), the command's output
folder (``results``, ``staging``, ``data/patches`` or ``runs``) is put on a filesystem of
its own (a tmpfs holding what the folder held), the command is prepared again and run
under one fault:

- **full**: the filesystem has room for a drawn share (uniform in [0, 1)) of the bytes
  the reference wrote there, so that it fills at a random point of the command;
- **read-only**: the filesystem is remounted read-only at a drawn instant of the run;
- **server**: the command reports to a Prefect server of its own (``PREFECT_API_URL``),
  killed (SIGKILL) at a drawn instant.

and then, with the fault gone (room, read-write, no server: the command starts its own),
run again to completion. For each point:

- **message**: a command that failed exited 3 (:data:`plumbing.refusals.EXIT_REFUSED`),
  or 2 where its checks found the folder unwritable before any work, with exactly one
  ``error:`` line and no traceback;
- **kept**: every file of the copy outside the command's outputs has the content it had
  before (other stores, runs, staging and tables: what was finished), and none of the
  command's outputs but its JSON records (which may say it failed) is there with other
  content than the reference's: nothing half-written looks complete;
- **leftovers**: processes of the copy, temporary files, flow runs still shown Running;
- **rerun**: exit 0 and every output's content the reference's.

``python -m bench faults --points 30`` (after ``make demo``; as root, which mounts the
filesystems); ``--source``, ``--commands``, ``--faults``, ``--seed``, ``--keep`` as for
``bench crash``. Exit 1 when a point lost, mixed or left something; 2 where filesystems
cannot be mounted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from bench.bench_crash import (
    COMMANDS,
    PYTHON,
    CrashCommand,
    _ordinary,
    campaign_arguments,
    copy_processes,
    make_copy,
    stuck_flow_runs,
    temporaries,
    tree_digests,
    upstream_first,
)

IN_DEFAULT_RUN = False  # needs the demo's outputs and root
FAULTS = ("full", "read-only", "server")
EXIT_REFUSED = 3  # plumbing.refusals: the machine refused (no space, read-only, no server)
EXIT_BAD_PARAMETERS = 2  # plumbing.cli: what the checks before any work find
# what holds the finished outputs of the copy, compared before and after each fault
FINISHED = ("data/patches", "runs", "staging", "results")
# above the reference's bytes: what a filesystem of the "full" fault always has (the
# folders and files already there take pages of their own)
SLACK_BYTES = 64 * 1024


class CannotMount(RuntimeError):
    """A tmpfs could not be mounted (not root, no CAP_SYS_ADMIN)."""


def output_folder(command: CrashCommand) -> str:
    """The folder a command writes into: its first output's top-level folder."""
    first = Path(command.outputs[0])
    return "data/patches" if first.parts[:2] == ("data", "patches") else first.parts[0]


def used_bytes(folder: Path) -> int:
    """Bytes the files under ``folder`` take (their blocks)."""
    return sum(p.stat().st_blocks * 512 for p in folder.rglob("*") if p.is_file())


def _mount(*options: str) -> None:
    done = subprocess.run(["mount", *options], capture_output=True, text=True)
    if done.returncode != 0:
        raise CannotMount(f"mount {' '.join(options)}: {done.stderr.strip()}")


@contextlib.contextmanager
def own_filesystem(folder: Path, size_bytes: int) -> Iterator[Path]:
    """``folder`` on a tmpfs of ``size_bytes`` holding what it held; on exit, what it then
    holds copied back onto the folder's own filesystem and the tmpfs unmounted."""
    aside = folder.with_name(folder.name + ".aside")
    folder.mkdir(parents=True, exist_ok=True)
    folder.rename(aside)
    folder.mkdir()
    try:
        _mount("-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(folder))
    except CannotMount:
        folder.rmdir()
        aside.rename(folder)
        raise
    try:
        shutil.copytree(aside, folder, dirs_exist_ok=True, symlinks=True)
        yield folder
    finally:
        shutil.rmtree(aside)
        shutil.copytree(folder, aside, symlinks=True)
        subprocess.run(["umount", str(folder)], check=True)
        folder.rmdir()
        aside.rename(folder)


def resize(folder: Path, size_bytes: int | None = None, read_only: bool | None = None) -> None:
    options = ["remount"]
    if size_bytes is not None:
        options.append(f"size={size_bytes}")
    if read_only is not None:
        options.append("ro" if read_only else "rw")
    _mount("-o", ",".join(options), str(folder))


@dataclass
class Point:
    command: str
    fault: str
    draw: float  # the share of the reference's bytes ("full") or of its time
    exit_code: int = 0
    message: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)
    rerun: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.message or self.lost or self.leftovers or self.rerun)


def finished_digests(copy: Path) -> dict[str, str]:
    return tree_digests(copy, [name for name in FINISHED if (copy / name).exists()], _ordinary)


def message_problems(code: int, output: str) -> list[str]:
    """What is wrong with how a failed command said so."""
    if code == 0:
        return []
    problems = []
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    # a folder the command's checks find unwritable before any work: exit 2, as for the
    # other checks (docs/troubleshooting.md), its parameter being the thing to change
    checked = code == EXIT_BAD_PARAMETERS and any("cannot be written" in e for e in errors)
    if code != EXIT_REFUSED and not checked:
        problems.append(f"exit {code}, not {EXIT_REFUSED}")
    if len(errors) != 1:
        problems.append(f"{len(errors)} error: lines")
    if "Traceback" in output:
        problems.append("a traceback")
    if not problems:
        return []
    where = output.find("Traceback")
    shown = output[where:].splitlines()[-12:] if where >= 0 else errors[:2]
    return problems + [f"said: {line}" for line in shown]


def lost_outputs(before: dict[str, str], after: dict[str, str], command: CrashCommand,
                 reference: dict[str, str]) -> list[str]:  # fmt: skip
    """Finished files changed or gone, and outputs of the command that are there with
    content other than the reference's (JSON records and the command's ``records``
    excepted: they may say it failed)."""
    mine = tuple(command.outputs)

    def is_output(name: str) -> bool:
        return any(name == o or name.startswith(o.rstrip("/") + "/") for o in mine)

    lost = [f"changed or gone: {name}" for name in sorted(before)
            if not is_output(name) and after.get(name) != before[name]]  # fmt: skip
    lost += [f"half-written: {name}" for name in sorted(after)
             if is_output(name) and not name.endswith((".json", ".jsonl"))
             and name not in command.records and after[name] != reference.get(name)]  # fmt: skip
    return lost


def _leftovers(copy: Path, prefect_home: Path, fault: str | None = None) -> list[str]:
    """Processes of the copy, temporary files in it, and flow runs its Prefect database
    still shows Running. After a fault, two wait for the rerun: a temporary file on a
    filesystem turned read-only mid-write cannot be removed until it is writable again
    (the rerun removes it: :func:`plumbing.atomic.remove_stale_temporaries`), and the
    flow runs of a server killed mid-run stay Running until the next command marks them
    Crashed."""
    found = [f"process {p.pid} {' '.join(p.cmdline()[:3])}"
             for p in copy_processes(copy, {os.getpid()})]  # fmt: skip
    if fault != "read-only":  # the folder set aside while the tmpfs holds it: the bench's
        found += [f"temporary {name}" for name in temporaries(copy)
                  if not name.split("/", 1)[0].endswith(".aside")]  # fmt: skip
    flow_runs = fault != "server"
    if flow_runs:
        found += [f"flow run {name}" for name in stuck_flow_runs(prefect_home)]
    return found


def _run_faulted(command: CrashCommand, copy: Path, env: dict[str, str], fault: str,
                 instant_s: float, folder: Path, server: subprocess.Popen[bytes] | None
                 ) -> tuple[int, str]:  # fmt: skip
    """The command under ``fault`` applied at ``instant_s`` (the full filesystem is set
    before it starts): its exit code and output."""
    with tempfile.TemporaryFile("w+") as output:
        process = subprocess.Popen(command.argv, cwd=copy, env=env, stdout=output,
                                   stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        if fault != "full":
            try:
                process.wait(timeout=instant_s)
            except subprocess.TimeoutExpired:
                if fault == "read-only":
                    resize(folder, read_only=True)
                elif server is not None:
                    for child in psutil.Process(server.pid).children(recursive=True):
                        with contextlib.suppress(psutil.NoSuchProcess):
                            child.kill()
                    server.kill()
        code = process.wait(timeout=1800)
        output.seek(0)
        return code, output.read()


@contextlib.contextmanager
def _server(prefect_home: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A Prefect server of the point's own, as `make serve` keeps one."""
    from plumbing.network import free_port

    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(prefect_home)}
    prefect = Path(PYTHON).parent / "prefect"
    server = subprocess.Popen([str(prefect), "server", "start", "--host", "127.0.0.1", "--port",
                               str(port)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        import urllib.request

        deadline = time.monotonic() + 180
        while True:
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{api}/health", timeout=2):
                break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the point's Prefect server on {api} did not start")
            time.sleep(0.3)
        yield server, api
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            for child in psutil.Process(server.pid).children(recursive=True):
                child.kill()
        server.kill()
        server.wait()


def fault_point(command: CrashCommand, copy: Path, env: dict[str, str], fault: str,
                draw: float, reference: tuple[float, dict[str, str], int],
                prefect_home: Path) -> Point:  # fmt: skip
    """One point: the command under ``fault`` at ``draw`` (a share of the reference's
    bytes or time), the checks, the rerun without the fault."""
    seconds, digests, written = reference
    point = Point(command.name, fault, draw)
    folder = copy / output_folder(command)
    command.prepare(copy)
    before = finished_digests(copy)
    room = used_bytes(folder) + SLACK_BYTES
    size = room + int(draw * written) if fault == "full" else room + 4 * written + (1 << 24)
    with own_filesystem(folder, size), contextlib.ExitStack() as stack:
        faulted_env, server = env, None
        if fault == "server":
            server, api = stack.enter_context(_server(prefect_home))
            faulted_env = {**env, "PREFECT_API_URL": api}
        point.exit_code, output = _run_faulted(command, copy, faulted_env, fault,
                                               draw * seconds, folder, server)  # fmt: skip
        time.sleep(0.5)  # the kernel reaps what the command's end took with it
        point.message = message_problems(point.exit_code, output)
        point.lost = lost_outputs(before, finished_digests(copy), command, digests)
        point.leftovers = _leftovers(copy, prefect_home, fault)
        if fault == "read-only":
            resize(folder, read_only=False)
        resize(folder, size_bytes=room + 4 * written + (1 << 24))
    done = subprocess.run(command.argv, cwd=copy, env=env, capture_output=True, text=True,
                          timeout=1800)  # fmt: skip
    if done.returncode != 0:
        point.rerun.append(f"rerun exit {done.returncode}: "
                           f"{(done.stdout + done.stderr).strip().splitlines()[-1:]}")  # fmt: skip
    now = command.digests(copy)
    point.rerun += [f"differs: {name}" for name in sorted(digests.keys() | now.keys())
                    if digests.get(name) != now.get(name)]  # fmt: skip
    point.rerun += [f"left after the rerun: {x}" for x in _leftovers(copy, prefect_home)]
    return point


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench faults",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--faults", nargs="+", choices=FAULTS, default=list(FAULTS))
    flows = sorted(name for name in COMMANDS if name != "dvc")  # flows, not dvc's own
    args = campaign_arguments(parser, argv, 30, flows)
    if args is None:
        return 2
    folder = Path(tempfile.mkdtemp(prefix="faults-"))
    try:
        copy = make_copy(args.source, folder)
        prefect_home = folder / "prefect-home"
        path = f"{Path(PYTHON).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        env = {**os.environ, "PREFECT_HOME": str(prefect_home), "PATH": path}
        env.pop("PREFECT_API_URL", None)
        try:  # can this machine mount a filesystem for a folder?
            with own_filesystem(folder / "probe", 1 << 20):
                pass
        except CannotMount as error:
            print(f"error: {error}: the campaign puts each command's output folder on a "
                  "tmpfs of its own (run it as root)", file=sys.stderr)  # fmt: skip
            return 2
        references: dict[str, tuple[float, dict[str, str], int]] = {}
        for name in upstream_first(args.commands):
            command = COMMANDS[name]
            command.prepare(copy)
            target = copy / output_folder(command)
            before = used_bytes(target) if target.exists() else 0
            started = time.monotonic()
            done = subprocess.run(command.argv, cwd=copy, env=env, capture_output=True,
                                  text=True, timeout=1800)  # fmt: skip
            seconds = time.monotonic() - started
            if done.returncode != 0:
                print(f"error: the reference {name} failed (exit {done.returncode}):\n"
                      f"{(done.stdout + done.stderr)[-3000:]}", file=sys.stderr)  # fmt: skip
                return 1
            written = max(used_bytes(target) - before, 4096)
            references[name] = (seconds, command.digests(copy), written)
            print(f"reference {name}: {seconds:.1f} s, {written / 1e6:.2f} MB written into "
                  f"{output_folder(command)}", flush=True)  # fmt: skip
        draw = random.Random(args.seed)
        points = []
        for index in range(args.points):
            name, fault = draw.choice(args.commands), draw.choice(args.faults)
            share = draw.random()
            point = fault_point(COMMANDS[name], copy, env, fault, share, references[name],
                                prefect_home)  # fmt: skip
            points.append(point)
            at = f"{share:4.0%} of its bytes" if fault == "full" else f"{share:4.0%} of its time"
            how = "finished" if point.exit_code == 0 else f"exit {point.exit_code}"
            print(f"point {index + 1:>2}: {name:<10} {fault:<9} at {at}: {how}; "
                  f"{'ok' if point.ok else 'FAILED'}"
                  + "".join(f"\n    message: {x}" for x in point.message)
                  + "".join(f"\n    lost: {x}" for x in point.lost)
                  + "".join(f"\n    left: {x}" for x in point.leftovers)
                  + "".join(f"\n    rerun: {x}" for x in point.rerun), flush=True)  # fmt: skip
        failed = [p for p in points if not p.ok]
        refused = sum(p.exit_code != 0 for p in points)
        print(f"\n{len(points)} points over {', '.join(args.commands)} x "
              f"{', '.join(args.faults)} (seed {args.seed}): {refused} refused by the machine, "
              f"{sum(bool(p.message) for p in points)} said it badly, "
              f"{sum(bool(p.lost) for p in points)} lost or mixed something, "
              f"{sum(bool(p.leftovers) for p in points)} left something behind, "
              f"{sum(bool(p.rerun) for p in points)} reran to other bytes")  # fmt: skip
        return 1 if failed else 0
    finally:
        if args.keep:
            print(f"the copy: {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
