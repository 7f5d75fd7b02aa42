"""The native ``llada2_moe`` model against a re-statement of the reference modeling forward (``llada2_reference``),
on tiny random checkpoints in the reference's saved format, float32, with the block-causal mask; its loading checks
and its mask / EOS id order."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from llada2_reference import EOS, MASK, block_mask, llada2_config, reference_logits, write_llada2
from safetensors.torch import load_file, save_file

from dlm_decode.cache import KVStore
from dlm_decode.models.llada2 import REFERENCE_EOS_ID, REFERENCE_MASK_ID, LLaDA2MoeModelLM
from dlm_decode.models.loading import load_model, model_facts, read_config

pytestmark = pytest.mark.usefixtures("one_thread")


def _ref(path):
    return json.loads((path / "config.json").read_text()), load_file(str(path / "model.safetensors"))


@pytest.mark.parametrize(
    "over",
    [{}, {"use_bias": False, "use_qkv_bias": True, "first_k_dense_replace": 2}, {"num_experts_per_tok": 1}],
    ids=["official-default-bias", "qkv-bias", "top1"],
)
@pytest.mark.parametrize("block", [8, 16])
def test_logits_equal_reference_block_causal(tmp_path, over, block):
    path = write_llada2(tmp_path / "m", seed=3, **over)
    model, _ = load_model(path)
    cfg, sd = _ref(path)
    ids = torch.randint(0, MASK + 1, (2, 45), generator=torch.Generator().manual_seed(1))
    mask = block_mask(48, block)[:, :, :45, :45]
    ref = reference_logits(cfg, sd, ids, mask)
    assert (model(ids, attention_mask=mask).logits - ref).abs().max() < 1e-4
    assert (model(ids, block_length=block).logits - ref).abs().max() < 1e-4
    # the mask matters: bidirectional logits differ
    assert (model(ids).logits - ref).abs().max() > 1e-2


@torch.no_grad()
def test_moe_path_is_real(tmp_path):
    """Routed experts, their selection bias and the shared expert all change the logits."""
    path = write_llada2(tmp_path / "m", seed=2)
    model, _ = load_model(path)
    ids = torch.arange(20)[None]
    base = model(ids, block_length=8).logits
    layer = model.model.layers[1].mlp
    assert len(layer.experts) >= 4 and layer.shared_experts is not None
    for tweak in (lambda: layer.gate.expert_bias.mul_(-3.0), lambda: layer.shared_experts.down_proj.weight.zero_()):
        saved = {k: v.clone() for k, v in model.state_dict().items()}
        tweak()
        assert (model(ids, block_length=8).logits - base).abs().max() > 1e-3
        model.load_state_dict(saved)


def test_denoise_with_store_equals_full_forward(tmp_path):
    """The decoding surface: a block computed against the K/V store of the earlier blocks (written by a forward over
    the previous block and this one) gives the full block-causal forward's logits."""
    path = write_llada2(tmp_path / "m", seed=4)
    model, _ = load_model(path)
    b, t = 8, 40
    ids = torch.randint(0, MASK, (1, t), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(t)[None]
    full = model(ids, block_length=b).logits
    n_layers, kv, hd = model.kv_shape()
    store = KVStore(n_layers, 1, kv, t, hd, dtype=torch.float32, device="cpu")
    model.denoise(ids, pos, compute=slice(0, 24), region=(16, 24), store=store, block_length=b)
    out = model.denoise(ids, pos, compute=slice(16, 32), region=(24, 32), store=store, block_length=b)
    assert (out - full[:, 24:32]).abs().max() < 1e-4


def test_config_errors_name_file_and_key_before_weights(tmp_path):
    path = write_llada2(tmp_path / "m", n_group=3)
    (path / "model.safetensors").write_bytes(b"not read")
    with pytest.raises(ValueError, match=r"config\.json: num_experts \(8\) must be a multiple of n_group \(3\)"):
        model_facts(path)
    bad = write_llada2(tmp_path / "b")
    cfg = json.loads((bad / "config.json").read_text())
    del cfg["hidden_size"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"config\.json: .*hidden_size.*2048"):  # names the key and the official value
        model_facts(bad)


def test_missing_expert_bias_is_an_error_naming_the_file(tmp_path):
    path = write_llada2(tmp_path / "m")
    sd = load_file(str(path / "model.safetensors"))
    del sd["model.layers.1.mlp.gate.expert_bias"]
    save_file(sd, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model\.safetensors.*expert_bias"):
        load_model(path)


def test_mask_and_eos_order(tmp_path):
    """config.json first, then the tokenizer's, then the reference defaults 156895 / 156892."""
    path = write_llada2(tmp_path / "m")
    assert model_facts(path).mask_id == MASK
    cfg = llada2_config()
    del cfg["mask_token_id"], cfg["eos_token_id"]
    (path / "config.json").write_text(json.dumps(cfg))
    with torch.device("meta"):
        model = LLaDA2MoeModelLM(read_config(path))
    # the reference EOS is outside this tiny vocabulary: no EOS (a notice at loading), never an id it cannot write
    assert REFERENCE_EOS_ID >= 64 and model.mask_token_id == REFERENCE_MASK_ID and model.eos_token_ids == []
    model.adopt_tokenizer_ids(SimpleNamespace(mask_token_id=5, eos_token_id=EOS))
    assert model.mask_token_id == 5 and model.eos_token_ids == [EOS]
    model.adopt_tokenizer_ids(SimpleNamespace(mask_token_id=6, eos_token_id=7))  # config values now win
    assert model.mask_token_id == 5


@torch.no_grad()
@pytest.mark.parametrize("top1", [False, True])
def test_grouped_experts_equal_looped(tmp_path, top1):
    """The grouped expert path (no host sync, graph-recordable; the default for bf16 on CUDA) gives the looped one's
    logits on inputs that leave some experts without tokens, and packing the experts into stacks keeps the official
    parameter names and values (a state dict round trip, a dtype change re-packs)."""
    over = {"num_experts_per_tok": 1} if top1 else {}
    model, _ = load_model(write_llada2(tmp_path / "m", seed=5, **over))
    moes = [m for m in model.modules() if hasattr(m, "grouped")]
    ids = torch.randint(0, MASK, (2, 7), generator=torch.Generator().manual_seed(2))
    looped = model(ids, block_length=8).logits
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for m in moes:
        m.grouped = True
    grouped = model(ids, block_length=8).logits
    assert (grouped - looped).abs().max() < 1e-4 and looped.abs().max() > 1e-2
    layer = moes[0]
    one = ids[:1, :1]  # one token reaches top-k of the experts: the others' groups are empty
    assert layer.gate.top_k < len(layer.experts)
    for m in moes:
        m.grouped = False
    one_looped = model(one).logits
    for m in moes:
        m.grouped = True
    assert (model(one).logits - one_looped).abs().max() < 1e-4
    stack = layer._packed[0]
    assert layer.experts[1].gate_proj.weight.data_ptr() == stack[1].data_ptr()  # a view, not a copy
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    model.to(torch.bfloat16)  # new parameter storage: the stacks are rebuilt from it
    low = model(ids, block_length=8).logits.float()
    assert layer._packed[0].dtype == torch.bfloat16
    assert layer.experts[1].gate_proj.weight.data_ptr() == layer._packed[0][1].data_ptr()
    for m in moes:
        m.grouped = False
    low_looped = model(ids, block_length=8).logits.float()
    assert (low - low_looped).abs().mean() < 0.02 * low_looped.abs().mean()
