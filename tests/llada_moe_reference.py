"""Tiny random LLaDA-MoE checkpoints in the hub's format, a tokenizer like the official one, and a re-statement of the
reference modeling forward, written independently of ``dlm_decode.models``.

The checkpoint: config.json with ``model_type: llada`` (as the dense LLaDA's), ``architectures:
["LLaDAMoEModelLM"]``, the ``LLaDAMoEConfig`` keys of the reference configuration class and no ``mask_token_id``;
one ``model.safetensors`` with the official parameter names (``model.layers.{i}.self_attn.q_norm``, ``mlp.gate``,
``mlp.experts.{e}``, ``shared_expert``, and ``mlp.expert_bias`` when the selection bias is on).

``reference_logits`` follows ZHZisZZ/dllm ``modeling_lladamoe.py`` step by step: q/k/v projections, RMSNorm of each
head of q and k on the flat projection (``reshape(-1, head_dim)``), HF RoPE on the first ``rotary_dim`` dims (fp32
tables cast to the dtype), ``repeat_kv`` and eager attention with the 2D key mask made additive (softmax in fp32),
``o_proj``; the MLP: the dense SwiGLU where ``moe_layer_freq`` is 0, else the router ``softmax(gate(x), fp32)`` (+
``expert_bias``), ``topk`` of it as choice and weights, no renormalisation, the experts looped in index order over
``torch.where`` of the one-hot mask and ``index_add_``, plus the shared expert; final norm, ``lm_head``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

VOCAB = 64
MASK = 62  # the id of <|mask|> in the tiny tokenizer (156895 in the official one)
EOS = 1  # <|endoftext|> (156892 in the official one)
ROLE_END = 2  # <|role_end|>


def llada_moe_config(**over) -> dict:
    """Tiny widths with the MoE path real: 8 experts, top-3, a shared expert, a dense first layer, qk-norm, GQA."""
    cfg = {
        "architectures": ["LLaDAMoEModelLM"],
        "auto_map": {
            "AutoConfig": "configuration_lladamoe.LLaDAConfig",
            "AutoModel": "modeling_lladamoe.LLaDAMoEModelLM",
            "AutoModelForCausalLM": "modeling_lladamoe.LLaDAMoEModelLM",
        },
        "model_type": "llada",
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "dense_intermediate_size": 48,
        "expert_intermediate_size": 16,
        "shared_expert_intermediate_size": 24,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_act": "silu",
        "max_position_embeddings": 256,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-05,
        "use_cache": False,
        "pad_token_id": EOS,
        "bos_token_id": None,
        "eos_token_id": EOS,
        "tie_word_embeddings": False,
        "rope_theta": 50000,
        "partial_rotary_factor": 1.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "clip_qkv": None,
        "num_experts_per_tok": 3,
        "num_experts": 8,
        "output_router_logits": False,
        "router_aux_loss_coef": 0.01,
        "norm_topk_prob": False,
        "qk_layernorm": True,
        "moe_layer_freq": [0, 1, 1],
        "moe_router_enable_expert_bias": False,
        "moe_router_score_function": "softmax",
        "routed_scaling_factor": 1,
        "router_num_group": None,
        "router_topk_group": None,
        "torch_dtype": "bfloat16",
    }
    cfg.update(over)
    return cfg


def _rand(g: torch.Generator, *shape: int, scale: float = 0.3) -> torch.Tensor:
    return torch.randn(*shape, generator=g) * scale


def _swiglu(sd: dict, g: torch.Generator, p: str, d: int, inner: int) -> None:
    sd[p + "gate_proj.weight"] = _rand(g, inner, d)
    sd[p + "up_proj.weight"] = _rand(g, inner, d)
    sd[p + "down_proj.weight"] = _rand(g, d, inner)


def llada_moe_state_dict(cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    d, v = cfg["hidden_size"], cfg["vocab_size"]
    hd = d // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * hd
    bias = cfg["attention_bias"]
    sd = {"model.embed_tokens.weight": _rand(g, v, d, scale=1.0)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = 1 + _rand(g, d, scale=0.1)
        sd[p + "post_attention_layernorm.weight"] = 1 + _rand(g, d, scale=0.1)
        for n, rows in (("q", d), ("k", kv), ("v", kv), ("o", d)):
            sd[p + f"self_attn.{n}_proj.weight"] = _rand(g, rows, d)
            if bias:
                sd[p + f"self_attn.{n}_proj.bias"] = _rand(g, rows, scale=0.1)
        if cfg["qk_layernorm"]:
            sd[p + "self_attn.q_norm.weight"] = 1 + _rand(g, hd, scale=0.1)
            sd[p + "self_attn.k_norm.weight"] = 1 + _rand(g, hd, scale=0.1)
        if cfg["moe_layer_freq"][i] == 0:
            _swiglu(sd, g, p + "mlp.", d, cfg["dense_intermediate_size"])
            continue
        sd[p + "mlp.gate.weight"] = _rand(g, cfg["num_experts"], d, scale=1.0)
        if cfg["moe_router_enable_expert_bias"]:
            sd[p + "mlp.expert_bias"] = _rand(g, cfg["num_experts"], scale=0.05)
        for e in range(cfg["num_experts"]):
            _swiglu(sd, g, p + f"mlp.experts.{e}.", d, cfg["expert_intermediate_size"])
        if cfg["shared_expert_intermediate_size"] is not None:
            _swiglu(sd, g, p + "shared_expert.", d, cfg["shared_expert_intermediate_size"])
    sd["model.norm.weight"] = 1 + _rand(g, d, scale=0.1)
    head = _rand(g, v, d, scale=0.5)
    head[MASK] = 0.0  # the MASK logit stays 0 while others spread wide: MASK is never the argmax
    sd["lm_head.weight"] = head
    return sd


def write_llada_moe(path: Path, seed: int = 0, tokenizer: bool = True, **over) -> Path:
    """config.json, model.safetensors and (``tokenizer``) the tiny tokenizer, in ``path``."""
    cfg = llada_moe_config(**over)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    sd = {k: t.contiguous() for k, t in llada_moe_state_dict(cfg, seed).items()}
    save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})
    if tokenizer:
        write_llada_moe_tokenizer(path)
    return path


def write_llada_moe_tokenizer(path: Path, mask_token: str | None = "<|mask|>", set_mask: bool = False) -> None:
    """A word-level tokenizer with the official special tokens (``mask_token``: the vocabulary's MASK entry, or
    None for none; ``set_mask``: also declare it as the tokenizer's ``mask_token``, which the official one does not)
    and the official chat layout ``<role>HUMAN</role>...<|role_end|><role>ASSISTANT</role>``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = {"<unk>": 0, "<|endoftext|>": EOS, "<|role_end|>": ROLE_END, "<role>": 3, "</role>": 4}
    if mask_token is not None:
        specials[mask_token] = MASK
    vocab = dict(specials)
    for i in range(VOCAB):
        if i not in specials.values():
            vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    extra = {"mask_token": mask_token} if set_mask and mask_token else {}
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        unk_token="<unk>",
        additional_special_tokens=[t for t in specials if t not in ("<unk>", "<|endoftext|>")],
        **extra,
    )
    fast.chat_template = (
        "{% for m in messages %}<role> {{ m['role'] | upper }} </role> {{ m['content'] }} <|role_end|> {% endfor %}"
        "{% if add_generation_prompt %}<role> w20 </role> {% endif %}"
    )
    fast.save_pretrained(str(path))


