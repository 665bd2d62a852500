"""The range of every numeric key, declared on the key itself in the schema (`Annotated[int, Range(...)]`,
named aliases below), and the one check that reads them back: `problems(cfg)`.

Every int and float of the schema carries a Range (tests/unit/test_config_bounds.py fails on one that
does not), every float must be finite, and no string may hold a control character (a newline in a
path ends up in redis.conf, a YAML file or a command line). The cross-field rules stay in
`build.validate`; a value out of its own range is refused here, before anything is created.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional, Union

INT64_MAX = 2**63 - 1  # the largest count Redis and torch hold
MAX_SECONDS = threading.TIMEOUT_MAX  # the longest wait this machine's locks, sleeps and sockets take
MAX_CONTEXT = 1 << 20  # tokens: the longest context any model rlrun can serve has (1M)


@dataclass(frozen=True)
class Range:
    """Where a numeric key's values lie: at least `low` (above it when `open_low`), at most `high`
    (below it when `open_high`); `why` is said when a value is refused."""

    low: Optional[float] = None
    high: Optional[float] = None
    open_low: bool = False
    open_high: bool = False
    why: str = ""

    def admits(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.open_low else value < self.low):
            return False
        if self.high is not None and (value >= self.high if self.open_high else value > self.high):
            return False
        return True

    def describe(self) -> str:
        """'at least 1', 'greater than 0', '0 or more', 'in [0, 1)', ... for messages and the reference."""
        low, high = _number(self.low), _number(self.high)
        if self.high is not None and self.low is not None and not _default_high(self.high):
            return f"in {'(' if self.open_low else '['}{low}, {high}{')' if self.open_high else ']'}"
        if self.low is None:
            return f"{'below' if self.open_high else 'at most'} {high}"
        if self.open_low:
            return f"greater than {low}"
        return "0 or more" if self.low == 0 else f"at least {low}"


def _default_high(high: float | None) -> bool:
    """The caps every count and duration has (not worth stating in a message about its low end)."""
    return high in (INT64_MAX, MAX_SECONDS)


def _number(value: Optional[float]) -> str:
    if value is None:
        return ""
    if isinstance(value, int):
        return str(value)
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:g}"


# The kinds of numeric keys the schema uses. A new key takes one of these (or its own Range).
Count = Annotated[int, Range(1, INT64_MAX)]  # one or more
Natural = Annotated[int, Range(0, INT64_MAX)]  # zero or more
Port = Annotated[int, Range(0, 65535, why="0 picks a free port")]
Positive = Annotated[float, Range(0, open_low=True)]  # finite and above 0
NonNegative = Annotated[float, Range(0)]  # finite, 0 or more
Seconds = Annotated[
    float, Range(0, MAX_SECONDS, open_low=True)
]  # a wait: above 0, at most what the machine's timers take
SecondsOrZero = Annotated[float, Range(0, MAX_SECONDS)]  # 0: none
Fraction = Annotated[float, Range(0, 1, open_low=True)]  # (0, 1]


def problems(cfg: Any) -> list[str]:
    """One sentence per key of `cfg` (a schema dataclass) outside its range, not finite, or a string
    holding a control character, each naming the key by its dotted path."""
    out: list[str] = []
    _walk(cfg, "", out)
    return out


def range_of(tp: Any) -> Optional[Range]:
    """The Range an annotation carries (None without one), through Optional."""
    tp = _unwrap_optional(tp)
    if typing.get_origin(tp) is Annotated:
        return next((m for m in tp.__metadata__ if isinstance(m, Range)), None)
    return None


def numeric_keys(cls: type, path: str = "") -> list[tuple[str, Any]]:
    """(dotted key, annotation) of every int or float in the schema below `cls`, lists' and mappings'
    elements as `key[]`: what must carry a Range."""
    out = []
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        key = f"{path}.{f.name}" if path else f.name
        out += _numeric(hints[f.name], key)
    return out


def _numeric(tp: Any, key: str) -> list[tuple[str, Any]]:
    bare = _bare(tp)
    if isinstance(bare, type) and dataclasses.is_dataclass(bare):
        return numeric_keys(bare, key)
    if bare in (list, dict):
        return _numeric(typing.get_args(_strip(tp))[-1], f"{key}[]")
    return [(key, tp)] if bare in (int, float) else []


def _walk(obj: Any, path: str, out: list[str]) -> None:
    hints = typing.get_type_hints(type(obj), include_extras=True)
    for f in dataclasses.fields(obj):
        _check(hints[f.name], getattr(obj, f.name), f"{path}.{f.name}" if path else f.name, out)


def _check(tp: Any, value: Any, key: str, out: list[str]) -> None:
    if value is None:
        return
    if dataclasses.is_dataclass(value):
        _walk(value, key, out)
        return
    inner = _strip(tp)
    if isinstance(value, list):
        element = typing.get_args(inner)[0] if typing.get_args(inner) else Any
        for i, item in enumerate(value):
            _check(element, item, f"{key}[{i}]", out)
        return
    if isinstance(value, dict):
        element = typing.get_args(inner)[-1] if typing.get_args(inner) else Any
        for name, item in value.items():
            _check(element, item, f"{key}.{name}", out)
        return
    if isinstance(value, str):
        if any(ord(c) < 32 or ord(c) == 127 for c in value) and _bare(tp) is not Any:
            out.append(f"{key} holds a control character (a newline, a tab, ...): {value!r}. Give it on one line.")
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if isinstance(value, float) and not math.isfinite(value):
        out.append(f"{key} must be a finite number (got {value}).")
        return
    bounds = range_of(tp)
    if bounds is not None and not bounds.admits(value):
        above = bounds.high is not None and value >= bounds.high
        rule = f"at most {_number(bounds.high)}" if above and _default_high(bounds.high) else bounds.describe()
        why = f": {bounds.why}" if bounds.why else ""
        out.append(f"{key} must be {rule}{why} (got {_number(value) if isinstance(value, float) else value}).")


def _unwrap_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return inner[0] if len(inner) == 1 else tp
    return tp


def _strip(tp: Any) -> Any:
    """Without Optional and Annotated."""
    tp = _unwrap_optional(tp)
    return typing.get_args(tp)[0] if typing.get_origin(tp) is Annotated else tp


def _bare(tp: Any) -> Any:
    """The plain type: int, float, str, a dataclass, Any, or the origin (list, dict, Literal)."""
    tp = _strip(tp)
    origin = typing.get_origin(tp)
    if origin is Literal:
        return Literal
    return origin or tp
