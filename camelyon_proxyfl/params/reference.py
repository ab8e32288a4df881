"""The configuration reference: every key of a parameters file, its type, default and
help, read from the models that validate the file (:class:`~camelyon_proxyfl.params.whole.
Params`), so that the documentation cannot drift from the code.

The documentation site's hook (``docs/hooks/configuration.py``) puts
:func:`reference_markdown` into ``docs/configuration.md``; ``tests/docs/test_docs.py``
checks that every key of ``params.yaml`` and ``params-paper.yaml`` is in it.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined


@dataclass(frozen=True)
class KeyReference:
    """One key of a parameters file: ``key`` dotted (``train.options.sigma``)."""

    key: str
    type: str
    default: str
    help: str
    section: bool  # a mapping of further keys (its own table follows)


def _section_model(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds, where it holds one (a section of further keys)."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def type_name(annotation: Any) -> str:
    """A reader's name of a field's type: ``int``, ``list[int]``, ``'a' | 'b'``, ``float |
    None``, ``int | dict[int, int]`` (constraints dropped: the help states them)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(type_name(a) for a in args)}]"
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type):
        return "path" if issubclass(annotation, PurePath) else annotation.__name__
    return str(annotation)


def _default(info: FieldInfo) -> Any:
    """The value a key left out of the file takes (None for a required one)."""
    default = info.get_default(call_default_factory=True)
    return None if default is PydanticUndefined else default


def _shown(value: Any) -> str:
    """A default as it would be written in params.yaml."""
    if isinstance(value, BaseModel):
        return ""
    if isinstance(value, PurePath):
        return value.as_posix()
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def key_references(model: type[BaseModel], at: tuple[str, ...] = ()) -> Iterator[KeyReference]:
    """Every key of ``model``, depth first in the file's order: a section's row, then its
    keys'."""
    for name, info in model.model_fields.items():
        key = (*at, name)
        section = _section_model(info.annotation)
        help_text = info.description or ""
        if section is not None and not help_text:
            help_text = _first_paragraph(section)
        yield KeyReference(".".join(key), "section" if section else type_name(info.annotation),
                           _shown(_default(info)), help_text, section is not None)  # fmt: skip
        if section is not None:
            yield from key_references(section, key)


def undocumented_keys(model: type[BaseModel], at: tuple[str, ...] = ()) -> list[str]:
    """The keys of ``model`` whose help is empty: each key's field must say what it sets
    (``Field(description=...)``; a section may say it in its class's docstring)."""
    return [ref.key for ref in key_references(model, at) if not ref.help.strip()]


def _first_paragraph(model: type[BaseModel]) -> str:
    """The model's docstring's first paragraph in Markdown, less a leading ``name:``: (the
    section's heading says it)."""
    text = " ".join((inspect.getdoc(model) or "").split("\n\n")[0].split())
    return re.sub(r"^``\w+:``: ", "", text).replace("``", "`")


def reference_markdown(model: type[BaseModel] | None = None) -> str:
    """The reference in Markdown: a heading per section (``## `train:` ``, ``### `train.
    options:` ``) with its help, then one item per key: the key, its type, its default,
    what it sets."""
    if model is None:
        from camelyon_proxyfl.params.whole import Params

        model = Params
    parts: list[str] = []
    for ref in key_references(model):
        if ref.section:
            level = "#" * min(2 + ref.key.count("."), 4)
            parts += ["", f"{level} `{ref.key}:`", "", ref.help, ""]
            continue
        default = f", default `{ref.default}`" if ref.default else ""
        parts.append(f"- **`{ref.key}`** ({ref.type}{default}): {ref.help}")
    return "\n".join(parts).strip() + "\n"
