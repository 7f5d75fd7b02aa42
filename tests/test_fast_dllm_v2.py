"""Fast-dLLM v2 (``model_type: Fast_dLLM_Qwen``) on tiny random checkpoints in the published format, float32: the
model against the re-stated reference forward (``fast_dllm_v2_reference.ReferenceFastDLLM``), the ``fast_dllm_v2``
decode against the re-stated ``batch_sample`` token for token (temperature 0) over prompt lengths (inside the first
block, mid-block after whole prompt blocks, on a block boundary), thresholds (0.5, the preset's 0.9, the evaluation
scripts' 1.0), sub-block sizes, caches and batches; the approximate sub-block cache against
``batch_sample(use_block_cache=True)``; each row of a ``generate`` batch and each request through the
engine equal to ``generate`` of it alone; stop tokens; the CLI with ``--preset fast_dllm_v2``; bad configs and options
refused before any weight is read."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from fast_dllm_v2_reference import MASK, STOP, ReferenceFastDLLM, batch_sample, write_fdllm
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModel

import dlm_decode
from dlm_decode.cache.sub_block import SubBlockCache
from dlm_decode.cli import main
from dlm_decode.models.fast_dllm_v2 import FastDLLMV2ForCausalLM
from dlm_decode.models.loading import load_model
from dlm_decode.samplers.presets import get_preset

pytestmark = pytest.mark.usefixtures("one_thread")

B, SMALL = 8, 4  # the tiny grid: block 8 in sub-blocks of 4 (the published 32 / 8 scaled down)


def _ref(path) -> ReferenceFastDLLM:
    return ReferenceFastDLLM(json.loads((path / "config.json").read_text()), load_file(str(path / "model.safetensors")))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = write_fdllm(tmp_path_factory.mktemp("fdllm") / "m", seed=0)
    model, _ = load_model(path)
    return path, model, _ref(path)


@pytest.fixture(scope="module")
def stopper(tmp_path_factory):
    """The stop token's output row scaled up: answers hold stop tokens mid-block."""
    path = write_fdllm(tmp_path_factory.mktemp("fdllm_stop") / "m", seed=1, stop_scale=1.6)
    model, _ = load_model(path)
    return path, model, _ref(path)


def _prompt(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, MASK, (1, n), generator=torch.Generator().manual_seed(seed))