# ---- the reference forward, re-stated ----------------------------------------------------------------------------


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    xf = x.to(torch.float32)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(dtype)


def _mlp(sd: dict, p: str, x: torch.Tensor) -> torch.Tensor:
    g = F.linear(x, sd[p + "gate_proj.weight"])
    return F.linear(F.silu(g) * F.linear(x, sd[p + "up_proj.weight"]), sd[p + "down_proj.weight"])


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _rope_tables(cfg: dict, pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """HF default rope: inv_freq over ``int(head_dim * partial_rotary_factor)`` dims; [B, T, rot] in ``dtype``."""
    hd = cfg["hidden_size"] // cfg["num_attention_heads"]
    dim = int(hd * cfg["partial_rotary_factor"])
    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    freqs = (inv[None, :, None].expand(pos.shape[0], -1, 1) @ pos[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _attention(cfg: dict, sd: dict, p: str, x: torch.Tensor, cos, sin, keymask) -> torch.Tensor:
    b, t, d = x.shape
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = d // nh

    def proj(n):
        return F.linear(x, sd[p + f"self_attn.{n}_proj.weight"], sd.get(p + f"self_attn.{n}_proj.bias"))

    q, k, v = proj("q"), proj("k"), proj("v")
    if cfg["qk_layernorm"]:
        eps = cfg["rms_norm_eps"]
        q = _rms(q.reshape(-1, hd), sd[p + "self_attn.q_norm.weight"], eps).reshape(b, t, -1)
        k = _rms(k.reshape(-1, hd), sd[p + "self_attn.k_norm.weight"], eps).reshape(b, t, -1)
    q = q.view(b, t, nh, hd).transpose(1, 2)
    k = k.view(b, t, nkv, hd).transpose(1, 2)
    v = v.view(b, t, nkv, hd).transpose(1, 2)
    r = cos.shape[-1]
    c, s = cos[:, None], sin[:, None]
    q = torch.cat((q[..., :r] * c + _rotate_half(q[..., :r]) * s, q[..., r:]), dim=-1)
    k = torch.cat((k[..., :r] * c + _rotate_half(k[..., :r]) * s, k[..., r:]), dim=-1)
    rep = nh // nkv
    k = k[:, :, None].expand(b, nkv, rep, t, hd).reshape(b, nh, t, hd)
    v = v[:, :, None].expand(b, nkv, rep, t, hd).reshape(b, nh, t, hd)
    w = q @ k.transpose(2, 3) / math.sqrt(hd)
    if keymask is not None:  # AttentionMaskConverter.to_4d, not causal: finfo.min on padded keys
        hidden = ~(keymask if keymask.dim() == 4 else keymask[:, None, None, :])  # or a [B, 1, T, T] bool mask
        w = w + hidden.to(w.dtype) * torch.finfo(w.dtype).min
    w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    o = (w @ v).transpose(1, 2).reshape(b, t, d)
    return F.linear(o, sd[p + "self_attn.o_proj.weight"], sd.get(p + "self_attn.o_proj.bias"))


def _sparse(cfg: dict, sd: dict, p: str, h: torch.Tensor) -> torch.Tensor:
    b, t, d = h.shape
    x = h.view(-1, d)
    weights = F.softmax(F.linear(x, sd[p + "mlp.gate.weight"]), dim=1, dtype=torch.float)
    if p + "mlp.expert_bias" in sd:
        weights += sd[p + "mlp.expert_bias"]
    weights, chosen = torch.topk(weights, cfg["num_experts_per_tok"], dim=-1)
    weights = weights.to(x.dtype)
    out = torch.zeros((b * t, d), dtype=x.dtype)
    onehot = F.one_hot(chosen, num_classes=cfg["num_experts"]).permute(2, 1, 0)
    for e in range(cfg["num_experts"]):
        idx, top_x = torch.where(onehot[e])
        y = _mlp(sd, p + f"mlp.experts.{e}.", x[None, top_x].reshape(-1, d)) * weights[top_x, idx, None]
        out.index_add_(0, top_x, y.to(x.dtype))
    return out.view(b, t, d)


@torch.no_grad()
def reference_logits(cfg: dict, sd: dict, ids: torch.Tensor, keymask=None, pos=None) -> torch.Tensor:
    """The reference ``LLaDAMoEModelLM(ids, attention_mask=keymask, position_ids=pos).logits``."""
    b, t = ids.shape
    pos = torch.arange(t)[None].expand(b, t) if pos is None else pos
    h = sd["model.embed_tokens.weight"][ids]
    cos, sin = _rope_tables(cfg, pos, h.dtype)
    eps = cfg["rms_norm_eps"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = h + _attention(cfg, sd, p, _rms(h, sd[p + "input_layernorm.weight"], eps), cos, sin, keymask)
        m = _rms(h, sd[p + "post_attention_layernorm.weight"], eps)
        if cfg["moe_layer_freq"][i] == 0:
            out = _mlp(sd, p + "mlp.", m)
        else:
            out = _sparse(cfg, sd, p, m)
            if p + "shared_expert.gate_proj.weight" in sd:
                out = out + _mlp(sd, p + "shared_expert.", m)
        h = h + out
    return F.linear(_rms(h, sd["model.norm.weight"], eps), sd["lm_head.weight"])
