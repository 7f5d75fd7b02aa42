"""Declarative ``config.json`` schemas: what each model family reads from its config, checked before any weight.

A family declares one ``ConfigSchema`` on its config class (``config_schema = ConfigSchema(...)``): for every key the
model reads, a ``Key`` (its type, the smallest allowed value, the allowed choices, whether it may be null or left out,
the official value to name when it is missing), plus cross-key ``Rule``s (``d_model`` a multiple of ``n_heads``, the
MASK id inside the vocabulary). ``models.loading.read_config`` checks the raw JSON against it before transformers
builds the config, so a bad value is one ``ValueError`` naming the file and the key, never a traceback from the model
code or a shape mismatch with the weights. Every schema also checks the special ids the file sets (``mask_token_id``,
``eos_token_id``, ``pad_token_id``, ``bos_token_id``) against its ``vocab_size`` (``core.special_ids``), so a new
family gets that check by declaring ``vocab_size``. Keys the schema does not name are left alone (transformers' own
keys, ``architectures``, ``auto_map``, ...). A new family needs a few lines, for instance::

    config_schema = ConfigSchema(
        "LLaDA2",
        {"hidden_size": positive_int(required=True), "hidden_act": Key("str", choices=("silu",)), ...},
        rules=(divides("num_attention_heads", "num_key_value_heads"),),
    )
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlm_decode.core.special_ids import check_special_ids


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


# kind -> (test, how the message names it)
KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "int": (_is_int, "an integer"),
    "number": (_is_number, "a finite number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "object": (lambda v: isinstance(v, dict), "a JSON object"),
    "ids": (lambda v: _is_int(v) or (isinstance(v, list) and all(map(_is_int, v))), "a token id or a list of them"),
    "int_list": (lambda v: isinstance(v, list) and all(map(_is_int, v)), "a list of integers"),
}


@dataclass(frozen=True)
class Key:
    """One config key the model reads: ``kind`` (a ``KINDS`` name), ``low`` the smallest allowed value (``above``:
    values must be greater than it), ``choices`` the allowed values, ``nullable`` whether JSON null is allowed,
    ``required`` whether it must be present, ``official`` the value of the official checkpoints (named in the error
    when a required key is missing)."""

    kind: str
    required: bool = False
    low: float | None = None
    above: bool = False
    high: float | None = None
    choices: tuple[Any, ...] | None = None
    nullable: bool = False
    official: Any = None

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value`` for this key, or None."""
        if value is None:
            return None if self.nullable else "must not be null"
        test, what = KINDS[self.kind]
        if not test(value):
            return f"must be {what}{' or null' if self.nullable else ''}, got {value!r}"
        values = value if isinstance(value, list) else [value]
        if self.choices is not None and value not in self.choices:
            return f"{value!r} is not supported; supported: {', '.join(map(repr, self.choices))}"
        for v in values if self.kind in ("int", "number", "ids", "int_list") else []:
            if self.low is not None and (v <= self.low if self.above else v < self.low):
                return f"must be {'>' if self.above else '>='} {self.low:g}, got {value!r}"
            if self.high is not None and v > self.high:
                return f"must be <= {self.high:g}, got {value!r}"
        return None


def positive_int(**kw: Any) -> Key:
    return Key("int", low=1, **kw)


def positive_number(**kw: Any) -> Key:
    return Key("number", low=0, above=True, **kw)


def token_id(**kw: Any) -> Key:
    return Key("int", low=0, **kw)


def flag(**kw: Any) -> Key:
    return Key("bool", **kw)


@dataclass(frozen=True)
class Rule:
    """A check across ``keys`` (skipped when one of them is absent or null): ``ok(*values)`` must hold, else
    ``says`` (formatted with the keys' values by name) is the error."""

    keys: tuple[str, ...]
    ok: Callable[..., bool]
    says: str


def divides(whole: str, part: str) -> Rule:
    """``whole`` must be a multiple of ``part`` (heads of the model width, KV heads of the heads)."""
    return Rule(
        (whole, part), lambda w, p: w % p == 0, f"{whole} ({{{whole}}}) must be a multiple of {part} ({{{part}}})"
    )


def below(key: str, limit: str) -> Rule:
    """``key`` must be < ``limit`` (a token id inside the vocabulary)."""
    return Rule((key, limit), lambda k, n: k < n, f"{key} ({{{key}}}) must be < {limit} ({{{limit}}})")


@dataclass(frozen=True)
class ConfigSchema:
    """The config keys of one model family (``family`` names it in messages) and the rules across them."""

    family: str
    keys: Mapping[str, Key]
    rules: tuple[Rule, ...] = field(default=())

    def check(self, config: Mapping[str, Any], where: str | Path) -> None:
        """Raise ``ValueError`` naming ``where`` (the file) and the first bad key: a required key missing, a value
        of the wrong type or out of range, or a broken rule."""
        for name, key in self.keys.items():
            if name not in config:
                if key.required:
                    official = f" (the official {self.family} checkpoints use {key.official!r})" if key.official else ""
                    raise ValueError(
                        f"{where}: required key {name!r} is missing{official}; add it to the {self.family} config"
                    )
                continue
            why = key.problem(config[name])
            if why is not None:
                raise ValueError(f"{where}: key {name!r} {why} ({self.family} config)")
        for rule in self.rules:
            values = [config.get(k) for k in rule.keys]
            if all(_is_number(v) for v in values) and not rule.ok(*values):
                raise ValueError(f"{where}: " + rule.says.format(**dict(zip(rule.keys, values, strict=True))))
        if _is_int(config.get("vocab_size")):  # every family: MASK / EOS / PAD / BOS inside the vocabulary
            check_special_ids(config, config["vocab_size"], str(where))
