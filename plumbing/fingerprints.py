"""What decided an artefact's bytes: files by identity or by content, code by digest.

An artefact rebuilt only when its inputs change records them beside itself and compares
them with the inputs now (:mod:`wsi.freshness` for the stores, :mod:`analysis.audit.freshness`
for the audit, :mod:`analysis.staging.freshness` for a centre's staging). A source file
nobody rewrites (a slide) is identified without reading it, by size and modification
time: a rewrite or a copy changes the time, so the comparison errs one way only (an
artefact that would have come out the same is rebuilt; one whose input changed is never
kept). A file DVC caches (an output of another stage) by its content: DVC copies it into
its cache and back, which keeps its bytes, not its time. Code is identified by the digest
of its package's source.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Collection, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from plumbing.atomic import write_json


def file_identity(path: str | os.PathLike[str]) -> list[int]:
    """``[size, mtime_ns]`` of ``path``."""
    stat = Path(path).stat()
    return [stat.st_size, stat.st_mtime_ns]


def file_digest(path: str | os.PathLike[str]) -> str:
    """``sha256:`` and the SHA-256 of ``path``'s bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def walk_folders(root: Path) -> Iterator[tuple[Path, list[str]]]:
    """(folder, the names of its files, sorted) for ``root`` and every folder below it, in
    name order, following links to folders (real slides often lie on another disk, a
    centre's folder a link to it), each real folder once: a link back up is no loop."""
    visited: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in visited:
            dirnames.clear()
            continue
        visited.add(real)
        dirnames.sort()
        yield Path(dirpath), sorted(filenames)


def files_under(path: Path) -> Iterator[Path]:
    """``path`` if it is a file, every file below it (sorted, through links to folders:
    :func:`walk_folders`) if a directory, else none."""
    if path.is_file():
        yield path
    elif path.is_dir():
        found = (folder / name for folder, names in walk_folders(path) for name in names)
        yield from sorted(file for file in found if file.is_file())


def file_identities(root: Path, sources: Iterable[Path]) -> dict[str, list[int]]:
    """``{path relative to root: [size, mtime_ns]}`` of every file of ``sources`` (files or
    directories under ``root``); absent ones are left out."""
    return {
        path.relative_to(root).as_posix(): file_identity(path)
        for source in sources
        for path in files_under(source)
    }


def file_digests(root: Path, sources: Iterable[Path]) -> dict[str, str]:
    """``{path relative to root: file_digest}`` of every file of ``sources``."""
    return {
        path.relative_to(root).as_posix(): file_digest(path)
        for source in sources
        for path in files_under(source)
    }


def source_digest(package: Path, skip: Collection[str] = ()) -> str:
    """SHA-256 of every ``*.py`` under ``package`` (by relative path and bytes), less those
    whose first path part is in ``skip`` (a subpackage's directory name)."""
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        if relative.parts[0] in skip:
            continue
        digest.update(relative.as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def packages_digest(*packages: Path) -> str:
    """SHA-256 of the :func:`source_digest` of each of ``packages``, in order: the code of
    an artefact computed by several packages (the audit's and the staging's: ``analysis``,
    ``proxyfl`` and ``wsi``)."""
    return hashlib.sha256("".join(source_digest(p) for p in packages).encode()).hexdigest()


def artefact_digest(path: str | os.PathLike[str]) -> str:
    """A file's :func:`file_digest`; a directory's, the SHA-256 of its files' relative
    paths and digests (:func:`file_digests`): a file added, removed or changed below it
    changes it."""
    path = Path(path)
    if not path.is_dir():
        return file_digest(path)
    listing = json.dumps(file_digests(path, [path]), sort_keys=True)
    return "sha256:" + hashlib.sha256(listing.encode()).hexdigest()


def write_inputs_record(
    record: str | os.PathLike[str], inputs: Mapping[str, Any], artefacts: Mapping[str, Path]
) -> None:
    """Write ``record``: ``inputs`` (JSON), and under each name of ``artefacts`` (files or
    directories) its :func:`artefact_digest`, just written from them."""
    digests = {name: artefact_digest(path) for name, path in artefacts.items()}
    write_json(record, {"inputs": dict(inputs), **digests}, sort_keys=True)


def read_inputs_record(
    record: str | os.PathLike[str], artefacts: Mapping[str, Path]
) -> tuple[dict[str, Any], None] | tuple[None, str]:
    """``(inputs, None)`` as ``record`` holds them, when each of ``artefacts`` is there and
    is the file (or directory) recorded under its name, checked in order; else ``(None,
    why)``: the first reason to compute the artefacts again."""
    for path in artefacts.values():
        if not Path(path).exists():
            return None, f"no {path} yet"
    try:
        document = json.loads(Path(record).read_text())
        inputs, written = document["inputs"], {name: document[name] for name in artefacts}
    except (OSError, ValueError, KeyError, TypeError):
        return None, f"no readable record of its inputs ({record})"
    for name, path in artefacts.items():
        if written[name] != artefact_digest(path):
            kind = "directory" if Path(path).is_dir() else "file"
            return None, f"{path} is not the {kind} its record describes"
    return inputs, None
