"""The continuous-batching engine: every request decodes exactly as ``generate`` decodes it alone (tokens and its own
forward count), whatever it is batched with, whenever it joins, for every sampler with every cache; joins in the
middle of another request's block, cancels, streaming, bad requests, the memory budget and the background thread."""

from __future__ import annotations

import threading

import pytest
from llada2_reference import write_llada2

import dlm_decode
from dlm_decode.engine import Engine

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15, 16, 17], [3, 4], [20, 21, 22, 23, 24]]


def options(sampler: str, cache: str, i: int, temperature: float = 0.0) -> dict:
    """A request's options: gen lengths 16 / 24 in blocks of 8, mixed over ``i``."""
    gen = 16 if i % 2 else 24
    opts = {"sampler": sampler, "cache": cache, "gen_length": gen, "block_length": 8}
    if sampler in ("threshold", "entropy_threshold", "factor", "local_leap"):
        opts["sampler_options"] = {"threshold": 0.5} if sampler != "factor" else None
    if sampler in ("low_confidence", "random", "learned_filter", "origin", "maskgit_plus", "topk_margin", "entropy"):
        opts["steps"] = gen // 2 if i % 3 else gen
    if temperature:
        opts |= {"temperature": temperature, "seed": 11 * i + 1}
    return {k: v for k, v in opts.items() if v is not None}


def alone(model, prompt, opts):
    out = dlm_decode.generate(model, [prompt], **opts)
    return out.rows[0].generated_ids, out.nfe


def valid_requests(model, samplers, caches, temperature=0.0):
    """(prompt, options, alone's ids and nfe) for every sampler x cache the model takes (the others are refused
    before any work, by the engine as by ``generate``: checked here too)."""
    reqs = []
    for s in samplers:
        for c in caches:
            i = len(reqs)
            prompt, opts = PROMPTS[i % len(PROMPTS)], options(s, c, i, temperature)
            try:
                expect = alone(model, prompt, opts)
            except ValueError as err:
                with pytest.raises(ValueError) as caught:
                    Engine(model).submit(prompt, **opts)
                assert str(caught.value) == str(err)
                continue
            reqs.append((prompt, opts, expect))
    return reqs


def run_staggered(model, reqs, max_batch=5):
    """Submit the requests a few at a time, stepping between submissions (later ones join mid-block)."""
    eng = Engine(model, max_batch=max_batch)
    handles = []
    for j, (prompt, opts, _) in enumerate(reqs):
        handles.append(eng.submit(prompt, **opts))
        if j % 3 == 2:
            for _ in range(2):
                eng.step()
    eng.run_until_done()
    return eng, [h.result() for h in handles]


BIDIRECTIONAL_SAMPLERS = [s for s in dlm_decode.SAMPLERS if s not in ("llada2", "token_editing", "learned_filter")]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_every_sampler_and_cache_decodes_as_alone(tiny_model, temperature):
    reqs = valid_requests(tiny_model, BIDIRECTIONAL_SAMPLERS, list(dlm_decode.CACHES), temperature)
    assert len(reqs) > 60  # most pairs apply
    eng, results = run_staggered(tiny_model, reqs)
    for (_, opts, (ids, nfe)), r in zip(reqs, results, strict=True):
        assert r.error is None, (opts, r.error)
        assert (r.generated_ids, r.nfe) == (ids, nfe), opts
    # requests shared forwards: fewer model calls than the forwards they made alone
    assert eng.scheduler.calls < sum(nfe for _, _, (_, nfe) in reqs)


@pytest.fixture(scope="module")
def llada2(tmp_path_factory):
    return dlm_decode.load_model(write_llada2(tmp_path_factory.mktemp("llada2") / "m", seed=0))[0]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_block_causal_requests_decode_as_alone(llada2, temperature):
    samplers = ["llada2", "token_editing", "threshold", "low_confidence", "entropy_threshold"]
    reqs = valid_requests(llada2, samplers, ["none", "prefix"], temperature)
    reqs += [([1, 2, 3], {"sampler": "threshold", "sampler_options": {"threshold": 0.5}, "gen_length": 40,
                          "block_length": 16, "stop_at_eos": True}, None)]  # fmt: skip
    reqs[-1] = (*reqs[-1][:2], alone(llada2, *reqs[-1][:2]))
    assert len(reqs) >= 8
    _, results = run_staggered(llada2, reqs, max_batch=4)
    for (_, opts, (ids, nfe)), r in zip(reqs, results, strict=True):
        assert (r.generated_ids, r.nfe, r.error) == (ids, nfe, None), opts


