"""Tiny random LLaDA2 checkpoints in the format the reference code saves, and a re-statement of the reference
modeling forward, written independently of ``dlm_decode.models``.

The checkpoint is what ``LLaDA2MoeModelLM.save_pretrained`` of ZHZisZZ/dllm ``dllm/pipelines/llada2/models`` writes:
config.json with ``model_type: llada2_moe`` and the ``LLaDA2MoeConfig`` keys, one ``model.safetensors`` with the
official parameter names, including every MoE layer's ``mlp.gate.expert_bias`` buffer (persistent in the reference).

``reference_logits`` follows ``modeling_llada2_moe.py`` step by step: fused qkv split by heads, per-head RMSNorm of q
and k, RoPE on the first ``head_dim * partial_rotary_factor`` dims (fp32 tables cast to the model dtype), eager
attention with the additive 4D mask (``repeat_kv``, softmax in fp32), dense MLP in the first layers, the sigmoid
router with ``group_limited_topk`` and ``moe_infer``'s sort-by-expert dispatch, shared experts, final norm, lm_head.
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


def llada2_config(**over) -> dict:
    """Tiny widths, the MoE path real: 8 routed experts in 4 groups (2 kept, top-3), one shared expert, a dense
    first layer, qk-norm, partial rotary, dense-output bias (the reference class's default ``use_bias`` True)."""
    cfg = {
        "architectures": ["LLaDA2MoeModelLM"],
        "auto_map": {
            "AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
            "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
            "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM",
        },
        "model_type": "llada2_moe",
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "hidden_act": "silu",
        "use_qkv_bias": False,
        "use_qk_norm": True,
        "use_bias": True,
        "rms_norm_eps": 1e-06,
        "norm_head": False,
        "tie_word_embeddings": False,
        "embedding_dropout": 0.0,
        "attention_dropout": 0.0,
        "output_dropout": 0.0,
        "initializer_range": 0.02,
        "max_position_embeddings": 512,
        "rope_theta": 600000.0,
        "use_cache": False,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
        "rope_scaling": None,
        "pad_token_id": EOS,
        "num_experts": 8,
        "num_shared_experts": 1,
        "num_experts_per_tok": 3,
        "n_group": 4,
        "topk_group": 2,
        "routed_scaling_factor": 2.5,
        "moe_intermediate_size": 16,
        "first_k_dense_replace": 1,
        "output_router_logits": False,
        "partial_rotary_factor": 0.5,
        "score_function": "sigmoid",
        "norm_topk_prob": True,
        "moe_router_enable_expert_bias": True,
        "mask_token_id": MASK,
        "eos_token_id": EOS,
        "torch_dtype": "float32",
    }
    cfg.update(over)
    return cfg


def llada2_state_dict(cfg: dict, seed: int = 0, scale: float = 0.3) -> dict[str, torch.Tensor]:
    """Random weights under the official names (larger than the init scale, so tokens are not all ties)."""
    g = torch.Generator().manual_seed(seed)
    d, hd, h, kv = cfg["hidden_size"], cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def w(*shape):
        return torch.randn(*shape, generator=g) * scale

    def norm(n):
        return 1.0 + 0.1 * torch.randn(n, generator=g)

    def mlp(prefix, inner):
        return {
            f"{prefix}.gate_proj.weight": w(inner, d),
            f"{prefix}.up_proj.weight": w(inner, d),
            f"{prefix}.down_proj.weight": w(d, inner),
        }

    sd = {"model.word_embeddings.weight": w(cfg["vocab_size"], d), "model.norm.weight": norm(d)}
    sd["lm_head.weight"] = w(cfg["vocab_size"], d)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        sd[f"{p}.input_layernorm.weight"] = norm(d)
        sd[f"{p}.post_attention_layernorm.weight"] = norm(d)
        sd[f"{p}.attention.query_key_value.weight"] = w((h + 2 * kv) * hd, d)
        if cfg["use_qkv_bias"]:
            sd[f"{p}.attention.query_key_value.bias"] = w((h + 2 * kv) * hd)
        sd[f"{p}.attention.query_layernorm.weight"] = norm(hd)
        sd[f"{p}.attention.key_layernorm.weight"] = norm(hd)
        sd[f"{p}.attention.dense.weight"] = w(d, h * hd)
        if cfg["use_bias"]:
            sd[f"{p}.attention.dense.bias"] = w(d)
        if i < cfg["first_k_dense_replace"]:
            sd |= mlp(f"{p}.mlp", cfg["intermediate_size"])
            continue
        e, inner = cfg["num_experts"], cfg["moe_intermediate_size"]
        sd[f"{p}.mlp.gate.weight"] = w(e, d)
        sd[f"{p}.mlp.gate.expert_bias"] = 0.5 * torch.randn(e, generator=g)
        for j in range(e):
            sd |= mlp(f"{p}.mlp.experts.{j}", inner)
        sd |= mlp(f"{p}.mlp.shared_experts", inner * cfg["num_shared_experts"])
    return sd


def write_llada2(path: Path, seed: int = 0, eos_scale: float | None = None, **over) -> Path:
    """A checkpoint directory; ``eos_scale``: multiplies lm_head's EOS row (plants EOS answers)."""
    path.mkdir(parents=True, exist_ok=True)
    cfg = llada2_config(**over)
    sd = llada2_state_dict(cfg, seed)
    if eos_scale is not None:
        sd["lm_head.weight"][EOS] *= eos_scale
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def block_mask(total: int, block_length: int) -> torch.Tensor:
    """The reference's additive mask: ``tril(ones(nb, nb))`` repeated B times on both axes, log, bfloat16."""
    nb = total // block_length
    m = torch.tril(torch.ones(nb, nb)).repeat_interleave(block_length, 0).repeat_interleave(block_length, 1)
    return m[None, None].log().to(torch.bfloat16)


def _rms(x, w, eps):
    dt = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return w * x.to(dt)


def _mlp(sd, p, x):
    return F.linear(
        F.silu(F.linear(x, sd[f"{p}.gate_proj.weight"])) * F.linear(x, sd[f"{p}.up_proj.weight"]),
        sd[f"{p}.down_proj.weight"],
    )


def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def _gate(cfg, sd, p, x):
    logits = F.linear(x.type(torch.float32), sd[f"{p}.weight"].type(torch.float32))
    scores = torch.sigmoid(logits.float()).type_as(logits)
    routing = scores + sd[f"{p}.expert_bias"]
    n = routing.shape[0]
    gs = routing.view(n, cfg["n_group"], -1).topk(2, dim=-1)[0].sum(dim=-1)
    gi = torch.topk(gs, k=cfg["topk_group"], dim=-1, sorted=False)[1]
    gm = torch.zeros_like(gs)
    gm.scatter_(1, gi, 1)
    sm = gm.unsqueeze(-1).expand(n, cfg["n_group"], cfg["num_experts"] // cfg["n_group"]).reshape(n, -1)
    _, idx = torch.topk(routing.masked_fill(~sm.bool(), float("-inf")), k=cfg["num_experts_per_tok"], dim=-1)
    s = torch.gather(scores, 1, idx).type_as(logits)
    wt = s / (s.sum(-1, keepdim=True) + 1e-20) if cfg["num_experts_per_tok"] > 1 else s
    return idx, wt * cfg["routed_scaling_factor"]


def _moe(cfg, sd, p, h):
    b, t, d = h.shape
    x = h.view(-1, d)
    idx, wt = _gate(cfg, sd, f"{p}.gate", x)
    cnts = idx.new_zeros((idx.shape[0], cfg["num_experts"]))
    cnts.scatter_(1, idx, 1)
    per = cnts.sum(0).tolist()
    order = idx.view(-1).argsort()
    tokens = x[order // idx.shape[1]]
    outs, start = [], 0
    for e, n in enumerate(per):
        if n == 0:
            continue
        outs.append(_mlp(sd, f"{p}.experts.{e}", tokens[start : start + n]))
        start += n
    cat = torch.cat(outs, 0)
    new = torch.empty_like(cat)
    new[order] = cat
    y = new.view(*idx.shape, -1).type(wt.dtype).mul_(wt.unsqueeze(-1)).sum(1).type(new.dtype).view(b, t, d)
    return y + _mlp(sd, f"{p}.shared_experts", h)


@torch.no_grad()
def reference_logits(cfg: dict, sd: dict, ids: torch.Tensor, mask4d: torch.Tensor, pos: torch.Tensor | None = None):
    """The reference ``LLaDA2MoeModelLM.forward(ids, attention_mask=mask4d, position_ids=pos).logits``, eager."""
    b, t = ids.shape
    pos = torch.arange(t)[None].expand(b, t) if pos is None else pos
    h_, kv, hd, eps = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["rms_norm_eps"]
    dim = int(hd * cfg["partial_rotary_factor"])
    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    freqs = (inv[None, :, None].expand(b, -1, 1) @ pos[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), -1)
    cos, sin = emb.cos()[:, None], emb.sin()[:, None]
    h = sd["model.word_embeddings.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        x = _rms(h, sd[f"{p}.input_layernorm.weight"], eps)
        qkv = F.linear(x, sd[f"{p}.attention.query_key_value.weight"], sd.get(f"{p}.attention.query_key_value.bias"))
        q, k, v = qkv.view(b, t, h_ + 2 * kv, hd).split([h_, kv, kv], dim=-2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = _rms(q, sd[f"{p}.attention.query_layernorm.weight"], eps)
        k = _rms(k, sd[f"{p}.attention.key_layernorm.weight"], eps)
        q = torch.cat([q[..., :dim] * cos + _rotate_half(q[..., :dim]) * sin, q[..., dim:]], -1)
        k = torch.cat([k[..., :dim] * cos + _rotate_half(k[..., :dim]) * sin, k[..., dim:]], -1)
        k, v = k.repeat_interleave(h_ // kv, 1), v.repeat_interleave(h_ // kv, 1)
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(hd) + mask4d[:, :, :t, :t].to(q.dtype)
        a = torch.matmul(F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype), v).transpose(1, 2).reshape(b, t, -1)
        h = h + F.linear(a, sd[f"{p}.attention.dense.weight"], sd.get(f"{p}.attention.dense.bias"))
        x = _rms(h, sd[f"{p}.post_attention_layernorm.weight"], eps)
        h = h + (_mlp(sd, f"{p}.mlp", x) if i < cfg["first_k_dense_replace"] else _moe(cfg, sd, f"{p}.mlp", x))
    return F.linear(_rms(h, sd["model.norm.weight"], eps), sd["lm_head.weight"]).float()
