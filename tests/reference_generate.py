"""Straightforward re-statements of the official generate functions (LLaDA ``generate``, Fast-dLLM ``generate`` with
threshold / factor, Dream ``diffusion_generate`` / ``_sample`` with its effective defaults), written from their
published behaviour for token-identity tests.

They keep the references' structure on purpose (per-row Python loops, ``torch.topk`` per row, the whole canvas
through the model every step) so that they are an independent check of the vectorised library code. ``model`` is
any callable ``ids -> raw logits [B, T, V]`` (the official forward).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def _num_transfer(block_mask: torch.Tensor, steps: int) -> torch.Tensor:
    n = block_mask.sum(dim=1, keepdim=True)
    base, rem = n // steps, n % steps
    out = torch.zeros(n.size(0), steps, dtype=torch.int64, device=n.device) + base
    for i in range(n.size(0)):
        out[i, : rem[i]] += 1
    return out


@torch.no_grad()
def llada_generate(model, prompt, steps, gen_length, block_length, mask_id, remasking="low_confidence"):
    """LLaDA ``generate()`` at temperature 0, cfg 0 (confidence softmax in float64, as Fast-dLLM)."""
    x = torch.full((prompt.shape[0], prompt.shape[1] + gen_length), mask_id, dtype=torch.long, device=prompt.device)
    x[:, : prompt.shape[1]] = prompt.clone()
    assert gen_length % block_length == 0
    num_blocks = gen_length // block_length
    assert steps % num_blocks == 0
    steps = steps // num_blocks
    p = prompt.shape[1]
    for nb in range(num_blocks):
        block_mask = x[:, p + nb * block_length : p + (nb + 1) * block_length] == mask_id
        ntt = _num_transfer(block_mask, steps)
        for i in range(steps):
            mask_index = x == mask_id
            logits = model(x)
            x0 = torch.argmax(logits, dim=-1)
            prob = F.softmax(logits.to(torch.float64), dim=-1)
            x0_p = torch.squeeze(torch.gather(prob, dim=-1, index=torch.unsqueeze(x0, -1)), -1)
            x0_p[:, p + (nb + 1) * block_length :] = -np.inf
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, -np.inf)
            transfer = torch.zeros_like(x0, dtype=torch.bool)
            for j in range(confidence.shape[0]):
                _, sel = torch.topk(confidence[j], k=int(ntt[j, i]))
                transfer[j, sel] = True
            x[transfer] = x0[transfer]
    return x


@torch.no_grad()
def fastdllm_generate(model, prompt, gen_length, block_length, mask_id, threshold=None, factor=None, steps=None):
    """Fast-dLLM's no-cache ``generate`` at temperature 0 with ``threshold`` or ``factor``; returns (x, nfe)."""
    x = torch.full((prompt.shape[0], prompt.shape[1] + gen_length), mask_id, dtype=torch.long, device=prompt.device)
    x[:, : prompt.shape[1]] = prompt.clone()
    p = prompt.shape[1]
    num_blocks = gen_length // block_length
    nfe = 0
    for nb in range(num_blocks):
        s, e = p + nb * block_length, p + (nb + 1) * block_length
        while True:
            nfe += 1
            mask_index = x == mask_id
            logits = model(x)
            mask_index[:, e:] = 0
            x0 = torch.argmax(logits, dim=-1)
            prob = F.softmax(logits.to(torch.float64), dim=-1)
            x0_p = torch.squeeze(torch.gather(prob, dim=-1, index=torch.unsqueeze(x0, -1)), -1)
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, -np.inf)
            transfer = torch.zeros_like(x0, dtype=torch.bool)
            counts = mask_index.sum(dim=1)
            for j in range(confidence.shape[0]):
                n = int(counts[j])
                if n == 0:
                    continue
                if factor is None:
                    _, sel = torch.topk(confidence[j], k=n)
                    transfer[j, sel] = True
                    for k in range(1, n):
                        if confidence[j, sel[k]] < threshold:
                            transfer[j, sel[k]] = False
                else:
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
            x[transfer] = x0[transfer]
            if (x[:, s:e] == mask_id).sum() == 0:
                break
    return x, nfe


