"""A fresh model of the chosen family in the official checkpoint format, or a trained one to continue from.

``family: llada`` builds ``LLaDAModelLM`` (bidirectional attention, ``logit_shift`` 0), ``family: dream`` builds
``DreamModel`` (bidirectional, shifted logits), ``family: llada2`` builds ``LLaDA2MoeModelLM`` (block-causal attention
with the config's ``block_length``, unshifted logits), fresh or upcycled from a LLaDA checkpoint (``upcycle.py``).
A run that continues a trained model may deepen it first (``grow_after``: LLaMA Pro's block expansion, ``grown``).
"""

from __future__ import annotations

import copy
import re
from typing import Any

import torch

from dlm_decode.models import load_model
from dlm_decode.models.dream import DreamConfig, DreamModel
from dlm_decode.models.llada import LLaDAConfig, LLaDAModelLM
from dlm_decode.models.llada2 import LLaDA2MoeModelLM
from recipes.train_demo.config import ModelConfig
from recipes.train_demo.upcycle import llada2_config, upcycled_llada2

LOGIT_SHIFT = {"llada": 0, "dream": 1, "llada2": 0}


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
    if m.family == "llada2":
        return LLaDA2MoeModelLM(llada2_config(m, vocab, ids, theta))
    raise ValueError(f"model.family: {m.family!r} has no model here; choose llada, dream or llada2")


def initial_model(m: ModelConfig, tok: Any, say: Any = print) -> torch.nn.Module:
    """``m.init``'s trained weights (in fp32; a rope_theta given replaces its base) or a fresh ``m.family`` model.
    A checkpoint of another family than ``m.family`` is a ValueError: the objective's logit shift would be wrong."""
    if m.init is None:
        return upcycled_llada2(m, say) if m.upcycle is not None else make_model(m, tok)
    model, _ = load_model(m.init, dtype=torch.float32, tokenizer=False)
    block_causal = bool(getattr(model, "block_causal", False))
    if model.logit_shift != LOGIT_SHIFT[m.family] or block_causal != (m.family == "llada2"):
        raise ValueError(f"model.init {m.init} is not a {m.family} model; set model.family to its family")
    if m.rope_theta is not None:  # the rotary tables are built from the config at every forward
        say(f"RoPE base {model.config.rope_theta:g} -> {m.rope_theta:g}")
        model.config.rope_theta = m.rope_theta
    say(f"initialised from {m.init} (its architecture; the size keys are ignored)")
    return grown(model, m.family, m.grow_after, say) if m.grow_after else model


# A layer's parameters: ``model.transformer.blocks.3.`` (llada), ``model.layers.3.`` (dream, llada2).
LAYER_KEY = re.compile(r"^(.*?\b(?:blocks|layers))\.(\d+)\.(.*)$")
# The projections that write into the residual stream: attention output and MLP / expert down projection.
RESIDUAL_OUT = re.compile(r"(?:^|\.)(?:attn_out|ff_out|o_proj|dense|down_proj)\.(?:weight|bias)$")
LAYER_COUNT = {"llada": "n_layers", "dream": "num_hidden_layers", "llada2": "num_hidden_layers"}


@torch.no_grad()
def grown(model: torch.nn.Module, family: str, after: tuple[int, ...], say: Any = print) -> torch.nn.Module:
    """``model`` deepened: a copy of each layer in ``after`` (0-based) inserted right after it, with the copy's
    residual-stream outputs (attention output, MLP or expert down projections) at zero. This is LLaMA Pro's block
    expansion (Wu et al. 2024, "LLaMA Pro: Progressive LLaMA with Block Expansion"): each new layer is the identity
    at step 0, so the grown model computes exactly the old one's logits and training adds depth from there."""
    count_key = LAYER_COUNT[family]
    n = int(getattr(model.config, count_key))
    first_moe = int(getattr(model.config, "first_k_dense_replace", 0) or 0) if family == "llada2" else 0
    bad = [i for i in after if not first_moe <= i < n] + [i for i in after if list(after).count(i) > 1]
    if bad:
        raise ValueError(
            f"model.grow_after: {sorted(set(bad))} is not a list of distinct layers in [{first_moe}, {n - 1}]"
            + (" (llada2 copies only MoE layers: a copy must keep its index's dense / MoE kind)" if first_moe else "")
        )
    order = [src for i in range(n) for src in ([i, i] if i in after else [i])]  # new index -> source layer
    copies = {j for j in range(1, len(order)) if order[j] == order[j - 1]}
    old = model.state_dict()
    by_layer: dict[int, list[tuple[str, str, str]]] = {}
    state = {}
    for key, value in old.items():
        hit = LAYER_KEY.match(key)
        if hit is None:
            state[key] = value
        else:
            by_layer.setdefault(int(hit.group(2)), []).append((hit.group(1), hit.group(3), key))
    for j, src in enumerate(order):
        for prefix, rest, key in by_layer[src]:
            value = old[key].clone()
            state[f"{prefix}.{j}.{rest}"] = value.zero_() if j in copies and RESIDUAL_OUT.search(rest) else value
    config = copy.deepcopy(model.config)
    setattr(config, count_key, len(order))
    deeper = type(model)(config)
    deeper.load_state_dict(state, strict=True)
    say(f"grown {n} -> {len(order)} layers: a zero-output copy after layer(s) {', '.join(map(str, after))}")
    return deeper.float().train(model.training)


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
