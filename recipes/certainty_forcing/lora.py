"""LoRA on the attention and MLP projections of LLaDA and Dream (peft), merged back into a plain checkpoint.

Targets are the seven projections of every transformer block under their real names:
LLaDA ``q_proj k_proj v_proj attn_out ff_proj up_proj ff_out`` (``blocks.{i}.*``), Dream ``self_attn.{q,k,v,o}_proj``
and ``mlp.{gate,up,down}_proj``. They are given as one anchored regex because LLaDA's LM head is also called
``ff_out`` (``model.transformer.ff_out``) and must stay frozen. (The dParallel reference lists the Qwen names for
both models; on LLaDA only q/k/v/up_proj match them, so its adapters never touch attn_out, ff_proj or ff_out.)

``merge`` folds the adapters into the base weights (``merge_and_unload``); the result has the official parameter
names, so ``export`` writes config.json + model.safetensors + tokenizer files that ``dlm_decode.load_model`` reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recipes.certainty_forcing.common import arch_of
from recipes.train_demo.checkpoint import export_model

LORA_TARGETS = {
    "llada": r"model\.transformer\.blocks\.\d+\.(q_proj|k_proj|v_proj|attn_out|ff_proj|up_proj|ff_out)",
    "dream": r"model\.layers\.\d+\.(self_attn\.(q_proj|k_proj|v_proj|o_proj)|mlp\.(gate_proj|up_proj|down_proj))",
}
LORA_RANK = {"llada": 128, "dream": 32}  # the reference configs (alpha = r, dropout 0)


def add_lora(model: Any, rank: int | None = None, alpha: float | None = None, dropout: float = 0.0) -> Any:
    """Wrap ``model`` in a peft model with adapters on the seven projections of every block; base weights frozen."""
    from peft import LoraConfig, get_peft_model

    arch = arch_of(model)
    r = rank or LORA_RANK[arch]
    cfg = LoraConfig(
        r=r,
        lora_alpha=alpha if alpha is not None else r,
        target_modules=LORA_TARGETS[arch],
        lora_dropout=dropout,
        bias="none",
    )
    return get_peft_model(model, cfg)


def merge(peft_model: Any) -> Any:
    """The base model with the adapters folded in (in place: the peft wrapper is spent afterwards)."""
    return peft_model.merge_and_unload()


def export(model: Any, tokenizer: Any, out: str | Path, card: dict | None = None) -> None:
    """Write a plain official-format checkpoint (atomically; see train_demo's ``export_model``)."""
    export_model(model, tokenizer, Path(out), card)
