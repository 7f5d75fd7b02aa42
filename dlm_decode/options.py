"""Building frozen-dataclass components (samplers, caches) from names and ``KEY=VALUE`` options, failing loudly."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def resolve(registry: dict[str, type[T]], name: str, kind: str) -> type[T]:
    """The class registered as ``name``; unknown names list the valid ones."""
    if not isinstance(name, str) or name not in registry:
        raise ValueError(f"unknown {kind} {name!r}; valid {kind}s: {', '.join(sorted(registry))}")
    return registry[name]


def is_int(value: Any) -> bool:
    """An integer value: an int, not a bool (True is no length or count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """A real value: a finite int or float, not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_probability(owner: str, key: str, value: Any) -> None:
    """Raise unless ``value`` is a number in (0, 1] (a threshold on a probability)."""
    if not (isinstance(value, int | float) and math.isfinite(value) and 0.0 < value <= 1.0):
        raise ValueError(f"{owner}: {key} must be in (0, 1], got {value!r}")


def check_count(owner: str, key: str, value: Any, *, optional: bool = False) -> None:
    """Raise unless ``value`` is an integer >= 1 (or None when ``optional``); bool is no count."""
    if optional and value is None:
        return
    if not is_int(value) or value < 1:
        either = " (or None)" if optional else ""
        raise ValueError(f"{owner}: {key} must be an integer >= 1{either}, got {value!r}")


def check_bounded(owner: str, obj: Any, bounds: Mapping[str, tuple[int, str]]) -> None:
    """The one rule for options that count what a block (or the generation) holds: a value set larger than what it
    counts is a ``ValueError`` naming the bound (``bounds``: option -> (bound, what the bound is)). The shipped
    default is exempt: a reference default past a short block (``window_tokens`` 64 with a 32-token generation) means
    all of them. Unset (None) options pass."""
    defaults = {f.name: f.default for f in dataclasses.fields(obj)}
    for key, (bound, what) in bounds.items():
        value = getattr(obj, key)
        if value is None or value == defaults.get(key) or not is_int(value) or value <= bound:
            continue
        raise ValueError(f"{owner}: {key} ({value}) must be <= {what} ({bound}), which bounds what it counts")


def _coerce(value: Any, tp: Any, key: str, owner: str) -> Any:
    """Convert CLI strings to the field's annotated type; reject wrong types with the expected one."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if type(None) in args:
                return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key, owner)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError(errors[0] if errors else f"{owner}: bad value for {key}: {value!r}")
    if origin in (tuple, list):
        inner = typing.get_args(tp)
        items = value.split(",") if isinstance(value, str) else list(value)
        elem = inner[0] if inner else str
        return tuple(_coerce(v, elem, key, owner) for v in items if v != "")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ValueError(f"{owner}: option {key} expects true/false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ValueError(f"{owner}: option {key} expects an integer, got {value!r}")
        try:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value) if not isinstance(value, str) else int(value.strip())
        except (TypeError, ValueError):
            raise ValueError(f"{owner}: option {key} expects an integer, got {value!r}") from None
    if tp is float:
        if isinstance(value, bool):
            raise ValueError(f"{owner}: option {key} expects a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{owner}: option {key} expects a number, got {value!r}") from None
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"{owner}: option {key} expects a string, got {value!r}")
        return value
    return value


_SEVERAL = (
    " (several blocks in flight, D2F / d3LLM, are an option of threshold, entropy_threshold and low_confidence: the "
    "other samplers decide over one block at a time)"
)
MISSING_HINTS = {"block_add_threshold": _SEVERAL, "decoded_token_threshold": _SEVERAL}  # why an option is absent


def build(cls: type, options: dict[str, Any] | None, kind: str) -> Any:
    """Instantiate dataclass ``cls`` from ``options``; unknown keys and bad values raise ValueError."""
    name = getattr(cls, "name", cls.__name__)
    if options is not None and not isinstance(options, Mapping):
        raise ValueError(
            f"{kind} {name!r}: options must be a dict of option name -> value (e.g. {{'threshold': 0.9}}), "
            f"got {type(options).__name__} {options!r}"
        )
    options = dict(options or {})
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(options) - set(fields))
    if unknown:
        valid = ", ".join(sorted(fields)) or "(none)"
        why = MISSING_HINTS.get(next((k for k in unknown if k in MISSING_HINTS), ""), "")
        raise ValueError(f"{kind} {name!r} has no option(s) {', '.join(unknown)}; valid options: {valid}{why}")
    hints = typing.get_type_hints(cls)
    kwargs = {k: _coerce(v, hints[k], k, f"{kind} {name!r}") for k, v in options.items()}
    return cls(**kwargs)


def parse_kv(pairs: list[str] | None) -> dict[str, str]:
    """["a=1", "b=x"] -> {"a": "1", "b": "x"}; a pair without '=' is an error."""
    out: dict[str, str] = {}
    for p in pairs or []:
        if "=" not in p:
            raise ValueError(f"option {p!r} is not KEY=VALUE")
        k, v = p.split("=", 1)
        out[k.strip()] = v.strip()
    return out


QUIET = {"quiet": True}  # field metadata: ``describe`` leaves the field out while it holds its default (an off switch)


def describe(obj: Any) -> dict[str, Any]:
    """A JSON-ready description: name plus every field (a ``QUIET`` field only when it is not at its default)."""
    d = {"name": getattr(obj, "name", type(obj).__name__)}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if f.metadata.get("quiet") and v == f.default:
            continue
        d[f.name] = list(v) if isinstance(v, tuple) else v
    return d
