"""Options that count tokens or steps of a block, bounded by what they count (issue 78).

The rule (``options.check_bounded``, applied by ``check_request``): a value set larger than what it counts is one
``ValueError`` naming the bound; the shipped default is exempt (a reference default past a short block covers all of
it). Every integer option of every registered sampler and cache is either bounded or listed in ``NOT_COUNTS`` with
the reason, so a new option cannot slip past the rule.
"""

from __future__ import annotations

import dataclasses

import pytest

from dlm_decode.cache import CACHES, get_cache
from dlm_decode.decode import check_request
from dlm_decode.samplers import SAMPLERS, get_sampler

ROWS = [[5, 6, 7]]  # the shortest prompt: 3 tokens
GEN = dict(gen_length=32, block_length=8)  # 4 blocks of 8; fixed-budget samplers: 8 steps per block

# (component kind, name, option, first value past the bound, the bound as the message names it)
CASES = [
    ("sampler", "token_editing", "num_to_transfer", 9, "the block length (8)"),
    ("sampler", "lossless", "drafts", 9, "the steps of one block (8)"),
    ("sampler", "local_leap", "radius", 8, "the block length - 1 (7)"),
    ("cache", "dual", "refresh_interval", 9, "the steps of one block (8)"),
    ("cache", "prefix", "refresh_interval", 9, "the steps of one block (8)"),
    ("cache", "dkv_decode", "refresh_interval", 9, "the steps of one block (8)"),
    ("cache", "dkv_greedy", "refresh_interval", 9, "the steps of one block (8)"),
    ("cache", "dkv_prefill", "refresh_interval", 9, "the steps of one block (8)"),
    ("cache", "dkv_pd", "prompt_refresh_interval", 9, "the steps of one block (8)"),
    ("cache", "elastic", "window_length", 33, "the gen length (32)"),
    ("cache", "elastic", "track_num", 4, "the shortest prompt's length (3)"),
    ("cache", "window", "window_tokens", 33, "the gen length (32)"),
    ("cache", "window", "active_tokens", 33, "the gen length (32)"),
    ("cache", "window", "refresh_cycle", 9, "the steps of one block (8)"),
]


def request(kind: str, name: str, options: dict):
    if kind == "sampler":
        return check_request(None, ROWS, sampler=name, sampler_options=options, **GEN)
    return check_request(None, ROWS, cache=name, cache_options=options, **GEN)


@pytest.mark.parametrize("kind,name,key,value,bound", CASES, ids=[f"{c[1]}.{c[2]}" for c in CASES])
def test_a_count_past_what_it_counts_is_an_error_naming_the_bound(kind, name, key, value, bound):
    request(kind, name, {key: value - 1})  # at the bound: accepted
    with pytest.raises(ValueError) as e:
        request(kind, name, {key: value})
    assert str(e.value).endswith(f"{key} ({value}) must be <= {bound}, which bounds what it counts")


def test_the_llada21_preset_refuses_num_to_transfer_past_its_block():
    from dlm_decode.samplers.presets import get_preset

    kw = get_preset("llada21").generate_kwargs({"num_to_transfer": 100}, gen_length=64)
    with pytest.raises(ValueError, match=r"num_to_transfer \(100\) must be <= the block length \(32\)"):
        check_request(None, ROWS, **kw)


def test_a_shipped_default_past_a_short_block_is_accepted():
    """window's reference window_tokens 64 and elastic's window_length 16 with an 8-token generation: all of it."""
    req = check_request(None, ROWS, cache="window", gen_length=8, block_length=8)
    assert req.cache.window_tokens == 64
    check_request(None, ROWS, cache="elastic", gen_length=8, block_length=8)
    check_request(None, ROWS, sampler="lossless", gen_length=8, block_length=2)  # drafts 4 > 2 steps a block


# integer options that count no tokens or steps of a block, with the reason
NOT_COUNTS = {
    ("early_commit", "answer_offset"): "a generation offset, checked against the generation window by its own check",
    ("early_commit", "answer_length"): "checked with answer_offset against the generation window",
    ("early_commit", "prefix_offset"): "a generation offset, checked against the generation window",
    ("token_editing", "max_post_steps"): "editing steps after the block has no MASK left: not steps of the block",
    ("delayed", "cache_delay_iter"): "steps a done block waits; past the call's end: never (the reference default)",
    ("delayed", "refresh_interval"): "forwards of the call; past the call's end: never (the published 10000)",
    ("dkv_greedy", "window"): "neighbours on each side, bounded to 0..3 by its own check",
}


def int_fields(component) -> list[str]:
    hints = {f.name: f.type for f in dataclasses.fields(component)}
    return [k for k, t in hints.items() if "int" in str(t) and "float" not in str(t) and "tuple" not in str(t)]


def test_every_integer_option_of_every_sampler_and_cache_is_bounded_or_says_why_not():
    unaccounted = []
    for name in SAMPLERS:
        if name == "oracle":
            continue
        smp = get_sampler(name)
        bounded = smp.count_bounds(8, 8, 32)
        unaccounted += [(name, k) for k in int_fields(smp) if k not in bounded and (name, k) not in NOT_COUNTS]
    for name in CACHES:
        pol = get_cache(name)
        bounded = pol.count_bounds(8, 8, 32, 3)
        unaccounted += [(name, k) for k in int_fields(pol) if k not in bounded and (name, k) not in NOT_COUNTS]
    assert not unaccounted, f"integer options with no bound and no reason in NOT_COUNTS: {unaccounted}"
