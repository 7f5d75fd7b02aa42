"""SDAR / TraDo token for token: ``dlm-decode generate DIR --input-ids ... --preset sdar --sampler-opt remasking=NAME
--sampler-opt threshold=T ... --seed S --cache prefix|none --json`` on tiny random checkpoints in the official format,
against the re-statement of the reference ``block_diffusion_generate`` (``reference_sdar_generate``) run on the
re-stated reference forward (``sdar_reference.ReferenceSDAR``) after ``torch.manual_seed(S)``: the same draws, so the
same tokens, over prompt lengths (mid-block, on a boundary, longer than a block), block sizes, steps, thresholds,
the three runnable strategies, temperature / top-k / top-p, and one forward fewer per finished block than the
reference with the exact cache."""

from __future__ import annotations

import json
import math

import pytest
import torch
from reference_sdar_generate import sdar_generate
from safetensors.torch import load_file
from sdar_reference import EOS, MASK, ReferenceSDAR, write_sdar

import dlm_decode
from dlm_decode.cli import main
from dlm_decode.models.loading import load_model
from dlm_decode.samplers.presets import get_preset

pytestmark = pytest.mark.usefixtures("one_thread")

MID = [5, 6, 7]  # ends mid-block
ON8 = list(range(2, 10))  # ends on an 8 (and 4) boundary
LONG = list(range(2, 13))  # a whole block of 8 and a partial one


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """MASK at logit 0 under a wide head (never drawn, as with trained checkpoints); EOS planted mid-answer for some
    of the runs below."""
    path = write_sdar(tmp_path_factory.mktemp("sdar") / "m", seed=0, head_scale=2.5, eos_scale=1.6)
    cfg = json.loads((path / "config.json").read_text())
    return path, ReferenceSDAR(cfg, load_file(str(path / "model.safetensors")))


def _reference(ref, prompt, case, only_masked=False):
    b, s, t, strategy, temp, k, p, seed, g = case
    torch.manual_seed(seed)
    return sdar_generate(
        ref,
        prompt,
        mask_id=MASK,
        gen_length=g,
        block_length=b,
        denoising_steps=s,
        temperature=temp,
        top_k=k,
        top_p=p,
        remasking_strategy=strategy,
        confidence_threshold=t,
        stop_ids=[EOS],
        only_masked=only_masked,
    )


def _cli(capsys, path, prompts, case, cache, preset="sdar"):
    b, s, t, strategy, temp, k, p, seed, g = case
    argv = ["generate", str(path), "--preset", preset, "--json", "--cache", cache]
    for row in prompts:
        argv += ["--input-ids", ",".join(map(str, row))]
    argv += ["--sampler-opt", f"remasking={strategy}", "--sampler-opt", f"threshold={t}"]
    argv += ["--block-length", str(b), "--steps", str(s), "--gen-length", str(g), "--temperature", str(temp)]
    argv += ["--top-k", str(k), "--top-p", str(p), "--seed", str(seed)]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _same(row, ref):
    got = row["generated_ids"]
    assert got[: len(ref.tokens)] == ref.tokens
    if ref.tokens and ref.tokens[-1] == EOS:  # the answer ends at the first EOS; the slots after it are EOS fill
        assert set(got[len(ref.tokens) :]) <= {EOS}


# block, steps, threshold, strategy, temperature, top_k, top_p, seed, gen: each runs where the reference departs from
# dlm_decode's rule in no way (checked), on each of the three prompts
GRID = [
    (4, 4, 0.9, "low_confidence_dynamic", 1.0, 0, 1.0, 0, 24),  # the published setting
    (4, 4, 0.9, "low_confidence_dynamic", 1.0, 0, 1.0, 3, 24),
    (8, 8, 0.5, "low_confidence_dynamic", 0.8, 0, 1.0, 1, 20),
    (8, 8, 0.3, "low_confidence_static", 1.0, 5, 1.0, 2, 20),
    (4, 2, 0.9, "sequential", 0.7, 0, 0.9, 4, 18),
    (8, 4, 0.9, "sequential", 1.3, 10, 0.8, 5, 17),
    (8, 8, 0.99, "low_confidence_dynamic", 1.0, 1, 1.0, 6, 20),  # top-k 1: the argmax at confidence 1
    (8, 8, 1.0, "low_confidence_static", 1.0, 1, 1.0, 7, 20),  # confidence ties: torch.topk's order
]


