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
from collections.abc import Sequence
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ValidationInfo, field_validator

Item = TypeVar("Item")

BOOLEAN_HINT = ("a YAML boolean (as yes/no, on/off and true/false are read): write the "
                "number, or quote the word ('off')")  # fmt: skip


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


def _items_type(annotation: Any) -> Any | None:
    """The item type of a list, tuple or set type (``None`` for any other type)."""
    if typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (list, tuple, set, frozenset):
        args = [arg for arg in typing.get_args(annotation) if arg is not Ellipsis]
        return args[0] if len(set(args)) == 1 else None
    return None


class Parameters(BaseModel):
    """A model of parameters read from a file or a command line (module docstring)."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_for_another_type(cls, value: Any, info: ValidationInfo) -> Any:
        if info.field_name is None:
            return value
        annotation = cls.model_fields[info.field_name].annotation
        if isinstance(value, bool) and not accepts_bool(annotation):
            if {"on", "off"} <= _words(annotation):
                return "on" if value else "off"
            raise ValueError(BOOLEAN_HINT)
        items = _items_type(annotation)
        if isinstance(value, list | tuple) and items is not None and not accepts_bool(items):
            booleans = [i for i, item in enumerate(value) if isinstance(item, bool)]
            if booleans:
                raise ValueError(f"item {booleans[0]} is {BOOLEAN_HINT}")
        return value


def distinct(values: Sequence[Item], what: str) -> Sequence[Item]:
    """``values`` if each is listed once; a ``ValueError`` naming the repeated ones (a
    repeated seed or method would run the same job twice into one folder)."""
    repeated = list(dict.fromkeys(v for v in values if list(values).count(v) > 1))
    if repeated:
        raise ValueError(f"{what} {', '.join(map(str, repeated))} listed more than once")
    return values
