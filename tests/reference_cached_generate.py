"""Straightforward re-statements of Fast-dLLM's ``generate_with_prefix_cache`` and ``generate_with_dual_cache``
(``llada/generate.py``) at temperature 0, for token-identity tests of the ``prefix`` and ``dual`` caches.

Independent of ``dlm_decode``: the forward is a plain LLaDA transformer over the checkpoint tensors with an explicit
past-K/V mechanism written the way Fast-dLLM's modified ``modeling_llada.py`` does it: the cache holds K/V *before*
RoPE, each call concatenates (prefix mode) or overwrites the block's entries (dual mode, ``replace_position``), and
RoPE is applied to the whole key sequence every call; queries take the last positions of the keys (prefix) or the
positions ``[block_end - Q, block_end)`` (dual). The decoding functions keep the references' structure (per-row
Python loops, ``torch.topk`` per row, the first step of a block on the full forward's logits).

``benchmarks/bench_speed.py --versus-reference`` times these loops against ``dlm_decode.generate``; it runs the forward
with ``official_ops=True`` (SDPA attention and ``F.silu``, as the official modeling file computes them; the tests keep
the plain softmax and ``x * sigmoid(x)``), on any device.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from checkpoints import _attn, _rms, _rope_tables, _rotate


def _sdpa(q, k, v):
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    return F.scaled_dot_product_attention(q, k, v)


def llada_cached_forward(sd, cfg, ids, past=None, replace=None, official_ops=False):
    """ids [B, Q] -> (raw logits [B, Q, V], present: per layer (k, v) before RoPE, [B, H, S, hd]).

    ``past`` None: a full forward over positions 0..Q-1. ``replace`` None: keys are ``past`` followed by the new
    ones (prefix mode). ``replace=(s, e)``: the new K/V overwrite ``past`` at ``[s, e)`` in place (dual mode).
    ``official_ops``: attention through ``F.scaled_dot_product_attention`` and the MLP gate through ``F.silu``.
    """
    b, q_len = ids.shape
    nh, nkv = cfg["n_heads"], cfg["n_kv_heads"]
    hd = cfg["d_model"] // nh
    theta = cfg["rope_theta"]
    key_len = q_len if past is None else past[0][0].shape[2] + (q_len if replace is None else 0)
    q_end = key_len if replace is None else replace[1]
    dev = ids.device
    q_rope = _rope_tables(torch.arange(q_end - q_len, q_end, device=dev).expand(b, q_len), hd, theta)
    k_rope = _rope_tables(torch.arange(key_len, device=dev).expand(b, key_len), hd, theta)
    attend = _sdpa if official_ops else lambda q, k, v: _attn(q, k, v, None)
    gate = F.silu if official_ops else lambda g: g * torch.sigmoid(g)
    h = sd["model.transformer.wte.weight"][ids]
    present = []
    for i in range(cfg["n_layers"]):
        p = f"model.transformer.blocks.{i}."
        a = _rms(h, sd[p + "attn_norm.weight"], cfg["rms_norm_eps"])
        q = (a @ sd[p + "q_proj.weight"].T).view(b, q_len, nh, hd).transpose(1, 2)
        k = (a @ sd[p + "k_proj.weight"].T).view(b, q_len, nkv, hd).transpose(1, 2)
        v = (a @ sd[p + "v_proj.weight"].T).view(b, q_len, nkv, hd).transpose(1, 2)
        if past is not None:
            pk, pv = past[i]
            if replace is None:
                k, v = torch.cat([pk, k], dim=2), torch.cat([pv, v], dim=2)
            else:
                pk[:, :, replace[0] : replace[1]] = k
                pv[:, :, replace[0] : replace[1]] = v
                k, v = pk, pv
        present.append((k, v))
        qr, kr = _rotate(q, *q_rope, True), _rotate(k, *k_rope, True)
        o = attend(qr, kr, v).transpose(1, 2).reshape(b, q_len, -1)
        h = h + o @ sd[p + "attn_out.weight"].T
        m = _rms(h, sd[p + "ff_norm.weight"], cfg["rms_norm_eps"])
        g = m @ sd[p + "ff_proj.weight"].T
        h = h + (gate(g) * (m @ sd[p + "up_proj.weight"].T)) @ sd[p + "ff_out.weight"].T
    h = _rms(h, sd["model.transformer.ln_f.weight"], cfg["rms_norm_eps"])
    return h @ sd["model.transformer.ff_out.weight"].T, present


def _num_transfer(block_mask, steps):
    n = block_mask.sum(dim=1, keepdim=True)
    out = torch.zeros(n.size(0), steps, dtype=torch.int64, device=n.device) + n // steps
    for i in range(n.size(0)):
        out[i, : (n % steps)[i]] += 1
    return out


def _transfer(logits, mask_index, x, k=None, threshold=None, factor=None):
    """``get_transfer_index`` (fixed count ``k`` [B] or ``threshold``) / ``get_transfer_index_dynamic`` (``factor``)
    at temperature 0 with low-confidence remasking."""
    x0 = torch.argmax(logits, dim=-1)
    p = F.softmax(logits.to(torch.float64), dim=-1)
    x0_p = torch.squeeze(torch.gather(p, dim=-1, index=torch.unsqueeze(x0, -1)), -1)
    x0 = torch.where(mask_index, x0, x)
    confidence = torch.where(mask_index, x0_p, -np.inf)
    transfer = torch.zeros_like(x0, dtype=torch.bool)
    counts = mask_index.sum(dim=1)
    for j in range(confidence.shape[0]):
        if factor is not None:
            n = int(counts[j])
            if n == 0:
                continue  # the reference would fail on a row without masks; such a row commits nothing
            threshs = [1 - factor / (m + 1) for m in range(1, n + 1)]
            threshs[0] = -1
            ordered = torch.sort(confidence[j][mask_index[j]], dim=-1, descending=True)[0]
            top_i = 0
            for top_i in range(len(threshs)):
                if ordered[top_i] < threshs[top_i]:
                    break
            if top_i == 0 or top_i == len(threshs) - 1:
                top_i += 1
            _, sel = torch.topk(confidence[j], k=top_i)
            transfer[j, sel] = True
            continue
        n = int(counts[j]) if threshold is not None else int(k[j])
        _, sel = torch.topk(confidence[j], k=n)
        transfer[j, sel] = True
        if threshold is not None:
            for m in range(1, n):
                if confidence[j, sel[m]] < threshold:
                    transfer[j, sel[m]] = False
    return x0, transfer


def _cached_generate(fwd, prompt, steps, gen_length, block_length, mask_id, threshold, factor, dual):
    x = torch.full((prompt.shape[0], prompt.shape[1] + gen_length), mask_id, dtype=torch.long, device=prompt.device)
    x[:, : prompt.shape[1]] = prompt.clone()
    num_blocks = gen_length // block_length
    steps_per_block = (steps if steps is not None else gen_length) // num_blocks
    fixed = threshold is None and factor is None
    nfe = 0
    for nb in range(num_blocks):
        s = prompt.shape[1] + nb * block_length
        e = s + block_length
        ntt = _num_transfer(x[:, s:e] == mask_id, steps_per_block)
        logits, past = fwd(x)  # cache init and the block's first update
        mask_index = x == mask_id
        mask_index[:, e:] = 0
        x0, tr = _transfer(logits, mask_index, x, ntt[:, 0] if fixed else None, threshold, factor)
        x[tr] = x0[tr]
        nfe += 1
        if not dual:
            past = [(k[:, :, :s], v[:, :, :s]) for k, v in past]  # keep only the prefix
        i = 1
        while True:
            if (x[:, s:e] == mask_id).sum() == 0:
                break
            nfe += 1
            if dual:
                mask_index = x[:, s:e] == mask_id
                logits, _ = fwd(x[:, s:e], past=past, replace=(s, e))
                x0, tr = _transfer(logits, mask_index, x[:, s:e], ntt[:, i] if fixed else None, threshold, factor)
                x[:, s:e][tr] = x0[tr]
            else:
                mask_index = x[:, s:] == mask_id
                mask_index[:, block_length:] = 0
                logits, _ = fwd(x[:, s:], past=past)
                x0, tr = _transfer(logits, mask_index, x[:, s:], ntt[:, i] if fixed else None, threshold, factor)
                x[:, s:][tr] = x0[tr]
            i += 1
    return x, nfe


@torch.no_grad()
def prefix_cache_generate(fwd, prompt, gen_length, block_length, mask_id, steps=None, threshold=None, factor=None):
    """Fast-dLLM ``generate_with_prefix_cache``; ``fwd(ids, past=None, replace=None) -> (logits, present)``."""
    return _cached_generate(fwd, prompt, steps, gen_length, block_length, mask_id, threshold, factor, dual=False)


@torch.no_grad()
def dual_cache_generate(fwd, prompt, gen_length, block_length, mask_id, steps=None, threshold=None, factor=None):
    """Fast-dLLM ``generate_with_dual_cache``; ``fwd(ids, past=None, replace=None) -> (logits, present)``."""
    return _cached_generate(fwd, prompt, steps, gen_length, block_length, mask_id, threshold, factor, dual=True)
