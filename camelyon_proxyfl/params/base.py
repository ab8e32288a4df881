"""What every section and every command of the parameters file shares: the section base
class, a stage's own view of the file, and the command whose flags set the file's keys."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, model_validator

from plumbing.cli import (
    ConfigError,
    Flag,
    KeyPath,
    add_field_flag,
    add_model_flags,
    given,
    layered,
    read_yaml,
    validate,
)
from plumbing.parameters import Parameters

logger = logging.getLogger(__name__)

DEFAULT_PARAMS = Path("params.yaml")
# every section of a parameters file (camelyon_proxyfl.params.whole.Params' fields)
SECTIONS = ("data", "preprocess", "train", "audit", "stage", "report", "machine")


# Keys renamed since an earlier version, with what the new name says: a file that still
# uses an old key is refused, naming the new one (never silently ignored or mapped).
RENAMED_KEYS: dict[KeyPath, tuple[KeyPath, str]] = {
    ("train", "options", "workers"): (
        ("train", "options", "loader_workers"),
        "the DataLoader processes of each rank, not preprocess.workers' pool",
    ),
}


def refuse_renamed_keys(
    document: Mapping[str, Any], sections: Sequence[str], source: Path | str
) -> None:
    """A :class:`ConfigError` for the first key of ``sections`` in ``document`` that has
    been renamed (:data:`RENAMED_KEYS`)."""
    for old, (new, meaning) in RENAMED_KEYS.items():
        if old[0] not in sections:
            continue
        level: Any = document
        for part in old[:-1]:
            level = level.get(part) if isinstance(level, Mapping) else None
        if isinstance(level, Mapping) and old[-1] in level:
            raise ConfigError(
                source, f"{'.'.join(old)}: renamed {'.'.join(new)} ({meaning}); rename the key"
            )


class Section(Parameters):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StageParams(Section):
    """The sections of a parameters file one stage reads, as its fields. The file's other
    sections are left unread (another stage validates them); a section that no stage
    knows is an error."""

    KNOWN_KEYS: ClassVar[tuple[str, ...]] = SECTIONS  # for the error naming an unknown one

    @model_validator(mode="before")
    @classmethod
    def _only_own_sections(cls, document: Any) -> Any:
        if not isinstance(document, Mapping):
            return document
        others = set(SECTIONS) - set(cls.model_fields)
        return {key: value for key, value in document.items() if key not in others}


Stage = TypeVar("Stage", bound=StageParams)


def project_root(start: Path) -> Path | None:
    """The project ``start`` is in: the nearest of ``start`` and the folders above it that
    holds ``params.yaml`` (as git looks for ``.git`` and DVC for ``.dvc``); ``None`` in
    none. Every relative path of the file is relative to that folder."""
    for folder in (start, *start.parents):
        if (folder / DEFAULT_PARAMS).exists():  # a folder so named is then said to be one
            return folder
    return None


def enter_project(argv: Sequence[str] | None) -> Path | None:
    """Make the project's folder (:func:`project_root` of the working directory) this
    process's working directory, so that a command started in a subfolder (``results/``)
    reads the project's ``params.yaml`` and its paths as one started there does. Returns
    the folder the command was started in where it moved (paths the user typed are
    relative to it: :func:`from_folder`), else ``None``. A ``--config`` given names the
    file itself: nothing moves. A :class:`ConfigError` where no folder holds the file."""
    if config_option(argv)[1]:
        return None
    started = Path.cwd()
    root = project_root(started)
    if root is None:
        raise ConfigError(
            started, f"no {DEFAULT_PARAMS} here nor in any folder above it: run the command "
            f"in the project's folder (the one holding {DEFAULT_PARAMS}) or below it, or name "
            "the parameters file with --config",
        )  # fmt: skip
    if root == started:
        return None
    os.chdir(root)
    logger.info("project: %s (its %s)", root, DEFAULT_PARAMS)
    return started


def from_folder(started: Path | None, value: Any) -> Any:
    """``value`` (a flag's: a path, or a list of them) with each relative path made
    relative to ``started``, the folder the command was started in (:func:`enter_project`);
    anything else as it is."""
    if started is None:
        return value
    if isinstance(value, Path):
        return value if value.is_absolute() else started / value
    if isinstance(value, list):
        return [from_folder(started, item) for item in value]
    return value


def config_option(argv: Sequence[str] | None) -> tuple[Path, bool]:
    """The ``--config`` file of ``argv`` (default ``params.yaml``) and whether it was given."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--config", type=Path, default=None)
    known, _ = early.parse_known_args(argv)
    return (known.config or DEFAULT_PARAMS), known.config is not None


