"""Elastic-Cache (``cache=elastic``) beyond the generic cache suite of ``test_caches.py``: token identity with no
cache on the shipped demo models when the drift test fails every step, the refresh statistics on cases whose answer
is known, the drift measure itself, and bad options refused before any work."""

from __future__ import annotations

import pytest
import torch
from test_checks_before_loading import cli_error, no_weights  # noqa: F401 (fixture)

import dlm_decode
import dlm_decode.cache.elastic as elastic_module
import dlm_decode.models.depth as depth
from dlm_decode.cache import get_cache

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPTS = [[5, 9, 17, 3, 40, 22], [7, 2, 33], [11, 30, 30, 8, 19]]


def _run(model, cache="elastic", prompts=PROMPTS, **kw):
    kw.setdefault("gen_length", 16)
    kw.setdefault("block_length", 8)
    kw.setdefault("sampler", "threshold")
    return dlm_decode.generate(model, prompts, cache=cache, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("demo", ["demo-llada", "demo-dream"])
@pytest.mark.parametrize("sampler", ["threshold", "entropy_threshold", "low_confidence"])
def test_demo_models_refreshing_every_step_decode_as_without_a_cache(demo, sampler):
    model, tok = dlm_decode.load_model(demo)
    chats = [[{"role": "user", "content": c}] for c in ("copy: a b c d e f", "sort: 9 3 7 1 5", "reverse: x y z w")]
    kw = dict(tokenizer=tok, chat=True, sampler=sampler, gen_length=32, block_length=8)
    ref = dlm_decode.generate(model, chats, **kw)
    every_step = {"elastic": {"gamma": 2.0}, "prefix": {"refresh_interval": 1}, "dual": {"refresh_interval": 1}}
    for cache, opts in every_step.items():
        out = dlm_decode.generate(model, chats, cache=cache, cache_options=opts, **kw)
        assert torch.equal(out.sequences, ref.sequences), (cache, sampler)
        if cache == "elastic":  # every reuse row-step refreshed from the embeddings
            st = out.cache_stats
            assert st["refresh_from_layer"][0] > 0 and sum(st["refresh_from_layer"][1:]) == 0
            assert st["reused_all_layers"] == 0


@pytest.mark.parametrize("model_name", ["llada", "dream"])
def test_a_test_that_never_fails_reuses_every_layer(model_name, request):
    model = request.getfixturevalue(model_name)
    out = _run(model, cache_options={"gamma": -2.0})  # a cosine is never below -2
    st = out.cache_stats
    assert st["full_refreshes"] == out.refreshes == 1
    assert st["refresh_from_layer"] == [0] * model.kv_shape()[0]
    assert st["reused_all_layers"] == sum(r.nfe for r in out.rows) - len(out.rows)  # every row-step after the first
    assert all(m is not None and -1.0 <= m <= 1.0 + 1e-6 for m in st["drift_mean"])  # every layer tested


def test_refresh_layer_counts_follow_the_drift_test(llada, monkeypatch):
    """Layer 0 always passes the test, layer 1 always fails: every reuse row-step refreshes from layer 1."""
    calls = []
    plan = elastic_module.ElasticCache.plan

    def counting_plan(self, state, region):
        calls.clear()
        return plan(self, state, region)

    def fake_drift(past, now, track):
        calls.append(1)
        return torch.full((past.shape[0],), 1.0 if len(calls) == 1 else 0.0)

    monkeypatch.setattr(elastic_module.ElasticCache, "plan", counting_plan)
    monkeypatch.setattr(depth, "_drift", fake_drift)
    out = _run(llada, prompts=PROMPTS[:1], cache_options={"gamma": 0.5})
    st = out.cache_stats
    reuse = out.rows[0].nfe - 1
    assert reuse > 0
    assert st["refresh_from_layer"] == [0, reuse] and st["reused_all_layers"] == 0
    assert st["drift_mean"] == [1.0, 0.0] and st["drift_tests"] == [reuse, reuse]
    n_layers, t = 2, out.sequences.shape[1]
    assert st["slot_layers"] < out.nfe * t * n_layers  # layer 0 of the reuse steps computed only the query slots


def test_drift_is_the_cosine_of_attention_rows_over_keys():
    past = torch.tensor([[[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 1.0, 0.0]]]])  # [B=1, H=1, K=3, T=3]
    now = torch.tensor([[[[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]]])
    assert depth._drift(past, now, torch.tensor([[4, 7, 9]])).item() == pytest.approx(1 / 3)
    assert depth._drift(past, now, torch.tensor([[4, 7, 7]])).item() == pytest.approx(1 / 2)  # repeats are padding


def test_the_sliding_window_bounds_the_commits(llada):
    out = _run(llada, prompts=PROMPTS[:1], sampler="threshold", sampler_options={"threshold": 1e-9},
               cache_options={"window_length": 2, "gamma": -2.0}, gen_length=32, block_length=16)  # fmt: skip
    per_step = [s[0] for s in out.tokens_per_step]
    assert max(per_step[1:]) <= 2 and per_step[0] > 2  # the first (full) step commits a whole block


BAD = [
    ({"gamma": float("nan")}, "gamma must be a finite number"),
    ({"gamma": "x"}, "gamma"),
    ({"window_length": 0}, "window_length must be an integer >= 1"),
    ({"track_num": -1}, "track_num must be an integer >= 1"),
    ({"block_caching": "maybe"}, "block_caching expects true/false"),
    ({"beta": 16}, "beta"),
]


@pytest.mark.parametrize("opts,needle", BAD, ids=[b[1][:30] for b in BAD])
def test_bad_options_fail_before_any_work(opts, needle):
    with pytest.raises(ValueError, match=needle):
        get_cache("elastic", opts)


def test_bad_option_on_the_command_line_exits_2_before_the_weights(no_weights, capsys):  # noqa: F811
    line = cli_error(
        capsys, ["generate", str(no_weights), "--input-ids", "5,6", "--cache", "elastic", "--cache-opt", "gamma=x"]
    )
    assert "gamma" in line and "damaged" not in line
