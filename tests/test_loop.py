"""The decode loop: input checks, statistics, EOS stop, non-finite rows, guidance, bounded steps."""

from __future__ import annotations

import pytest
import torch
from fake import ScriptedModel, peaked, table_model

import dlm_decode
from dlm_decode.core.config import DecodeConfig


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(sampler="nope"), "valid samplers: .*low_confidence"),
        (dict(cache="nope"), "valid caches: .*none"),
        (dict(sampler="low_confidence", sampler_options={"x": "1"}), "has no option"),
        (dict(gen_length=12, block_length=8), "multiple of block_length"),
        (dict(gen_length=8, block_length=16), "block_length .* must be <= gen_length"),
        (dict(gen_length=16, block_length=8, steps=3), "multiple of the number of blocks"),
        (dict(gen_length=16, block_length=8, steps=32), "must be <= gen_length"),
        (dict(gen_length=0), "gen_length must be a positive integer"),
        (dict(steps=0), "steps must be a positive integer"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k must be an integer >= 0"),
        (dict(top_k=2.5), "top_k"),
        # a bool is no length, a string no number (they used to pass as 1, or fail deep in the loop)
        (dict(gen_length=True), "gen_length must be a positive integer, got True"),
        (dict(block_length=True), "block_length must be a positive integer or None, got True"),
        (dict(steps=True), "steps must be a positive integer or None, got True"),
        (dict(top_p="0.5"), r"top_p must be in \(0, 1\], got '0.5'"),
        (dict(temperature=True), "temperature must be a finite number >= 0, got True"),
        (dict(cfg_scale="1"), "cfg_scale must be >= 0, got '1'"),
        (dict(seed=1.5), "seed must be an integer or None, got 1.5"),
        (dict(stop_at_eos="yes"), "stop_at_eos must be True or False, got 'yes'"),
    ],
)
def test_bad_decoding_arguments_fail_before_work(llada, kwargs, match):
    calls = []
    llada.register_forward_pre_hook(lambda *a: calls.append(1))
    with pytest.raises(ValueError, match=match):
        dlm_decode.generate(llada, [[5, 6, 7]], **kwargs)
    assert not calls


def test_bad_prompts_fail_before_work(llada):
    mask = llada.mask_token_id
    with pytest.raises(ValueError, match="empty batch"):
        dlm_decode.generate(llada, [])
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        dlm_decode.generate(llada, [[4], []])
    with pytest.raises(ValueError, match=f"contains the MASK id {mask} at position 1"):
        dlm_decode.generate(llada, [[4, mask, 5]])
    with pytest.raises(ValueError, match="maximum sequence length 256"):
        dlm_decode.generate(llada, [[4] * 250], gen_length=16, block_length=8)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        dlm_decode.generate(llada, [[4, 9999]])
    with pytest.raises(ValueError, match="no tokenizer"):
        dlm_decode.generate(llada, ["hello"])
    with pytest.raises(ValueError, match="not a single string"):
        dlm_decode.generate(llada, "hello")
    # token ids as a float or bool tensor: refused, not truncated (int(5.7) would have been 5)
    with pytest.raises(ValueError, match="input_ids tensor must hold integer token ids, got dtype float32"):
        dlm_decode.generate(llada, torch.tensor([[4.0, 5.7]]))
    with pytest.raises(ValueError, match="prompt 1 must hold integer token ids, got dtype bool"):
        dlm_decode.generate(llada, [torch.tensor([4, 5]), torch.tensor([True, False])])


def test_statistics_are_consistent(llada):
    out = dlm_decode.generate(llada, [[5, 6, 7], [8, 9]], gen_length=16, block_length=8, steps=8, trace=True)
    assert out.nfe == 8 and len(out.tokens_per_step) == 8
    assert out.committed_tokens() == 32
    assert [r.nfe for r in out.rows] == [8, 8]
    assert out.token_forwards == 8 * 2 * out.sequences.shape[1]  # no cache: every slot of every row, every step
    assert out.trace.shape == (2, 16) and set(out.trace.unique().tolist()) == set(range(8))
    assert out.cache_bytes == 0 and out.seconds > 0
    js = out.to_json()
    assert js["nfe"] == 8 and len(js["rows"][0]["generated_ids"]) == 16 and js["sampler"]["name"] == "low_confidence"


def test_stop_at_eos_fills_the_rest_and_saves_steps():
    # slot 0 -> token 5 (sure), slot 1 -> EOS (sure), later slots unsure
    confs = [0.99, 0.98] + [0.3] * 6
    model = table_model(confs, tokens=[5, 1] + [7] * 6)
    full = dlm_decode.generate(model, [[3, 4]], gen_length=8, block_length=8, steps=8)
    stopped = dlm_decode.generate(model, [[3, 4]], gen_length=8, block_length=8, steps=8, stop_at_eos=True)
    assert full.rows[0].generated_ids == [5, 1] + [7] * 6
    assert stopped.rows[0].generated_ids == [5, 1] + [1] * 6
    assert stopped.nfe == 2 and full.nfe == 8