def test_a_request_joins_in_the_middle_of_another_ones_block(llada):
    a_opts = {"sampler": "low_confidence", "cache": "prefix", "gen_length": 24, "block_length": 8, "steps": 24}
    b_opts = {"sampler": "threshold", "cache": "prefix", "gen_length": 16, "block_length": 8}
    eng = Engine(llada, max_batch=2)
    a = eng.submit(PROMPTS[1], **a_opts)
    for _ in range(3):
        eng.step()
    unit = eng.scheduler.units[a.id]
    assert unit.state.block_step == 3 and unit.state.block_index == 0  # a is three steps into its first block
    b = eng.submit(PROMPTS[0], **b_opts)
    calls = eng.scheduler.calls
    eng.step()
    assert eng.scheduler.calls == calls + 1  # both in one forward
    eng.run_until_done()
    assert (a.result().generated_ids, a.result().nfe) == alone(llada, PROMPTS[1], a_opts)
    assert (b.result().generated_ids, b.result().nfe) == alone(llada, PROMPTS[0], b_opts)
    assert b.result().queued_seconds < a.result().seconds  # b did not wait for a


def test_fast_rows_leave_and_waiting_ones_take_their_row(llada):
    fast = {"sampler": "threshold", "sampler_options": {"threshold": 0.01}, "gen_length": 8, "block_length": 8}
    slow = {"sampler": "low_confidence", "gen_length": 32, "block_length": 8, "steps": 32}
    eng = Engine(llada, max_batch=2)
    hs = [eng.submit(PROMPTS[0], **slow)] + [eng.submit(PROMPTS[i % 4], **fast) for i in range(4)]
    eng.run_until_done()
    steps = eng.scheduler.steps
    assert steps == hs[0].result().nfe == 32  # the four fast ones ran beside the slow one, one after another
    assert sum(h.result().nfe for h in hs[1:]) <= 32
    assert len(eng.arena.free) == 2 and eng.arena.rows == 2  # every row given back


def test_cancel(llada):
    opts = {"sampler": "low_confidence", "cache": "prefix", "gen_length": 32, "block_length": 8, "steps": 32}
    eng = Engine(llada, max_batch=1)
    a, b, c = (eng.submit(p, **opts) for p in PROMPTS[:3])
    eng.step()
    assert eng.cancel(a) == "cancelled" and eng.cancel(c.id) == "cancelled"  # running, and waiting
    eng.run_until_done()
    assert a.result().finish_reason == "cancelled" and c.result().finish_reason == "cancelled"
    assert (b.result().generated_ids, b.result().nfe) == alone(llada, PROMPTS[1], opts)
    assert eng.cancel(b) == "finished" and eng.cancel("req-nope") == "unknown"


def test_streamed_text_is_final_and_joins_to_the_answer(tok_dir):
    model, tok = dlm_decode.load_model(tok_dir)
    eng = Engine(model, tok, max_batch=3)
    runs = [
        ("abc def", {"sampler": "threshold", "gen_length": 24, "block_length": 8, "sampler_options": {"threshold": 0.3}}),  # noqa: E501
        ("hello there", {"sampler": "low_confidence", "gen_length": 16, "block_length": 8, "steps": 16}),
        ("xyz", {"sampler": "low_confidence", "gen_length": 16, "block_length": 16, "steps": 8, "cache": "dual"}),
    ]  # fmt: skip
    handles = [eng.submit(p, **o) for p, o in runs]
    seen = {h.id: [] for h in handles}
    for h in handles:
        for delta in h:
            seen[h.id].append(delta)
    for h, (p, o) in zip(handles, runs, strict=True):
        r = h.result()
        out = dlm_decode.generate(model, [p], tokenizer=tok, **o)
        assert r.text == out.rows[0].text
        assert "".join(d.text for d in seen[h.id]) == r.text
        ids = [i for d in seen[h.id] for i in d.token_ids]
        assert ids == r.completion_ids and len(seen[h.id]) > 1  # streamed in pieces, never taken back


