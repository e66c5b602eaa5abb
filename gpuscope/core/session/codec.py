"""The frozen dataclasses that flow to the console, as JSON values and back.

Sessions (journal, snapshot, replay) store frames and serving snapshots with this one codec, so a
field added to a model class is recorded and replayed without touching the sessions code: a
dataclass becomes an object of its fields (a field at its default is left out, which keeps
recordings small and lets newer readers fill fields older files lack); tuples become lists.

`decode` reads files that anyone may have written, so it checks every value against its field's
type: a string where a number belongs, a list where an object belongs, a whole number past 64
bits, a number past MAX_NUMBER (a byte count past an exabyte) or a free-form value nested past
MAX_DEPTH is a DecodeError, never a value that crashes whoever uses it later. A `Decoder` can
also check fields by name (what a PID or a time may be).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from gpuscope.errors import GpuscopeError

T = TypeVar("T")


class DecodeError(GpuscopeError, ValueError):
    """A stored value does not fit the class it should become."""


MAX_NUMBER = 1e18  # larger than any count of bytes, time or rate gpuscope records
INT_LIMIT = 2**63  # what SQLite and every other reader of the file can hold


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
    return _PLAIN_DECODER.decode(cls, data)


class Decoder:
    """Decodes into dataclasses, checking each value against its type and, for the fields named
    in `checks`, against what the name says (`checks["pid"](value)` true for a usable PID, say);
    `default_check` is for every other field. `finite`: every float is a finite number (an
    infinity where None may be is None: not known), for readers that do arithmetic on what they
    are given. `upgrades[cls]` turns an object of `cls` as an older gpuscope wrote it (fields since
    renamed or regrouped) into the current form, before it is decoded and checked.

    Each type is turned into a decoding function once: reading an hour of frames costs little
    more than parsing them."""

    def __init__(self, checks: Mapping[str, Callable[[Any], bool]] | None = None, *,
                 default_check: Callable[[Any], bool] | None = None, finite: bool = False,
                 upgrades: Mapping[type, Callable[[dict], dict]] | None = None) -> None:
        self._checks = dict(checks or {})
        self._upgrades = dict(upgrades or {})
        self._default_check = default_check
        self._finite = finite
        self._compiled: dict[Any, Callable[[Any], Any]] = {}

    def decode(self, cls: type[T], data: Any) -> T:
        return self._for(cls)(data)

    def _for(self, tp: Any) -> Callable[[Any], Any]:
        decoder = self._compiled.get(tp)
        if decoder is None:
            decoder = self._compiled[tp] = self._compile(tp)
        return decoder

    def _compile(self, tp: Any) -> Callable[[Any], Any]:
        if tp is Any:
            return _plain
        origin = typing.get_origin(tp)
        if origin in (typing.Union, types.UnionType):
            return self._union(tp)
        if origin is tuple:
            return self._tuple(tp)
        if origin is dict or tp is dict:
            args = typing.get_args(tp)
            value = self._for(args[1]) if args else None

            def mapping(data: Any) -> dict:
                if not isinstance(data, dict):
                    raise DecodeError(f"expected an object, not {_shown(data)}")
                return {k: value(v) for k, v in data.items()} if value else _plain(dict(data))

            return mapping
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            return self._dataclass(tp)
        if tp is float and self._finite:
            return _finite_float
        scalar = _SCALARS.get(tp)
        if scalar is None:
            raise DecodeError(f"cannot decode {tp!r}")
        return scalar

    def _union(self, tp: Any) -> Callable[[Any], Any]:
        options = typing.get_args(tp)
        nullable = type(None) in options
        decoders = [self._for(option) for option in options if option is not type(None)]
        unknown = (None, "inf", "-inf") if self._finite and float in options else (None,)

        def union(data: Any) -> Any:
            if nullable and isinstance(data, (str, type(None))) and data in unknown:
                return None
            errors = []
            for decoder in decoders:
                try:
                    return decoder(data)
                except DecodeError as exc:
                    errors.append(str(exc))
            raise DecodeError("; ".join(errors) or f"unexpected {_shown(data)}")

        return union

    def _tuple(self, tp: Any) -> Callable[[Any], tuple]:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            item = self._for(args[0])

            def homogeneous(data: Any) -> tuple:
                if not isinstance(data, list):
                    raise DecodeError(f"expected a list, not {_shown(data)}")
                return tuple(map(item, data))

            return homogeneous
        items = [self._for(a) for a in args]

        def fixed(data: Any) -> tuple:
            if not isinstance(data, list):
                raise DecodeError(f"expected a list, not {_shown(data)}")
            if len(items) != len(data):
                raise DecodeError(f"expected {len(items)} items, not {len(data)}")
            return tuple(decoder(v) for decoder, v in zip(items, data))

        return fixed

    def _dataclass(self, tp: type) -> Callable[[Any], Any]:
        hints = typing.get_type_hints(tp)
        names = {f.name for f in dataclasses.fields(tp)}
        checks = {name: self._checks.get(name, self._default_check) for name in names}
        fields: dict[str, Callable[[Any], Any]] = {}  # filled on first use: a class may contain itself
        upgrade = self._upgrades.get(tp)

        def record(data: Any) -> Any:
            if not isinstance(data, dict):
                raise DecodeError(f"expected an object for {tp.__name__}, not {_shown(data)}")
            if upgrade is not None:
                data = upgrade(data)
            kwargs = {}
            for name, raw in data.items():
                decoder = fields.get(name)
                if decoder is None:
                    if name not in names:
                        continue  # a key a newer gpuscope wrote; the schema version guards real incompatibility
                    decoder = fields[name] = self._for(hints[name])
                value = kwargs[name] = decoder(raw)
                check = checks.get(name)
                if check is not None and value is not None and not check(value):
                    raise DecodeError(f"{tp.__name__}.{name}: out of range")
            try:
                return tp(**kwargs)
            except (TypeError, ValueError) as exc:  # a field missing, or a value the class itself refuses
                raise DecodeError(f"{tp.__name__}: {exc}") from None

        return record


def _float(data: Any) -> float:
    if data in ("inf", "-inf"):
        return float(data)
    if data is None:  # NaN was stored as null
        return math.nan
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        if isinstance(data, int) and not -INT_LIMIT < data < INT_LIMIT:
            raise DecodeError("a number out of range")
        value = float(data)
        if not -MAX_NUMBER <= value <= MAX_NUMBER:  # also NaN and the infinities, written as numbers
            raise DecodeError(f"a number out of range: {value!r}")
        return value
    raise DecodeError(f"expected a number, not {_shown(data)}")


def _finite_float(data: Any) -> float:
    if data is None or isinstance(data, str):
        raise DecodeError(f"expected a finite number, not {_shown(data)}")
    return _float(data)


def _int(data: Any) -> int:
    if isinstance(data, int) and not isinstance(data, bool):
        if not -INT_LIMIT < data < INT_LIMIT:
            raise DecodeError("a whole number out of range")
        return data
    raise DecodeError(f"expected a whole number, not {_shown(data)}")


def _exactly(tp: type) -> Callable[[Any], Any]:
    def check(data: Any) -> Any:
        if type(data) is tp:
            return data
        raise DecodeError(f"expected {tp.__name__}, not {_shown(data)}")

    return check


def _null(data: Any) -> None:
    if data is None:
        return None
    raise DecodeError(f"expected null, not {_shown(data)}")


_SCALARS: dict[Any, Callable[[Any], Any]] = {float: _float, int: _int, bool: _exactly(bool), str: _exactly(str), type(None): _null}


MAX_DEPTH = 32  # a free-form value (a diagnosis step's evidence) nested deeper is not one gpuscope wrote


def _plain(data: Any, depth: int = 0) -> Any:
    """A free-form JSON value, checked: not nested past MAX_DEPTH, its numbers in range."""
    if depth > MAX_DEPTH:
        raise DecodeError("a value nested too deeply")
    if isinstance(data, dict):
        for v in data.values():
            _plain(v, depth + 1)
    elif isinstance(data, list):
        for v in data:
            _plain(v, depth + 1)
    elif isinstance(data, (int, float)) and not isinstance(data, bool):
        if not -MAX_NUMBER <= data <= MAX_NUMBER:
            raise DecodeError("a number out of range")
    return data


def _shown(data: Any) -> str:
    """What was found instead, briefly: the file's own text is never repeated."""
    return type(data).__name__


_PLAIN_DECODER = Decoder()
