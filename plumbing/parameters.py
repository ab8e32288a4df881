"""What every model of parameters shares: YAML's booleans are never taken for numbers or
words, and a list that names things names each once.

PyYAML reads YAML 1.1, where ``yes``, ``no``, ``on``, ``off``, ``true`` and ``false`` are
booleans, and pydantic takes a boolean for an integer (``rounds: yes`` would train one
round). A :class:`Parameters` field whose type has no ``bool`` in it refuses a boolean,
saying to write the number or to quote the word; a field whose words are ``on`` and
``off`` takes the boolean for the word it was written as (``compile: off``).
"""

from __future__ import annotations

import types
import typing
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import PurePath
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ValidationInfo, field_validator

Item = TypeVar("Item")

BOOLEAN = "a YAML boolean (as yes/no, on/off and true/false are read)"


def _members(annotation: Any) -> list[Any]:
    """``annotation``'s types, through unions and ``Annotated``."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _members(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [member for arg in typing.get_args(annotation) for member in _members(arg)]
    return [annotation]


def boolean_hint(annotation: Any) -> str:
    """What to write instead of a boolean where a field of type ``annotation`` holds none."""
    members = _members(annotation)
    number = any(m in (int, float) for m in members)
    word = any(m is str or (isinstance(m, type) and issubclass(m, PurePath))
               or typing.get_origin(m) is Literal for m in members)  # fmt: skip
    if number and word:
        return f"{BOOLEAN}: write the number, or quote the word"
    if number:
        return f"{BOOLEAN}: write the number"
    if word:
        return f"{BOOLEAN}: quote the word ('off')"
    return f"{BOOLEAN}, which this key does not take"


def accepts_bool(annotation: Any) -> bool:
    """Whether a field of type ``annotation`` holds a boolean as one (``bool``, ``Any``, or
    a union or literal with a boolean in it)."""
    if annotation is bool or annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return accepts_bool(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return any(accepts_bool(arg) for arg in typing.get_args(annotation))
    if origin is Literal:
        return any(isinstance(arg, bool) for arg in typing.get_args(annotation))
    return False


def _words(annotation: Any) -> set[str]:
    """The string values of a literal type (through unions and ``Annotated``)."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return {arg for arg in typing.get_args(annotation) if isinstance(arg, str)}
    if origin in (Annotated, typing.Union, types.UnionType):
        return set().union(*(_words(arg) for arg in typing.get_args(annotation)))
    return set()


def _contained(annotation: Any, containers: tuple[type, ...], arg: int) -> Any | None:
    """The type of what the ``containers`` among ``annotation``'s members hold (argument
    ``arg`` of each: a list's items, a dict's values), a union where several; ``None``
    where no member is such a container, or says nothing of its contents."""
    origin = typing.get_origin(annotation)
    if origin in (Annotated, typing.Union, types.UnionType):
        members = typing.get_args(annotation)[:1] if origin is Annotated else typing.get_args(
            annotation)  # fmt: skip
        found = [t for t in (_contained(m, containers, arg) for m in members) if t is not None]
        return typing.Union[tuple(found)] if found else None  # noqa: UP007
    if origin in containers:
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        return args[arg] if len(args) > arg else None
    return None


def boolean_where(value: Any, annotation: Any) -> tuple[str, Any] | None:
    """Where in ``value`` a boolean stands that a field of type ``annotation`` does not hold
    as one, and the type there: ``""`` for ``value`` itself, ``"[0]"`` or ``"[2][1]"`` for
    an item of a list or a dict's value (through unions and nesting); ``None`` where none
    does."""
    if isinstance(value, bool):
        return None if accepts_bool(annotation) else ("", annotation)
    if annotation is Any:
        return None
    if isinstance(value, Mapping):
        inner = _contained(annotation, (dict, Mapping), 1)
        items: Iterable[tuple[Any, Any]] = value.items()
    elif isinstance(value, list | tuple | set | frozenset):
        inner = _contained(annotation, (list, tuple, set, frozenset, Sequence), 0)
        items = enumerate(value)
    else:
        return None
    if inner is None:
        return None
    for key, item in items:
        found = boolean_where(item, inner)
        if found is not None:
            return f"[{key!r}]{found[0]}", found[1]
    return None


class Parameters(BaseModel):
    """A model of parameters read from a file or a command line (module docstring)."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_for_another_type(cls, value: Any, info: ValidationInfo) -> Any:
        if info.field_name is None:
            return value
        annotation = cls.model_fields[info.field_name].annotation
        words = {"on", "off"} <= _words(annotation)
        if isinstance(value, bool) and words and not accepts_bool(annotation):
            return "on" if value else "off"
        found = boolean_where(value, annotation)
        if found is not None:
            where, expected = found
            hint = boolean_hint(expected)
            raise ValueError(f"item {where} is {hint}" if where else hint)
        return value


def distinct(values: Sequence[Item], what: str) -> Sequence[Item]:
    """``values`` if each is listed once; a ``ValueError`` naming the repeated ones (a
    repeated seed or method would run the same job twice into one folder)."""
    counts = Counter(values)
    repeated = [value for value, count in counts.items() if count > 1]
    if repeated:
        raise ValueError(f"{what} {', '.join(map(str, repeated))} listed more than once")
    return values
