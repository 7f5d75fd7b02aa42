"""LLaDA-MoE: the native model against a re-statement of the reference forward (``llada_moe_reference``) on tiny
random checkpoints in the hub's format (float32), LLaDA's reference ``generate()`` token for token over it, every
cache with two samplers, the CLI, its MASK id from the tokenizer and its config checks before any weight."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch
from checkpoints import llada_config, llada_state_dict, write_checkpoint
from llada_moe_reference import (
    EOS,
    MASK,
    ROLE_END,
    llada_moe_config,
    reference_logits,
    write_llada_moe,
    write_llada_moe_tokenizer,
)
from reference_generate import llada_generate
from safetensors.torch import load_file
from test_caches import EVERY_STEP  # each cache at its refresh-every-step setting: the no-cache tokens
from transformers import AutoConfig, AutoModel

import dlm_decode
from dlm_decode.cache import CACHES
from dlm_decode.cli import main
from dlm_decode.models import LLaDAConfig, LLaDAModelLM, LLaDAMoEConfig, LLaDAMoEModelLM, compiled
from dlm_decode.models.llada_moe import LLaDAMoESparseBlock
from dlm_decode.models.loading import load_model, model_facts

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = torch.tensor([[5, 9, 17, 3, 40, 22], [7, 7, 2, 33, 12, 4]])


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = write_llada_moe(tmp_path_factory.mktemp("lladamoe") / "m", seed=0)
    return path, load_model(path)[0]


def _reference(path):
    return json.loads((path / "config.json").read_text()), load_file(str(path / "model.safetensors"))


def test_auto_classes_dispatch_on_architectures(ckpt, tmp_path):
    """Both config.json files say ``model_type: llada``; ``architectures`` picks the model, no remote code."""
    path, model = ckpt
    assert type(AutoConfig.from_pretrained(path)) is LLaDAMoEConfig
    auto = AutoModel.from_pretrained(path, dtype=torch.float32)
    assert type(auto) is LLaDAMoEModelLM and type(model) is LLaDAMoEModelLM
    _, sd = _reference(path)
    assert auto.state_dict().keys() == sd.keys()
    assert all(torch.equal(auto.state_dict()[k], v) for k, v in sd.items())
    dense = write_checkpoint(tmp_path / "dense", llada_config(), llada_state_dict(llada_config()))
    assert type(AutoConfig.from_pretrained(dense)) is LLaDAConfig
    assert type(load_model(dense)[0]) is LLaDAModelLM
    # saved again, it is the hub's format (model_type llada) and loads as LLaDA-MoE
    auto.save_pretrained(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert saved["model_type"] == "llada" and saved["architectures"] == ["LLaDAMoEModelLM"]
    assert type(AutoConfig.from_pretrained(tmp_path / "saved")) is LLaDAMoEConfig
    # dllm's own class saves model_type "lladamoe": that loads too
    cfg = llada_moe_config(model_type="lladamoe")
    (tmp_path / "saved" / "config.json").write_text(json.dumps(cfg))
    write_llada_moe_tokenizer(tmp_path / "saved")
    assert type(load_model(tmp_path / "saved")[0]) is LLaDAMoEModelLM


@pytest.mark.parametrize(
    "over",
    [
        {},
        {"moe_router_enable_expert_bias": True, "num_key_value_heads": 4},
        {"shared_expert_intermediate_size": None, "qk_layernorm": False, "attention_bias": True},
        {"partial_rotary_factor": 0.5, "num_experts_per_tok": 1, "moe_layer_freq": [1, 1, 1]},
    ],
    ids=["official-like", "expert-bias-mha", "no-shared-no-qknorm-bias", "partial-rope-top1"],
)
def test_logits_equal_reference(tmp_path, over):
    path = write_llada_moe(tmp_path / "m", seed=3, tokenizer=False, **over, mask_token_id=MASK)
    model = load_model(path)[0]
    cfg, sd = _reference(path)
    ids = torch.randint(0, MASK, (2, 21), generator=torch.Generator().manual_seed(1))
    ref = reference_logits(cfg, sd, ids)
    assert ref.abs().max() > 1.0
    # fp32 rounding of two summation orders (our attention against the reference's eager softmax): ~1e-5 at |10|
    assert (model(ids).logits - ref).abs().max() < 5e-5
    keymask = torch.ones_like(ids, dtype=torch.bool)
    keymask[1, :4] = False
    got = model(ids, attention_mask=keymask).logits
    assert (got - reference_logits(cfg, sd, ids, keymask=keymask))[keymask].abs().max() < 5e-5


@torch.no_grad()
def test_moe_pieces_change_the_logits(tmp_path):
    """The router's bias, the shared expert, the qk-norm and every routed expert reach the logits (so the
    reference comparison above tests them)."""
    path = write_llada_moe(
        tmp_path / "m", seed=2, tokenizer=False, mask_token_id=MASK, moe_router_enable_expert_bias=True
    )
    model = load_model(path)[0]
    ids = torch.arange(4, 24)[None]
    base = model(ids).logits
    layer = model.model.layers[1]
    assert len(layer.mlp.experts) == 8 and layer.mlp.top_k == 3
    tweaks = (
        lambda: layer.mlp.expert_bias.copy_(torch.arange(8.0)),  # changes which experts are chosen
        lambda: layer.shared_expert.down_proj.weight.zero_(),
        lambda: layer.self_attn.k_norm.weight.mul_(2.0),
    )
    for tweak in tweaks:
        saved = {k: v.clone() for k, v in model.state_dict().items()}
        tweak()
        assert (model(ids).logits - base).abs().max() > 1e-3
        model.load_state_dict(saved)


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("gen,block,steps", [(16, 16, 16), (16, 8, 8), (24, 8, 12)])
def test_low_confidence_equals_llada_reference_generate(ckpt, batch, gen, block, steps):
    """LLaDA-MoE's model card decodes with LLaDA's ``generate()``: ours gives its tokens over the reference
    forward (temperature 0, float32)."""
    path, model = ckpt
    cfg, sd = _reference(path)
    prompt = PROMPTS[:batch]
    ref = llada_generate(lambda x: reference_logits(cfg, sd, x), prompt, steps, gen, block, MASK)
    out = dlm_decode.generate(model, prompt, sampler="low_confidence", gen_length=gen, block_length=block, steps=steps)
    assert torch.equal(out.sequences, ref)
    assert out.nfe == steps


@pytest.mark.parametrize("sampler", ["low_confidence", "threshold"])
# sub_block: Fast-dLLM v2's cache, refused on this bidirectional family (tests/test_fast_dllm_v2.py)
@pytest.mark.parametrize("cache", sorted(c for c in CACHES if c != "none" and not CACHES[c].samplers))
def test_every_cache_refreshing_each_step_equals_no_cache(ckpt, sampler, cache):
    """The bidirectional family's caches apply: each, refreshing every step, gives decoding without a cache its
    tokens (padded batch of two, gen 16 in blocks of 8); its default setting runs and fills every slot."""
    _, model = ckpt
    prompts = [[5, 9, 17, 3, 40, 22], [7, 2, 33]]
    kw = {"gen_length": 16, "block_length": 8, "sampler": sampler}
    if sampler == "threshold":
        kw["sampler_options"] = {"threshold": 0.5}
    plain = dlm_decode.generate(model, prompts, cache="none", **kw)
    same = dlm_decode.generate(model, prompts, cache=cache, cache_options=EVERY_STEP[cache], **kw)
    assert torch.equal(same.sequences, plain.sequences)
    default = dlm_decode.generate(model, prompts, cache=cache, **kw)
    assert not (default.sequences == MASK).any()


@pytest.mark.parametrize("cache", ["none", "dual"])
def test_dynamo_captures_the_pieces_with_qk_norm(ckpt, cache):
    """The shared layer pieces with the qk-norm hook trace in one graph each (dynamo's tracing-only ``eager``
    backend: a graph break would fall back and set ``error``) and decode the eager tokens."""
    _, model = ckpt
    prompts = [[5, 9, 17, 3, 40, 22], [7, 2, 33]]
    kw = {"gen_length": 16, "block_length": 8, "sampler": "threshold", "sampler_options": {"threshold": 0.5}}
    eager = dlm_decode.generate(model, prompts, cache=cache, **kw)
    pieces = compiled.CompiledLayers(backend="eager")
    model.layer_pieces = pieces
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            out = dlm_decode.generate(model, prompts, cache=cache, **kw)
    finally:
        del model.layer_pieces
    assert pieces.error is None
    assert torch.equal(out.sequences, eager.sequences) and out.nfe == eager.nfe


def _cli(capsys, path, rows, args):
    argv = ["generate", str(path), "--json"]
    for r in rows:
        argv += ["--input-ids", ",".join(map(str, r))]
    assert main(argv + args) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_equals_reference_generate(ckpt, capsys):
    path, _ = ckpt
    cfg, sd = _reference(path)
    prompt = PROMPTS[:1]
    ref = llada_generate(lambda x: reference_logits(cfg, sd, x), prompt, 16, 32, 16, MASK)
    args = ["--sampler", "low_confidence", "--gen-length", "32", "--block-length", "16", "--steps", "16"]
    out = _cli(capsys, path, prompt.tolist(), args)
    assert out["rows"][0]["generated_ids"] == ref[0, prompt.shape[1] :].tolist()
    fast = _cli(capsys, path, prompt.tolist(), ["--preset", "fast_dllm_threshold", "--gen-length", "32"])
    assert len(fast["rows"][0]["generated_ids"]) == 32 and MASK not in fast["rows"][0]["generated_ids"]


def test_mask_id_order_config_then_mask_token_then_tokenizer_mask(tmp_path):
    path = write_llada_moe(tmp_path / "m")  # config.json has no mask_token_id; the tokenizer has <|mask|>
    assert "mask_token_id" not in json.loads((path / "config.json").read_text())
    assert model_facts(path).mask_id == MASK
    assert load_model(path)[0].mask_token_id == MASK
    cfg = llada_moe_config(mask_token_id=40)  # config.json wins
    (path / "config.json").write_text(json.dumps(cfg))
    assert model_facts(path).mask_id == 40
    other = write_llada_moe(tmp_path / "o", tokenizer=False)
    write_llada_moe_tokenizer(other, mask_token="<mask>", set_mask=True)  # no <|mask|>: the tokenizer's mask_token
    assert model_facts(other).mask_id == MASK


@pytest.mark.parametrize("tokenizer", ["none", "without-mask"])
def test_missing_mask_id_is_an_error_before_weights(tmp_path, tokenizer, capsys):
    path = write_llada_moe(tmp_path / "m", tokenizer=False)
    if tokenizer == "without-mask":
        write_llada_moe_tokenizer(path, mask_token=None)
    (path / "model.safetensors").write_bytes(b"not read")  # any read of the weights would fail differently
    with pytest.raises(ValueError, match=r"no MASK id.*mask_token_id.*<\|mask\|>"):
        model_facts(path)
    with pytest.raises(ValueError, match=r"no MASK id"):
        load_model(path)
    assert main(["generate", str(path), "--input-ids", "5,6", "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no MASK id" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "over,says",
    [
        ({"moe_layer_freq": [1, 1]}, r"moe_layer_freq has 2 entries \(one per layer: 3\)"),
        ({"num_experts_per_tok": 9}, r"num_experts_per_tok \(9\) must be <= num_experts \(8\)"),
        ({"clip_qkv": 8.0}, r"clip_qkv.*not supported"),
        ({"moe_layer_freq": "all"}, r"moe_layer_freq.*must be a list of integers"),
        ({"partial_rotary_factor": 0.1}, r"rotary width"),
        ({"num_key_value_heads": 3}, r"num_attention_heads \(4\) must be a multiple of num_key_value_heads \(3\)"),
        ({"dense_intermediate_size": None}, r"dense_intermediate_size=None"),
        ({"hidden_act": "gelu"}, r"hidden_act.*'gelu' is not supported"),
        ({"mask_token_id": 64}, r"mask_token_id \(64\) must be < vocab_size \(64\)"),
    ],
)
def test_bad_configs_refused_before_weights(tmp_path, over, says):
    path = write_llada_moe(tmp_path / "m")
    (path / "config.json").write_text(json.dumps(llada_moe_config(**over)))
    (path / "model.safetensors").write_bytes(b"not read")
    with pytest.raises(ValueError, match=says) as err:
        model_facts(path)
    assert "config.json" in str(err.value)
    with pytest.raises(ValueError, match=says):
        load_model(path)


def test_missing_required_key_names_the_official_value(tmp_path):
    path = write_llada_moe(tmp_path / "m")
    cfg = llada_moe_config()
    del cfg["expert_intermediate_size"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"config\.json: required key 'expert_intermediate_size'.*1024"):
        model_facts(path)


def test_eos_from_config_and_role_end_from_the_tokenizer(ckpt, tmp_path):
    """config.json's EOS; the Instruct turn's end ``<|role_end|>`` (the reference's eot_token) where the tokenizer
    has it."""
    _, model = ckpt
    assert model.eos_token_ids == [EOS, ROLE_END]
    bare = write_llada_moe(tmp_path / "m", tokenizer=False, mask_token_id=MASK)
    assert load_model(bare)[0].eos_token_ids == [EOS]


def test_lm_eval_plugin_generates_and_scores(ckpt):
    """The lm-eval plugin loads it by path: answers are ``generate``'s, a log-likelihood comes back finite."""
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance

    from dlm_decode.eval.lm import DLMDecodeLM

    path, _ = ckpt
    lm = DLMDecodeLM(pretrained=str(path), gen_length=16, block_length=8, mc_num=8, progress=False)
    assert type(lm.model) is LLaDAMoEModelLM and lm.model.mask_token_id == MASK
    req = Instance("generate_until", {}, ("w5 w6 w7 w8", {"until": [], "max_gen_toks": 16}), 0, ("t", 0, 1))
    ids = lm.tokenizer("w5 w6 w7 w8")["input_ids"]
    direct = dlm_decode.generate(lm.model, [ids], tokenizer=lm.tokenizer, gen_length=16, block_length=8)
    assert lm.generate_until([req]) == [direct.rows[0].text]
    ((ll, _),) = lm.loglikelihood([Instance("loglikelihood", {}, ("w5 w6", " w7"), 0, ("t", 0, 1))])
    assert math.isfinite(ll) and ll < 0


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_forward_close_to_fp32(ckpt, dtype):
    """Loads and runs in half precision (a token routed to other experts moves its logits more, so the mean is
    bounded, not the max)."""
    path, model = ckpt
    ids = torch.randint(0, MASK, (2, 30), generator=torch.Generator().manual_seed(0))
    low = load_model(path, dtype=dtype)[0]
    got, ref = low(ids).logits, model(ids).logits
    assert got.dtype == getattr(torch, dtype) and torch.isfinite(got).all()
    assert (got.float() - ref).abs().mean() < 0.05 * ref.abs().mean()  # bf16: 2.3% here


@torch.no_grad()
def test_elastic_attention_weights_use_the_qk_norm(ckpt):
    """Elastic-Cache's attention rows (``depth.attention_weights``) are the layer's own: queries through the same
    qk-norm and RoPE as ``common.layer_input``'s."""
    from functools import partial

    from dlm_decode.models.common import layer_input, rope_cos_sin
    from dlm_decode.models.depth import attention_weights

    _, model = ckpt
    c, block = model.config, model.model.layers[1]
    x = model.model.embed_tokens(torch.tensor([[5, 9, 17, 3, 40, 22, 8]]))
    pos = torch.arange(7)[None]
    rope = partial(rope_cos_sin, head_dim=c.rotary_dim, theta=c.rope_theta)
    q, k, _ = layer_input(block, x, *rope(pos))
    k_rep = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    want = (q @ k_rep.transpose(-1, -2) / math.sqrt(q.shape[-1])).softmax(-1)
    got = attention_weights(block, x, pos, k, None, rope)
    assert (got - want).abs().max() < 1e-5
    block.qk_norm = False  # without the norm the rows differ: the test sees it
    try:
        assert (attention_weights(block, x, pos, k, None, rope) - want).abs().max() > 1e-3
    finally:
        block.qk_norm = True


def test_padded_batch_rows_decode_as_alone(ckpt):
    _, model = ckpt
    prompts = [[5, 9, 17, 3, 40, 22], [7, 2, 33]]
    kw = {"sampler": "low_confidence", "gen_length": 16, "block_length": 8, "steps": 16}
    both = dlm_decode.generate(model, prompts, **kw)
    for i, p in enumerate(prompts):
        alone = dlm_decode.generate(model, [p], **kw)
        assert both.rows[i].generated_ids == alone.rows[0].generated_ids


def test_a_config_saved_alone_reads_back_as_llada_moe(tmp_path):
    """``LLaDAMoEConfig.save_pretrained`` writes the hub's ``model_type: llada`` and always the architecture that
    tells it from the dense model."""
    cfg = LLaDAMoEConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_experts=4)
    cfg.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "llada" and saved["architectures"] == ["LLaDAMoEModelLM"]
    assert type(AutoConfig.from_pretrained(tmp_path)) is LLaDAMoEConfig


@torch.no_grad()
def test_grouped_experts_equal_looped(tmp_path):
    """The grouped expert path (no host sync; the default for bf16 on CUDA) gives the looped one's logits with this
    family's router, and keeps the official parameter names."""
    path = write_llada_moe(
        tmp_path / "m", seed=5, tokenizer=False, mask_token_id=MASK, moe_router_enable_expert_bias=True
    )
    model = load_model(path)[0]
    moes = [m for m in model.modules() if isinstance(m, LLaDAMoESparseBlock)]
    assert len(moes) == 2
    ids = torch.randint(0, MASK, (2, 9), generator=torch.Generator().manual_seed(2))
    looped = model(ids).logits
    before = set(model.state_dict())
    for m in moes:
        m.grouped = True
    grouped = model(ids).logits
    assert (grouped - looped).abs().max() < 1e-4 and looped.abs().max() > 1e-2
    assert set(model.state_dict()) == before
