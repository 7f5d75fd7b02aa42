"""The certainty-forcing loss of dParallel (``DLMTrainer.compute_loss`` in ``LLaDA/llada_train.py`` and
``Dream/dream_train.py`` of the reference code).

Per view (the two complementary masks of ``masking.complementary_views``), over the masked tokens of the active
block: ``CE(z, target)`` averaged over those tokens, plus ``beta`` times the entropy of ``softmax(z / T)`` (T = 0.5)
averaged over the subset the model already predicts correctly (``argmax z == target``; the argmax does not depend on
T). The entropy term pushes the model to be *certain* where it is already right, which is what lets an entropy- or
confidence-threshold decoder commit many tokens per step. beta = 2 for LLaDA, 1 for Dream.

Normalisation, generalised to any batch size. The reference divides each view's sums by the counts of the whole
batch; it trains at ``per_device_train_batch_size: 1`` with gradient accumulation 8, where that is a per-example mean
and every example weighs the same in the accumulated gradient. Here every example gets exactly its batch-1 loss

    loss_i = sum_v [ CE_sum_iv / max(M_iv, 1) + beta * H_sum_iv / max(C_iv, 1) ]

(M: masked active tokens, C: the correctly predicted ones; a term with an empty set is 0, as in the reference), and a
batch returns ``loss_i`` per example; the trainer averages over the examples of an optimizer step. Padding never
enters: positions outside the loss masks are not gathered at all. So a batch of 3 left-padded rows gives the same
per-example losses as the three rows alone, and the step's gradient is the same for any split into devices and
micro-batches.

Numerics: logits are gathered at the loss positions only and upcast to fp32; the entropy uses ``log_softmax`` (the
reference's ``log(p + 1e-12)`` differs by < 1e-11 per token). For Dream, raw logits are unshifted (hidden ``i``
predicts token ``i + 1``), so the logits for token ``i`` are read at ``i - 1`` (``logit_shift = 1``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

BETA = {"llada": 2.0, "dream": 1.0}
TEMPERATURE = 0.5


@dataclass(frozen=True)
class ViewTerms:
    ce: torch.Tensor  # [B] mean CE over the row's loss positions (0 if none)
    entropy: torch.Tensor  # [B] mean tempered entropy over the correctly predicted loss positions (0 if none)
    n_masked: torch.Tensor  # [B] loss positions
    n_correct: torch.Tensor  # [B] loss positions whose argmax equals the target


def view_terms(
    logits: torch.Tensor,  # [B, T, V] raw model logits
    targets: torch.Tensor,  # [B, T] clean ids
    loss_mask: torch.Tensor,  # [B, T] bool: positions trained on
    *,
    temperature: float = TEMPERATURE,
    logit_shift: int = 0,
) -> ViewTerms:
    """Per-row CE and correct-token entropy of one view."""
    b = targets.shape[0]
    rows, cols = loss_mask.nonzero(as_tuple=True)  # [M]
    if logit_shift and bool((cols < logit_shift).any()):
        raise ValueError("a loss position has no predicting hidden state (column < logit_shift)")
    z = logits[rows, cols - logit_shift].float()  # [M, V]
    y = targets[rows, cols]  # [M]
    ce = F.cross_entropy(z, y, reduction="none")  # [M]
    logp = F.log_softmax(z / temperature, dim=-1)
    ent = -(logp.exp() * logp).sum(-1)  # [M]
    correct = (z.argmax(-1) == y).to(z.dtype)  # [M]
    zeros = torch.zeros(b, dtype=z.dtype, device=z.device)
    n_masked = zeros.index_add(0, rows, torch.ones_like(ce))
    n_correct = zeros.index_add(0, rows, correct)
    ce_sum = zeros.index_add(0, rows, ce)
    ent_sum = zeros.index_add(0, rows, ent * correct)
    return ViewTerms(
        ce=ce_sum / n_masked.clamp(min=1),
        entropy=ent_sum / n_correct.clamp(min=1),
        n_masked=n_masked,
        n_correct=n_correct,
    )


def certainty_forcing_loss(
    logits_a: torch.Tensor,  # [B, T, V]
    logits_b: torch.Tensor,  # [B, T, V]
    targets: torch.Tensor,  # [B, T]
    loss_a: torch.Tensor,  # [B, T] bool
    loss_b: torch.Tensor,  # [B, T] bool
    *,
    beta: float,
    temperature: float = TEMPERATURE,
    logit_shift: int = 0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-example losses [B] (each equal to the reference loss of that example at batch 1) and per-example terms."""
    va = view_terms(logits_a, targets, loss_a, temperature=temperature, logit_shift=logit_shift)
    vb = view_terms(logits_b, targets, loss_b, temperature=temperature, logit_shift=logit_shift)
    ce = va.ce + vb.ce
    ent = va.entropy + vb.entropy
    stats = {
        "ce": ce,
        "entropy": ent,
        "n_masked": va.n_masked + vb.n_masked,
        "n_correct": va.n_correct + vb.n_correct,
    }
    return ce + beta * ent, stats
