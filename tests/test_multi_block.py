"""Several blocks in flight (``core.frontier``, ``samplers.multi_block``): the rules on hand-built confidences with
answers worked out by hand, the reduction to block-by-block decoding at thresholds 1, rows of a batch and requests
of the engine decoding what they decode alone, the exact cache under block-causal attention (D2F's on LLaDA / Dream,
LLaDA2's own) against no cache, d3LLM's delayed cache, and the requests refused before any work.

The token-for-token checks against the re-stated D2F and d3LLM reference decoders are in
``tests/test_reference_multi_block.py``.
"""

from __future__ import annotations

import math

import pytest
import torch

import dlm_decode
from dlm_decode.engine import Engine
from tests.fake import table_model
from tests.llada2_reference import write_llada2

pytestmark = pytest.mark.usefixtures("one_thread")

# eight generation slots in two blocks of four (prompt of two): per-slot confidences, the same every step
CONFS = [0.95, 0.6, 0.5, 0.4, 0.85, 0.8, 0.3, 0.2]
GEN = {"gen_length": 8, "block_length": 4}


def _trace(out) -> list[int]:
    return out.trace[0].tolist()


def _run(sampler, options, confs=CONFS, tokens=None, **kw):
    model = table_model(confs, tokens)
    return dlm_decode.generate(model, [[3, 4]], sampler=sampler, sampler_options=options, trace=True, **(GEN | kw))


def _entropy_at(conf: float, vocab: int = 16) -> float:
    """The entropy of ``fake.peaked(token, conf)``: ``conf`` on one token, the rest uniform."""
    rest = (1 - conf) / (vocab - 1)
    return -(conf * math.log(conf) + (vocab - 1) * rest * math.log(rest))


def test_d2f_rule_by_hand():
    # step 1: block 0 alone, its sure slot 0; step 2: its top-1, slot 1 (share 0.5 reached); step 3: block 1 opens
    # semi-activated (block 0 is not done): block 0's top-1 (slot 2), none of block 1 is over 0.9; step 4: slot 3;
    # then block 1 is fully activated: one slot per step
    out = _run("threshold", {"threshold": 0.9, "block_add_threshold": 0.5, "decoded_token_threshold": 1.0})
    assert _trace(out) == [0, 1, 2, 3, 4, 5, 6, 7] and out.nfe == 8
    # a sure slot in the semi-activated block is committed at once (slots 4 and 5 at 0.95)
    confs = [0.95, 0.6, 0.5, 0.4, 0.95, 0.95, 0.3, 0.2]
    out = _run("threshold", {"threshold": 0.9, "block_add_threshold": 0.5, "decoded_token_threshold": 1.0}, confs)
    assert _trace(out) == [0, 1, 2, 3, 2, 2, 4, 5] and out.nfe == 6
    plain = _run("threshold", {"threshold": 0.9}, confs)  # block by block: block 1 waits for block 0
    assert _trace(plain) == [0, 1, 2, 3, 4, 4, 5, 6] and plain.nfe == 7


def test_d2f_full_activation_lets_both_blocks_take_their_top1():
    # decoded_token_threshold 0.5: block 1 is fully activated as it opens (block 0 half done): both blocks commit
    # their own top-1 each step
    out = _run("threshold", {"threshold": 0.9, "block_add_threshold": 0.5, "decoded_token_threshold": 0.5})
    assert _trace(out) == [0, 1, 2, 3, 2, 3, 4, 5] and out.nfe == 6


def test_d3llm_rule_by_hand():
    # eta at the entropy of confidence 0.9: sure = confidence over 0.9. Step 3: block 1 opens semi-activated; the
    # single best slot anywhere is slot 4 (0.85) in the semi-activated block, and block 0, the first fully activated
    # block with a MASK, got nothing, so its best slot (2) is forced; step 4 the same with slots 5 and 3
    eta = _entropy_at(0.9)
    opts = {"eta": eta, "block_add_threshold": 0.5, "decoded_token_threshold": 1.0}
    out = _run("entropy_threshold", opts)
    assert _trace(out) == [0, 1, 2, 3, 2, 3, 4, 5] and out.nfe == 6
    d2f = _run("threshold", {"threshold": 0.9, "block_add_threshold": 0.5, "decoded_token_threshold": 1.0})
    assert d2f.nfe == 8  # D2F's semi-activated block takes only sure slots


