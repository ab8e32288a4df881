"""Command lines generated from the parameter models, and parameter files read once.

A command's flags are the fields of pydantic models, each placed at a key path of the
parameters file (``--patch-size`` sets ``preprocess.patch_size``): the help text and the
default are the field's own. The file is read, the flags given on the command line are
laid over it at their key paths, and the result is validated once by the root model. Any
problem (not YAML, an unknown section or key, a wrong type or value) is one
:class:`ConfigError` naming the file, or the flag, with the key path and the reason; a
command exits with :data:`EXIT_BAD_PARAMETERS` before anything runs.
"""

from __future__ import annotations

import argparse
import sys
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from plumbing.errors import PipelineError

EXIT_BAD_PARAMETERS = 2
KeyPath = tuple[str, ...]
Model = TypeVar("Model", bound=BaseModel)


class ConfigError(PipelineError):
    """Bad parameters: ``subject`` is the file (or ``command line``), ``reason`` says which
    key and why."""


@dataclass(frozen=True)
class Flag:
    """One command-line option and the key of the parameters file it sets."""

    option: str  # "--patch-size"
    dest: str  # attribute of the parsed namespace
    key: KeyPath  # ("preprocess", "patch_size")


# --------------------------------------------------------------------------------------
# Flags from models
# --------------------------------------------------------------------------------------


def _none_or(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """``kind``, with ``null``/``none`` standing for ``None`` (an optional field's unset)."""

    def convert(text: str) -> Any:
        return None if text.lower() in ("null", "none") else kind(text)

    convert.__name__ = getattr(kind, "__name__", "value")
    return convert


def _argparse_options(annotation: Any) -> dict[str, Any]:
    """``type``/``nargs``/``choices``/``action`` for a field's annotation."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Annotated:
        return _argparse_options(args[0])
    if origin in (typing.Union, types.UnionType):
        present = [a for a in args if a is not type(None)]
        if len(present) == 1:
            options = _argparse_options(present[0])
            if "type" in options and len(present) < len(args):
                options["type"] = _none_or(options["type"])
            return options
        return {"nargs": "+"}  # e.g. one number, or one per centre: the model decides
    if origin is list or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
        return {**_argparse_options(args[0]), "nargs": "+"}
    if origin is tuple and args and len(set(args)) == 1:
        return {**_argparse_options(args[0]), "nargs": len(args)}
    if origin is Literal:  # the model checks the value (and may accept other spellings)
        return {"metavar": "{" + ",".join(str(a) for a in args) + "}"}
    if annotation is bool:
        return {"action": argparse.BooleanOptionalAction}
    if annotation in (int, float):
        return {"type": annotation}
    if isinstance(annotation, type) and issubclass(annotation, PurePath):
        return {"type": Path}  # a path typed in a subfolder is of that folder's
    return {}  # str, ...: the model converts


def _shown(value: Any) -> str:
    if isinstance(value, list | tuple):
        return " ".join(map(str, value))
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items())
    return "null" if value is None else str(value)


def add_model_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    model: type[BaseModel],
    at: KeyPath = (),
    *,
    exclude: Iterable[str] = (),
    current: Mapping[str, Any] | None = None,
    source: str = "params.yaml",
) -> list[Flag]:
    """One ``--flag`` per field of ``model`` (``patch_size`` -> ``--patch-size``), setting
    key ``at + (name,)``; see :func:`add_field_flag` for the help text."""
    excluded = set(exclude)
    return [
        add_field_flag(
            parser, "--" + name.replace("_", "-"), (*at, name), info, current=current, source=source
        )
        for name, info in model.model_fields.items()
        if name not in excluded
    ]


def add_field_flag(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    option: str,
    key: KeyPath,
    info: FieldInfo,
    *,
    current: Mapping[str, Any] | None = None,
    source: str = "params.yaml",
) -> Flag:
    """A flag setting ``key``, typed and explained by the model field ``info``. The help is
    the field's description and its value: from ``current`` (the key's section as the
    parameters file has it, shown as ``source``) else the field's default. A field marked
    ``json_schema_extra={"hidden": True}`` gets no help line."""
    name = key[-1]
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    if extra.get("hidden"):
        text = argparse.SUPPRESS
    else:
        if current is not None and name in current:
            shown = f"{source}: {_shown(current[name])}"
        elif info.default is not PydanticUndefined:
            shown = f"default: {_shown(info.default)}"
        elif info.default_factory is not None:
            shown = f"default: {_shown(info.default_factory())}"  # type: ignore[call-arg]
        else:
            shown = "required"
        # argparse %-formats help (for %(default)s): a literal % (a field's "~8 %
        # slower", a value's "50%") is written %%, or it prints the action's dict
        text = f"{info.description or name.replace('_', ' ')} ({shown})".replace("%", "%%")
    dest = "__".join(key)
    options = _argparse_options(info.annotation)
    if "metavar" not in options and "action" not in options:
        options["metavar"] = name.upper()
    parser.add_argument(option, dest=dest, default=None, help=text, **options)
    return Flag(option, dest, key)


def given(args: argparse.Namespace, flags: Sequence[Flag]) -> dict[Flag, Any]:
    """The flags given on the command line, with their values."""
    return {flag: getattr(args, flag.dest) for flag in flags
            if getattr(args, flag.dest, None) is not None}  # fmt: skip


# --------------------------------------------------------------------------------------
# Parameters files
# --------------------------------------------------------------------------------------


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping: YAML would keep the
    last silently, and DVC (ruamel) refuses the file, so a parameters file read here and by
    ``dvc repro`` could otherwise mean two things."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor`: merged keys may be overridden, as YAML has it
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, typing.Hashable) and key in first:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice in one mapping (first on line "
                    f"{first[key] + 1}); keep one", key_node.start_mark,
                )  # fmt: skip
            if isinstance(key, typing.Hashable):
                first[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path, *, required: bool = True) -> dict[str, Any]:
    """The mapping ``path`` holds; ``{}`` for a missing file that is not ``required``. A
    key given twice in one mapping is an error (:class:`_UniqueKeyLoader`)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(path, "is a folder, not a parameters file")
    if not path.is_file():
        if required:
            raise ConfigError(path, "no such parameters file")
        return {}
    try:
        document = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        raise ConfigError(path, f"not valid YAML ({where}{problem})") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(path, f"cannot read it ({error})") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ConfigError(path, f"must hold a mapping of sections, not {type(document).__name__}")
    return document


