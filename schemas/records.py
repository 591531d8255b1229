"""Frozen records checked against their annotations, without pydantic (schemas.manifest).

:class:`Record` is a frozen, keyword-only dataclass whose fields are checked whenever one
is made: str, int, float (an int taken for one: JSON has one number type), bool (never
an int), a Literal of strings, ``X | None``, ``dict[str, X]`` and other records, made from
their JSON objects. Each annotation's check is compiled once (:func:`_checker`). The
methods keep pydantic's names (``model_validate``, ``model_validate_json``, ``model_dump``,
``model_copy``), so records read like the spec and artifact models; a value that does
not match raises :class:`ManifestError` naming the field's path.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from functools import cache, partial
from typing import Any, Literal, Union, get_args, get_origin

from schemas.fileio import parse_json


class ManifestError(ValueError):
    """A manifest, or a record in it, that does not match its fields: ``path: problem``."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}" if path else problem)
        self.path, self.problem = path, problem

    def within(self, outer: str) -> ManifestError:
        """The same problem, its path prefixed with the enclosing field ``outer``."""
        return ManifestError(f"{outer}.{self.path}" if self.path else outer, self.problem)


Check = Callable[[Any, str], Any]
"""A compiled check of one annotation: ``(value, path) -> value`` (a record made from its
JSON object, an int made a float), or :class:`ManifestError` naming ``path``."""


def _shown(value: Any) -> str:
    """``repr(value)``, cut to 60 characters (a hostile file's value may be megabytes)."""
    shown = repr(value)
    return shown if len(shown) <= 60 else f"{shown[:57]}..."


def _wrong(path: str, expected: str, value: Any) -> ManifestError:
    return ManifestError(path, f"expected {expected}, got {type(value).__name__} {_shown(value)}")


def _str(value: Any, path: str) -> str:
    if isinstance(value, str):
        return value
    raise _wrong(path, "str", value)


def _int(value: Any, path: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise _wrong(path, "int", value)


def _float(value: Any, path: str) -> float:
    """A float, or an int as one (JSON has one number type); never a bool."""
    if isinstance(value, float):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if abs(value) < 2**1023:
            return float(value)
        raise ManifestError(path, f"expected float, got an int of {value.bit_length()} bits")
    raise _wrong(path, "float", value)


def _bool(value: Any, path: str) -> bool:
    if value is True or value is False:
        return value
    raise _wrong(path, "bool", value)


def _literal(allowed: tuple[str, ...], value: Any, path: str) -> str:
    if isinstance(value, str) and value in allowed:
        return value
    choices = ", ".join(map(repr, allowed))
    raise ManifestError(path, f"expected one of {choices}, got {_shown(value)}")


def _optional(inner: Check, value: Any, path: str) -> Any:
    return None if value is None else inner(value, path)


def _mapping(item: Check, plain: frozenset[type] | None, value: Any, path: str) -> dict[str, Any]:
    """An object whose keys are strings and whose values pass ``item``; when ``item``
    only takes values of the exact types ``plain`` (str, ``str | None``), checked by type
    in one pass (a run's table digests: ~130 entries)."""
    if not isinstance(value, dict):
        raise _wrong(path, "an object", value)
    plain_keys = plain is not None and set(map(type, value)) <= {str}
    if plain_keys and set(map(type, value.values())) <= plain:
        return dict(value)
    out = {}
    for key, v in value.items():
        try:
            out[_str(key, "")] = item(v, key)
        except ManifestError as e:
            raise e.within(path) from None
    return out


def _record(cls: type[Record], value: Any, path: str) -> Record:
    try:
        return cls.model_validate(value)
    except ManifestError as e:
        raise e.within(path) from None


@cache
def _checker(tp: Any) -> Check:
    """The check of the annotation ``tp``: str, int, float, bool, a Literal of strings,
    ``X | None``, ``dict[str, X]`` or a record (made once per annotation)."""
    origin = get_origin(tp)
    if origin is Literal:
        return partial(_literal, get_args(tp))
    if origin in (Union, types.UnionType):
        (inner,) = [a for a in get_args(tp) if a is not type(None)]
        return partial(_optional, _checker(inner))
    if origin is dict:
        item = get_args(tp)[1]
        plain = {str: frozenset({str}), str | None: frozenset({str, type(None)})}.get(item)
        return partial(_mapping, _checker(item), plain)
    if isinstance(tp, type) and issubclass(tp, Record):
        return partial(_record, tp)
    return {str: _str, int: _int, float: _float, bool: _bool}[tp]


@dataclasses.dataclass(frozen=True)
class _Shape:
    """A record class's fields: ``(name, check, default)`` in declared order (``default``:
    a function giving the default, None for a required field), and their names."""

    fields: tuple[tuple[str, Check, Callable[[], Any] | None], ...]
    names: frozenset[str]


@cache
def _shape(cls: type) -> _Shape:
    hints = typing.get_type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        default = None if f.default is dataclasses.MISSING else partial(_same, f.default)
        default = default if f.default_factory is dataclasses.MISSING else f.default_factory
        fields.append((f.name, _checker(hints[f.name]), default))
    return _Shape(tuple(fields), frozenset(hints))


def _same(value: Any) -> Any:
    return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class Record:
    """A frozen record whose fields are checked against their annotations when it is made
    (extra keys and missing required ones refused by :meth:`model_validate`)."""

    def __post_init__(self) -> None:
        for name, check, _ in _shape(type(self)).fields:
            object.__setattr__(self, name, check(getattr(self, name), name))

    @classmethod
    def model_validate(cls, data: Any) -> typing.Self:
        """The record of a parsed JSON object (or the record itself): each field checked
        once, straight into the new record (``__init__`` would set and check it again)."""
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            raise _wrong("", "an object", data)
        shape = _shape(cls)
        for key in data:
            if key not in shape.names:
                names = ", ".join(name for name, *_ in shape.fields)
                raise ManifestError(str(key), f"unknown field (fields: {names})")
        values = {}
        for name, check, default in shape.fields:
            if name in data:
                values[name] = check(data[name], name)
            elif default is None:
                raise ManifestError(name, "field required")
            else:
                values[name] = default()
        record = object.__new__(cls)
        record.__dict__.update(values)  # frozen: no __setattr__
        return record

    @classmethod
    def model_validate_json(cls, raw: str | bytes) -> typing.Self:
        """The record of a JSON document."""
        try:
            data = parse_json(raw)
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, too deep
            raise ManifestError("", f"not valid JSON ({e})") from e
        return cls.model_validate(data)

    def model_dump(self, mode: str = "json") -> dict[str, Any]:
        """The record as a JSON object, fields in their declared order (every value is a
        JSON type already, so ``mode`` changes nothing)."""
        return {f.name: _dump(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def model_copy(self, update: dict[str, Any] | None = None) -> typing.Self:
        """A copy with the fields of ``update`` replaced, checked as any new record."""
        return dataclasses.replace(self, **(update or {}))


def _dump(value: Any) -> Any:
    if isinstance(value, Record):
        return value.model_dump()
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value