def _gen(p: int, blocks: int) -> int:
    """The gen length that ends where ``batch_sample``'s last block ends (its ``max_new_tokens // B`` blocks)."""
    return (p // B + blocks) * B - p


def _answer(tokens: list[int], n: int) -> list[int]:
    """Up to and including the first stop token, else the first n."""
    return tokens[: tokens.index(STOP) + 1] if STOP in tokens[:n] else tokens[:n]


def _ours(model, prompts, threshold, small=SMALL, cache="prefix", gen=None):
    out = dlm_decode.generate(
        model,
        prompts,
        sampler="fast_dllm_v2",
        sampler_options={"threshold": threshold, "small_block_size": small},
        block_length=B,
        gen_length=gen,
        cache=cache,
    )
    return out, [r.generated_ids for r in out.rows]


def test_logits_equal_reference_and_the_mask_matters(ckpt):
    _, model, ref = ckpt
    ids = torch.randint(0, MASK + 1, (2, 21), generator=torch.Generator().manual_seed(1))
    full = ref(ids, [], False, B)
    assert (model(ids).logits - full).abs().max() < 1e-4  # block_length defaults to config.json's bd_size (8)
    assert (model(ids, block_length=4).logits - full).abs().max() > 1e-2
    cache: list = []
    ref(ids[:, :16], cache, True, B)  # the reference's cache protocol gives the same block logits
    assert (ref(ids[:, 16:], cache, False, B) - full[:, 16:]).abs().max() < 1e-4


def test_auto_classes_and_official_names(ckpt):
    path, model, _ = ckpt
    assert type(AutoModel.from_pretrained(path)) is FastDLLMV2ForCausalLM
    assert AutoConfig.from_pretrained(path).model_type == "Fast_dLLM_Qwen"
    names = set(model.state_dict())
    assert set(load_file(str(path / "model.safetensors"))) == names
    assert "model.layers.0.self_attn.q_proj.bias" in names and "model.layers.0.self_attn.o_proj.bias" not in names
    assert model.logit_shift == 1 and model.block_causal and model.mask_token_id == MASK


@pytest.mark.parametrize("p", [3, 5, 9, 12, 16, 19, 24], ids=lambda p: f"prompt{p}")
@pytest.mark.parametrize("threshold", [0.5, 0.9, 1.0])
def test_equals_reference_batch_sample(ckpt, p, threshold):
    """16 and 24 end on a block boundary: the first slot of the next block comes from the prefill's last logit."""
    _, model, ref = ckpt
    prompt, gen = _prompt(p, p), _gen(p, 3)
    ref.calls = 0
    want = batch_sample(ref, prompt, block_size=B, small_block_size=SMALL, max_new_tokens=3 * B, threshold=threshold)
    out, got = _ours(model, prompt, threshold, gen=gen)
    assert _answer(got[0], gen) == _answer(want[0], gen)
    # the reference's forward that writes a finished block (and gives the next block's first slot) is our next
    # block's first forward; ours saves its prefill off a block boundary and the write after the last block (which
    # it skips once the row has stopped)
    assert out.nfe == ref.calls - (p > B and p % B != 0) - (STOP not in want[0][:gen])


@pytest.mark.parametrize("small", [1, 2, 8])
def test_sub_block_sizes_and_no_cache(ckpt, small):
    _, model, ref = ckpt
    prompt, gen = _prompt(11, 7), _gen(11, 2)
    want = batch_sample(ref, prompt, block_size=B, small_block_size=small, max_new_tokens=2 * B, threshold=0.9)
    for cache in ("prefix", "none"):
        assert _answer(_ours(model, prompt, 0.9, small, cache, gen)[1][0], gen) == _answer(want[0], gen)


def test_stop_token_ends_the_row_as_the_reference(stopper):
    _, model, ref = stopper
    stops = 0
    for p in (4, 10, 16):
        prompt, gen = _prompt(p, 100 + p), _gen(p, 4)
        want = batch_sample(ref, prompt, block_size=B, small_block_size=SMALL, max_new_tokens=4 * B, threshold=0.9)
        got = _ours(model, prompt, 0.9, gen=gen)[1][0]
        assert _answer(got, gen) == _answer(want[0], gen)
        if STOP in want[0]:
            stops += 1
            k = want[0].index(STOP)
            assert set(got[k:]) == {STOP}  # after the first stop token: the fill (the reference's pad)
    assert stops >= 2  # the planted stop token does end answers


def test_reference_batch_rows_and_our_batches_equal_each_row_alone(ckpt):
    """``batch_sample`` over rows of one length equals each row alone; our batches of mixed lengths (left-padded
    onto their own grids) and the engine give each row what ``generate`` gives it alone."""
    _, model, ref = ckpt
    same = torch.cat([_prompt(10, s) for s in (1, 2, 3)])
    together = batch_sample(ref, same, block_size=B, small_block_size=SMALL, max_new_tokens=2 * B, threshold=0.9)
    gen = _gen(10, 2)
    for row, want in zip(same, together, strict=True):
        assert _answer(want, gen) == _answer(batch_sample(ref, row[None], block_size=B, small_block_size=SMALL,
                                                          max_new_tokens=2 * B, threshold=0.9)[0], gen)  # fmt: skip
        assert _answer(_ours(model, row[None], 0.9, gen=gen)[1][0], gen) == _answer(want, gen)
    prompts = [_prompt(n, n).tolist()[0] for n in (3, 8, 13, 16)]
    alone = [_ours(model, [q], 0.9, gen=20)[1][0] for q in prompts]
    assert _ours(model, prompts, 0.9, gen=20)[1] == alone
    eng = dlm_decode.Engine(model, max_batch=3)
    opts = {"sampler": "fast_dllm_v2", "sampler_options": {"threshold": 0.9, "small_block_size": SMALL}}
    handles = [eng.submit(q, block_length=B, gen_length=20, cache="prefix", **opts) for q in prompts]
    eng.run_until_done()
    assert [h.result().generated_ids for h in handles] == alone


def test_cli_preset(ckpt, capsys):
    path, model, ref = ckpt
    preset = get_preset("fast_dllm_v2")
    assert preset.options == {"threshold": 0.9, "small_block_size": 8} and preset.config == {"block_length": 32}
    prompt = _prompt(5, 5)
    argv = ["generate", str(path), "--input-ids", ",".join(map(str, prompt[0].tolist())), "--preset", "fast_dllm_v2"]
    argv += ["--block-length", str(B), "--sampler-opt", f"small_block_size={SMALL}", "--gen-length", "11", "--json"]
    assert main(argv) == 0
    got = json.loads(capsys.readouterr().out)["rows"][0]["generated_ids"]
    want = batch_sample(ref, prompt, block_size=B, small_block_size=SMALL, max_new_tokens=2 * B, threshold=0.9)[0]
    assert _answer(got, 11) == _answer(want, 11)
    assert main(["generate", str(path), "--input-ids", "5,6,7", "--preset", "fast_dllm_v2", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["rows"][0]["generated_ids"]) > 0


@pytest.mark.parametrize(
    ("over", "needle"),
    [
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"bd_size": 0}, "bd_size"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"mask_token_id": 64}, "mask_token_id"),
        ({"hidden_size": None}, "hidden_size"),
    ],
)
def test_bad_config_refused_before_weights(tmp_path, capsys, over, needle):
    path = write_fdllm(tmp_path / "m", seed=0)
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(over)
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "model.safetensors").write_bytes(b"not a safetensors file")  # never reached
    with pytest.raises(ValueError, match=needle):
        load_model(path)
    assert main(["generate", str(path), "--input-ids", "5,6", "--preset", "fast_dllm_v2", "--json"]) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize(
    ("opt", "needle"),
    [("threshold=1.5", "threshold"), ("small_block_size=0", "small_block_size"), ("small_block_size=3", "multiple")],
)
def test_bad_options_refused(ckpt, capsys, opt, needle):
    path = ckpt[0]
    argv = ["generate", str(path), "--input-ids", "5,6", "--preset", "fast_dllm_v2", "--block-length", "8"]
    assert main([*argv, "--sampler-opt", opt, "--json"]) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("p", [3, 9, 16, 19], ids=lambda p: f"prompt{p}")
