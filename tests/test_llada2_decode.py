"""LLaDA2 token for token: ``dlm-decode generate DIR --input-ids ... --preset llada2|llada21 ... --json`` on tiny random
checkpoints in the reference format, against the re-statements of the reference ``generate()``
(``reference_llada2_generate``), float32, temperature 0, with and without the exact cache: the same tokens over the
reference's length (which ends at its first EOS) and no more forwards than the reference."""

from __future__ import annotations

import json

import pytest
import torch
from llada2_reference import EOS, MASK, write_llada2
from reference_llada2_generate import llada2_generate, llada21_generate

import dlm_decode
from dlm_decode.cli import main
from dlm_decode.models.loading import load_model

pytestmark = pytest.mark.usefixtures("one_thread")

MID = [1, 2, 3]  # ends mid-block
ON16 = list(range(3, 19))  # ends on a 16 boundary
ON32 = [(7 * i) % 60 + 2 for i in range(32)]  # ends on a 32 boundary


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """Seed 0 answers [1, 2, 3] with EOS at its third slot (B 16, threshold 0.5) and a 20-token prompt with EOS
    mid-answer (B 32): both an EOS mid-answer and answers that run to gen_length occur in the grid below."""
    path = write_llada2(tmp_path_factory.mktemp("llada2") / "m", seed=0)
    model, _ = load_model(path)
    return path, model


def _forward(model):
    return lambda ids, mask, pos: model(ids, attention_mask=mask, position_ids=pos).logits


def _cli(capsys, path, prompts, preset, args):
    argv = ["generate", str(path), "--preset", preset, "--json"]
    for p in prompts:
        argv += ["--input-ids", ",".join(map(str, p))]
    assert main(argv + args) == 0
    return json.loads(capsys.readouterr().out)


def _check(out, refs):
    for row, (ref, nfe) in zip(out["rows"], refs, strict=True):
        got = row["generated_ids"]
        assert got[: len(ref)] == ref
        if ref and ref[-1] == EOS:  # the answer ends at the first EOS; the slots after it are EOS fill
            assert set(got[len(ref) :]) <= {EOS}
        assert row["nfe"] <= nfe


LLADA2_GRID = [  # prompt, block, steps, threshold, gen
    (MID, 16, 8, 0.5, 40),  # EOS in the first block
    (MID, 32, 32, 0.95, 64),
    (ON16, 16, 16, 0.0, 33),  # everything in one forward per block; gen not a multiple of the block
    (ON16, 16, 8, 0.9, 48),
    (ON32, 32, 16, 0.7, 40),
    (list(range(3, 23)), 32, 32, 0.95, 64),  # EOS mid-answer
]


@pytest.mark.parametrize("cache", ["none", "prefix"])
def test_cli_llada2_equals_reference_one(ckpt, capsys, cache):
    path, model = ckpt
    prompt, b, s, t, g = LLADA2_GRID[0]
    ref = llada2_generate(
        _forward(model), prompt, gen_length=g, block_length=b, steps=s, threshold=t, mask_id=MASK, eos_id=EOS
    )
    args = ["--sampler-opt", f"threshold={t}", "--block-length", str(b), "--steps", str(s), "--gen-length", str(g)]
    _check(_cli(capsys, path, [prompt], "llada2", args + ["--cache", cache]), [ref])


@pytest.mark.slow
@pytest.mark.parametrize("case", LLADA2_GRID[1:], ids=lambda c: f"p{len(c[0])}-b{c[1]}-s{c[2]}-t{c[3]}-g{c[4]}")
def test_cli_llada2_equals_reference_grid(ckpt, capsys, case):
    path, model = ckpt
    prompt, b, s, t, g = case
    ref = llada2_generate(
        _forward(model), prompt, gen_length=g, block_length=b, steps=s, threshold=t, mask_id=MASK, eos_id=EOS
    )
    args = ["--sampler-opt", f"threshold={t}", "--block-length", str(b), "--steps", str(s), "--gen-length", str(g)]
    for cache in ("none", "prefix"):
        _check(_cli(capsys, path, [prompt], "llada2", args + ["--cache", cache]), [ref])


LLADA21_GRID = [  # prompt, block, threshold, editing threshold, max_post_steps, num_to_transfer, gen
    (MID, 16, 0.5, 0.6, 4, 1, 40),
    (MID, 16, 0.9, 0.5, 16, 2, 33),  # EOS mid-answer
    (ON16, 16, 0.5, 0.6, 4, 1, 40),
    (ON32, 32, 0.95, 0.9, 16, 1, 40),
]


