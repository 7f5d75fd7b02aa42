"""Re-statements of the reference ``generate()`` of LLaDA2.0 and LLaDA2.1 (the HF modeling files, copied in
ZHZisZZ/dllm ``dllm/pipelines/llada2/`` and ``llada21/``; ``ALGORITHMS.md`` §12), written as plain loops for
token-identity tests: uncached (the window ``[0, (k+1)B)`` through the model every step), batch 1, temperature 0.

``model`` is any callable ``(ids [1, W], mask4d [1, 1, W, W], positions [1, W]) -> logits [1, W, V]`` (the official
forward). Each function returns ``(tokens, nfe)``: the reference's return value (the generated tokens up to and
including the first EOS, else ``gen_length`` of them) as a list, and the number of forwards it ran.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def schedule(block_length: int, steps: int) -> list[int]:
    """``_get_num_transfer_tokens``: B split evenly over the steps, the first ``B % steps`` get one more."""
    base, rem = divmod(block_length, steps)
    return [base + (1 if i < rem else 0) for i in range(steps)]


def block_mask(total: int, block_length: int) -> torch.Tensor:
    nb = total // block_length
    m = torch.tril(torch.ones(nb, nb)).repeat_interleave(block_length, 0).repeat_interleave(block_length, 1)
    return m[None, None].log().to(torch.bfloat16)


def greedy(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Temperature 0: argmax of the softmax and its probability (``_sample_with_temperature_topk_topp``)."""
    probs = F.softmax(logits, dim=-1)
    tok = probs.argmax(-1)
    return tok, probs.gather(-1, tok[..., None])[..., 0]


def _answer(x: list[int], p: int, gen_length: int, eos_id: int) -> list[int]:
    gen = x[p : p + gen_length]
    return gen[: gen.index(eos_id) + 1] if eos_id in gen else gen


@torch.no_grad()
def llada2_generate(
    model,
    prompt: list[int],
    *,
    gen_length,
    block_length=32,
    steps=32,
    threshold=0.95,
    mask_id,
    eos_id,
    minimal_topk=1,
    device="cpu",
):
    """LLaDA2.0 ``generate`` (eos_early_stop False): returns (tokens, nfe). ``device``: where the canvas lives (the
    model's)."""
    steps = min(steps, gen_length // minimal_topk)
    p = len(prompt)
    nb = (p + gen_length + block_length - 1) // block_length
    total = nb * block_length
    mask4d = block_mask(total, block_length).to(device)
    x = torch.full((1, total), mask_id, dtype=torch.long, device=device)
    x[0, :p] = torch.tensor(prompt)
    pos = torch.arange(total, device=device)[None]
    sched = schedule(block_length, steps)
    nfe = 0
    for k in range(p // block_length, nb):
        end = (k + 1) * block_length
        for step in range(steps):
            active = x[0, end - block_length : end] == mask_id  # [B]
            if int(active.sum()) == 0:
                break
            logits = model(x[:, :end], mask4d[:, :, :end, :end], pos[:, :end])
            nfe += 1
            tok, prob = greedy(logits[0, -block_length:])
            n = sched[step]
            conf = torch.where(active, prob, torch.tensor(float("-inf"), device=device))
            high = conf > threshold
            transfer = torch.zeros(block_length, dtype=torch.bool, device=device)
            if int(high.sum()) >= n:
                transfer = high
            else:
                transfer[torch.topk(conf, k=min(n, int(active.sum()))).indices] = True
            x[0, end - block_length : end][transfer] = tok[transfer]
        if (x[0, p:end] == eos_id).any():
            break
    return _answer(x[0].tolist(), p, gen_length, eos_id), nfe


def _editing_step(tok, prob, active, old, prompt_in_block, threshold, editing_threshold, num_to_transfer):
    """One LLaDA2.1 iteration's choice: (mask commits, edits), both [B] bool."""
    minus_inf = torch.tensor(float("-inf"))
    transfer = torch.zeros_like(active)
    if int(active.sum()) > 0:
        conf = torch.where(active, prob, minus_inf)
        high = (conf > threshold) & active
        if int(high.sum()) >= num_to_transfer:
            transfer = high
        else:
            transfer[torch.topk(conf, k=min(num_to_transfer, int(active.sum()))).indices] = True
    editable = ~active & ~prompt_in_block
    edit = (torch.where(editable, prob, minus_inf) > editing_threshold) & editable & (tok != old)
    return transfer, edit


@torch.no_grad()
def llada21_generate(
    model,
    prompt: list[int],
    *,
    gen_length,
    block_length=32,
    threshold=0.95,
    editing_threshold=0.9,
    max_post_steps=16,
    num_to_transfer=1,
    mask_id,
    eos_id,
):
    """LLaDA2.1 ``generate`` with token editing (eos_early_stop False: every block runs): returns (tokens, nfe)."""
    p = len(prompt)
    nb = (p + gen_length + block_length - 1) // block_length
    total = nb * block_length
    mask4d = block_mask(total, block_length)
    x = torch.full((1, total), mask_id, dtype=torch.long)
    x[0, :p] = torch.tensor(prompt)
    pos = torch.arange(total)[None]
    nfe = 0
    for k in range(p // block_length, nb):
        start, end = k * block_length, (k + 1) * block_length
        prompt_in_block = torch.arange(start, end) < p
        post = 0
        while True:
            old = x[0, start:end].clone()
            active = old == mask_id
            if not bool(active.any()):
                post += 1
            if post > max_post_steps:
                break
            logits = model(x[:, :end], mask4d[:, :, :end, :end], pos[:, :end])
            nfe += 1
            tok = logits[0, -block_length:].argmax(-1)  # 2.1 takes the argmax of the logits at temperature 0
            prob = F.softmax(logits[0, -block_length:], dim=-1).gather(-1, tok[:, None])[:, 0]
            transfer, edit = _editing_step(
                tok, prob, active, old, prompt_in_block, threshold, editing_threshold, num_to_transfer
            )
            both = transfer | edit
            x[0, start:end][both] = tok[both]
            if not bool(active.any()) and not bool(edit.any()):
                break
    return _answer(x[0].tolist(), p, gen_length, eos_id), nfe