def test_low_confidence_schedules_each_fully_activated_block():
    # steps 4 over 2 blocks: each block commits ceil(left / steps left) of its masks per step once fully activated
    opts = {"block_add_threshold": 0.5, "decoded_token_threshold": 1.0}
    out = _run("low_confidence", opts, steps=4)
    assert _trace(out) == [0, 0, 1, 1, 2, 2, 3, 3] and out.nfe == 4
    out = _run("low_confidence", opts | {"decoded_token_threshold": 0.5}, steps=4)
    assert _trace(out) == [0, 0, 1, 1, 1, 1, 2, 2] and out.nfe == 3


def test_early_stop_d2f_stops_opening_and_d3llm_fills():
    tokens = [5, 1, 6, 7, 8, 9, 10, 11]  # slot 1 proposes EOS (id 1)
    opts = {"threshold": 0.9, "block_add_threshold": 0.5, "decoded_token_threshold": 1.0, "early_stop": True}
    out = _run("threshold", opts, tokens=tokens)
    # EOS committed at step 2: no block opens after it; block 0 is finished, block 1 never opened: filled, untraced
    assert _trace(out) == [0, 1, 2, 3, -1, -1, -1, -1] and out.nfe == 4
    assert out.generated[0].tolist() == [5, 1, 6, 7, 1, 1, 1, 1]
    off = _run("threshold", opts | {"early_stop": False}, tokens=tokens)
    assert off.nfe == 8 and off.generated[0].tolist() == tokens
    # d3LLM: at the next step's start everything after the first EOS is the fill id, masks included
    opts = {"eta": _entropy_at(0.9), "block_add_threshold": 0.5, "decoded_token_threshold": 1.0, "early_stop": True}
    out = _run("entropy_threshold", opts, tokens=tokens)
    assert _trace(out) == [0, 1, -1, -1, -1, -1, -1, -1] and out.nfe == 2
    assert out.generated[0].tolist() == [5, 1, 1, 1, 1, 1, 1, 1]


@pytest.mark.parametrize(
    ("sampler", "options"),
    [("threshold", {"threshold": 0.3}), ("entropy_threshold", {"eta": 2.0}), ("low_confidence", {})],
)
def test_thresholds_at_one_are_block_by_block(tiny_model, sampler, options):
    kw = _kw(sampler)
    for ids in ([[5, 6, 7, 8, 9]], [[11, 12, 13]]):
        plain = dlm_decode.generate(tiny_model, ids, sampler=sampler, sampler_options=options, **kw)
        ones = {"block_add_threshold": 1.0, "decoded_token_threshold": 1.0}
        multi = dlm_decode.generate(tiny_model, ids, sampler=sampler, sampler_options=options | ones, **kw)
        assert torch.equal(plain.sequences, multi.sequences) and plain.nfe == multi.nfe
        assert _trace(plain) == _trace(multi)


PROMPTS = [[5, 6, 7, 8, 9], [11, 12, 13], [20, 21, 22, 23, 24, 25, 26]]
MULTI = [
    ("threshold", {"threshold": 0.3, "block_add_threshold": 0.3, "decoded_token_threshold": 0.7, "early_stop": True}),
    ("entropy_threshold", {"eta": 2.0, "block_add_threshold": 0.5, "decoded_token_threshold": 0.9, "early_stop": True}),
    ("low_confidence", {"block_add_threshold": 0.5, "decoded_token_threshold": 0.5}),
]


def _kw(sampler):
    return {"gen_length": 24, "block_length": 8, "steps": 12 if sampler == "low_confidence" else None, "trace": True}


