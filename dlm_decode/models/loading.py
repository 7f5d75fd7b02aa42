"""Loading checkpoints by path or shipped demo name, with early, specific errors.

Weights load from safetensors only (``use_safetensors=True``): a directory holding only ``pytorch_model.bin`` is
refused rather than unpickled.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

DEMO_DIR = Path(__file__).resolve().parent.parent / "demo_models"
DEMO_MODELS = ("demo-llada", "demo-dream")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_model_path(name_or_path: str | Path) -> Path:
    """A shipped demo name (``demo-llada``) or a checkpoint directory -> the directory, checked for its files."""
    p = Path(name_or_path)
    if str(name_or_path) in DEMO_MODELS and not p.exists():
        p = DEMO_DIR / str(name_or_path)
        if not p.is_dir():
            raise FileNotFoundError(f"demo model {name_or_path!r} is not shipped in this install (looked in {p})")
    if not p.is_dir():
        raise FileNotFoundError(
            f"model {str(name_or_path)!r} is neither a checkpoint directory nor a shipped demo model "
            f"({', '.join(DEMO_MODELS)}); hub downloads are not attempted"
        )
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"{p} has no config.json: not a checkpoint directory")
    if not (p / "model.safetensors").is_file() and not (p / "model.safetensors.index.json").is_file():
        found = sorted(x.name for x in p.iterdir())
        raise FileNotFoundError(
            f"{p} has no model.safetensors or model.safetensors.index.json (found: {found}); "
            "weights are loaded from safetensors only"
        )
    return p


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype {dtype} not supported; choose one of {sorted(DTYPES)}")
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} not supported; choose one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def load_model(
    name_or_path: str | Path,
    *,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    tokenizer: bool = True,
):
    """Load (model, tokenizer or None) from a checkpoint directory or a demo name; the model is in eval mode."""
    from transformers import AutoModel, AutoTokenizer

    import dlm_decode.models  # noqa: F401  (registers the Auto classes)
    from dlm_decode.models import SUPPORTED_MODEL_TYPES

    path = resolve_model_path(name_or_path)
    model_type = json.loads((path / "config.json").read_text()).get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"{path}: config model_type {model_type!r} is not supported; supported: {SUPPORTED_MODEL_TYPES}"
        )
    model = AutoModel.from_pretrained(path, dtype=parse_dtype(dtype), use_safetensors=True).to(device).eval()
    tok = None
    if tokenizer and any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        tok = AutoTokenizer.from_pretrained(path)
    return model, tok
