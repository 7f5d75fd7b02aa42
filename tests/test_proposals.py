"""``gumbel_proposals`` narrowed to the read slots (``only``) gives the whole-region values there, bit for bit."""

from __future__ import annotations

import pytest
import torch

import dlm_decode
from dlm_decode.core.proposals import gumbel_proposals


@pytest.mark.parametrize("filters", [{}, {"top_k": 5}, {"top_p": 0.8}])
def test_only_slots_get_the_whole_region_values(filters):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 9, 50, generator=g) * 4  # [B, R, V]
    logits[0, 2, 7] = 99.0  # the MASK id's logit is the highest there: never proposed, its confidence is still read
    logits[1, 4] = 0.0  # a flat slot (one left out of a narrowed forward): argmax ties to the first id
    only = torch.rand(3, 9, generator=g) < 0.5
    only[0, 2] = only[1, 4] = True
    full_x0, full_conf = gumbel_proposals(logits, mask_id=7, temperature=0.0, **filters)
    x0, conf = gumbel_proposals(logits, mask_id=7, temperature=0.0, only=only, **filters)
    assert full_x0[0, 2] != 7 and torch.equal(x0[only], full_x0[only])
    assert torch.equal(conf[only], full_conf[only])  # bitwise, float64
    assert (x0[~only] == 0).all() and (conf[~only] == 0).all()
    assert conf.dtype == torch.float64 and x0.dtype == torch.long


def test_only_is_ignored_when_drawing():
    logits = torch.randn(2, 6, 40)
    only = torch.zeros(2, 6, dtype=torch.bool)
    only[0, 1] = True
    a = gumbel_proposals(logits, mask_id=3, temperature=0.7, generator=torch.Generator().manual_seed(1), only=only)
    b = gumbel_proposals(logits, mask_id=3, temperature=0.7, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])  # the draws cover the whole region, as the reference


@pytest.mark.parametrize("sampler", ["threshold", "low_confidence", "factor", "local_leap", "entropy_threshold"])
def test_samplers_decode_as_before_narrowing(llada, sampler, monkeypatch):
    prompts = [[5, 9, 17, 3, 22, 8, 40, 11], [7, 30, 2, 19]]
    cfg = dict(gen_length=24, block_length=8, steps=12, sampler=sampler, trace=True)
    narrowed = dlm_decode.generate(llada, prompts, **cfg)
    import dlm_decode.samplers.base as base

    whole_region = base.gumbel_proposals

    def every_slot(logits, **kw):
        assert kw.pop("only") is not None  # the samplers narrow ...
        return whole_region(logits, **kw)  # ... and here they do not

    monkeypatch.setattr(base, "gumbel_proposals", every_slot)
    whole = dlm_decode.generate(llada, prompts, **cfg)
    assert torch.equal(narrowed.sequences, whole.sequences)
    assert [r.nfe for r in narrowed.rows] == [r.nfe for r in whole.rows]