@pytest.mark.parametrize("prompt", [MID, ON8, LONG], ids=["mid", "on8", "long"])
@pytest.mark.parametrize("case", GRID, ids=lambda c: f"b{c[0]}-s{c[1]}-{c[3][:15]}-t{c[4]}-k{c[5]}-p{c[6]}-seed{c[7]}")
def test_cli_equals_reference_draw_for_draw(ckpt, capsys, prompt, case):
    path, ref_model = ckpt
    ref = _reference(ref_model, prompt, case)
    assert ref.departs == set()  # the case is one where the reference's rule is ours
    for cache in ("prefix", "none"):
        row = _cli(capsys, path, [prompt], case, cache)["rows"][0]
        _same(row, ref)
        assert row["nfe"] == ref.nfe - ref.stores  # the reference's extra forwards are its cache writes alone


def test_eos_stops_after_its_block(ckpt, capsys):
    """At least one grid run ends at a planted EOS before gen_length, and our answer stops there too."""
    path, ref_model = ckpt
    case = GRID[0]
    stopped = [p for p in (MID, ON8, LONG) if _reference(ref_model, p, case).tokens[-1:] == [EOS]]
    assert stopped, "no EOS answer: the planted EOS row no longer triggers; re-plant it"
    ref = _reference(ref_model, stopped[0], case)
    assert len(ref.tokens) < case[-1]
    row = _cli(capsys, path, [stopped[0]], case, "prefix")["rows"][0]
    _same(row, ref)
    assert row["generated_ids"][len(ref.tokens) :] == [EOS] * (case[-1] - len(ref.tokens))


# cases where the reference's top-k asks for more slots than are masked and overwrites decoded / prompt slots
DEPARTING = [
    (MID, (8, 4, 0.9, "low_confidence_static", 1.0, 0, 1.0, 0, 20)),  # the prompt fills part of the first block
    (ON8, (8, 3, 0.6, "low_confidence_dynamic", 1.2, 0, 0.95, 0, 20)),  # a dynamic step committed extra earlier
]


@pytest.mark.parametrize("prompt, case", DEPARTING, ids=["static-partial-block", "dynamic-steps-lt-block"])
def test_overwrite_departure_is_the_documented_one(ckpt, capsys, prompt, case):
    """Where the reference overwrites non-masked slots, our tokens are its tokens with top-k kept to the masks."""
    path, ref_model = ckpt
    faithful = _reference(ref_model, prompt, case)
    assert faithful.departs == {"overwrite"}
    fixed = _reference(ref_model, prompt, case, only_masked=True)
    assert "mask" not in fixed.departs
    row = _cli(capsys, path, [prompt], case, "prefix")["rows"][0]
    _same(row, fixed)


def test_temperature_zero_is_the_top_k_one_decode(ckpt, capsys):
    """Temperature 0 (undefined in the reference) is its limit: the reference's top-k 1 tokens, without draws."""
    path, ref_model = ckpt
    case = (4, 4, 0.9, "low_confidence_dynamic", 1.0, 1, 1.0, 0, 24)
    ref = _reference(ref_model, LONG, case)
    for seed in (0, 9):
        greedy = (4, 4, 0.9, "low_confidence_dynamic", 0.0, 0, 1.0, seed, 24)
        _same(_cli(capsys, path, [LONG], greedy, "prefix")["rows"][0], ref)


