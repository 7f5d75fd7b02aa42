"""The training objective: LLaDA's SFT loss on the response tokens, for either model family.

Nie et al. 2025, "Large Language Diffusion Models", Alg. 2 and the SFT guidelines of the LLaDA repository: the prompt
is never masked; the response (answer, ``<|eot_id|>``, then ``<|endoftext|>`` up to the task's generation length) is
masked independently per token with probability ``p = (1 - eps) t + eps``, ``t ~ U(0, 1)`` per row, and the loss is
the cross-entropy on masked response tokens weighted by ``1 / p`` and divided by the response length, averaged over
the batch. Dream's logits are shifted (``logit_shift`` 1): token ``i`` is scored from the hidden state at ``i - 1``.

Rows are left-padded (positions ``cumsum(valid) - 1``, key-padding mask), the canvas layout ``dlm_decode.generate``
decodes with. The masks of a step are drawn from ``step_generator(seed, step)``, so a resumed run draws the same.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def collate(rows: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Left-pad prompt + response rows -> ids, valid, response mask [B, T], response length [B]."""
    t = max(len(p) + len(r) for p, r in rows)
    b = len(rows)
    ids = torch.full((b, t), pad_id, dtype=torch.long)
    valid = torch.zeros((b, t), dtype=torch.bool)
    resp = torch.zeros((b, t), dtype=torch.bool)
    resp_len = torch.zeros(b)
    for i, (p, r) in enumerate(rows):
        n = len(p) + len(r)
        ids[i, t - n :] = torch.tensor(p + r)
        valid[i, t - n :] = True
        resp[i, t - len(r) :] = True
        resp_len[i] = len(r)
    return {"input_ids": ids, "valid": valid, "response": resp, "response_length": resp_len}


def mask_response(
    batch: dict[str, torch.Tensor],
    mask_id: int,
    generator: torch.Generator,
    eps: float = 1e-3,
    stratified: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LLaDA forward process on the response only -> noisy ids, masked positions [B, T], p_mask [B].

    ``stratified``: the batch's t are one draw from each of B equal strata of [0, 1) in a random order (same
    marginal U(0, 1) per row, far less variance of the 1/p-weighted loss across batches)."""
    ids, resp = batch["input_ids"], batch["response"]
    b, t = ids.shape
    t_draw = torch.rand(b, generator=generator, device=generator.device)
    if stratified:
        order = torch.randperm(b, generator=generator, device=generator.device)
        t_draw = (order + t_draw) / b
    t_draw = t_draw.to(ids.device)
    p_mask = (1 - eps) * t_draw + eps  # [B]
    u = torch.rand(b, t, generator=generator, device=generator.device).to(ids.device)
    masked = (u < p_mask[:, None]) & resp  # [B, T]
    return torch.where(masked, torch.full_like(ids, mask_id), ids), masked, p_mask


def masked_logits(
    model: Any, batch: dict[str, torch.Tensor], generator: torch.Generator, eps: float = 1e-3, stratified: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mask the responses (``mask_response``) and score the masked slots: logits [M, V] from hidden ``i -
    logit_shift`` (the LM head runs only on those), their true ids [M], each one's batch row [M], and p_mask [B]."""
    core = model.module if hasattr(model, "module") else model
    noisy, masked, p_mask = mask_response(batch, core.mask_token_id, generator, eps, stratified)
    valid = batch["valid"]
    positions = (valid.long().cumsum(1) - 1).clamp(min=0)
    hid = core.hidden_states(noisy, positions, key_mask=valid)  # [B, T, d]
    rows, cols = masked.nonzero(as_tuple=True)
    logits = core.output_logits(hid[rows, cols - core.logit_shift])  # [M, V]
    return logits, batch["input_ids"][rows, cols], rows, p_mask


def diffusion_loss(
    model: Any, batch: dict[str, torch.Tensor], generator: torch.Generator, eps: float = 1e-3, stratified: bool = False
) -> tuple[torch.Tensor, dict[str, float]]:
    """LLaDA SFT loss: sum over masked response tokens of CE / p_mask, divided by the response length, batch mean."""
    logits, target, rows, p_mask = masked_logits(model, batch, generator, eps, stratified)
    ce = F.cross_entropy(logits.float(), target, reduction="none")  # [M]
    weight = 1.0 / (p_mask[rows] * batch["response_length"][rows])
    loss = (ce * weight).sum() / batch["input_ids"].shape[0]
    return loss, {"masked": int(rows.numel()), "ce": float(ce.detach().mean()) if rows.numel() else 0.0}


def step_generator(seed: int, step: int, device: Any = "cpu") -> torch.Generator:
    """The masking RNG of one step: a function of (seed, step), so a resumed run draws the same masks."""
    g = torch.Generator(device=device)
    g.manual_seed(seed * 1_000_003 + step)
    return g
