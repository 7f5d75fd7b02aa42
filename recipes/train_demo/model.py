"""A fresh model of the chosen family in the official checkpoint format, or a trained one to continue from.

``family: llada`` builds ``LLaDAModelLM`` (bidirectional attention, ``logit_shift`` 0), ``family: dream`` builds
``DreamModel`` (bidirectional, shifted logits). ``llada2`` (block-causal attention with ``block_length``) is reserved
in the config for the LLaDA2 model once dlm_decode has it.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from dlm_decode.models import load_model
from dlm_decode.models.dream import DreamConfig, DreamModel
from dlm_decode.models.llada import LLaDAConfig, LLaDAModelLM
from recipes.train_demo.config import ModelConfig

LOGIT_SHIFT = {"llada": 0, "dream": 1}


def make_model(m: ModelConfig, tok: Any) -> torch.nn.Module:
    """A fresh model of ``m.family`` in the official config format, with the tokenizer's mask / eos / pad ids."""
    ids = dict(
        mask_token_id=tok.mask_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    vocab = len(tok)
    theta = m.rope_theta if m.rope_theta is not None else 10000.0
    if m.family == "llada":
        cfg = LLaDAConfig(
            d_model=m.d_model,
            n_layers=m.n_layers,
            n_heads=m.n_heads,
            n_kv_heads=m.kv_heads,
            mlp_hidden_size=m.mlp_hidden,
            vocab_size=vocab,
            embedding_size=vocab,
            max_sequence_length=m.max_len,
            rope_theta=theta,
            weight_tying=m.tie_embeddings,
            **ids,
        )
        return LLaDAModelLM(cfg)
    if m.family == "dream":
        cfg = DreamConfig(
            vocab_size=vocab,
            hidden_size=m.d_model,
            intermediate_size=m.mlp_hidden,
            num_hidden_layers=m.n_layers,
            num_attention_heads=m.n_heads,
            num_key_value_heads=m.kv_heads,
            max_position_embeddings=m.max_len,
            rope_theta=theta,
            bos_token_id=tok.bos_token_id,
            **ids,
        )
        return DreamModel(cfg)
    raise ValueError(f"model.family: {m.family!r} has no model here; choose llada or dream")


def initial_model(m: ModelConfig, tok: Any, say: Any = print) -> torch.nn.Module:
    """``m.init``'s trained weights (in fp32; a rope_theta given replaces its base) or a fresh ``m.family`` model.
    A checkpoint of another family than ``m.family`` is a ValueError: the objective's logit shift would be wrong."""
    if m.init is None:
        return make_model(m, tok)
    model, _ = load_model(m.init, dtype=torch.float32, tokenizer=False)
    if model.logit_shift != LOGIT_SHIFT[m.family]:
        raise ValueError(f"model.init {m.init} is not a {m.family} model; set model.family to its family")
    if m.rope_theta is not None:  # the rotary tables are built from the config at every forward
        say(f"RoPE base {model.config.rope_theta:g} -> {m.rope_theta:g}")
        model.config.rope_theta = m.rope_theta
    say(f"initialised from {m.init} (its architecture; the size keys are ignored)")
    return model


def trainable_parameters(
    model: torch.nn.Module, patterns: tuple[str, ...] | None
) -> list[tuple[str, torch.nn.Parameter]]:
    """The (name, parameter) pairs that train; with ``patterns`` (regular expressions, ``re.search``) the others get
    ``requires_grad=False``: e.g. ``blocks\\.[45]\\.`` trains only the two top layers of a grown model."""
    if patterns is None:
        return list(model.named_parameters())
    patterns = [re.compile(p) for p in patterns]
    keep = []
    for name, p in model.named_parameters():
        p.requires_grad_(any(pat.search(name) for pat in patterns))
        if p.requires_grad:
            keep.append((name, p))
    if not keep:
        names = ", ".join(n for n, _ in list(model.named_parameters())[:6])
        raise ValueError(f"optim.train_only matches no parameter of the model (names look like: {names}, ...)")
    return keep
