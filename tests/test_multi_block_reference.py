"""dlm_decode's multi-block decoding against the re-stated D2F and d3LLM decoders (``reference_multi_block.py``):
tokens and forwards, token for token, on tiny random float32 checkpoints at temperature 0, batch 1, over the
thresholds 0.5-1.0, two prompt lengths, D2F's EOS stop in an open block, and the caches (D2F's exact cache against
its uncached re-statement, d3LLM's delayed cache against its past-K/V re-statement on LLaDA).

Known differences, on purpose, not compared here (documented in ``samplers/multi_block.py`` and
``cache/delayed.py``): d3LLM's Dream cached loop gives the first slot of a forward that starts mid-canvas its own
logit and can hold a block's keys twice (we predict that slot from the slot before it and keep each key once).
"""

from __future__ import annotations

import pytest
import torch
from checkpoints import (
    EOS,
    MASK,
    dream_config,
    dream_state_dict,
    llada_config,
    llada_state_dict,
    reference_dream_logits,
    reference_llada_logits,
)
from reference_multi_block import d2f_generate, d3llm_generate, d3llm_generate_cached

import dlm_decode

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[5, 9, 17, 3, 40, 22], [9, 3, 36, 3, 17, 11, 40, 5, 21]]
SHARES = [(0.5, 0.5), (0.5, 1.0), (0.75, 0.9), (1.0, 1.0)]  # (block_add_threshold, decoded_token_threshold)
GEN, BLOCK = 32, 8


def _masked_forward(name):
    """The pure-torch reference forward of the conftest checkpoint under a 4D mask (D2F's re-statement)."""
    cfg = llada_config() if name == "llada" else dream_config()
    sd = llada_state_dict(cfg) if name == "llada" else dream_state_dict(cfg)
    fwd = reference_llada_logits if name == "llada" else reference_dream_logits
    return lambda ids, mask4d: fwd(sd, cfg, ids, mask4d=mask4d)


def _ours(model, prompt, sampler, options, **kw):
    kw = {"gen_length": GEN, "block_length": BLOCK} | kw
    return dlm_decode.generate(model, [prompt], sampler=sampler, sampler_options=options, **kw)


@pytest.mark.parametrize("name", ["llada", "dream"])
@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize(("add", "dec"), SHARES)
@pytest.mark.parametrize("skip", [0.3, 0.6])
@pytest.mark.parametrize("cache", ["none", "prefix"])
def test_d2f(request, name, prompt, add, dec, skip, cache):
    model = request.getfixturevalue(name)
    ref, forwards = d2f_generate(
        _masked_forward(name), torch.tensor([prompt]), mask_id=MASK, eos_id=EOS, block_size=BLOCK,
        max_new_tokens=GEN, block_add_threshold=add, decoded_token_threshold=dec, skip_threshold=skip,
        shift=name == "dream",
    )  # fmt: skip
    opts = {"threshold": skip, "block_add_threshold": add, "decoded_token_threshold": dec, "early_stop": True}
    out = _ours(model, prompt, "threshold", opts, attention="answer_block_causal", cache=cache)
    got = out.rows[0].generated_ids
    n = ref.shape[0]  # shorter when an EOS stopped the opening of blocks: ours fills the rest with the fill id
    assert got[:n] == ref.tolist() and all(t == EOS for t in got[n:])
    assert out.nfe == forwards


def test_d2f_covers_eos_in_an_open_block():
    """Some D2F case above stops opening blocks at an EOS (the answer is cut short), so that path is compared."""
    cut = 0
    for name in ("llada", "dream"):
        for prompt in PROMPTS:
            for skip in (0.3, 0.6):
                ref, _ = d2f_generate(
                    _masked_forward(name), torch.tensor([prompt]), mask_id=MASK, eos_id=EOS, block_size=BLOCK,
                    max_new_tokens=GEN, block_add_threshold=0.5, decoded_token_threshold=0.5, skip_threshold=skip,
                    shift=name == "dream",
                )  # fmt: skip
                cut += ref.shape[0] < GEN
    assert cut > 0


ETAS = {"llada": [2.0, 3.0], "dream": [1.5, 2.5]}  # several masks per step on the tiny checkpoints


def _d3_kw(name, eta, add, dec, early=False):
    return dict(
        mask_id=MASK, eos_id=EOS, block_size=BLOCK, max_new_tokens=GEN, threshold=eta, block_add_threshold=add,
        decoded_token_threshold=dec, early_stop=early, shift=name == "dream",
    )  # fmt: skip


def _d3_options(name, eta, add, dec, early=False):
    opts = {"eta": eta, "block_add_threshold": add, "decoded_token_threshold": dec, "global_best": name == "llada"}
    return opts | {"early_stop": early}


@pytest.mark.parametrize("name", ["llada", "dream"])
@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize(("add", "dec"), SHARES)
@pytest.mark.parametrize("which", [0, 1])
@pytest.mark.parametrize("early", [False, True])
def test_d3llm_without_cache(request, name, prompt, add, dec, which, early):
    model = request.getfixturevalue(name)
    eta = ETAS[name][which]
    kw = _d3_kw(name, eta, add, dec, early)
    ref, forwards = d3llm_generate(lambda ids: model(ids).logits, torch.tensor([prompt]), **kw)
    out = _ours(model, prompt, "entropy_threshold", _d3_options(name, eta, add, dec, early), cache="none")
    assert torch.equal(out.sequences, ref) and out.nfe == forwards


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize(("add", "dec"), SHARES)
@pytest.mark.parametrize(("delay", "refresh"), [(1, 10000), (2, 3), (0, 10000), (10000, 10000)])
@pytest.mark.parametrize("early", [False, True])
def test_d3llm_delayed_cache_llada(llada, prompt, add, dec, delay, refresh, early):
    eta = ETAS["llada"][0]
    kw = _d3_kw("llada", eta, add, dec, early) | {"cache_delay_iter": delay, "refresh_interval": refresh}
    ref, forwards = d3llm_generate_cached(llada, torch.tensor([prompt]), **kw)
    cache_options = {"cache_delay_iter": delay, "refresh_interval": refresh}
    out = _ours(llada, prompt, "entropy_threshold", _d3_options("llada", eta, add, dec, early), cache="delayed",
                cache_options=cache_options)  # fmt: skip
    assert torch.equal(out.sequences, ref) and out.nfe == forwards