@pytest.mark.parametrize(
    "case", [LLADA21_GRID[0], pytest.param(LLADA21_GRID[1], marks=pytest.mark.slow)], ids=["mid", "eos"]
)
def test_cli_llada21_equals_reference(ckpt, capsys, case):
    path, model = ckpt
    prompt, b, t, e, m, n, g = case
    ref = llada21_generate(
        _forward(model),
        prompt,
        gen_length=g,
        block_length=b,
        threshold=t,
        editing_threshold=e,
        max_post_steps=m,
        num_to_transfer=n,
        mask_id=MASK,
        eos_id=EOS,
    )
    args = [
        "--sampler-opt",
        f"threshold={t}",
        "--sampler-opt",
        f"editing_threshold={e}",
        "--sampler-opt",
        f"max_post_steps={m}",
        "--sampler-opt",
        f"num_to_transfer={n}",
        "--block-length",
        str(b),
        "--gen-length",
        str(g),
    ]
    for cache in ("none", "prefix"):
        _check(_cli(capsys, path, [prompt], "llada21", args + ["--cache", cache]), [ref])


@pytest.mark.slow
@pytest.mark.parametrize("case", LLADA21_GRID[2:], ids=["on16", "on32"])
def test_cli_llada21_equals_reference_grid(ckpt, capsys, case):
    test_cli_llada21_equals_reference(ckpt, capsys, case)


@pytest.mark.parametrize("preset", ["llada2", "llada21"])
def test_batch_of_two_gives_each_row_its_own_answer(ckpt, capsys, preset):
    """Prompts of different lengths (one ends mid-block, one on a boundary) in one call: each row equals the
    reference run alone, with the exact cache."""
    path, model = ckpt
    prompts, g, b = [MID, ON16], 40, 16
    if preset == "llada2":
        refs = [
            llada2_generate(
                _forward(model), p, gen_length=g, block_length=b, steps=8, threshold=0.5, mask_id=MASK, eos_id=EOS
            )
            for p in prompts
        ]
        args = ["--sampler-opt", "threshold=0.5", "--steps", "8"]
    else:
        refs = [
            llada21_generate(
                _forward(model),
                p,
                gen_length=g,
                block_length=b,
                threshold=0.5,
                editing_threshold=0.6,
                max_post_steps=4,
                mask_id=MASK,
                eos_id=EOS,
            )
            for p in prompts
        ]
        args = [
            "--sampler-opt",
            "threshold=0.5",
            "--sampler-opt",
            "editing_threshold=0.6",
            "--sampler-opt",
            "max_post_steps=4",
        ]
    out = _cli(capsys, path, prompts, preset, args + ["--block-length", str(b), "--gen-length", str(g)])
    _check(out, refs)
    assert out["cache"]["name"] == "prefix"  # the default on a block-causal model


def test_cached_decode_computes_less_with_the_same_forwards(ckpt):
    _, model = ckpt
    kw = dict(sampler="llada2", sampler_options={"threshold": 0.9}, gen_length=64, block_length=16, steps=16)
    none = dlm_decode.generate(model, [ON16], cache="none", **kw)
    exact = dlm_decode.generate(model, [ON16], cache="prefix", **kw)
    assert exact.rows[0].generated_ids == none.rows[0].generated_ids
    assert exact.nfe == none.nfe
    assert exact.token_forwards < 0.6 * none.token_forwards


@pytest.mark.parametrize("cache", ["dual", "window", "dkv_decode"])
def test_caches_without_a_block_causal_rule_fail_before_work(ckpt, capsys, cache):
    path, _ = ckpt
    assert main(["generate", str(path), "--input-ids", "1,2,3", "--preset", "llada2", "--cache", cache]) == 2
    assert "block-causal" in capsys.readouterr().err


def test_bad_token_editing_options(ckpt):
    _, model = ckpt
    for opts, needle in (({"editing_threshold": 1.5}, "editing_threshold"), ({"max_post_steps": -1}, "max_post")):
        with pytest.raises(ValueError, match=needle):
            dlm_decode.generate(model, [MID], sampler="token_editing", sampler_options=opts, gen_length=16)


def test_mask_id_proposals_never_committed(ckpt):
    """The canvas never holds MASK after a call, whatever the sampler (the reference could propose MASK)."""
    _, model = ckpt
    out = dlm_decode.generate(model, [MID], sampler="llada2", gen_length=16, block_length=16, steps=4)
    assert MASK not in out.rows[0].generated_ids
    assert torch.is_tensor(out.sequences)
