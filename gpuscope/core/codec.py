"""The frozen dataclasses that flow to the console, as JSON values and back.

Sessions (journal, snapshot, replay) store frames and serving snapshots with this one codec, so a
field added to a model class is recorded and replayed without touching the sessions code: a
dataclass becomes an object of its fields (a field at its default is left out, which keeps
recordings small and lets newer readers fill fields older files lack); tuples become lists.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from functools import cache
from typing import Any, TypeVar

T = TypeVar("T")


class DecodeError(ValueError):
    """A stored value does not fit the class it should become."""


def encode(value: Any) -> Any:
    """A JSON-ready value: dataclasses as objects of their non-default fields, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if f.default is not dataclasses.MISSING and _same(v, f.default):
                continue
            out[f.name] = encode(v)
        return out
    if isinstance(value, (tuple, list)):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def decode(cls: type[T], data: Any) -> T:
    """`data` (as `encode` made it) back into an instance of the dataclass `cls`."""
    return _decode(cls, data)


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _decode(tp: Any, data: Any) -> Any:
    if tp is Any:
        return data
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if data is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _decode(option, data)
            except DecodeError as exc:
                errors.append(str(exc))
        raise DecodeError("; ".join(errors) or f"unexpected {data!r}")
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(data, list):
            raise DecodeError(f"expected a list, not {type(data).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v) for v in data)
        if len(args) != len(data):
            raise DecodeError(f"expected {len(args)} items, not {len(data)}")
        return tuple(_decode(a, v) for a, v in zip(args, data))
    if origin is dict or tp is dict:
        if not isinstance(data, dict):
            raise DecodeError(f"expected an object, not {type(data).__name__}")
        args = typing.get_args(tp)
        return {k: _decode(args[1], v) for k, v in data.items()} if args else dict(data)
    if dataclasses.is_dataclass(tp):
        if not isinstance(data, dict):
            raise DecodeError(f"expected an object for {tp.__name__}, not {type(data).__name__}")
        hints = _hints(tp)
        names = {f.name for f in dataclasses.fields(tp)}
        # Keys a newer gpuscope wrote are ignored; the schema version guards real incompatibility.
        kwargs = {k: _decode(hints[k], v) for k, v in data.items() if k in names}
        try:
            return tp(**kwargs)
        except TypeError as exc:
            raise DecodeError(f"{tp.__name__}: {exc}") from None
    if tp is float:
        if data in ("inf", "-inf"):
            return float(data)
        if data is None:  # NaN was stored as null
            return math.nan
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return float(data)
        raise DecodeError(f"expected a number, not {data!r}")
    if tp is int:
        if isinstance(data, int) and not isinstance(data, bool):
            return data
        raise DecodeError(f"expected a whole number, not {data!r}")
    if tp is bool or tp is str:
        if type(data) is tp:
            return data
        raise DecodeError(f"expected {tp.__name__}, not {data!r}")
    if tp is type(None):
        if data is None:
            return None
        raise DecodeError(f"expected null, not {data!r}")
    raise DecodeError(f"cannot decode {tp!r}")
