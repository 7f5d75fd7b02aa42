"""Tiny random SDAR checkpoints in the format the published checkpoints use, and a re-statement of the reference
modeling forward with its K/V cache, written independently of ``dlm_decode.models``.

The checkpoint is what ``SDARForCausalLM.save_pretrained`` of the published modeling file (copied in Gen-Verse/dLLM-RL
``models/sdar/modeling_sdar.py``) writes: config.json with ``model_type: sdar`` and the ``SDARConfig`` keys plus
``mask_token_id``, one ``model.safetensors`` with the official parameter names; with ``tie_word_embeddings`` no
``lm_head.weight`` (the 1.7B / 4B checkpoints, Qwen3 style).

``ReferenceSDAR`` follows ``modeling_sdar.py`` step by step: per-head RMSNorm of q and k before RoPE (fp32 tables cast
to the model dtype), eager attention with ``repeat_kv``, the caller's float mask turned into 0 / ``finfo.min``
(``> 0`` visible) and sliced to the keys, softmax in fp32, SwiGLU MLP (``sdar_moe``: Qwen3-MoE's sparse block on
the layers its rule makes sparse), final norm, lm_head. Its cache is the
reference's ``store_kv`` protocol over a ``DynamicCache``: ``store_kv=True`` appends the call's K/V to the cache,
``store_kv=False`` attends to cache + call without keeping them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

VOCAB = 64
MASK = 63
EOS = 1


def sdar_config(**over) -> dict:
    """Tiny widths with GQA (4 heads over 2 KV heads), qk-norm, an explicit head_dim other than hidden / heads."""
    cfg = {
        "architectures": ["SDARForCausalLM"],
        "auto_map": {
            "AutoConfig": "configuration_sdar.SDARConfig",
            "AutoModel": "modeling_sdar.SDARModel",
            "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM",
        },
        "model_type": "sdar",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": EOS,
        "eos_token_id": EOS,
        "head_dim": 12,
        "hidden_act": "silu",
        "hidden_size": 32,
        "initializer_range": 0.02,
        "intermediate_size": 48,
        "max_position_embeddings": 512,
        "max_window_layers": 28,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB,
        "mask_token_id": MASK,
    }
    cfg.update(over)
    return cfg


def sdar_state_dict(cfg: dict, seed: int = 0, scale: float = 0.3) -> dict[str, torch.Tensor]:
    """Random weights under the official names (larger than the init scale, so tokens are not all ties)."""
    g = torch.Generator().manual_seed(seed)
    d, hd, h, kv = cfg["hidden_size"], cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def w(*shape):
        return torch.randn(*shape, generator=g) * scale

    def norm(n):
        return 1.0 + 0.1 * torch.randn(n, generator=g)

    sd = {"model.embed_tokens.weight": w(cfg["vocab_size"], d), "model.norm.weight": norm(d)}
    if not cfg["tie_word_embeddings"]:
        sd["lm_head.weight"] = w(cfg["vocab_size"], d)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        sd[f"{p}.input_layernorm.weight"] = norm(d)
        sd[f"{p}.post_attention_layernorm.weight"] = norm(d)
        for name, rows in (("q", h * hd), ("k", kv * hd), ("v", kv * hd)):
            sd[f"{p}.self_attn.{name}_proj.weight"] = w(rows, d)
            if cfg["attention_bias"]:
                sd[f"{p}.self_attn.{name}_proj.bias"] = w(rows)
        sd[f"{p}.self_attn.o_proj.weight"] = w(d, h * hd)
        if cfg["attention_bias"]:
            sd[f"{p}.self_attn.o_proj.bias"] = w(d)
        sd[f"{p}.self_attn.q_norm.weight"] = norm(hd)
        sd[f"{p}.self_attn.k_norm.weight"] = norm(hd)
        if i in _moe_layers(cfg):
            sd[f"{p}.mlp.gate.weight"] = w(cfg["num_experts"], d) * 3.0  # peaked routing: the top-k matters
            mlps, inner = [f"{p}.mlp.experts.{e}" for e in range(cfg["num_experts"])], cfg["moe_intermediate_size"]
        else:
            mlps, inner = [f"{p}.mlp"], cfg["intermediate_size"]
        for m in mlps:
            sd[f"{m}.gate_proj.weight"] = w(inner, d)
            sd[f"{m}.up_proj.weight"] = w(inner, d)
            sd[f"{m}.down_proj.weight"] = w(d, inner)
    return sd


def sdar_moe_config(**over) -> dict:
    """SDAR-MoE (``model_type: sdar_moe``, Qwen3-MoE keys): 6 experts, top 2 renormalised, layer 0 dense."""
    cfg = sdar_config(
        architectures=["SDARMoeForCausalLM"],
        model_type="sdar_moe",
        num_experts=6,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[0],
        output_router_logits=False,
        router_aux_loss_coef=0.001,
    )
    cfg["auto_map"] = {k: v.replace("sdar.SDAR", "sdar_moe.SDARMoe") for k, v in cfg["auto_map"].items()}
    cfg.update(over)
    return cfg


def _moe_layers(cfg: dict) -> list[int]:
    """Qwen3-MoE's rule for which layers are sparse."""
    if not cfg.get("num_experts"):
        return []
    step, dense = cfg.get("decoder_sparse_step", 1), cfg.get("mlp_only_layers") or []
    return [i for i in range(cfg["num_hidden_layers"]) if i not in dense and (i + 1) % step == 0]