@pytest.mark.parametrize("threshold", [0.5, 0.9, 1.0])
def test_sub_block_cache_equals_reference_use_block_cache(ckpt, p, threshold):
    """``cache=SubBlockCache()`` against ``batch_sample(use_block_cache=True)``: the same (approximate) tokens."""
    _, model, ref = ckpt
    prompt, gen = _prompt(p, p), _gen(p, 3)
    kw = {"block_size": B, "small_block_size": SMALL, "max_new_tokens": 3 * B, "threshold": threshold}
    want = batch_sample(ref, prompt, use_block_cache=True, **kw)
    out, got = _ours(model, prompt, threshold, cache=SubBlockCache(), gen=gen)
    assert _answer(got[0], gen) == _answer(want[0], gen)
    exact, _ = _ours(model, prompt, threshold, gen=gen)
    assert out.token_forwards < exact.token_forwards  # the sub-block steps compute a sub-block, not the block


def test_sub_block_cache_is_approximate_and_rows_decode_alone(ckpt):
    _, model, ref = ckpt
    kw = {"block_size": B, "small_block_size": SMALL, "max_new_tokens": 3 * B, "threshold": 0.9}
    differ = 0
    for p in (3, 5, 9, 16):
        prompt, gen = _prompt(p, p), _gen(p, 3)
        approx = batch_sample(ref, prompt, use_block_cache=True, **kw)[0]
        differ += _answer(approx, gen) != _answer(batch_sample(ref, prompt, **kw)[0], gen)
    assert differ >= 2  # the stale block keys change tokens on these random checkpoints (the reference's too)
    prompts = [_prompt(n, n).tolist()[0] for n in (3, 8, 13, 16)]
    alone = [_ours(model, [q], 0.9, cache=SubBlockCache(), gen=20)[1][0] for q in prompts]
    assert _ours(model, prompts, 0.9, cache=SubBlockCache(), gen=20)[1] == alone
    eng = dlm_decode.Engine(model, max_batch=3)
    opts = {"sampler": "fast_dllm_v2", "sampler_options": {"threshold": 0.9, "small_block_size": SMALL}}
    handles = [eng.submit(q, block_length=B, gen_length=20, cache=SubBlockCache(), **opts) for q in prompts]
    eng.run_until_done()
    assert [h.result().generated_ids for h in handles] == alone


def test_sub_block_cache_refused_elsewhere(ckpt, llada_dir):
    model = ckpt[1]
    with pytest.raises(ValueError, match="fast_dllm_v2 sampler only"):
        dlm_decode.generate(model, [[5, 6]], sampler="llada2", cache=SubBlockCache(), gen_length=8)
    llada = load_model(llada_dir)[0]
    with pytest.raises(ValueError, match="applies to block-causal models decoded with the fast_dllm_v2 sampler"):
        dlm_decode.generate(llada, [[5, 6]], sampler="fast_dllm_v2", cache=SubBlockCache(), gen_length=8)


@pytest.mark.parametrize("p", [5, 12], ids=lambda p: f"prompt{p}")
def test_cli_cache_sub_block_equals_the_python_api(ckpt, capsys, p):
    """``--cache sub_block`` (registered as ``sub_block``) gives ``cache=SubBlockCache()``'s tokens and forwards,
    which are the reference's ``use_block_cache`` ones (above) and, here, not the exact cache's."""
    path, model, _ = ckpt
    prompts = [_prompt(p, p)[0].tolist(), _prompt(p + 3, p + 1)[0].tolist()]
    gen = _gen(p, 3)
    argv = ["generate", str(path), "--preset", "fast_dllm_v2", "--block-length", str(B), "--sampler-opt",
            f"small_block_size={SMALL}", "--gen-length", str(gen), "--cache", "sub_block", "--json"]  # fmt: skip
    for row in prompts:
        argv += ["--input-ids", ",".join(map(str, row))]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    api, ids = _ours(model, prompts, 0.9, cache=SubBlockCache(), gen=gen)
    assert [r["generated_ids"] for r in out["rows"]] == ids
    assert [r["nfe"] for r in out["rows"]] == [r.nfe for r in api.rows]
    assert out["cache"]["name"] == "sub_block"
    exact = _ours(model, prompts, 0.9, gen=gen)[0]
    assert api.token_forwards < exact.token_forwards