def test_nonfinite_logits_stop_only_that_row():
    def fn(canvas, step):
        out = torch.zeros(canvas.shape[0], canvas.shape[1], 16)
        out[:, :] = peaked(4, 0.9)
        out[canvas[:, 0] == 5, :, 3] = float("nan")  # the second row's (by content: a forward may skip idle rows)
        return out

    out = dlm_decode.generate(ScriptedModel(fn), [[3, 4], [5, 6]], gen_length=4, block_length=4, steps=4)
    assert out.rows[0].error is None and out.rows[0].generated_ids == [4, 4, 4, 4]
    assert "non-finite logits" in out.rows[1].error


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), 3.3e38])
def test_nonfinite_check_flags_nan_and_inf_at_candidates_but_not_huge_finite_logits(bad):
    """``fail_nonfinite`` (a float64 sum per slot): NaN, +inf and -inf at a candidate slot stop the row; a row whose
    logits are all finite but sum past float32's range (3.3e38 x 4) does not; a non-finite non-candidate is ignored."""
    from types import SimpleNamespace

    from dlm_decode.decode.commit import fail_nonfinite

    logits = torch.zeros(3, 2, 4)
    logits[0, 1, 2] = bad  # row 0: at a candidate
    logits[1, 0, 2] = bad  # row 1: at a slot that is not a candidate
    logits[2] = 3.3e38  # row 2: huge, finite
    cand = torch.tensor([[False, True], [False, True], [True, True]])
    stats = SimpleNamespace(fail_step=torch.full((3,), -1), fail_block=torch.full((3,), -1))
    state = SimpleNamespace(stats=stats, step=7, block_index=2, finished=torch.zeros(3, dtype=torch.bool))
    fail_nonfinite(state, logits, cand)
    huge_only = bad == 3.3e38
    assert state.finished.tolist() == [not huge_only, False, False]
    assert stats.fail_step.tolist() == [-1 if huge_only else 7, -1, -1]
    assert stats.fail_block.tolist() == [-1 if huge_only else 2, -1, -1]


def test_mask_is_never_written_even_if_predicted():
    def fn(canvas, step):
        out = torch.zeros(canvas.shape[0], canvas.shape[1], 16)
        out[:, :] = peaked(15, 0.9)  # the model's favourite is MASK (id 15)
        out[:, :, 6] = out[:, :, 6] + 1.0
        return out

    out = dlm_decode.generate(ScriptedModel(fn), [[3, 4]], gen_length=4, block_length=4, steps=2)
    assert out.rows[0].generated_ids == [6, 6, 6, 6]


def test_classifier_free_guidance_combines_conditional_and_unconditional():
    seen = []

    def fn(canvas, step):
        seen.append(canvas.clone())
        out = torch.zeros(canvas.shape[0], canvas.shape[1], 16)
        out[:, :, 5] = 1.0
        out[canvas.shape[0] // 2 :, :, 5] = 2.0  # the unconditional half prefers token 5 more
        out[: canvas.shape[0] // 2, :, 6] = 1.5  # the conditional half prefers token 6
        return out

    cfg = dlm_decode.generate(ScriptedModel(fn), [[3, 4]], gen_length=2, block_length=2, steps=2, cfg_scale=1.0)
    # guided: un + 2 * (cond - un): token 5 -> 2 + 2 * (1 - 2) = 0; token 6 -> 0 + 2 * 1.5 = 3
    assert cfg.rows[0].generated_ids == [6, 6]
    assert seen[0].shape[0] == 2 and (seen[0][1, :2] == 15).all() and seen[0][0, :2].tolist() == [3, 4]


def test_config_object_and_keywords_agree(llada):
    a = dlm_decode.generate(llada, [[5, 6]], config=DecodeConfig(gen_length=8, block_length=4, steps=8))
    b = dlm_decode.generate(llada, [[5, 6]], gen_length=8, block_length=4, steps=8)
    assert torch.equal(a.sequences, b.sequences)


def test_end_of_turn_tokens_count_as_eos(llada, tmp_path):
    from checkpoints import EOS, EOT, write_tokenizer
    from transformers import AutoTokenizer

    from dlm_decode.decode.prepare import eos_ids

    write_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert eos_ids(llada, None) == [EOS]
    assert eos_ids(llada, tok) == sorted({EOS, EOT})


def test_numpy_scalars_are_taken_as_python_numbers(llada):
    np = pytest.importorskip("numpy")
    cfg = DecodeConfig(gen_length=np.int64(16), block_length=np.int32(8), temperature=np.float32(0.5), seed=np.int64(3))
    assert (cfg.gen_length, cfg.block_length, cfg.seed) == (16, 8, 3) and type(cfg.gen_length) is int
    assert cfg.temperature == 0.5 and type(cfg.temperature) is float
    out = dlm_decode.generate(llada, [[5, 6, 7]], gen_length=np.int64(16), block_length=np.int64(8), steps=np.int64(8))
    assert out.sequences.shape == (1, 3 + 16) and out.nfe == 8
    with pytest.raises(ValueError, match="gen_length must be a positive integer, got np.True_"):
        DecodeConfig(gen_length=np.bool_(True))
    with pytest.raises(ValueError, match="gen_length must be a positive integer"):
        DecodeConfig(gen_length=np.float64(16.0))