def test_bad_requests_fail_alone(llada):
    eng = Engine(llada, max_batch=2)
    with pytest.raises(ValueError, match="threshold"):
        eng.submit([5, 6], sampler="threshold", sampler_options={"threshold": 2.0})
    with pytest.raises(ValueError, match="unknown request option"):
        eng.submit([5, 6], max_new_tokens=3)
    good = {"prompt": [5, 6, 7], "sampler": "threshold", "gen_length": 16, "block_length": 8}
    res = eng.generate_many([good, {"prompt": [5], "cache": "nope"}, {"sampler": "threshold"}, good])
    assert [r.finish_reason for r in res] == ["stop" if res[0].finish_reason == "stop" else "length", "error", "error",
                                              res[0].finish_reason]  # fmt: skip
    assert "cache" in res[1].error and "prompt" in res[2].error
    assert res[0].generated_ids == res[3].generated_ids
    with pytest.raises(ValueError, match="max_batch"):
        Engine(llada, max_batch=0)


def test_a_request_over_the_memory_budget_fails_alone(llada):
    opts = {"sampler": "threshold", "cache": "prefix", "gen_length": 16, "block_length": 8}
    eng = Engine(llada, max_batch=2, memory_budget=60_000)
    small = eng.submit([5, 6, 7], **opts)
    big = eng.submit([i % 60 + 1 for i in range(200)], **opts)
    eng.run_until_done()
    assert small.result().error is None
    assert big.result().finish_reason == "error" and "memory_budget" in big.result().error


def test_background_thread_serves_concurrent_submitters(llada):
    eng = Engine(llada, max_batch=4).start()
    opts = [options("threshold", "prefix", i) for i in range(8)]
    results = [None] * 8

    def client(i):
        results[i] = eng.submit(PROMPTS[i % 4], **opts[i]).result(timeout=60)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    eng.stop()
    for i, r in enumerate(results):
        assert (r.generated_ids, r.nfe) == alone(llada, PROMPTS[i % 4], opts[i])


def test_new_families_decode_as_alone(tmp_path):
    """SDAR (block-causal, its own seeded sampler), sdar_moe, LLaDA-MoE and DiffuCoder through the engine, mixed with
    each other's options, each request equal to generate alone (seeded draws included)."""
    from coder_checkpoints import write_coder
    from llada_moe_reference import write_llada_moe
    from sdar_reference import write_sdar

    runs = {
        "sdar": (write_sdar(tmp_path / "sdar", seed=0, head_scale=2.5), [
            {"sampler": "sdar", "gen_length": 16, "block_length": 4, "steps": 4, "temperature": 1.0, "seed": 3},
            {"sampler": "sdar", "sampler_options": {"remasking": "low_confidence_static"}, "gen_length": 12,
             "block_length": 8, "steps": 4, "temperature": 0.8, "seed": 5, "cache": "none"},
            {"sampler": "threshold", "sampler_options": {"threshold": 0.5}, "gen_length": 16, "block_length": 8},
        ]),
        "sdar_moe": (write_sdar(tmp_path / "sdar_moe", seed=1, moe=True), [
            {"sampler": "sdar", "gen_length": 8, "block_length": 4, "steps": 4, "temperature": 1.0, "seed": 1},
            {"sampler": "sdar", "gen_length": 12, "block_length": 4, "steps": 2, "temperature": 0.0},
        ]),
        "llada_moe": (write_llada_moe(tmp_path / "lmoe", seed=0), [
            {"sampler": "low_confidence", "gen_length": 16, "block_length": 8, "steps": 8, "cache": "prefix"},
            {"sampler": "threshold", "sampler_options": {"threshold": 0.5}, "gen_length": 16, "block_length": 8,
             "cache": "dual", "temperature": 0.7, "seed": 2},
        ]),
        "diffucoder": (write_coder(tmp_path / "dc", "diffucoder"), [
            {"sampler": "entropy", "gen_length": 16, "steps": 16, "temperature": 0.4, "top_p": 0.95, "seed": 4},
            {"sampler": "entropy", "gen_length": 8, "steps": 8},
        ]),
    }  # fmt: skip
    for name, (path, opts) in runs.items():
        model = dlm_decode.load_model(path)[0]
        eng = Engine(model, max_batch=2)
        prompts = [[5, 6, 7], [9, 10, 11, 12, 13], [3, 4]]
        handles = [eng.submit(prompts[i % 3], **o) for i, o in enumerate(opts)]
        eng.run_until_done()
        for i, (h, o) in enumerate(zip(handles, opts, strict=True)):
            r = h.result()
            assert r.error is None, (name, o, r.error)
            assert (r.generated_ids, r.nfe) == alone(model, prompts[i % 3], o), (name, o)


