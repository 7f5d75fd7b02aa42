"""The loop's parts alone: the length rule, ``check_request``'s defaults, ``prepare``, ``begin_block`` / ``step``,
the pure ``commit_mask``, the read-only cursor and the ``Selection`` contract (what a sampler changes comes back)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from fake import table_model

import dlm_decode
from dlm_decode.cache import CACHES, KVStore, get_cache
from dlm_decode.cache.none import NoCache
from dlm_decode.core.config import DEFAULT_BLOCK_LENGTH, resolve_lengths
from dlm_decode.core.inputs import ModelFacts
from dlm_decode.decode import check_request, commit_mask, prepare, step
from dlm_decode.decode.loop import begin_block, open_rows
from dlm_decode.samplers import SAMPLERS, Selection, get_sampler, register_sampler
from dlm_decode.samplers.base import candidates
from dlm_decode.samplers.early_commit import EarlyCommit
from dlm_decode.samplers.threshold import Threshold

FACTS = ModelFacts(vocab_size=16, mask_id=15, max_length=512)


# ---------------------------------------------------------------------------------------------- the length rule


def test_resolve_lengths_is_the_one_default_rule():
    assert resolve_lengths(128) == (DEFAULT_BLOCK_LENGTH, 128)  # blockwise: 32, steps = gen_length
    assert resolve_lengths(16) == (16, 16)  # the default block never exceeds the generation
    assert resolve_lengths(128, blockwise=False) == (128, 128)  # Dream orderings: one block
    assert resolve_lengths(128, 64, 32, blockwise=False) == (64, 32)  # given values win
    for name in ("low_confidence", "origin"):
        req = check_request(None, sampler=name, gen_length=64)
        block, steps = resolve_lengths(64, blockwise=get_sampler(name).traits.blockwise)
        assert (req.block_length, req.num_blocks, req.steps) == (block, 64 // block, steps)


def test_check_request_fills_the_samplers_reference_defaults():
    facts = dataclasses.replace(FACTS, sampling_defaults={"top_k": 50, "top_p": 1.0})
    dream = check_request(facts, [[3, 4]], sampler="maskgit_plus", gen_length=8)
    assert dream.config.top_k == 50 and dream.config.top_p == 1.0 and dream.sampler.eps == 1e-3
    llada = check_request(facts, [[3, 4]], sampler="low_confidence", gen_length=8)
    assert llada.config.top_k is None and llada.config.top_p is None  # follows no model defaults
    given = check_request(facts, [[3, 4]], sampler="maskgit_plus", gen_length=8, top_k=0)
    assert given.config.top_k == 0  # the caller's value is never replaced


# ---------------------------------------------------------------------------------------------- commit_mask


def _b(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.bool)


def test_commit_mask_keeps_only_proposed_candidates():
    proposed, cand = _b([[1, 1, 0, 1]]), _b([[0, 1, 1, 1]])
    before = proposed.clone(), cand.clone()
    assert commit_mask(proposed, cand).tolist() == [[False, True, False, True]]
    assert torch.equal(proposed, before[0]) and torch.equal(cand, before[1])  # pure: inputs untouched


def test_commit_mask_all_in_computed_and_last_step():
    proposed, cand = _b([[1, 1, 0, 0]]), _b([[0, 1, 1, 0]])
    all_in = _b([[1, 0, 0, 0]])  # a stopping row may also fill slot 0 (outside its block)
    assert commit_mask(proposed, cand, all_in=all_in).tolist() == [[True, True, False, False]]
    computed = _b([[1, 0, 1, 1]])  # the cache computed no logits for slot 1: never committed
    assert commit_mask(proposed, cand, all_in=all_in, computed=computed).tolist() == [[True, False, False, False]]
    assert commit_mask(proposed, cand, last=True).tolist() == [[False, True, True, False]]  # every candidate


# ---------------------------------------------------------------------------------------------- prepare and step


def test_prepare_builds_the_state_and_the_store(llada):
    req = check_request(ModelFacts.of_model(llada), [[5, 6, 7], [8]], cache="dual", gen_length=8, block_length=4)
    state, store = prepare(llada, [[5, 6, 7], [8]], req)
    assert state.canvas.shape == (2, 11) and state.prompt_len == 3 and state.valid[1].tolist()[:3] == [0, 0, 1]
    assert (state.canvas[:, 3:] == llada.mask_token_id).all() and state.cursor.next_start.tolist() == [3, 3]
    assert (state.block_length, state.num_blocks, state.steps) == (4, 2, 8)
    assert state.stats.trace.shape == (2, 8) and (state.stats.trace == -1).all() and not state.stats.commits
    assert isinstance(store, KVStore) and store.k.shape[3] == 11
    req = check_request(ModelFacts.of_model(llada), [[5, 6]], gen_length=8)
    assert prepare(llada, [[5, 6]], req)[1] is None  # no cache: no store


def test_prepare_writes_the_samplers_forced_context():
    model = table_model([0.5] * 16)
    sampler = EarlyCommit(prefix_ids=(7, 8), prefix_offset=3)  # watches [5, 10) after the prefix
    req = check_request(FACTS, [[3, 4]], sampler=sampler, gen_length=16, block_length=16)
    state, _ = prepare(model, [[3, 4]], req)
    assert state.canvas[0, 2:].tolist() == [15, 15, 15, 7, 8] + [15] * 11
    assert (state.stats.trace == -1).all()  # context, not decoding
    assert isinstance(sampler.forced_tokens(state), Selection) and EarlyCommit().forced_tokens(state) is None


def test_one_step_commits_what_the_sampler_chose():
    model = table_model([0.95, 0.5, 0.97, 0.4], tokens=[5, 6, 7, 8])
    req = check_request(FACTS, [[3, 4]], sampler="threshold", sampler_options={"threshold": 0.9}, gen_length=4)
    state, store = prepare(model, [[3, 4]], req)
    begin_block(state, req.sampler, req.cache, open_rows(state))
    assert (state.block_start, state.block_end.tolist(), state.block_limit) == (2, [6], 4)
    step(model, state, req.sampler, req.cache, store)
    assert state.canvas[0, 2:].tolist() == [5, 15, 7, 15] and state.step == 1 and state.block_step == 1
    assert state.stats.tokens_per_step() == [[2]] and state.stats.trace[0].tolist() == [0, -1, 0, -1]


def test_block_masked_is_shared_within_a_step_and_follows_every_change():
    model = table_model([0.95, 0.5, 0.97, 0.4], tokens=[5, 6, 7, 8])
    req = check_request(FACTS, [[3, 4], [9, 9]], gen_length=8, block_length=4)
    state, _ = prepare(model, [[3, 4], [9, 9]], req)
    begin_block(state, req.sampler, req.cache, open_rows(state))
    first = state.block_masked()
    assert first is state.block_masked()  # computed once while nothing it reads changes
    assert first[:, 2:].tolist() == [[True] * 4 + [False] * 4] * 2
    state.canvas[0, 3] = 5  # an in-place commit
    assert state.block_masked()[0, 2:6].tolist() == [True, False, True, True]
    state.finished[1] = True  # an in-place stop
    assert not state.block_masked()[1].any() and state.block_masked()[0, 2]
    state.cursor.block_end = torch.tensor([10, 10])  # a new block end
    assert state.block_masked()[0, 2:].tolist() == [True, False] + [True] * 6
    end = torch.tensor([4, 4])  # an explicit end is never memoised
    assert state.block_masked(end)[0].tolist() == [False, False, True, False] + [False] * 6


def test_open_rows_ends_when_every_row_is_done(llada):
    req = check_request(ModelFacts.of_model(llada), [[5, 6]], gen_length=4)
    state, _ = prepare(llada, [[5, 6]], req)
    assert open_rows(state).tolist() == [True]
    state.finished[:] = True
    assert open_rows(state) is None


# ---------------------------------------------------------------------------------------------- Selection contract


def test_samplers_cannot_move_the_cursor(llada):
    req = check_request(ModelFacts.of_model(llada), [[5, 6]], gen_length=4)
    state, _ = prepare(llada, [[5, 6]], req)
    with pytest.raises(AttributeError):
        state.block_end = torch.tensor([3])  # read-only view: a sampler returns a new end in its Selection


def test_adaptive_block_returns_its_block_end_instead_of_writing_it():
    model = table_model([0.95] * 2 + [0.3] * 6, tokens=[5, 9] + [7] * 6)
    opts = {"delimiter_ids": (9,), "delimiter_threshold": 0.3}
    req = check_request(FACTS, [[3, 4]], sampler="adaptive_block", sampler_options=opts, gen_length=8, block_length=8)
    state, _ = prepare(model, [[3, 4]], req)
    begin_block(state, req.sampler, req.cache, open_rows(state))
    r0, r1 = req.sampler.region(state)
    logits = model.fn(state.canvas, 0)[:, r0:r1]
    sel = req.sampler.select(state, logits, r0)
    assert sel.block_end.tolist() == [4] and state.block_end.tolist() == [10]  # the delimiter ends the block
    out = dlm_decode.generate(model, [[3, 4]], sampler="adaptive_block", sampler_options=opts, gen_length=8)
    assert [s[0] for s in out.scratch["adaptive_block"]][0] == 2


@dataclass(frozen=True)
class _LateBlockEnd(Threshold):
    name: ClassVar[str] = "late_block_end"

    def select(self, state, logits, r0):
        sel = super().select(state, logits, r0)
        return dataclasses.replace(sel, block_end=state.block_end)  # at every step, not just the first


def test_the_loop_rejects_a_block_end_after_the_first_step():
    model = table_model([0.95, 0.5, 0.4, 0.3])
    with pytest.raises(RuntimeError, match="moved the block end after the block's first step"):
        dlm_decode.generate(model, [[3, 4]], sampler=_LateBlockEnd(), gen_length=4)


def test_selection_candidates_follow_a_returned_block_end(llada):
    req = check_request(ModelFacts.of_model(llada), [[5, 6]], gen_length=8, block_length=8)
    state, _ = prepare(llada, [[5, 6]], req)
    begin_block(state, req.sampler, req.cache, open_rows(state))
    assert candidates(state, 2, 10).sum() == 8
    assert candidates(state, 2, 10, torch.tensor([5])).tolist() == [[True] * 3 + [False] * 5]


# ---------------------------------------------------------------------------------------------- registries


def test_registries_map_names_to_classes():
    assert SAMPLERS["threshold"] is Threshold and CACHES["none"] is NoCache
    assert all(isinstance(c, type) for c in [*SAMPLERS.values(), *CACHES.values()])
    register_sampler("late_block_end", _LateBlockEnd)
    try:
        assert isinstance(get_sampler("late_block_end", {"threshold": "0.5"}), _LateBlockEnd)
    finally:
        del SAMPLERS["late_block_end"]
    assert get_cache(None).name == "none" and isinstance(get_cache("none"), NoCache)