def layered(document: Mapping[str, Any], values: Mapping[Flag, Any]) -> dict[str, Any]:
    """``document`` with each flag's value set at its key path (a deep copy where changed)."""
    merged: dict[str, Any] = dict(document)
    for flag, value in values.items():
        level = merged
        for part in flag.key[:-1]:
            inner = level.get(part)
            level[part] = dict(inner) if isinstance(inner, Mapping) else {}
            level = level[part]
        level[flag.key[-1]] = value
    return merged


def _known_keys(model: type[BaseModel], path: Sequence[Any]) -> list[str] | None:
    """The keys the model accepts at ``path`` (None where that is not a model)."""
    current: Any = model
    for part in path:
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        info = current.model_fields.get(str(part))
        if info is None:
            return None
        current = info.annotation
    if isinstance(current, type) and issubclass(current, BaseModel):
        # a model that reads only part of its input names all it accepts (StageParams)
        return list(getattr(current, "KNOWN_KEYS", None) or current.model_fields)
    return None


def validate(
    model: type[Model],
    data: Mapping[str, Any],
    source: Path | str,
    flags: Mapping[Flag, Any] | Iterable[Flag] = (),
) -> Model:
    """``model`` validated from ``data``; a :class:`ConfigError` naming ``source`` (or the
    flag whose value is wrong), every key path and its reason."""
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise config_error(model, error, source, flags) from None


def config_error(
    model: type[BaseModel],
    error: ValidationError,
    source: Path | str,
    flags: Mapping[Flag, Any] | Iterable[Flag] = (),
) -> ConfigError:
    """One :class:`ConfigError` for all of ``error``'s problems."""
    by_key = {flag.key: flag.option for flag in flags}
    reasons: dict[str, str] = {}  # key path -> reason; a union's other branches add nothing
    from_flags: list[bool] = []
    for item in error.errors():
        loc = [str(part) for part in item["loc"] if not _is_union_branch(part)]
        key = ".".join(loc) or "(top level)"
        if key in reasons:
            continue
        if item["type"] == "extra_forbidden":
            known = _known_keys(model, loc[:-1])
            reason = "unknown key" + (f" (known: {', '.join(known)})" if known else "")
        else:
            reason = str(item["msg"]).removeprefix("Value error, ")
            if isinstance(item.get("input"), str | int | float | bool):
                reason += f", got {item['input']!r}"
        # the flag that set this key, or the list or mapping it is an item of
        option = next((by_key[tuple(loc[:n])] for n in range(len(loc), 0, -1)
                       if tuple(loc[:n]) in by_key), None)  # fmt: skip
        from_flags.append(option is not None)
        reasons[key] = f"{key} ({option}): {reason}" if option else f"{key}: {reason}"
    # every wrong value came from a flag: the file is not to blame
    subject = "command line" if from_flags and all(from_flags) else source
    return ConfigError(subject, "; ".join(reasons.values()))


def _is_union_branch(part: int | str) -> bool:
    """Pydantic names the branch of a union in an error's location ('int',
    'constrained-int', 'dict[int,constrained-int]'); keys of the file never look so."""
    return isinstance(part, str) and (
        "[" in part or "-" in part or part in ("int", "float", "str", "bool", "list", "dict")
    )


def exit_on_bad_parameters(main: Callable[..., int]) -> Callable[..., int]:
    """Decorate a command's ``main``: a :class:`ConfigError` prints ``error: ...`` and
    returns :data:`EXIT_BAD_PARAMETERS`."""

    def wrapper(*args: Any, **kwargs: Any) -> int:
        try:
            return main(*args, **kwargs)
        except ConfigError as error:
            print(f"error: invalid parameters: {error}", file=sys.stderr)
            return EXIT_BAD_PARAMETERS

    wrapper.__name__ = main.__name__
    wrapper.__doc__ = main.__doc__
    return wrapper


def refuse_unwritable(unwritable: Mapping[str, str]) -> bool:
    """Print ``error: KEY: why`` for each output folder of ``unwritable`` (a section's
    ``unwritable_folders()``); whether there was any. Every command checks its output
    folders so before it starts any work, and exits 2 when one cannot be written."""
    for key, reason in unwritable.items():
        print(f"error: {key}: {reason}", file=sys.stderr)
    return bool(unwritable)
