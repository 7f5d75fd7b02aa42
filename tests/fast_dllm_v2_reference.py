"""Tiny random Fast-dLLM v2 checkpoints in the published format, and re-statements of the reference forward (the hub's
``modeling.py`` for Efficient-Large-Model/Fast_dLLM_v2_7B, eval path) and of NVlabs/Fast-dLLM
``v2/generation_functions.py`` ``batch_sample``, written independently of ``dlm_decode``.

The checkpoint: config.json with ``model_type: Fast_dLLM_Qwen`` and Qwen2's keys plus ``bd_size`` (and, unlike the
published one, ``mask_token_id``, since the tiny vocabulary cannot hold 151665), one ``model.safetensors`` under Qwen2's
parameter names (q / k / v biases, none on o_proj).

``ReferenceFastDLLM(ids, cache, update)`` follows ``Fast_dLLM_QwenModel.forward`` at inference: positions and the
mask's query offset from the cache length (``cache_position``), the ``eval_mask`` (query block >= key block on the
absolute grid of ``block_size``), RoPE on q and k, K/V appended to the ``DynamicCache`` only with
``update_past_key_values`` (else concatenated for this call alone), SDPA with the boolean mask, final norm, lm_head;
unshifted logits. ``calls`` counts forwards.

``batch_sample`` here is the reference's loop at temperature 0 for rows of one prompt length (``min_len`` = every
``seq_len``): prefill the prompt's whole blocks when ``min_len > block_size`` (then, on a block boundary, the last
logit's argmax is the next token); per block, sub-blocks left to right, each step one forward of the block against the
cache, logits shifted by one, ``x1_p > threshold`` plus the row's most probable masked slot of the sub-block; a full
block gets one more forward that writes its K/V and whose last logit's argmax is appended; a row that commits the
stop token is finished after its block (the slots after its first stop token become ``pad``) and dropped.
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
STOP = 2  # the reference's stop_token (config.json's eos_token_id)
PAD = 0


def fdllm_config(**over) -> dict:
    """Tiny widths with GQA (4 heads over 2 KV heads), head_dim = hidden / heads = 8."""
    cfg = {
        "architectures": ["Fast_dLLM_QwenForCausalLM"],
        "auto_map": {
            "AutoConfig": "configuration.Fast_dLLM_QwenConfig",
            "AutoModel": "modeling.Fast_dLLM_QwenModel",
            "AutoModelForCausalLM": "modeling.Fast_dLLM_QwenForCausalLM",
        },
        "model_type": "Fast_dLLM_Qwen",
        "attention_dropout": 0.0,
        "bd_size": 8,
        "bos_token_id": 1,
        "eos_token_id": STOP,
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


def write_fdllm(path: Path, seed: int = 0, head_scale: float = 2.5, stop_scale: float | None = None, **over) -> Path:
    """A checkpoint directory. ``head_scale`` multiplies the output head and zeroes its MASK row (MASK at logit 0
    among wider logits is (almost) never the argmax, as with trained checkpoints); ``stop_scale`` multiplies the
    stop token's output row (plants stop tokens in answers)."""
    path.mkdir(parents=True, exist_ok=True)
    cfg = fdllm_config(**over)
    g = torch.Generator().manual_seed(seed)
    d, h, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = d // h

    def w(*shape):
        return torch.randn(*shape, generator=g) * 0.3

    def norm(n):
        return 1.0 + 0.1 * torch.randn(n, generator=g)

    sd = {"model.embed_tokens.weight": w(cfg["vocab_size"], d), "model.norm.weight": norm(d)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        sd[f"{p}.input_layernorm.weight"] = norm(d)
        sd[f"{p}.post_attention_layernorm.weight"] = norm(d)
        for name, rows in (("q", h * hd), ("k", kv * hd), ("v", kv * hd)):
            sd[f"{p}.self_attn.{name}_proj.weight"] = w(rows, d)
            sd[f"{p}.self_attn.{name}_proj.bias"] = w(rows)
        sd[f"{p}.self_attn.o_proj.weight"] = w(d, h * hd)
        sd[f"{p}.mlp.gate_proj.weight"] = w(cfg["intermediate_size"], d)
        sd[f"{p}.mlp.up_proj.weight"] = w(cfg["intermediate_size"], d)
        sd[f"{p}.mlp.down_proj.weight"] = w(d, cfg["intermediate_size"])
    head = "model.embed_tokens.weight" if cfg["tie_word_embeddings"] else "lm_head.weight"
    if not cfg["tie_word_embeddings"]:
        sd[head] = w(cfg["vocab_size"], d) * head_scale
        sd[head][MASK] = 0.0
    if stop_scale is not None:
        sd[head][STOP] *= stop_scale
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def _rms(x, w, eps):
    dt = x.dtype
    x = x.to(torch.float32)
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(dt)


def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class ReferenceFastDLLM:
    """``Fast_dLLM_QwenForCausalLM.forward(ids, past_key_values=cache, update_past_key_values=update,
    block_size=B).logits`` at inference; ``cache``: a list of per-layer ``(k, v)``."""

    def __init__(self, cfg: dict, sd: dict[str, torch.Tensor]) -> None:
        self.cfg, self.sd, self.calls = cfg, sd, 0

    @torch.no_grad()
    def __call__(self, ids, cache: list, update: bool, block_size: int, block_cache=None, replace=None):
        """``block_cache`` (``use_block_cache``): a list that a full-block call fills with the block's K/V, or that
        a sub-block call (``replace``: its offset in the block) overwrites in place and attends to, unmasked."""
        cfg, sd = self.cfg, self.sd
        self.calls += 1
        b, t = ids.shape
        past = cache[0][0].shape[-2] if cache else 0
        sub = block_cache is not None and replace is not None
        h_, kv, eps = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["rms_norm_eps"]
        hd = cfg["hidden_size"] // h_
        pos = torch.arange(past, past + t) + (replace if sub else 0)
        inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
        emb = torch.cat((pos[:, None].float() * inv[None], pos[:, None].float() * inv[None]), -1)
        cos, sin = emb.cos(), emb.sin()
        visible = (pos[:, None] // block_size) >= (torch.arange(past + t)[None, :] // block_size)  # eval_mask
        visible = None if sub else visible  # the reference passes no mask once the block cache is filled
        h = sd["model.embed_tokens.weight"][ids]
        for i in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{i}.self_attn"
            x = _rms(h, sd[f"model.layers.{i}.input_layernorm.weight"], eps)
            q = F.linear(x, sd[f"{p}.q_proj.weight"], sd[f"{p}.q_proj.bias"]).view(b, t, h_, hd).transpose(1, 2)
            k = F.linear(x, sd[f"{p}.k_proj.weight"], sd[f"{p}.k_proj.bias"]).view(b, t, kv, hd).transpose(1, 2)
            v = F.linear(x, sd[f"{p}.v_proj.weight"], sd[f"{p}.v_proj.bias"]).view(b, t, kv, hd).transpose(1, 2)
            q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
            if block_cache is not None and not sub:
                block_cache.append((k.clone(), v.clone()))
            elif sub:
                block_cache[i][0][:, :, replace : replace + t] = k
                block_cache[i][1][:, :, replace : replace + t] = v
                k, v = block_cache[i]
            if update:
                if len(cache) > i:
                    cache[i] = (torch.cat([cache[i][0], k], -2), torch.cat([cache[i][1], v], -2))
                else:
                    cache.append((k, v))
                k, v = cache[i]
            elif len(cache) > i:
                k, v = torch.cat([cache[i][0], k], -2), torch.cat([cache[i][1], v], -2)
            k, v = k.repeat_interleave(h_ // kv, 1), v.repeat_interleave(h_ // kv, 1)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=1 / math.sqrt(hd))
            h = h + F.linear(a.transpose(1, 2).reshape(b, t, -1), sd[f"{p}.o_proj.weight"])
            x = _rms(h, sd[f"model.layers.{i}.post_attention_layernorm.weight"], eps)
            m = f"model.layers.{i}.mlp"
            gate = F.silu(F.linear(x, sd[f"{m}.gate_proj.weight"])) * F.linear(x, sd[f"{m}.up_proj.weight"])
            h = h + F.linear(gate, sd[f"{m}.down_proj.weight"])
        head = sd["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else sd["lm_head.weight"]
        return F.linear(_rms(h, sd["model.norm.weight"], eps), head)


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    tok = logits.argmax(-1)
    assert not (tok == MASK).any(), "the reference proposed MASK: pick another checkpoint seed"
    return tok


@torch.no_grad()
def batch_sample(
    model: ReferenceFastDLLM,
    prompts: torch.Tensor,  # [b, P], one length
    *,
    block_size: int,
    small_block_size: int,
    max_new_tokens: int,
    threshold: float,
    stop_token: int = STOP,
    use_block_cache: bool = False,
) -> list[list[int]]:
    """Each row's tokens after the prompt, as ``batch_sample`` returns them (temperature 0)."""
    b, p = prompts.shape
    ids, cache = prompts.clone(), []
    if p > block_size:
        logits = model(ids[:, : p // block_size * block_size], cache, True, block_size)
        if p % block_size == 0:
            ids = torch.cat([ids, _argmax(logits[:, -1:])], 1)
    rows, done, finished = list(range(b)), {}, torch.zeros(b, dtype=torch.bool)
    for _block in range(p // block_size, max_new_tokens // block_size + p // block_size):
        if finished.all():
            break
        x = torch.cat([ids, torch.full((ids.shape[0], block_size - ids.shape[1] % block_size), MASK)], 1)
        x[finished, -block_size:] = PAD
        while True:
            if not (x[:, -block_size:] == MASK).any():
                for r in range(x.shape[0]):
                    if finished[r]:
                        first = int((x[r, p:] == stop_token).nonzero()[0][0])
                        x[r, p + first + 1 :] = PAD
                if finished.all():
                    break
                logits = model(x[:, -block_size:], cache, True, block_size)
                nxt = _argmax(logits[:, -1:])
                nxt[finished] = PAD
                x = torch.cat([x, nxt], 1)
                break
            args = (block_size, small_block_size, threshold, stop_token, use_block_cache)
            finished = _sub_blocks(model, x, cache, *args, finished)
        ids = x
        if finished.any():
            keep = ~finished
            for r in range(x.shape[0]):
                if finished[r]:
                    done[rows[r]] = x[r, p:].tolist()
            rows = [r for r, k in zip(rows, keep.tolist(), strict=True) if k]
            ids, cache = ids[keep], [(k[keep], v[keep]) for k, v in cache]
            finished = finished[keep]
    for r, row in zip(rows, ids, strict=True):
        done[r] = row[p:].tolist()
    return [done[r] for r in range(b)]


def _sub_blocks(model, x, cache, block_size, small, threshold, stop_token, use_block_cache, finished):
    """One pass over the block's sub-blocks, left to right (writes ``x`` in place) -> the updated finished flags."""
    block_cache = None
    for s in range(block_size // small):
        start = -block_size + s * small
        end = None if (s + 1) * small == block_size else start + small
        while True:
            masked = x[:, -block_size:] == MASK
            if masked[:, start:end].sum() == 0:
                break
            if not use_block_cache:
                logits = model(x[:, -block_size:], cache, False, block_size)
                logits = torch.cat([logits[:, :1], logits[:, :-1]], 1)[:, start:end]
            elif block_cache is None or (x[:, -block_size + s * small] == MASK).any():
                block_cache = []
                logits = model(x[:, -block_size:], cache, False, block_size, block_cache)
                logits = torch.cat([logits[:, :1], logits[:, :-1]], 1)[:, start:end]
            else:  # the sub-block alone against the block cache; shifted inside the sub-block
                logits = model(x[:, start:end], cache, False, block_size, block_cache, s * small)
                logits = torch.cat([logits[:, :1], logits[:, :-1]], 1)
            tok, probs = logits.argmax(-1), torch.softmax(logits, -1)
            conf = torch.where(masked[:, start:end], probs.gather(-1, tok[..., None])[..., 0], -torch.inf)
            take = conf > threshold
            take[torch.arange(tok.shape[0]), conf.argmax(-1)] = True
            take &= masked[:, start:end]
            assert not (tok[take] == MASK).any(), "the reference committed MASK: pick another checkpoint seed"
            x[:, start:end][take] = tok[take]
            finished = finished | ((tok == stop_token) & take).any(1)
    return finished