class ParamsCommand(Generic[Stage]):
    """A command whose flags set keys of a parameters file, and which validates the
    sections its stage reads (``stage``: a :class:`StageParams`, or the whole file).

    >>> command = ParamsCommand(PreprocessParams, "python -m flows.preprocess", doc, argv)
    >>> command.add_section(PreprocessSection, ("preprocess",))
    >>> command.add_key("--data-root", ("data", "root"))
    >>> args, params = command.parse()
    """

    def __init__(
        self, stage: type[Stage], prog: str, description: str, argv: Sequence[str] | None
    ) -> None:
        self.stage, self.argv = stage, argv
        words = sys.argv[1:] if argv is None else argv
        asking_for_help = bool({"-h", "--help"} & set(words))
        try:
            self.started_in = enter_project(argv)
        except ConfigError:
            if not asking_for_help:
                raise
            self.started_in = None
        self.params_file, explicit = config_option(argv)
        try:
            self.document = read_yaml(self.params_file, required=explicit)
        except ConfigError:
            if not asking_for_help:
                raise
            self.document = {}
        self.parser = argparse.ArgumentParser(prog=prog, description=description)
        self.parser.add_argument(
            "--config", type=Path, default=DEFAULT_PARAMS, metavar="PARAMS",
            help="parameters file; flags override its keys (default: the params.yaml of "
            "this folder or the nearest one above it, the project's; an empty file: the "
            "built-in defaults, the paper's)",
        )  # fmt: skip
        self.flags: list[Flag] = []

    def add_section(
        self,
        model: type[BaseModel],
        key: KeyPath,
        *,
        exclude: Sequence[str] = (),
        group: str | None = None,
    ) -> None:
        """A flag for each field of ``model``, the section at ``key``."""
        parser = self.parser.add_argument_group(group) if group else self.parser
        self.flags += add_model_flags(
            parser,
            model,
            key,
            exclude=exclude,
            current=self.section(*key),
            source=str(self.params_file),
        )

    def add_key(self, option: str, key: KeyPath) -> None:
        """A flag for one key of another section (``--data-root`` for ``data.root``)."""
        model: Any = self.stage
        for part in key[:-1]:
            model = model.model_fields[part].annotation
        self.flags.append(add_field_flag(self.parser, option, key, model.model_fields[key[-1]],
                                         current=self.section(*key[:-1]),
                                         source=str(self.params_file)))  # fmt: skip

    def section(self, *key: str) -> Mapping[str, Any]:
        """The file's values at ``key`` (for the help texts)."""
        level: Any = self.document
        for part in key:
            level = level.get(part) if isinstance(level, Mapping) else None
        return level if isinstance(level, Mapping) else {}

    def parse(self) -> tuple[argparse.Namespace, Stage]:
        """The parsed flags and the stage's sections validated with them laid over it."""
        args = self.parser.parse_args(self.argv)
        for name, value in vars(args).items():  # as typed in the folder it was started in
            if name != "config":  # given, nothing moved; else the project's
                setattr(args, name, from_folder(self.started_in, value))
        values = given(args, self.flags)
        refuse_renamed_keys(self.document, list(self.stage.model_fields), self.params_file)
        merged = layered(self.document, values)
        return args, validate(self.stage, merged, self.params_file, values)


def load_sections(
    stage: type[Stage], path: Path = DEFAULT_PARAMS, *, required: bool = True
) -> Stage:
    """The sections ``stage`` reads of the parameters file at ``path``, validated; a
    :class:`~plumbing.cli.ConfigError` otherwise."""
    document = read_yaml(path, required=required)
    refuse_renamed_keys(document, list(stage.model_fields), path)
    return validate(stage, document, path)
