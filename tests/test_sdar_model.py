"""The native ``sdar`` model (SDAR / TraDo) against a re-statement of the reference modeling forward
(``sdar_reference.ReferenceSDAR``), on tiny random checkpoints in the official saved format, float32, with the
reference's block-causal mask and its K/V cache protocol; the Auto classes; tied heads; its config checks, all made
before any weight is read; the MASK id order."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file
from sdar_reference import EOS, MASK, ReferenceSDAR, sdar_config, sdar_moe_config, write_sdar
from transformers import AutoConfig, AutoModel

from dlm_decode.cache import KVStore
from dlm_decode.cli import main
from dlm_decode.models.loading import load_model, model_facts
from dlm_decode.models.sdar import SDARConfig, SDARForCausalLM
from dlm_decode.models.sdar_moe import SDARMoeForCausalLM

pytestmark = pytest.mark.usefixtures("one_thread")


def _ref(path):
    return ReferenceSDAR(json.loads((path / "config.json").read_text()), load_file(str(path / "model.safetensors")))


def _grid(total: int, block: int) -> torch.Tensor:  # generate.py's mask: [1, 1, T, T] float, 1 = visible
    nb = -(-total // block)
    m = torch.tril(torch.ones(nb, nb)).repeat_interleave(block, 0).repeat_interleave(block, 1)
    return m[None, None, :total, :total]


@pytest.mark.parametrize(
    "over",
    [
        {},
        {"tie_word_embeddings": True, "attention_bias": True},
        {"head_dim": 8, "num_key_value_heads": 4},  # head_dim = hidden / heads; no GQA
    ],
    ids=["official-untied", "tied-bias", "mha"],
)
@pytest.mark.parametrize("block", [4, 8])
def test_logits_equal_reference_block_causal(tmp_path, over, block):
    path = write_sdar(tmp_path / "m", seed=3, **over)
    model, _ = load_model(path)
    ids = torch.randint(0, MASK + 1, (2, 21), generator=torch.Generator().manual_seed(1))
    mask = _grid(21, block)
    ref = _ref(path)(ids, mask)
    assert (model(ids, attention_mask=mask).logits - ref).abs().max() < 1e-4
    assert (model(ids, block_length=block).logits - ref).abs().max() < 1e-4
    assert (model(ids).logits - ref).abs().max() > 1e-2  # the mask matters: bidirectional logits differ


def test_reference_cache_protocol_and_our_store_agree(tmp_path):
    """The reference's cached forward (prefill with store_kv, then a block against the cache without storing) and
    our ``denoise`` against a K/V store written by the previous block's forward both give the full forward's
    logits for the block."""
    path = write_sdar(tmp_path / "m", seed=4)
    model, _ = load_model(path)
    ref = _ref(path)
    b, t = 4, 16
    ids = torch.randint(0, MASK, (1, t), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(t)[None]
    full = model(ids, block_length=b).logits
    cache: list = []
    ref(ids[:, :8], _grid(16, b)[:, :, :8, :8], pos[:, :8], cache, True)
    ref_block = ref(ids[:, 8:12], _grid(16, b)[:, :, 8:12, :12], pos[:, 8:12], cache, False)
    assert (ref_block - full[:, 8:12]).abs().max() < 1e-4
    n_layers, kv, hd = model.kv_shape()
    store = KVStore(n_layers, 1, kv, t, hd, dtype=torch.float32, device="cpu")
    model.denoise(ids, pos, compute=slice(0, 8), region=(4, 8), store=store, block_length=b)
    out = model.denoise(ids, pos, compute=slice(4, 12), region=(8, 12), store=store, block_length=b)
    assert (out - full[:, 8:12]).abs().max() < 1e-4


def test_auto_classes_and_official_names(tmp_path):
    path = write_sdar(tmp_path / "m", tie_word_embeddings=True)
    assert isinstance(AutoConfig.from_pretrained(path), SDARConfig)
    model = AutoModel.from_pretrained(path)
    assert isinstance(model, SDARForCausalLM) and model.block_causal
    names = set(model.state_dict())
    assert names == set(load_file(str(path / "model.safetensors")))  # tied: no lm_head tensor, as the checkpoints
    assert "model.layers.1.self_attn.q_norm.weight" in names and "lm_head.weight" not in names
    assert model.mask_token_id == MASK and model.eos_token_ids == [EOS]
    model.save_pretrained(tmp_path / "saved")  # our save is the official format again: it loads and agrees
    again, _ = load_model(tmp_path / "saved")
    ids = torch.arange(12)[None]
    assert torch.equal(again(ids, block_length=4).logits, model(ids, block_length=4).logits)
    assert set(load_file(str(tmp_path / "saved" / "model.safetensors"))) == names


def test_tied_checkpoint_with_a_head_tensor_is_refused_naming_it(tmp_path):
    path = write_sdar(tmp_path / "m", tie_word_embeddings=True)
    sd = load_file(str(path / "model.safetensors"))
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()
    save_file(sd, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model\.safetensors.*unexpected.*lm_head\.weight"):
        load_model(path)


BAD = [
    ({"hidden_size": None}, r"'hidden_size'.*2048"),  # removed: a required key, with the official value
    ({"hidden_act": "gelu"}, r"'hidden_act'.*'gelu' is not supported"),
    ({"num_key_value_heads": 3}, r"num_attention_heads \(4\) must be a multiple of num_key_value_heads \(3\)"),
    ({"mask_token_id": 64}, r"mask_token_id \(64\) must be < vocab_size \(64\)"),
    (
        {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}},
        r"supported: null",
    ),
    ({"head_dim": 7}, r"head_dim=7"),
    ({"head_dim": None}, r"'head_dim' must not be null"),  # the reference's attention needs it
    ({"eos_token_id": "x"}, r"'eos_token_id' must be a token id"),
]


@pytest.mark.parametrize("over, needle", BAD, ids=[next(iter(o)) for o, _ in BAD])
def test_bad_configs_are_refused_before_any_weight(tmp_path, capsys, over, needle):
    cfg = sdar_config(**over)
    if over.get("hidden_size", 0) is None:
        del cfg["hidden_size"]
    path = tmp_path / "m"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "model.safetensors").write_bytes(b"never read")  # a weight read would fail otherwise
    with pytest.raises(ValueError, match=needle):
        model_facts(path)
    with pytest.raises(ValueError, match=needle):
        load_model(path)
    assert main(["generate", str(path), "--input-ids", "1,2,3", "--preset", "sdar"]) == 2
    err = capsys.readouterr().err.strip()
    assert "config.json" in err and len(err.splitlines()) == 1


def test_mask_id_from_config_else_tokenizer_else_a_clear_error(tmp_path, capsys):
    path = write_sdar(tmp_path / "m")
    assert model_facts(path).mask_id == MASK
    cfg = sdar_config()
    del cfg["mask_token_id"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="mask_token_id"):
        model_facts(path)  # no tokenizer files here
    assert main(["generate", str(path), "--input-ids", "1,2,3", "--preset", "sdar"]) == 2
    assert "mask_token_id" in capsys.readouterr().err
    with torch.device("meta"):
        model = SDARForCausalLM(SDARConfig(**cfg))
    model.adopt_tokenizer_ids(SimpleNamespace(mask_token_id=5, eos_token_id=7))
    assert model.mask_token_id == 5 and model.eos_token_ids == [EOS]  # config.json's EOS stays


# ------------------------------------------------------------------------------------------------- sdar_moe


@pytest.mark.parametrize(
    "over",
    [{}, {"norm_topk_prob": False, "mlp_only_layers": [], "num_experts_per_tok": 1}, {"decoder_sparse_step": 2}],
    ids=["official-dense-first", "unnormalised-top1", "every-second-layer"],
)
def test_moe_logits_equal_reference(tmp_path, over):
    path = write_sdar(tmp_path / "m", seed=5, moe=True, **over)
    model, _ = load_model(path)
    assert isinstance(model, SDARMoeForCausalLM)
    kinds = [type(layer.mlp).__name__ for layer in model.model.layers]
    assert "SoftmaxMoE" in kinds
    ids = torch.randint(0, MASK + 1, (2, 21), generator=torch.Generator().manual_seed(1))
    ref = _ref(path)(ids, _grid(21, 4))
    assert (model(ids, block_length=4).logits - ref).abs().max() < 1e-4
    for layer in model.model.layers:  # the grouped expert path gives the same sums
        layer.mlp.grouped = True
    assert (model(ids, block_length=4).logits - ref).abs().max() < 1e-4


@torch.no_grad()
def test_moe_routing_is_real(tmp_path):
    """The router's choice and renormalisation change the logits (a dense stand-in would not pass the test above)."""
    path = write_sdar(tmp_path / "m", seed=5, moe=True)
    model, _ = load_model(path)
    ids = torch.arange(20)[None]
    base = model(ids, block_length=4).logits
    moe = model.model.layers[1].mlp
    moe.gate.normalize = False
    assert (model(ids, block_length=4).logits - base).abs().max() > 1e-3
    moe.gate.normalize = True
    moe.gate.weight.mul_(-1.0)  # other experts chosen
    assert (model(ids, block_length=4).logits - base).abs().max() > 1e-3


MOE_BAD = [
    ({"num_experts_per_tok": 7}, r"num_experts_per_tok \(7\) must be <= num_experts \(6\)"),
    ({"num_experts": None}, r"'num_experts'.*128"),
    ({"norm_topk_prob": None}, r"'norm_topk_prob'.*True"),
    ({"intermediate_size": None}, r"intermediate_size=None.*dense layers \[0\]"),
]


@pytest.mark.parametrize("over, needle", MOE_BAD, ids=["topk", "experts", "norm", "dense-width"])
def test_moe_bad_configs_are_refused_before_any_weight(tmp_path, over, needle):
    cfg = sdar_moe_config(**over)
    for k in [k for k, v in over.items() if v is None and k != "intermediate_size"]:
        del cfg[k]  # removed: a required key, with the official value
    path = tmp_path / "m"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "model.safetensors").write_bytes(b"never read")
    with pytest.raises(ValueError, match=needle):
        model_facts(path)