# transformers 4.x ``PretrainedConfig`` generation defaults (the reference needs transformers 4.4x) and
# ``DreamGenerationConfig``'s own defaults, for the fields ``_sample`` reads
TF4_MODEL_CONFIG = {"temperature": 1.0, "top_k": 50, "top_p": 1.0}
DREAM_GENERATION_CONFIG = {"temperature": 0.0, "top_p": None, "top_k": None, "eps": 1e-3, "alg_temp": None}


def dream_generation_config(model_config: dict, **kwargs) -> dict:
    """What ``diffusion_generate(..., **kwargs)`` samples with: ``DreamGenerationConfig.from_model_config`` of the
    model's config.json (transformers 4.x fills absent generation keys with its defaults; ``from_model_config``
    drops None values), then ``update(**kwargs)`` (explicit None included). generation_config.json is not read."""
    merged = {k: v for k, v in (TF4_MODEL_CONFIG | model_config).items() if v is not None}
    cfg = {k: merged.get(k, default) for k, default in DREAM_GENERATION_CONFIG.items()}
    cfg.update({k: v for k, v in kwargs.items() if k in cfg})
    return cfg


def _top_p_logits(logits, top_p):
    sorted_logits, sorted_indices = torch.sort(logits, descending=True)
    cum = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
    remove = cum > top_p
    remove[..., 1:] = remove[..., :-1].clone()
    remove[..., 0] = 0
    mask = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, sorted_indices, remove)
    return logits.masked_fill(mask, torch.finfo(logits.dtype).min)


def _top_k_logits(logits, top_k):
    top_k = min(top_k, logits.size(-1))
    remove = logits < torch.topk(logits, top_k)[0][..., -1, None]
    return logits.masked_fill(remove, torch.finfo(logits.dtype).min)


@torch.no_grad()
def dream_sample(model, input_ids, gen_length, steps, mask_id, alg="maskgit_plus", config=None, **kwargs):
    """Dream ``diffusion_generate`` / ``_sample`` at temperature 0 without padding (attention "full"); ``model``
    returns raw logits. ``config``: the checkpoint's config.json as a dict; ``kwargs``: what the caller passes
    (``temperature``, ``top_p``, ``top_k``, ``eps``), merged as :func:`dream_generation_config` does."""
    gc = dream_generation_config(config or {}, **kwargs)
    assert gc["temperature"] == 0 and not gc["alg_temp"], "re-stated at temperature 0, alg_temp off"
    x = F.pad(input_ids, (0, gen_length), value=mask_id)
    timesteps = torch.linspace(1, gc["eps"], steps + 1)
    for i in range(steps):
        mask_index = x == mask_id
        logits = model(x)
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        mask_logits = logits[mask_index]
        t, s = timesteps[i], timesteps[i + 1]
        if gc["top_p"] is not None and gc["top_p"] < 1:  # sample_tokens: top-p, then top-k
            mask_logits = _top_p_logits(mask_logits, gc["top_p"])
        if gc["top_k"] is not None:
            mask_logits = _top_k_logits(mask_logits, gc["top_k"])
        probs = torch.softmax(mask_logits, dim=-1)
        confidence, x0 = probs.max(dim=-1)
        if alg == "topk_margin":
            sp, _ = torch.sort(probs, dim=-1, descending=True)
            confidence = sp[:, 0] - sp[:, 1]
        elif alg == "entropy":
            confidence = torch.sum(probs * torch.log(probs + 1e-10), dim=-1)
        num_mask_token = mask_index.sum() / mask_index.shape[0]
        k = int(num_mask_token * (1 - s / t)) if i < steps - 1 else int(num_mask_token)
        full_conf = torch.full_like(x, -torch.inf, dtype=logits.dtype)
        full_conf[mask_index] = confidence
        if k > 0:
            _, transfer = torch.topk(full_conf, k)
            x_ = torch.zeros_like(x) + mask_id
            x_[mask_index] = x0.clone()
            rows = torch.arange(x.size(0)).unsqueeze(1).expand_as(transfer)
            x[rows, transfer] = x_[rows, transfer]
    return x
