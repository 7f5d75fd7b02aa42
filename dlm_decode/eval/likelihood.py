"""Log-likelihood of a continuation under a masked-diffusion LM: Monte Carlo over masking, batched and seeded.

A masked-diffusion LM gives no exact likelihood; both reference harnesses report the negative diffusion loss, an
evidence lower bound (ELBO) on ``log p(continuation | context)``, estimated by Monte Carlo:

* ``llada`` (LLaDA ``eval_llada.py``, ``get_log_likelihood``): per sample mask ``x`` of the ``L`` continuation
  tokens (never the context) at uniformly random positions, ``x`` stratified over the samples (``k ~ U{1..L}``,
  ``x_j = round(k + j L / M)`` wrapped into ``[1, L]``, so each ``x_j`` is uniform on ``{1..L}``); loss =
  cross-entropy summed over the masked tokens / (x / L).
* ``dream`` (Dream's lm-eval harness, ``_eval_target_nll_mc``): continuous time, ``t_j = (u + j / M) mod 1``,
  ``p = (1 - eps) t + eps``, each continuation token masked independently with probability ``p``; loss = masked
  cross-entropy / p.

The estimate is ``-mean(loss)`` over ``M = mc_num`` samples. For ``eps = 0`` both estimators have the same
expectation, ``-sum_S CE(S) / (|S| C(L, |S|))`` over non-empty masked subsets ``S``. A one-token continuation has a
single term (everything masked), so it takes one forward and is exact. The ``dream`` estimator weighs rare small
ratios by ``1/t`` and is far noisier (about 30x the standard deviation of ``llada`` on two-token continuations).

Differences from the references, on purpose: samples are stratified over all ``M`` samples of a request (LLaDA
stratifies within each forward batch) and rounded half up (LLaDA's half-to-even rounding skews some strata); each
request draws its masks from its own ``torch.Generator`` seeded from the run seed and the request's tokens, so
results do not depend on batch composition, request order or the number of processes; Dream's logits are read with
the model's one-position shift (``hidden[i-1]`` predicts token ``i``), where Dream's harness reads the unshifted
logits, and no EOS is appended to the continuation. Classifier-free guidance follows
LLaDA: the unconditional copy masks the context, and the guided logits are ``un + (cfg + 1) (cond - un)``.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from dlm_decode.decode import generate
from dlm_decode.eval.block_likelihood import block_row_losses
from dlm_decode.eval.scored import scored_losses


def request_seed(seed: int, context: Sequence[int], continuation: Sequence[int]) -> int:
    """A 63-bit seed from the run seed and the request's tokens (stable across processes and Python versions)."""
    text = f"{seed}|{','.join(map(str, context))}|{','.join(map(str, continuation))}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def mask_samples(
    length: int, num: int, method: str, generator: torch.Generator, eps: float = 1e-3
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masks [M, L] bool and mask ratios [M] for ``num`` Monte Carlo samples (one exact sample when L == 1)."""
    if length == 1:
        return torch.ones(1, 1, dtype=torch.bool), torch.ones(1, dtype=torch.float64)
    m = num
    if method == "llada":
        k = int(torch.randint(1, length + 1, (), generator=generator))
        # round half up (LLaDA rounds half to even, which makes some strata non-uniform)
        x = torch.floor(torch.linspace(float(k), k + (m - 1) * (length / m), steps=m, dtype=torch.float64) + 0.5)
        x = x.long()
        x = (x - 1) % length + 1  # [M] masked count per sample, in [1, L]
        rank = torch.rand(m, length, generator=generator).argsort(1)  # a random permutation per sample
        return rank < x[:, None], x.double() / length
    if method == "dream":
        u = torch.rand((), generator=generator, dtype=torch.float64)
        t = (u + torch.arange(m, dtype=torch.float64) / m) % 1
        p = (1 - eps) * t + eps
        return torch.rand(m, length, generator=generator, dtype=torch.float64) < p[:, None], p
    raise ValueError(f"unknown likelihood method {method!r}; use llada or dream")


@dataclass
class Row:
    """One forward row: context + continuation with the continuation slots in ``mask`` replaced by MASK."""

    owner: int  # index of the request this row estimates
    context: list[int]
    continuation: list[int]
    mask: torch.Tensor  # [L] bool
    ratio: float  # mask ratio the loss is divided by


def build_rows(
    requests: Sequence[tuple[list[int], list[int]]], *, mc_num: int, method: str, seed: int, eps: float
) -> list[Row]:
    rows = []
    for i, (ctx, cont) in enumerate(requests):
        gen = torch.Generator().manual_seed(request_seed(seed, ctx, cont))  # CPU: same masks on every device
        masks, ratios = mask_samples(len(cont), mc_num, method, gen, eps)
        rows.extend(Row(i, ctx, cont, masks[j], float(ratios[j])) for j in range(masks.shape[0]))
    return rows


@torch.no_grad()
def row_losses(model, rows: Sequence[Row], *, cfg_scale: float = 0.0, head_chunk: int = 4096) -> torch.Tensor:
    """[N] masked cross-entropy / ratio of each row, from one left-padded forward.

    The LM head runs only on the hidden states that predict masked continuation slots, ``head_chunk`` at a time,
    so memory does not grow with ``rows x length x vocabulary``.
    """
    mask_id = model.mask_token_id
    device = next(model.parameters()).device
    b = len(rows)
    t = max(len(r.context) + len(r.continuation) for r in rows)
    clean = torch.zeros(b, t, dtype=torch.long)  # pad id is irrelevant: padded keys are invisible
    valid = torch.zeros(b, t, dtype=torch.bool)
    is_ctx = torch.zeros(b, t, dtype=torch.bool)
    scored = torch.zeros(b, t, dtype=torch.bool)  # masked continuation slots
    for i, r in enumerate(rows):
        ids = r.context + r.continuation
        n, ll = len(ids), len(r.continuation)
        clean[i, t - n :] = torch.tensor(ids)
        valid[i, t - n :] = True
        is_ctx[i, t - n : t - ll] = True
        scored[i, t - ll :] = r.mask
    noisy = torch.where(scored, mask_id, clean)
    canvas, keys = noisy, valid
    if cfg_scale > 0:  # unconditional copy: the context masked (LLaDA)
        canvas, keys = torch.cat([noisy, torch.where(is_ctx, mask_id, noisy)]), torch.cat([valid, valid])
    positions = (keys.long().cumsum(1) - 1).clamp(min=0)
    hidden = model.hidden_states(canvas.to(device), positions.to(device), key_mask=keys.to(device))  # [B', T, d]
    row, slot = scored.nonzero(as_tuple=True)  # [N] each
    src = (slot - model.logit_shift).to(device)  # the hidden state predicting each slot (Dream: the one before)
    target = clean[scored].to(device)
    return scored_losses(model, hidden, row.to(device), src, target, [r.ratio for r in rows], cfg_scale, head_chunk)


def loglikelihoods(
    model,
    requests: Sequence[tuple[list[int], list[int]]],
    *,
    mc_num: int = 128,
    method: str = "llada",
    seed: int = 0,
    eps: float = 1e-3,
    cfg_scale: float = 0.0,
    max_batch: int = 32,
    on_done: Callable[[int], None] | None = None,
    block_length: int = 32,
) -> list[float]:
    """Monte Carlo ELBO of each (context ids, continuation ids) pair; contexts must be non-empty. A block-causal
    model (``model.block_causal``) is scored by the block diffusion ELBO on the ``block_length`` grid
    (``eval.block_likelihood``), with the same masks."""
    for i, (ctx, cont) in enumerate(requests):
        if not ctx or not cont:
            raise ValueError(f"request {i}: context and continuation need at least one token each")
    # longest first, so rows of one forward have similar lengths; a request's rows stay together
    order = sorted(range(len(requests)), key=lambda i: -(len(requests[i][0]) + len(requests[i][1])))
    rows = build_rows([requests[i] for i in order], mc_num=mc_num, method=method, seed=seed, eps=eps)
    per_forward = max(1, max_batch // 2) if cfg_scale > 0 else max_batch
    totals = torch.zeros(len(requests), dtype=torch.float64)
    counts = torch.zeros(len(requests), dtype=torch.long)
    last = {r.owner: j for j, r in enumerate(rows)}  # owners come in order, so these are increasing
    ends = [last[k] for k in sorted(last)]
    done = 0
    for s in range(0, len(rows), per_forward):
        chunk = rows[s : s + per_forward]
        if getattr(model, "block_causal", False):
            losses = block_row_losses(model, chunk, block_length=block_length, cfg_scale=cfg_scale)
        else:
            losses = row_losses(model, chunk, cfg_scale=cfg_scale)
        for r, loss in zip(chunk, losses.tolist(), strict=True):
            totals[order[r.owner]] += loss
            counts[order[r.owner]] += 1
        finished = bisect.bisect_right(ends, s + len(chunk) - 1)
        if on_done is not None and finished > done:
            on_done(finished - done)
        done = finished
    return (-(totals / counts.clamp(min=1))).tolist()


def greedy_matches(
    model,
    requests: Sequence[tuple[list[int], list[int]]],
    *,
    cfg_scale: float = 0.0,
    max_batch: int = 32,
    block_length: int = 32,
) -> list[bool]:
    """Whether decoding the fully masked continuation one token per step, highest confidence first (LLaDA's
    ``suffix_greedy_prediction``), reproduces it. A block-causal model decodes it on its ``block_length`` grid."""
    # one token per step; block-causal: LLaDA2's rule with threshold 1.0 is the pure schedule, and its steps count
    # per block (block_length of them: one token each), on the model's grid
    causal = bool(getattr(model, "block_causal", False))
    rule = dict(sampler="llada2", sampler_options={"threshold": 1.0}, steps=block_length) if causal else {}
    out = [False] * len(requests)
    by_len: dict[int, list[int]] = {}
    for i, (_, cont) in enumerate(requests):
        by_len.setdefault(len(cont), []).append(i)
    for length, idx in by_len.items():
        for s in range(0, len(idx), max_batch):
            chunk = idx[s : s + max_batch]
            res = generate(
                model,
                [requests[i][0] for i in chunk],
                **(dict(sampler="low_confidence", steps=length) | rule),
                gen_length=length,
                block_length=block_length if causal else length,
                temperature=0.0,
                cfg_scale=cfg_scale,
            )
            for i, row in zip(chunk, res.rows, strict=True):
                out[i] = row.generated_ids == list(requests[i][1])
    return out
