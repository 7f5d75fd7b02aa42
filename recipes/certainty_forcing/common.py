"""Shared helpers: which architecture a model is, and the train_demo recipe modules this recipe reuses.

``recipes/train_demo`` is a folder of scripts, not a package (and its ``train.py`` would clash with ours by name), so
its modules are loaded from their files under private names: ``demo_data()`` (``data.py``: fresh-seed ParallelBench
generation with official-sample exclusion) and ``demo_train()`` (``train.py``: prompt encoding, atomic checkpoints,
step-seeded generators, the official-format export).
"""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from dlm_decode.parallelbench.generator import WAITING_LINE_OPS

RECIPES = Path(__file__).resolve().parent.parent
TRAIN_DEMO = RECIPES / "train_demo"
WAITING_LINE = tuple(f"waiting_line/{op}" for op in WAITING_LINE_OPS)
DETERMINISTIC_WAITING_LINE = tuple(
    f"waiting_line/{op}" for op in ("copy", "reverse", "sort", "insert_index", "remove_index", "replace_index")
)


def _load(name: str) -> ModuleType:
    alias = f"_train_demo_{name}"
    if alias in sys.modules:
        return sys.modules[alias]
    path = TRAIN_DEMO / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: this recipe reuses the train_demo recipe's helpers")
    spec = importlib.util.spec_from_file_location(alias, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[alias] = mod
    # the scripts import their siblings by bare name (``from tokenizer import ...``): make those resolvable while
    # the module executes, behind every other entry so nothing else is shadowed
    added = str(TRAIN_DEMO) not in sys.path
    if added:
        sys.path.append(str(TRAIN_DEMO))
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[alias]
        raise
    finally:
        if added:
            sys.path.remove(str(TRAIN_DEMO))
    return mod


@cache
def demo_data() -> ModuleType:
    return _load("data")


@cache
def demo_train() -> ModuleType:
    return _load("train")


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