def _several_blocks_at_once(out) -> bool:
    """Some step committed slots of two different blocks (blocks of 8)."""
    for row in out.trace.tolist():
        by_step: dict[int, set[int]] = {}
        for slot, s in enumerate(row):
            by_step.setdefault(s, set()).add(slot // 8)
        if any(len(v) > 1 for k, v in by_step.items() if k >= 0):
            return True
    return False


@pytest.mark.parametrize(("sampler", "options"), MULTI)
@pytest.mark.parametrize(
    ("cache", "attention"),
    [("none", None), ("delayed", None), ("none", "answer_block_causal"), ("prefix", "answer_block_causal")],
)
def test_batch_rows_decode_what_they_decode_alone(tiny_model, sampler, options, cache, attention):
    kw = _kw(sampler) | {"sampler": sampler, "sampler_options": options, "cache": cache, "attention": attention}
    batch = dlm_decode.generate(tiny_model, PROMPTS, **kw)
    for i, ids in enumerate(PROMPTS):
        alone = dlm_decode.generate(tiny_model, [ids], **kw)
        assert alone.rows[0].generated_ids == batch.rows[i].generated_ids
        assert alone.trace[0].tolist() == batch.trace[i].tolist()
    assert _several_blocks_at_once(batch)


@pytest.mark.parametrize(("sampler", "options"), MULTI)
def test_exact_cache_under_d2f_attention_equals_no_cache(tiny_model, sampler, options):
    kw = _kw(sampler) | {"sampler": sampler, "sampler_options": options, "attention": "answer_block_causal"}
    none = dlm_decode.generate(tiny_model, PROMPTS, cache="none", **kw)
    exact = dlm_decode.generate(tiny_model, PROMPTS, cache="prefix", **kw)
    assert torch.equal(none.sequences, exact.sequences) and none.nfe == exact.nfe
    assert exact.token_forwards < 0.8 * none.token_forwards


def test_d2f_attention_changes_the_answer(llada):
    kw = _kw("threshold") | {"sampler": "threshold", "sampler_options": MULTI[0][1]}
    full = dlm_decode.generate(llada, PROMPTS, **kw)
    d2f = dlm_decode.generate(llada, PROMPTS, attention="answer_block_causal", **kw)
    assert not torch.equal(full.sequences, d2f.sequences)


@pytest.fixture(scope="module")
def llada2(tmp_path_factory):
    return dlm_decode.load_model(write_llada2(tmp_path_factory.mktemp("llada2") / "m"))[0]


@pytest.mark.parametrize(("sampler", "options"), MULTI)
def test_block_causal_model_exact_cache_and_batches(llada2, sampler, options):
    kw = _kw(sampler) | {"sampler": sampler, "sampler_options": options}
    none = dlm_decode.generate(llada2, PROMPTS, cache="none", **kw)
    exact = dlm_decode.generate(llada2, PROMPTS, cache="prefix", **kw)
    assert torch.equal(none.sequences, exact.sequences) and exact.token_forwards < none.token_forwards
    for i, ids in enumerate(PROMPTS):
        assert (
            dlm_decode.generate(llada2, [ids], cache="prefix", **kw).rows[0].generated_ids
            == exact.rows[i].generated_ids
        )


@pytest.mark.parametrize(
    ("sampler", "options"), [("threshold", {"threshold": 0.3}), ("entropy_threshold", {"eta": 2.0})]
)
def test_block_causal_model_at_thresholds_one_is_block_by_block(llada2, sampler, options):
    ones = {"block_add_threshold": 1.0, "decoded_token_threshold": 1.0}
    for ids in PROMPTS:
        plain = dlm_decode.generate(llada2, [ids], sampler=sampler, sampler_options=options, **_kw(sampler))
        multi = dlm_decode.generate(llada2, [ids], sampler=sampler, sampler_options=options | ones, **_kw(sampler))
        assert torch.equal(plain.sequences, multi.sequences) and plain.nfe == multi.nfe


def test_delayed_cache_that_never_caches_is_no_cache(tiny_model):
    sampler, options = MULTI[1]
    kw = _kw(sampler) | {"sampler": sampler, "sampler_options": options}
    none = dlm_decode.generate(tiny_model, PROMPTS, cache="none", **kw)
    never = dlm_decode.generate(tiny_model, PROMPTS, cache="delayed", cache_options={"cache_delay_iter": 10**6}, **kw)
    assert torch.equal(none.sequences, never.sequences) and never.refreshes == never.nfe
    cached = dlm_decode.generate(tiny_model, PROMPTS, cache="delayed", **kw)  # d3LLM's: delay 1
    assert cached.refreshes < cached.nfe and cached.cache_stats["cached_slots"] != [0, 0, 0]


def test_engine_requests_decode_what_generate_decodes(llada):
    eng = Engine(llada, None, max_batch=4)
    jobs = []
    for (sampler, options), ids in zip(MULTI, PROMPTS, strict=True):
        kw = _kw(sampler) | {"sampler": sampler, "sampler_options": options}
        kw.pop("trace")
        for attention, cache in ((None, "none"), ("answer_block_causal", "prefix")):
            jobs.append((ids, kw | {"attention": attention, "cache": cache}))
    handles = [eng.submit(ids, **kw) for ids, kw in jobs]
    eng.run_until_done()
    for (ids, kw), h in zip(jobs, handles, strict=True):
        want = dlm_decode.generate(llada, [ids], **kw)
        got = h.result()
        assert got.error is None and got.generated_ids == want.rows[0].generated_ids and got.nfe == want.nfe
    assert eng.scheduler.calls < sum(h.result().nfe for h in handles)  # the requests shared forwards


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"attention": "answer_block_causal"}, "block-causal already"),
        ({"sampler_options": {"block_add_threshold": 0.5}, "cache": "dual"}, "cache 'dual' does not apply"),
        ({"sampler_options": {"block_add_threshold": 0.5}, "cache": "prefix"}, "exact only under block-causal"),
        ({"sampler_options": {"block_add_threshold": 1.5}}, "share in (0, 1]"),
        ({"sampler_options": {"decoded_token_threshold": 0}}, "share in (0, 1]"),
        ({"sampler_options": {"early_stop": True}}, "early_stop is the EOS stop of multi-block"),
        ({"sampler": "factor", "sampler_options": {"block_add_threshold": 0.5}}, "several blocks in flight"),
        ({"sampler": "learned_filter", "sampler_options": {"block_add_threshold": 0.5}}, "do not apply"),
        ({"attention": "d2f"}, "attention must be one of"),
        ({"attention": "answer_block_causal", "cache": "window"}, "cache 'window' does not apply"),
    ],
)
def test_refused_before_any_work(llada, llada2, kw, message):
    model = llada2 if kw.get("attention") == "answer_block_causal" and "cache" not in kw else llada
    kw = {"sampler": "threshold", "gen_length": 16, "block_length": 8} | kw
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        dlm_decode.generate(model, [[5, 6, 7]], **kw)


