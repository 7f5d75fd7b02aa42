"""Reading the files a user hands over (JSON configs, safetensors weights) with one-line errors that name the file.

A damaged or wrong file is a ``ValueError`` (a missing one a ``FileNotFoundError``) saying which file and what is
wrong with it, never a parser's traceback: ``config.json``, ``model.safetensors[.index.json]``, Learn2PD filters and
their ``.json`` sidecars, sweep grids. Safetensors files are checked from their header alone (names, shapes, and that
the file holds every byte the header promises), so a truncated checkpoint fails before any weight is read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open

Shapes = dict[str, tuple[int, ...]]


def read_json(path: str | Path, what: str) -> Any:
    """The parsed JSON of ``path`` (``what`` names the file's role in messages)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{what} {p} not found")
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{p} is not UTF-8 text (a damaged or binary file?); expected the {what}") from None
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{p} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); expected the {what}"
        ) from None


def read_json_object(path: str | Path, what: str) -> dict[str, Any]:
    """``read_json`` for files that must hold one JSON object."""
    data = read_json(path, what)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the {what} must be a JSON object ({{...}}), got a JSON {type(data).__name__}")
    return data


def safetensors_shapes(path: str | Path, what: str) -> Shapes:
    """Tensor names and shapes from a safetensors header (no tensor data is read); a damaged file is an error."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{what} {p} not found")
    try:
        with safe_open(str(p), framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError) as e:
        raise ValueError(
            f"{p} is damaged or not a safetensors file ({e}); re-download or re-export the {what}"
        ) from None


def check_shapes(found: Shapes, expected: Shapes, where: str, against: str, shown: int = 3) -> None:
    """``found`` (a file's tensors) must hold exactly ``expected`` (what ``against`` needs), shapes included.

    Missing or unexpected tensors are never initialised or dropped silently: the error names ``where``, ``against``
    and the first ``shown`` offending names of each kind."""
    missing = [k for k in expected if k not in found]
    unexpected = [k for k in found if k not in expected]
    wrong = [k for k in expected if k in found and tuple(found[k]) != tuple(expected[k])]
    if not (missing or unexpected or wrong):
        return

    def few(keys: list[str], fmt=str) -> str:
        more = f", ... ({len(keys) - shown} more)" if len(keys) > shown else ""
        return ", ".join(fmt(k) for k in keys[:shown]) + more

    parts = []
    if missing:
        parts.append(f"{len(missing)} tensor(s) missing ({few(missing)})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected ({few(unexpected)})")
    if wrong:
        parts.append(
            f"{len(wrong)} with another shape ("
            + few(wrong, lambda k: f"{k}: {list(found[k])} (expected {list(expected[k])})")
            + ")"
        )
    raise ValueError(f"{where} does not match {against}: " + "; ".join(parts))
