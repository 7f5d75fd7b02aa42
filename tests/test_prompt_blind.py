"""``benchmarks/prompt_blind.py``'s mask: with it, the prompt's outputs no longer depend on the answer slots (and the
answer's still depend on the prompt); without it they do. Checked on a tiny random LLaDA."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import dlm_decode.models.common as common

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from prompt_blind import blind_attention  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@torch.no_grad()
def test_blind_prompt_ignores_the_answer(llada, monkeypatch):
    p, t = 6, 10
    a = torch.tensor([[5, 9, 17, 3, 40, 22, 7, 8, 11, 12]])
    b = a.clone()
    b[0, p:] = torch.tensor([30, 31, 32, 33])  # other answer tokens
    c = a.clone()
    c[0, 0] = 41  # another prompt token
    free = [llada(x).logits for x in (a, b, c)]
    assert (free[0][:, :p] - free[1][:, :p]).abs().max() > 1e-4  # bidirectional: the prompt sees the answer
    monkeypatch.setattr(common, "masked_attention", blind_attention(common.masked_attention, lambda: p))
    blind = [llada(x).logits for x in (a, b, c)]
    assert torch.equal(blind[0][:, :p], blind[1][:, :p])
    assert (blind[0][:, p:] - blind[2][:, p:]).abs().max() > 1e-4  # the answer still sees the prompt
    assert (blind[0][:, :p] - free[0][:, :p]).abs().max() > 1e-4 and blind[0].shape == (1, t, free[0].shape[-1])