def test_a_cancel_right_after_submit_is_kept_in_order_by_the_thread(llada):
    eng = Engine(llada, max_batch=2).start()
    opts = {"sampler": "low_confidence", "gen_length": 32, "block_length": 8, "steps": 32}
    for _ in range(5):
        h = eng.submit(PROMPTS[0], **opts)
        assert eng.cancel(h) == "cancelled"
        assert h.result(timeout=60).finish_reason == "cancelled"
    eng.stop()


def test_the_lm_head_runs_over_each_requests_own_slots_only(llada, monkeypatch):
    """The LM head (most of a step at a large vocabulary) runs over the slots each request reads, never over a shared
    call's or a static batch's padding: the rows it computes in the engine and in one static batch add up to those of
    the requests alone (the samplers read only their candidates; no cache here restricts them)."""
    reqs = []
    for i, cache in enumerate(["none", "prefix", "dual", "prefix", "dual"]):
        opts = options("threshold" if i % 2 else "low_confidence", cache, i)
        reqs.append((PROMPTS[i % len(PROMPTS)], opts))
    rows: list[int] = []
    head = llada.output_logits

    def counted(hid):
        rows.append(hid.shape[0] * hid.shape[1])
        return head(hid)

    monkeypatch.setattr(llada, "output_logits", counted)
    expect = [alone(llada, p, o) for p, o in reqs]
    alone_rows = sum(rows)
    rows.clear()
    _, results = run_staggered(llada, [(p, o, e) for (p, o), e in zip(reqs, expect, strict=True)], max_batch=5)
    assert [(r.generated_ids, r.nfe) for r in results] == expect
    assert sum(rows) == alone_rows
    same = reqs[1][1]  # one static batch of three prompts with one set of options
    rows.clear()
    for p in PROMPTS[:3]:
        alone(llada, p, same)
    alone_rows = sum(rows)
    rows.clear()
    dlm_decode.generate(llada, PROMPTS[:3], **same)
    assert sum(rows) == alone_rows


def test_longest_admission_starts_the_most_work_first_and_ends_a_list_sooner(llada):
    """``admission="longest"``: waiting requests start longest gen length first (then longest prompt, then oldest),
    each decoding as alone, results in input order. A list of four short requests and a long one: taken as they came
    the long one ends the list alone (8 + 8 + 32 steps); longest first, the short ones run beside it (32 steps)."""
    reqs = [(PROMPTS[i % 4], 8) for i in range(4)] + [(PROMPTS[1], 32)]
    opts = [{"sampler": "low_confidence", "gen_length": g, "block_length": 8, "steps": g} for _, g in reqs]
    expect = [alone(llada, p, o) for (p, _), o in zip(reqs, opts, strict=True)]
    for admission, steps in (("arrival", 48), ("longest", 32)):
        eng = Engine(llada, max_batch=2, admission=admission)
        results = eng.generate_many([{"prompt": p} | o for (p, _), o in zip(reqs, opts, strict=True)])
        assert [(r.generated_ids, r.nfe) for r in results] == expect, admission
        assert eng.scheduler.steps == steps, admission


def test_longest_admission_orders_by_gen_length_then_prompt_then_arrival(llada):
    gens = [8, 16, 24, 16, 24]
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[3], PROMPTS[0]]  # 3, 9, 2, 5, 3 ids
    for admission, order in (("arrival", [0, 1, 2, 3, 4]), ("longest", [4, 2, 1, 3, 0])):
        eng = Engine(llada, max_batch=1, admission=admission)
        hs = [eng.submit(p, gen_length=g, block_length=8, steps=g // 2) for p, g in zip(prompts, gens, strict=True)]
        ended = []
        while eng.step():
            ended += [i for i, h in enumerate(hs) if h.done and i not in ended]
        ended += [i for i, h in enumerate(hs) if i not in ended]
        assert ended == order, admission


def test_an_unknown_admission_is_refused():
    with pytest.raises(ValueError, match="admission must be one of arrival, longest, got 'shortest'"):
        Engine(None, admission="shortest")
