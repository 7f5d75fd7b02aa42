"""Tiny random checkpoints written in the official LLaDA and Dream formats (config keys and safetensors key names as
published), plus straightforward reference forwards written independently of ``dlm_decode.models``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

VOCAB = 64
MASK = 63
EOS = 1
EOT = 2


def llada_config(**over) -> dict:
    cfg = {
        "architectures": ["LLaDAModelLM"],
        "auto_map": {
            "AutoConfig": "configuration_llada.LLaDAConfig",
            "AutoModel": "modeling_llada.LLaDAModelLM",
            "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
        },
        "model_type": "llada",
        "d_model": 32,
        "n_layers": 2,
        "n_heads": 4,
        "n_kv_heads": 4,
        "mlp_hidden_size": 48,
        "mlp_ratio": 4,
        "vocab_size": VOCAB,
        "embedding_size": VOCAB,
        "max_sequence_length": 256,
        "rope": True,
        "rope_theta": 500000.0,
        "rope_full_precision": True,
        "block_type": "llama",
        "layer_norm_type": "rms",
        "rms_norm_eps": 1e-05,
        "layer_norm_with_affine": True,
        "bias_for_layer_norm": False,
        "include_bias": False,
        "include_qkv_bias": False,
        "activation_type": "silu",
        "weight_tying": False,
        "scale_logits": False,
        "input_emb_norm": False,
        "attention_layer_norm": False,
        "alibi": False,
        "flash_attention": False,
        "mask_token_id": MASK,
        "eos_token_id": EOS,
        "pad_token_id": EOS,
        "torch_dtype": "bfloat16",
    }
    cfg.update(over)
    return cfg


def dream_config(**over) -> dict:
    cfg = {
        "architectures": ["DreamModel"],
        "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
        "model_type": "Dream",
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_act": "silu",
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "vocab_size": VOCAB,
        "mask_token_id": MASK,
        "pad_token_id": EOS,
        "bos_token_id": EOS,
        "eos_token_id": EOS,
        "torch_dtype": "bfloat16",
    }
    cfg.update(over)
    return cfg


def _rand(gen: torch.Generator, *shape: int, scale: float = 0.3) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * scale


def llada_state_dict(cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    d, v, mlp = cfg["d_model"], cfg["embedding_size"], cfg["mlp_hidden_size"]
    hd = d // cfg["n_heads"]
    kv = cfg["n_kv_heads"] * hd
    sd = {"model.transformer.wte.weight": _rand(g, v, d, scale=1.0)}
    for i in range(cfg["n_layers"]):
        p = f"model.transformer.blocks.{i}."
        sd[p + "attn_norm.weight"] = 1 + _rand(g, d, scale=0.1)
        sd[p + "ff_norm.weight"] = 1 + _rand(g, d, scale=0.1)
        sd[p + "q_proj.weight"] = _rand(g, d, d)
        sd[p + "k_proj.weight"] = _rand(g, kv, d)
        sd[p + "v_proj.weight"] = _rand(g, kv, d)
        sd[p + "attn_out.weight"] = _rand(g, d, d)
        sd[p + "ff_proj.weight"] = _rand(g, mlp, d)
        sd[p + "up_proj.weight"] = _rand(g, mlp, d)
        sd[p + "ff_out.weight"] = _rand(g, d, mlp)
    sd["model.transformer.ln_f.weight"] = 1 + _rand(g, d, scale=0.1)
    head = _rand(g, v, d, scale=0.5)
    head[cfg["mask_token_id"]] = 0.0  # the MASK logit is 0 while others spread wide: MASK is never the argmax
    sd["model.transformer.ff_out.weight"] = head
    return sd


def dream_state_dict(cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    d, v, mlp = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    hd = d // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * hd
    sd = {"model.embed_tokens.weight": _rand(g, v, d, scale=1.0)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = 1 + _rand(g, d, scale=0.1)
        sd[p + "post_attention_layernorm.weight"] = 1 + _rand(g, d, scale=0.1)
        for n, rows in (("q", d), ("k", kv), ("v", kv)):
            sd[p + f"self_attn.{n}_proj.weight"] = _rand(g, rows, d)
            sd[p + f"self_attn.{n}_proj.bias"] = _rand(g, rows, scale=0.1)
        sd[p + "self_attn.o_proj.weight"] = _rand(g, d, d)
        sd[p + "mlp.gate_proj.weight"] = _rand(g, mlp, d)
        sd[p + "mlp.up_proj.weight"] = _rand(g, mlp, d)
        sd[p + "mlp.down_proj.weight"] = _rand(g, d, mlp)
    sd["model.norm.weight"] = 1 + _rand(g, d, scale=0.1)
    head = _rand(g, v, d, scale=0.5)
    head[cfg["mask_token_id"]] = 0.0
    sd["lm_head.weight"] = head
    return sd


def write_checkpoint(path: Path, cfg: dict, sd: dict[str, torch.Tensor], shards: int = 1) -> Path:
    """Write config.json and bf16-free fp32 safetensors (one file, or ``shards`` files plus the index)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    sd = {k: v.contiguous() for k, v in sd.items()}
    if shards == 1:
        save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})
        return path
    keys = sorted(sd)
    per = math.ceil(len(keys) / shards)
    weight_map = {}
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: sd[k] for k in keys[s * per : (s + 1) * per]}
        save_file(part, str(path / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
    total = sum(v.numel() * v.element_size() for v in sd.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return path


# ---- straightforward reference forwards (independent of dlm_decode.models) --------------------------------------


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return w * (xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rope_tables(pos: torch.Tensor, hd: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 cos, sin [B, 1, T, hd] for integer positions [B, T]."""
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, device=pos.device).float() / hd))
    ang = pos.float()[:, None, :, None] * inv  # [B, 1, T, hd/2]
    return torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fp32: bool) -> torch.Tensor:
    if not fp32:
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    y = x.float() if fp32 else x
    half = x.shape[-1] // 2
    rot = torch.cat([-y[..., half:], y[..., :half]], -1)
    return (y * cos + rot * sin).to(x.dtype)


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float, fp32: bool) -> torch.Tensor:
    return _rotate(x, *_rope_tables(pos, x.shape[-1], theta), fp32)


def _attn(q, k, v, keymask, mask4d=None):
    """``mask4d``: an optional [B or 1, 1, Tq, Tk] mask, bool (True = visible) or additive float (0 / -inf)."""
    b, h, t, hd = q.shape
    rep = h // k.shape[1]
    k = k.repeat_interleave(rep, 1)
    v = v.repeat_interleave(rep, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(hd)
    if keymask is not None:  # [B, T] keys, or a [B, 1, T, T] bool mask per query
        s = s.masked_fill(~(keymask if keymask.dim() == 4 else keymask[:, None, None, :]), float("-inf"))
    if mask4d is not None:
        s = s.masked_fill(~mask4d, float("-inf")) if mask4d.dtype == torch.bool else s + mask4d.to(s.dtype)
    return torch.softmax(s.float(), -1).to(q.dtype) @ v


def reference_llada_logits(sd, cfg, ids, pos=None, keymask=None, mask4d=None) -> torch.Tensor:
    """``mask4d``: an optional attention mask [B or 1, 1, T, T] (see ``_attn``) over the key mask, if any."""
    b, t = ids.shape
    pos = torch.arange(t).expand(b, t) if pos is None else pos
    h = sd["model.transformer.wte.weight"][ids]
    nh, nkv = cfg["n_heads"], cfg["n_kv_heads"]
    hd = cfg["d_model"] // nh
    for i in range(cfg["n_layers"]):
        p = f"model.transformer.blocks.{i}."
        a = _rms(h, sd[p + "attn_norm.weight"], cfg["rms_norm_eps"])
        q = (a @ sd[p + "q_proj.weight"].T).view(b, t, nh, hd).transpose(1, 2)
        k = (a @ sd[p + "k_proj.weight"].T).view(b, t, nkv, hd).transpose(1, 2)
        v = (a @ sd[p + "v_proj.weight"].T).view(b, t, nkv, hd).transpose(1, 2)
        q, k = _rope(q, pos, cfg["rope_theta"], True), _rope(k, pos, cfg["rope_theta"], True)
        o = _attn(q, k, v, keymask, mask4d).transpose(1, 2).reshape(b, t, -1)
        h = h + o @ sd[p + "attn_out.weight"].T
        m = _rms(h, sd[p + "ff_norm.weight"], cfg["rms_norm_eps"])
        g = m @ sd[p + "ff_proj.weight"].T
        h = h + (g * torch.sigmoid(g) * (m @ sd[p + "up_proj.weight"].T)) @ sd[p + "ff_out.weight"].T
    h = _rms(h, sd["model.transformer.ln_f.weight"], cfg["rms_norm_eps"])
    return h @ sd["model.transformer.ff_out.weight"].T


def reference_dream_logits(sd, cfg, ids, pos=None, keymask=None, mask4d=None) -> torch.Tensor:
    """Raw (unshifted) Dream logits, as the official forward returns them; ``mask4d`` as in
    ``reference_llada_logits``."""
    b, t = ids.shape
    pos = torch.arange(t).expand(b, t) if pos is None else pos
    h = sd["model.embed_tokens.weight"][ids]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg["hidden_size"] // nh
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = _rms(h, sd[p + "input_layernorm.weight"], cfg["rms_norm_eps"])

        def proj(n, heads, a=a, p=p):
            w, bias = sd[p + f"self_attn.{n}_proj.weight"], sd[p + f"self_attn.{n}_proj.bias"]
            return (a @ w.T + bias).view(b, t, heads, hd).transpose(1, 2)

        q, k, v = proj("q", nh), proj("k", nkv), proj("v", nkv)
        q, k = _rope(q, pos, cfg["rope_theta"], False), _rope(k, pos, cfg["rope_theta"], False)
        o = _attn(q, k, v, keymask, mask4d).transpose(1, 2).reshape(b, t, -1)
        h = h + o @ sd[p + "self_attn.o_proj.weight"].T
        m = _rms(h, sd[p + "post_attention_layernorm.weight"], cfg["rms_norm_eps"])
        g = m @ sd[p + "mlp.gate_proj.weight"].T
        h = h + (g * torch.sigmoid(g) * (m @ sd[p + "mlp.up_proj.weight"].T)) @ sd[p + "mlp.down_proj.weight"].T
    h = _rms(h, sd["model.norm.weight"], cfg["rms_norm_eps"])
    return h @ sd["lm_head.weight"].T


def write_tokenizer(path: Path) -> None:
    """A word-level tokenizer over the tiny vocabulary with LLaDA-style special tokens and chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = {
        "<|endoftext|>": EOS,
        "<|eot_id|>": EOT,
        "<|startoftext|>": 3,
        "<|start_header_id|>": 4,
        "<|end_header_id|>": 5,
        "<|mdm_mask|>": MASK,
        "<unk>": 0,
    }
    vocab = dict(specials)
    words = [f"w{i}" for i in range(VOCAB)]
    for i in range(VOCAB):
        if i not in specials.values():
            vocab[words[i]] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|startoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        mask_token="<|mdm_mask|>",
        unk_token="<unk>",
        additional_special_tokens=["<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"],
    )
    fast.chat_template = (
        "{{ bos_token }}{% for m in messages %}<|start_header_id|> {{ m['role'] }} <|end_header_id|> "
        "{{ m['content'] }} <|eot_id|> {% endfor %}{% if add_generation_prompt %}<|start_header_id|> w20 "
        "<|end_header_id|> {% endif %}"
    )
    fast.save_pretrained(str(path))