def test_cli_cache_sub_block_refused_on_llada_before_weights(llada_dir, tmp_path, capsys):
    """A bidirectional checkpoint whose weights are garbage (an error after reading them would be the damaged-file
    one): exit 2 with one line naming the cache, what it applies to and the model type."""
    bad = tmp_path / "llada"
    shutil.copytree(llada_dir, bad)
    (bad / "model.safetensors").write_bytes(b"not a safetensors file" * 4)
    for extra in ([], ["--preset", "fast_dllm_v2"]):  # any sampler, the Fast-dLLM v2 rule too
        argv = ["generate", str(bad), "--input-ids", "5,6,7", "--cache", "sub_block", "--gen-length", "32", *extra]
        assert main(argv) == 2
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(err) == 1 and err[0].startswith("dlm-decode generate: error: "), err
        assert "cache 'sub_block'" in err[0] and "fast_dllm_v2 sampler" in err[0] and "'llada'" in err[0]


def test_lm_eval_plugin_takes_a_fast_dllm_v2_checkpoint(tmp_path):
    """generate_until gives the text of ``dlm_decode.generate``'s tokens under the same options, loglikelihood is
    finite and negative, and the mask id comes from the tokenizer when config.json has none."""
    from checkpoints import write_tokenizer
    from lm_eval.api.instance import Instance

    from dlm_decode.eval.lm import DLMDecodeLM

    path = write_fdllm(tmp_path / "m", seed=0)
    cfg = json.loads((path / "config.json").read_text())
    del cfg["mask_token_id"]
    (path / "config.json").write_text(json.dumps(cfg))
    write_tokenizer(path)
    opts = dict(sampler="fast_dllm_v2", gen_length=16, block_length=B, cache="prefix")
    opts["sampler_options"] = {"threshold": 0.9, "small_block_size": SMALL}
    lm = DLMDecodeLM(pretrained=str(path), mc_num=8, progress=False, device="cpu", greedy_check=False, **opts)
    assert lm.model.mask_token_id == MASK
    req = Instance("generate_until", {}, ("w7 w8 w9", {"until": ["never"]}), 0, ("t", 0, 1))
    (text,) = lm.generate_until([req])
    ids = lm.tokenizer("w7 w8 w9")["input_ids"]
    kw = {k: v for k, v in opts.items() if k != "sampler"}
    direct = dlm_decode.generate(lm.model, [ids], tokenizer=lm.tokenizer, sampler="fast_dllm_v2", **kw).rows[0].text
    assert text == direct and text.strip()
    # likelihoods take no sampler and no cache (the plugin refuses them there): a second instance without them
    plain = DLMDecodeLM(pretrained=str(path), mc_num=8, progress=False, device="cpu", gen_length=16, block_length=B)
    lls = plain.loglikelihood([Instance("loglikelihood", {}, ("w7 w8", f" w{i}"), 0, ("t", i, 1)) for i in (9, 30)])
    assert all(math.isfinite(ll) and ll < 0 for ll, _ in lls)


def test_mask_id_from_config_else_tokenizer_else_reference_default(tmp_path, capsys):
    from types import SimpleNamespace

    from dlm_decode.models.fast_dllm_v2 import FastDLLMV2Config
    from dlm_decode.models.loading import model_facts

    path = write_fdllm(tmp_path / "m")
    assert model_facts(path).mask_id == MASK
    cfg = json.loads((path / "config.json").read_text())
    del cfg["mask_token_id"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="mask_token_id"):
        model_facts(path)  # no tokenizer, and 151665 is outside the tiny vocabulary: refused before any weight
    assert main(["generate", str(path), "--input-ids", "5,6,7", "--preset", "fast_dllm_v2"]) == 2
    assert "mask_token_id" in capsys.readouterr().err
    with torch.device("meta"):
        model = FastDLLMV2ForCausalLM(FastDLLMV2Config(**{**cfg, "vocab_size": 151936}))
    assert model.mask_token_id == 151665  # the reference's default (the published config.json names none)
    model.adopt_tokenizer_ids(SimpleNamespace(mask_token_id=5, eos_token_id=7))
    assert model.mask_token_id == 5 and model.eos_token_ids == [STOP]  # config.json's EOS stays
