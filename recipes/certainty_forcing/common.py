"""Shared helpers: the task groups of the recipe, which architecture a model is, the model under its wrappers."""

from __future__ import annotations

from typing import Any

from dlm_decode.parallelbench.generator import WAITING_LINE_OPS

WAITING_LINE = tuple(f"waiting_line/{op}" for op in WAITING_LINE_OPS)
DETERMINISTIC_WAITING_LINE = tuple(
    f"waiting_line/{op}" for op in ("copy", "reverse", "sort", "insert_index", "remove_index", "replace_index")
)


def arch_of(model: Any) -> str:
    """'llada' or 'dream' from the config's model_type."""
    mt = getattr(getattr(model, "config", None), "model_type", None)
    if mt == "llada":
        return "llada"
    if mt == "Dream":
        return "dream"
    raise ValueError(f"model_type {mt!r} is neither 'llada' nor 'Dream'")


def unwrap(model: Any) -> Any:
    """The plain model under DDP / PEFT wrappers (the one ``dlm_decode.generate`` decodes with)."""
    while hasattr(model, "module"):
        model = model.module
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return model
