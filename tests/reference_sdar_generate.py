"""A re-statement of the reference SDAR / TraDo decode, ``block_diffusion_generate`` of JetAstra/SDAR ``generate.py``
(@ c2041a8; ``ALGORITHMS.md`` §13), written as a plain loop for token-identity tests: batch 1, its K/V cache protocol
(prefill the prompt's whole blocks with ``store_kv=True``; per block, forwards of the block alone against the cache
without storing, and one more forward with ``store_kv=True`` once the block has no MASK), its global-RNG sampling.

``model`` is a callable ``(ids [1, n], mask [1, 1, n, S], pos [1, n], cache, store_kv) -> logits [1, n, V]`` with the
reference forward's cache semantics (``sdar_reference.ReferenceSDAR``). ``sdar_generate`` returns a ``RefRun``: the
generated tokens up to and including the first stop id (else ``gen_length`` of them), the number of forwards (and of
those that only store K/V), and the set of ways the run did what dlm_decode does differently on purpose:
``"overwrite"``, a step's top-k picked a slot that was not masked (the reference then overwrites a decoded or prompt
slot with a fresh draw); ``"mask"``, a drawn MASK was committed. dlm_decode commits masked slots only and never MASK:
its tokens are the reference's where the set is empty, and those of ``only_masked=True`` where it holds "overwrite"
alone.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


class RefRun(NamedTuple):
    tokens: list[int]  # up to and including the first stop id, else gen_length of them
    nfe: int  # every forward, the cache writes included
    stores: int  # the forwards with store_kv=True (the prompt's prefill and one per finished block)
    departs: set[str]  # see the module docstring


def schedule(block_length: int, steps: int) -> list[int]:
    """``get_num_transfer_tokens``: B split evenly over the steps, the first ``B % steps`` get one more."""
    base, rem = divmod(block_length, steps)
    return [base + (1 if i < rem else 0) for i in range(steps)]


def sample(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``sample_with_temperature_topk_topp`` on [n, V]: scale, keep the top k (ties at the k-th kept), keep the
    smallest prefix of the sorted distribution reaching top_p, softmax, one multinomial draw per row from the global
    RNG; the drawn token and its probability."""
    if temperature != 1.0:
        logits = logits / temperature
    if top_k > 0:
        kth = torch.topk(logits, top_k).values[..., -1:]
        logits = torch.where(logits < kth, float("-inf"), logits)
    if top_p < 1.0:
        ordered, order = torch.sort(logits, descending=True)
        over = torch.cumsum(F.softmax(ordered, dim=-1), dim=-1) > top_p
        over = torch.cat([torch.zeros_like(over[..., :1]), over[..., :-1]], dim=-1)  # keep the one crossing p
        drop = torch.zeros_like(over).scatter(-1, order, over)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = F.softmax(logits, dim=-1)
    tok = torch.multinomial(probs, num_samples=1)
    return tok[:, 0], probs.gather(-1, tok)[:, 0]


def _choose(strategy, x0_p, masked, n, threshold, only_masked):
    """The block's transfer mask [B] (reference order: torch.topk over the whole block, -inf outside the masks);
    ``only_masked``: top-k never takes more than the masked slots (dlm_decode's rule)."""
    transfer = torch.zeros_like(masked)
    if strategy == "sequential":
        first = int(masked.nonzero()[0, 0])
        transfer[first : first + n] = True
        return transfer
    conf = torch.where(masked, x0_p, torch.tensor(float("-inf")))
    if strategy == "low_confidence_dynamic" and int((conf > threshold).sum()) >= n:
        return conf > threshold
    if strategy not in ("low_confidence_static", "low_confidence_dynamic"):
        raise ValueError(f"unknown remasking strategy {strategy!r}")
    transfer[torch.topk(conf, min(n, int(masked.sum())) if only_masked else n).indices] = True
    return transfer


@torch.no_grad()
def sdar_generate(
    model,
    prompt: list[int],
    *,
    mask_id: int,
    gen_length: int = 128,
    block_length: int = 8,
    denoising_steps: int = 8,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    remasking_strategy: str = "low_confidence_dynamic",
    confidence_threshold: float = 0.85,
    stop_ids: list[int] | None = None,
    only_masked: bool = False,
):
    """The reference's run (``RefRun``); ``only_masked``: with dlm_decode's departure in the rule (``_choose``)."""
    p = len(prompt)
    nb = (p + gen_length + block_length - 1) // block_length
    total = nb * block_length
    grid = torch.tril(torch.ones(nb, nb)).repeat_interleave(block_length, 0).repeat_interleave(block_length, 1)
    grid = grid[None, None]  # [1, 1, T, T] float, 1 = visible
    pos = torch.arange(total)[None]
    x = torch.full((1, total), mask_id, dtype=torch.long)
    x[0, :p] = torch.tensor(prompt)
    cache: list = []
    nfe, stores, departs = 0, 0, set()
    done = (p // block_length) * block_length
    if done:
        model(x[:, :done], grid[:, :, :done, :done], pos[:, :done], cache, True)
        nfe, stores = nfe + 1, stores + 1
    sched = schedule(block_length, denoising_steps)
    for k in range(p // block_length, nb):
        s, e = k * block_length, (k + 1) * block_length
        cur = x[:, s:e].clone()
        mask, cur_pos = grid[:, :, s:e, :e], pos[:, s:e]
        for step in range(denoising_steps + 1):
            masked = cur[0] == mask_id
            if int(masked.sum()) == 0:
                model(cur, mask, cur_pos, cache, True)
                nfe, stores = nfe + 1, stores + 1
                break
            logits = model(cur, mask, cur_pos, cache, False)
            nfe += 1
            x0, x0_p = sample(logits[0], temperature, top_k, top_p)
            transfer = _choose(remasking_strategy, x0_p, masked, sched[step], confidence_threshold, only_masked)
            if bool((transfer & ~masked).any()):
                departs.add("overwrite")
            if bool((x0[transfer] == mask_id).any()):
                departs.add("mask")
            cur[0, transfer] = x0[transfer]
        x[:, s:e] = cur
        if stop_ids is not None and any(i in x[0, p:].tolist() for i in stop_ids):
            break
    gen = x[0, p : p + gen_length].tolist()
    first = min((gen.index(i) for i in stop_ids or [] if i in gen), default=None)
    return RefRun(gen if first is None else gen[: first + 1], nfe, stores, departs)