def write_sdar(
    path: Path, seed: int = 0, eos_scale: float | None = None, head_scale: float = 1.0, moe: bool = False, **over
) -> Path:
    """A checkpoint directory (``moe``: in the ``sdar_moe`` format). ``eos_scale``: multiplies the output row of EOS
    (plants EOS answers); ``head_scale`` (untied only): multiplies lm_head and zeroes its MASK row, so MASK, at logit
    0 among logits of a wider spread, is (almost) never drawn, as with trained checkpoints."""
    path.mkdir(parents=True, exist_ok=True)
    cfg = sdar_moe_config(**over) if moe else sdar_config(**over)
    sd = sdar_state_dict(cfg, seed)
    head = "model.embed_tokens.weight" if cfg["tie_word_embeddings"] else "lm_head.weight"
    if head_scale != 1.0:
        sd["lm_head.weight"] *= head_scale
        sd["lm_head.weight"][MASK] = 0.0
    if eos_scale is not None:
        sd[head][EOS] *= eos_scale
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def _rms(x, w, eps):
    dt = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return w * x.to(dt)


def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def _swiglu(sd, m, x):
    return F.linear(
        F.silu(F.linear(x, sd[f"{m}.gate_proj.weight"])) * F.linear(x, sd[f"{m}.up_proj.weight"]),
        sd[f"{m}.down_proj.weight"],
    )


class ReferenceSDAR:
    """``SDARForCausalLM(ids, attention_mask=mask, position_ids=pos, past_key_values=cache, store_kv=...).logits``.

    ``cache``: a list of per-layer ``(k, v)`` (the ``DynamicCache``), or None; ``calls`` counts the forwards."""

    def __init__(self, cfg: dict, sd: dict[str, torch.Tensor]) -> None:
        self.cfg, self.sd, self.calls = cfg, sd, 0

    @torch.no_grad()
    def __call__(self, ids, mask=None, pos=None, cache=None, store_kv=False) -> torch.Tensor:
        cfg, sd = self.cfg, self.sd
        self.calls += 1
        b, t = ids.shape
        pos = torch.arange(t)[None].expand(b, t) if pos is None else pos
        h_, kv, hd, eps = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["rms_norm_eps"]
        inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
        freqs = (inv[None, :, None].expand(b, -1, 1) @ pos[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), -1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]
        h = sd["model.embed_tokens.weight"][ids]
        for i in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{i}.self_attn"
            x = _rms(h, sd[f"model.layers.{i}.input_layernorm.weight"], eps)
            q = F.linear(x, sd[f"{p}.q_proj.weight"], sd.get(f"{p}.q_proj.bias")).view(b, t, h_, hd)
            k = F.linear(x, sd[f"{p}.k_proj.weight"], sd.get(f"{p}.k_proj.bias")).view(b, t, kv, hd)
            v = F.linear(x, sd[f"{p}.v_proj.weight"], sd.get(f"{p}.v_proj.bias")).view(b, t, kv, hd)
            q = _rms(q, sd[f"{p}.q_norm.weight"], eps).transpose(1, 2)
            k = _rms(k, sd[f"{p}.k_norm.weight"], eps).transpose(1, 2)
            v = v.transpose(1, 2)
            q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
            if cache is not None and store_kv:
                if len(cache) > i:
                    cache[i] = (torch.cat([cache[i][0], k], -2), torch.cat([cache[i][1], v], -2))
                else:
                    cache.append((k, v))
                k, v = cache[i]
            elif cache is not None and len(cache) > i:
                k, v = torch.cat([cache[i][0], k], -2), torch.cat([cache[i][1], v], -2)
            k, v = k.repeat_interleave(h_ // kv, 1), v.repeat_interleave(h_ // kv, 1)
            w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(hd)
            if mask is not None:
                am = mask[:, :, :, : k.shape[-2]].to(q.dtype)
                w = w + torch.where(am > 0, 0.0, torch.finfo(q.dtype).min)
            a = torch.matmul(F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype), v)
            a = a.transpose(1, 2).reshape(b, t, -1)
            h = h + F.linear(a, sd[f"{p}.o_proj.weight"], sd.get(f"{p}.o_proj.bias"))
            x = _rms(h, sd[f"model.layers.{i}.post_attention_layernorm.weight"], eps)
            m = f"model.layers.{i}.mlp"
            h = h + (self._moe(m, x) if i in _moe_layers(cfg) else _swiglu(sd, m, x))
        head = sd["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else sd["lm_head.weight"]
        return F.linear(_rms(h, sd["model.norm.weight"], eps), head)

    def _moe(self, m, x):
        """Qwen3-MoE's sparse block: router logits, softmax in fp32, top-k (renormalised with norm_topk_prob), each
        expert over the tokens routed to it, weighted, summed."""
        cfg, sd = self.cfg, self.sd
        b, t, d = x.shape
        flat = x.reshape(-1, d)
        probs = F.softmax(F.linear(flat, sd[f"{m}.gate.weight"]), dim=1, dtype=torch.float)
        w, chosen = torch.topk(probs, cfg["num_experts_per_tok"], dim=-1)
        if cfg["norm_topk_prob"]:
            w = w / w.sum(dim=-1, keepdim=True)
        w = w.to(x.dtype)
        out = torch.zeros_like(flat)
        for e in range(cfg["num_experts"]):
            token, slot = torch.where(chosen == e)
            if len(token):
                out.index_add_(0, token, _swiglu(sd, f"{m}.experts.{e}", flat[token]) * w[token, slot, None])
        return out.view(b, t, d)