@pytest.mark.parametrize(
    "case",
    [
        (4, 4, 0.9, "low_confidence_dynamic", 1.0, 1, 1.0, 0, 24),  # top-k 1
        (4, 4, 0.9, "low_confidence_dynamic", 1.0, 0, 1.0, 3, 24),  # seeded sampling, the published setting
        (8, 8, 0.5, "low_confidence_dynamic", 0.8, 0, 1.0, 1, 20),
        (8, 4, 0.9, "sequential", 1.3, 10, 0.8, 5, 17),
    ],
    ids=["topk1", "seeded-b4", "seeded-b8", "sequential"],
)
def test_batch_rows_equal_their_reference_alone(ckpt, capsys, case):
    """Prompts of three lengths in one call (left padding, each row on its own grid, its own generator): each row
    equals the reference run alone after ``torch.manual_seed(seed)``; rows stop after their own EOS block."""
    path, ref_model = ckpt
    refs = [_reference(ref_model, p, case) for p in (MID, ON8, LONG)]
    assert all(r.departs == set() for r in refs)
    for cache in ("prefix", "none"):
        out = _cli(capsys, path, [MID, ON8, LONG], case, cache)
        for row, ref in zip(out["rows"], refs, strict=True):
            _same(row, ref)


def test_cached_decode_computes_less_with_the_same_tokens(tmp_path):
    model, _ = load_model(write_sdar(tmp_path / "m", seed=0, head_scale=2.5, eos_token_id=None))  # no EOS stop
    kw = dict(sampler="sdar", sampler_options={"threshold": 0.9}, gen_length=32, block_length=8, steps=8)
    kw |= dict(temperature=1.0, seed=11)
    none = dlm_decode.generate(model, [LONG], cache="none", **kw)
    exact = dlm_decode.generate(model, [LONG], cache="prefix", **kw)
    assert exact.rows[0].generated_ids == none.rows[0].generated_ids
    assert exact.nfe == none.nfe
    assert exact.token_forwards < 0.6 * none.token_forwards


def test_trado_preset_and_published_settings():
    for name in ("sdar", "trado"):
        p = get_preset(name)
        assert (p.sampler, p.options, p.config) == (
            "sdar",
            {"remasking": "low_confidence_dynamic", "threshold": 0.9},
            {"block_length": 4, "steps": 4},
        )


@pytest.mark.parametrize(
    "opt, needle",
    [
        ("remasking=entropy_bounded", "transfer_index"),
        ("remasking=random", "unknown remasking"),
        ("threshold=1.5", "threshold"),
    ],
)
def test_bad_options_refused_before_work(ckpt, capsys, opt, needle):
    path, _ = ckpt
    argv = ["generate", str(path), "--input-ids", "1,2,3", "--preset", "sdar", "--sampler-opt", opt]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_mask_is_never_committed(ckpt):
    """A checkpoint whose head favours MASK (lm_head row not zeroed) still never gets MASK in its answer."""
    path, _ = ckpt
    model, _ = load_model(path)
    with torch.no_grad():
        model.lm_head.weight[MASK] = model.lm_head.weight[EOS + 2] * 3.0
    for k in (0, 1):
        out = dlm_decode.generate(
            model, [MID], sampler="sdar", gen_length=16, block_length=4, steps=4, temperature=1.0, top_k=k, seed=1
        )
        assert MASK not in out.rows[0].generated_ids


