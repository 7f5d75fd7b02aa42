"""Stale rows (recipes/train_demo/stale.py): the scored forward equals the decoder's cached forward at that state.

The oracle is the decoder's own K/V store (``dlm_decode.cache.store``): one forward over the refresh canvas writes
every slot, the next forward computes only the block (dual) or the block and everything after it (prefix) and
attends to the stored keys elsewhere, as the ``dual`` and ``prefix`` policies do in a block's later steps.
"""

from __future__ import annotations

import pytest
import torch

import dlm_decode
from dlm_decode.cache.store import KVAccess, KVStore
from recipes.train_demo import config as cf
from recipes.train_demo import objective as ob
from recipes.train_demo.stale import StaleRows, draw_stale_rows, stale_hidden_states


@pytest.fixture(scope="module", params=["demo-llada", "demo-dream"])
def model(request):
    m, tok = dlm_decode.load_model(request.param)
    return m.eval(), tok


def _canvas(tok):
    """Two left-padded rows: a prompt (the second one shorter) and the same 40-token response."""
    prompt = tok.encode("Sort the list: pear, fig, apple, kiwi, plum, date, lime, yam. Answer:")
    answer = tok.encode(" apple, date, fig, kiwi, lime, pear, plum, yam")
    answer = (answer + [tok.eos_token_id] * 40)[:40]
    batch = ob.collate([(prompt, answer), (prompt[3:], answer)], tok.pad_token_id)
    return batch


def _oracle(m, ids, refresh_ids, positions, valid, start, end, dual):  # one row [1, T] each -> hidden [1, T', d]
    """The refresh forward writes every slot; the next computes [start - shift, end) (dual) or [start - shift, T)."""
    n_layers, n_kv, hd = m.kv_shape()
    store = KVStore(n_layers, 1, n_kv, ids.shape[1], hd, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        m.hidden_states(refresh_ids, positions, kv=KVAccess(store), key_mask=valid)
        stop = end if dual else ids.shape[1]
        part = slice(start - m.logit_shift, stop)
        return m.hidden_states(ids[:, part], positions[:, part], kv=KVAccess(store), slots=part, key_mask=valid), part


@pytest.mark.parametrize("dual", [False, True])
def test_stale_forward_equals_the_cached_forward(model, dual):
    m, tok = model
    batch = _canvas(tok)
    ids, valid, resp = batch["input_ids"], batch["valid"], batch["response"]
    t = ids.shape[1]
    start, end = t - 40 + 32, t  # the response's second block (8 tokens)
    positions = (valid.long().cumsum(1) - 1).clamp(min=0)
    col = torch.arange(t)[None]
    block = ((col >= start) & (col < end)).expand(2, t)
    noisy = ids.clone()
    noisy[block & (col % 2 == 0)] = m.mask_token_id  # half the block masked
    refresh = resp & (col >= start)
    computed = (col >= start - m.logit_shift) & (col < end)  # Dream's caches compute the slot before the block too
    stale = (~computed & ((col < start - m.logit_shift) | dual)).expand(2, t)  # [2, T]
    rows = torch.tensor([1])
    spec = StaleRows(rows, block[[0]], refresh[[0]], stale[[0]], torch.zeros_like(resp), torch.tensor([8.0]))
    with torch.no_grad():
        got = stale_hidden_states(m, noisy, positions, valid, spec)  # [2, T, d]
        fresh = m.hidden_states(noisy, positions, key_mask=valid)
    refresh_ids = noisy[[1]].masked_fill(refresh[[0]], m.mask_token_id)
    want, part = _oracle(m, noisy[[1]], refresh_ids, positions[[1]], valid[[1]], start, end, dual)
    # the hidden states that score the block (Dream: slot i from hidden i - 1)
    s0, s1 = start - m.logit_shift, end - m.logit_shift
    torch.testing.assert_close(got[1, s0:s1], want[0, s0 - part.start : s1 - part.start], atol=1e-5, rtol=1e-5)
    assert (got[1, start:end] - fresh[1, start:end]).abs().max() > 1e-3  # the stale keys do change the block
    torch.testing.assert_close(got[0], fresh[0])  # a fresh row is untouched
    assert "layer_pieces" not in m.__dict__  # the eager pieces are back


def test_share_zero_draws_the_old_masks_and_share_one_scores_only_blocks(model):
    m, tok = model
    batch = _canvas(tok)
    old = ob.masked_logits(m, batch, ob.step_generator(3, 5))
    zero = ob.masked_logits(m, batch, ob.step_generator(3, 5), stale=(0.0, 32))
    for a, b in zip(old, zero, strict=True):
        torch.testing.assert_close(a, b)
    spec = draw_stale_rows(batch["response"], 1.0, 32, ob.step_generator(3, 9))
    assert spec is not None and spec.rows.tolist() == [0, 1]
    for i in range(2):  # a block is one of the response's two blocks (32 + 8 tokens), the refresh covers it onward
        n = int(spec.block[i].sum())
        assert n in (32, 8) and spec.block_length[i] == n
        first = int(spec.block[i].nonzero()[0])
        assert spec.refresh[i].nonzero()[0] == first and not spec.stale[i][spec.block[i]].any()
    _, _, rows, _, length = ob.masked_logits(m, batch, ob.step_generator(3, 9), stale=(1.0, 32))
    assert set(length.tolist()) <= {32.0, 8.0} and rows.numel() <= 40


def test_stale_options_are_checked_before_work(tmp_path):
    base = {"model": {"init": "x"}, "stages": [{"kind": "full", "steps": 5, "stale": 0.5}]}
    assert cf.config_from_dict(base).stages[0].stale == 0.5
    with pytest.raises(ValueError, match=r"stages\[0\]\.stale must be in \[0, 1\]"):
        cf.config_from_dict({**base, "stages": [{"kind": "full", "steps": 5, "stale": 1.5}]})
    with pytest.raises(ValueError, match=r"stages\[0\]\.stale_block must be >= 1"):
        cf.config_from_dict({**base, "stages": [{"kind": "full", "steps": 5, "stale_block": 0}]})
    llada2 = {"model": {"family": "llada2", "attention": "block_causal", "block_length": 32, "init": "x"}}
    with pytest.raises(ValueError, match="cache is exact"):
        cf.config_from_dict({**llada2, "stages": base["stages"]})


@pytest.mark.parametrize("name, family, seed", [("demo-llada-stale", "llada", 49), ("demo-dream-stale", "dream", 51)])
def test_the_stale_experiment_configs_load_as_they_were_run(name, family, seed):
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "recipes" / "train_demo" / "configs" / f"{name}.yaml"
    cfg = cf.load_config(path, ["model.init=x"])
    (stage,) = cfg.stages
    assert (stage.stale, stage.stale_block, stage.steps) == (0.5, 32, 1200)
    assert (cfg.model.family, cfg.data.full_batch, cfg.optim.lr, cfg.optim.decay_steps) == (family, 32, 1e-4, 300)
    assert cfg.run.seed == seed
