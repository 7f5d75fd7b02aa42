"""The block diffusion ELBO of a block-causal model (``eval.block_likelihood``): every masked subset's loss equals a
brute-force evaluation (a plain forward over the clean earlier blocks and the token's own noisy block, later blocks
cut off), a one-token continuation is exact, and the Monte Carlo estimate is the subsets' weighted mean."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from llada2_reference import MASK, write_llada2

from dlm_decode.eval.block_likelihood import block_row_losses
from dlm_decode.eval.likelihood import Row, greedy_matches, loglikelihoods
from dlm_decode.models.loading import load_model

pytestmark = pytest.mark.usefixtures("one_thread")

B = 4  # grid: context [9, 4, 7] ends mid-block, the continuation spans blocks 0 and 1
CTX, CONT = [9, 4, 7], [11, 5, 20]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_model(write_llada2(tmp_path_factory.mktemp("bl") / "m", seed=2))[0]


@torch.no_grad()
def brute_loss(model, ctx, cont, masked: set[int]) -> float:
    """Sum over masked continuation tokens of -log p(token | earlier blocks clean, its block with the masked set)."""
    ids = ctx + cont
    total = 0.0
    for j in sorted(masked):
        slot = len(ctx) + j
        end = (slot // B + 1) * B  # the end of the token's block: later blocks are cut off
        seq = [MASK if (k - len(ctx)) in masked and k // B == slot // B else t for k, t in enumerate(ids)][:end]
        x = torch.tensor([seq])
        logits = model(x, block_length=B).logits[0, slot].double()
        total -= float(torch.log_softmax(logits, -1)[ids[slot]])
    return total


def test_every_masked_subset_matches_brute_force(model):
    subsets = [set(c) for n in range(1, 4) for c in itertools.combinations(range(3), n)]
    rows = [Row(0, CTX, CONT, torch.tensor([j in s for j in range(3)]), len(s) / 3) for s in subsets]
    got = block_row_losses(model, rows, block_length=B)
    want = [brute_loss(model, CTX, CONT, s) / (len(s) / 3) for s in subsets]
    assert got.tolist() == pytest.approx(want, rel=1e-4, abs=1e-4)


def test_one_token_is_exact_and_the_estimate_is_the_subsets_mean(model):
    (one,) = loglikelihoods(model, [(CTX, [11])], mc_num=4, block_length=B)
    assert one == pytest.approx(-brute_loss(model, CTX, [11], {0}), abs=1e-5)
    exact = -sum(
        brute_loss(model, CTX, CONT, set(c)) / (n * math.comb(3, n))
        for n in range(1, 4)
        for c in itertools.combinations(range(3), n)
    )
    (est,) = loglikelihoods(model, [(CTX, CONT)], mc_num=3000, block_length=B, seed=1)
    assert est == pytest.approx(exact, abs=0.05 * abs(exact))


def test_guidance_and_the_greedy_check_run_on_the_grid(model):
    plain, guided = (
        loglikelihoods(model, [(CTX, CONT)] * 2, mc_num=8, block_length=B)[0],
        loglikelihoods(model, [(CTX, CONT)], mc_num=8, block_length=B, cfg_scale=1.0)[0],
    )
    assert math.isfinite(guided) and guided != plain
    from dlm_decode import generate

    out = generate(model, [CTX], sampler="llada2", sampler_options={"threshold": 1.0}, gen_length=3,
                   block_length=B, steps=B, stop_at_eos=False)  # fmt: skip
    greedy = out.rows[0].generated_ids
    assert greedy_matches(model, [(CTX, greedy), (CTX, [g + 1 for g in greedy])], block_length=B) == [True, False]