def test_lm_eval_plugin_takes_an_sdar_checkpoint(tmp_path):
    """generate_until gives the text of ``dlm_decode.generate``'s tokens under the same options (the plugin's own
    decode), and loglikelihood the block ELBO (finite, negative), with the mask id taken from the
    tokenizer when config.json has none (``generate.py``'s fallback)."""
    from checkpoints import write_tokenizer
    from lm_eval.api.instance import Instance

    from dlm_decode.eval.lm import DLMDecodeLM

    path = write_sdar(tmp_path / "m", seed=0, head_scale=2.5)
    cfg = json.loads((path / "config.json").read_text())
    del cfg["mask_token_id"]
    (path / "config.json").write_text(json.dumps(cfg))
    write_tokenizer(path)
    opts = dict(sampler="sdar", gen_length=8, block_length=4, steps=4, temperature=1.0, seed=2, cache="prefix")
    lm = DLMDecodeLM(pretrained=str(path), mc_num=8, progress=False, device="cpu", greedy_check=False, **opts)
    assert lm.model.mask_token_id == MASK
    req = Instance("generate_until", {}, ("w7 w8 w9", {"until": ["never"]}), 0, ("t", 0, 1))
    (text,) = lm.generate_until([req])
    ids = lm.tokenizer("w7 w8 w9")["input_ids"]
    kw = {k: v for k, v in opts.items() if k != "sampler"}
    direct = dlm_decode.generate(lm.model, [ids], tokenizer=lm.tokenizer, sampler="sdar", **kw).rows[0].text
    assert text == direct and text.strip()
    # likelihoods take no sampler and no cache (the plugin refuses them there): a second instance without them
    plain = DLMDecodeLM(pretrained=str(path), mc_num=8, progress=False, device="cpu", gen_length=8, block_length=4)
    lls = plain.loglikelihood([Instance("loglikelihood", {}, ("w7 w8", f" w{i}"), 0, ("t", i, 1)) for i in (9, 30)])
    assert all(math.isfinite(ll) and ll < 0 for ll, _ in lls)


@pytest.mark.parametrize("case", [GRID[1], GRID[4]], ids=["seeded-dynamic", "sequential-topp"])
def test_sdar_moe_cli_equals_reference(tmp_path, capsys, case):
    """SDAR-30B-A3B's format (``sdar_moe``: Qwen3-MoE feed-forwards) decodes like SDAR: the reference's tokens."""
    path = write_sdar(tmp_path / "m", seed=1, head_scale=2.5, moe=True)
    ref_model = ReferenceSDAR(
        json.loads((path / "config.json").read_text()), load_file(str(path / "model.safetensors"))
    )
    for prompt in (MID, LONG):
        ref = _reference(ref_model, prompt, case)
        assert ref.departs == set()
        for cache in ("prefix", "none"):
            row = _cli(capsys, path, [prompt], case, cache)["rows"][0]
            _same(row, ref)
            assert row["nfe"] == ref.nfe - ref.stores


def test_strategies_on_hand_built_confidences():
    """``choose`` on known confidences: strict threshold, the count fallback, the count clipped to the masks, the
    leftmost masks for sequential, torch.topk's order."""
    from dlm_decode.samplers.sdar import choose, schedule

    assert schedule(8, 3) == [3, 3, 2] and schedule(4, 4) == [1, 1, 1, 1] and schedule(4, 6) == [1, 1, 1, 1, 0, 0]
    conf = torch.tensor([[0.95, 0.9, 0.2, 0.91, 0.5, 0.99]])
    cand = torch.tensor([[False, True, True, True, True, True]])  # slot 0: decoded (its 0.95 is never read)
    rows = lambda m: m[0].nonzero()[:, 0].tolist()  # noqa: E731
    assert rows(choose("low_confidence_dynamic", conf, cand, 2, 0.9)) == [3, 5]  # 0.9 is not > 0.9
    assert rows(choose("low_confidence_dynamic", conf, cand, 3, 0.9)) == [1, 3, 5]  # 2 over it < 3: the top 3
    assert rows(choose("low_confidence_dynamic", conf, cand, 1, 0.0)) == [1, 2, 3, 4, 5]  # every mask over 0
    assert rows(choose("low_confidence_static", conf, cand, 2, 0.0)) == [3, 5]
    assert rows(choose("low_confidence_static", conf, cand, 6, 0.0)) == [1, 2, 3, 4, 5]  # never a decoded slot
    assert rows(choose("sequential", conf, cand, 2, 0.0)) == [1, 2]
    assert rows(choose("low_confidence_static", conf, cand, 0, 0.0)) == []