@pytest.mark.parametrize("preset", ["d2f_llada", "d2f_dream", "d3llm_llada", "d3llm_dream"])
def test_presets_set_rule_attention_and_cache_on_the_cli(preset, capsys):
    import json

    from dlm_decode.cli import main
    from dlm_decode.samplers.presets import get_preset

    model_name = "demo-dream" if preset.endswith("dream") else "demo-llada"
    assert (
        main(["generate", model_name, "--input-ids", "5,6,7", "--preset", preset, "--gen-length", "64", "--json"]) == 0
    )
    out = json.loads(capsys.readouterr().out)
    kw = get_preset(preset).generate_kwargs(gen_length=64)
    assert out["cache"]["name"] == kw["cache"] and out["config"]["attention"] == kw.get("attention")
    assert {k: out["sampler"][k] for k in kw["sampler_options"]} == kw["sampler_options"]
    model, tok = dlm_decode.load_model(model_name)
    want = dlm_decode.generate(model, [[5, 6, 7]], tokenizer=tok, **kw)
    assert out["rows"][0]["generated_ids"] == want.rows[0].generated_ids and out["nfe"] == want.nfe
    assert main(["generate", model_name, "--input-ids", "5,6,7", "--preset", preset, "--gen-length", "64",
                 "--cache", "none", "--json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["cache"]["name"] == "none"  # a given cache wins
