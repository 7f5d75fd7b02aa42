"""``config.json`` is checked against the model family's schema (``dlm_decode/models/schema.py``) before any weight
is read: a missing required key, a value of the wrong type or out of range, or a broken cross-key rule is one
``ValueError`` (CLI: exit 2, one line) naming the file and the key.

The checkpoints here have garbage in ``model.safetensors``: a config error reported after the weights were read would
show up as the damaged-weights error instead.

    pytest tests/test_config_schema.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from checkpoints import dream_config, llada_config

import dlm_decode
from dlm_decode.cli import main
from dlm_decode.models import SUPPORTED_MODEL_TYPES
from dlm_decode.models.loading import DEMO_DIR, DEMO_MODELS, model_facts, read_config
from dlm_decode.models.schema import ConfigSchema, Key, positive_int

GARBAGE = b"not a safetensors file" * 4


def checkpoint(root: Path, config: dict) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    (root / "model.safetensors").write_bytes(GARBAGE)
    return root


def without(config: dict, key: str) -> dict:
    return {k: v for k, v in config.items() if k != key}


LLADA_CASES = [
    # (config, words the one message must contain), each a case of ../shared/docs/BAD_INPUTS.md or the issue
    (without(llada_config(), "mask_token_id"), ["'mask_token_id' is missing", "126336"]),
    (without(llada_config(), "d_model"), ["'d_model' is missing", "4096"]),
    (llada_config(n_heads="four"), ["'n_heads' must be an integer", "'four'"]),
    (llada_config(vocab_size=-5), ["'vocab_size' must be >= 1, got -5"]),
    (llada_config(n_layers=True), ["'n_layers' must be an integer", "True"]),
    (llada_config(d_model=32.0), ["'d_model' must be an integer"]),
    (llada_config(activation_type="gelu"), ["'activation_type' 'gelu' is not supported; supported: 'silu'"]),
    (llada_config(rms_norm_eps=0), ["'rms_norm_eps' must be > 0"]),
    (llada_config(rope_theta=None), ["'rope_theta' must not be null"]),
    (llada_config(n_heads=5), ["d_model (32) must be a multiple of n_heads (5)"]),
    (llada_config(n_kv_heads=3), ["n_heads (4) must be a multiple of n_kv_heads (3)"]),
    (llada_config(mask_token_id=64), ["mask_token_id (64) must be < vocab_size (64)"]),
    (llada_config(embedding_size=32), ["vocab_size (64) must be <= embedding_size (32)"]),
]


@pytest.mark.parametrize("config,words", LLADA_CASES, ids=[w[0] for _, w in LLADA_CASES])
def test_bad_llada_config_is_one_error_naming_file_and_key(tmp_path, config, words):
    path = checkpoint(tmp_path / "ckpt", config)
    with pytest.raises(ValueError) as e:
        dlm_decode.load_model(path)
    msg = str(e.value)
    assert msg.startswith(f"{path / 'config.json'}: ") and "\n" not in msg, msg
    for w in words:
        assert w in msg, msg
    with pytest.raises(ValueError, match="config.json"):
        model_facts(path)


def test_missing_mask_token_id_cli_exit_2_names_key_and_official_value(tmp_path, capsys):
    path = checkpoint(tmp_path / "ckpt", without(llada_config(), "mask_token_id"))
    assert main(["generate", str(path), "--input-ids", "5,6", "--gen-length", "8"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"dlm-decode generate: error: {path / 'config.json'}: required key 'mask_token_id'"), err
    assert "126336" in err


DREAM_CASES = [
    (without(dream_config(), "mask_token_id"), ["'mask_token_id' is missing", "151666"]),
    (without(dream_config(), "hidden_size"), ["'hidden_size' is missing"]),
    (dream_config(num_attention_heads="4"), ["'num_attention_heads' must be an integer"]),
    (dream_config(hidden_act="relu"), ["'hidden_act' 'relu' is not supported"]),
    (dream_config(intermediate_size=0), ["'intermediate_size' must be >= 1, got 0"]),
    (dream_config(num_key_value_heads=3), ["num_attention_heads (4) must be a multiple of num_key_value_heads (3)"]),
    (dream_config(rope_scaling=[1]), ["'rope_scaling' must be a JSON object or null"]),
    (dream_config(top_k="50"), ["'top_k' must be an integer or null"]),
]


@pytest.mark.parametrize("config,words", DREAM_CASES, ids=[w[0] for _, w in DREAM_CASES])
def test_bad_dream_config_is_one_error_naming_file_and_key(tmp_path, config, words):
    path = checkpoint(tmp_path / "ckpt", config)
    with pytest.raises(ValueError) as e:
        dlm_decode.load_model(path)
    msg = str(e.value)
    assert msg.startswith(f"{path / 'config.json'}: "), msg
    for w in words:
        assert w in msg, msg


@pytest.mark.parametrize("name", DEMO_MODELS)
def test_shipped_and_official_configs_pass(tmp_path, name):
    read_config(DEMO_DIR / name)  # the demo models
    official_llada = llada_config(
        d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32, mlp_hidden_size=12288, vocab_size=126464,
        embedding_size=126464, max_sequence_length=4096, mask_token_id=126336, eos_token_id=126081,
        pad_token_id=126081,
    )  # fmt: skip
    read_config(checkpoint(tmp_path / "llada", official_llada))
    official_dream = dream_config(
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, vocab_size=152064, mask_token_id=151666, max_position_embeddings=131072,
    )  # fmt: skip
    read_config(checkpoint(tmp_path / "dream", official_dream))
    # an extra key nobody reads is left alone
    read_config(checkpoint(tmp_path / "extra", llada_config(my_note="hello")))


def test_every_supported_family_declares_a_schema():
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    for model_type in SUPPORTED_MODEL_TYPES:
        schema = getattr(CONFIG_MAPPING[model_type], "config_schema", None)
        assert isinstance(schema, ConfigSchema), f"{model_type}: declare config_schema on its config class"
        assert any(k.required for k in schema.keys.values())


def test_schema_mechanism_on_its_own():
    schema = ConfigSchema("Toy", {"width": positive_int(required=True, official=8), "act": Key("str", choices=("a",))})
    schema.check({"width": 8, "act": "a", "other": object()}, "toy.json")
    with pytest.raises(ValueError, match=r"^toy.json: required key 'width' is missing \(the official Toy checkpoints "):
        schema.check({}, "toy.json")
    with pytest.raises(ValueError, match="key 'act' 'b' is not supported; supported: 'a'"):
        schema.check({"width": 1, "act": "b"}, "toy.json")


def test_unsupported_option_still_refused_when_built_without_config_json():
    """``check_supported`` (the model's own guard, for configs built in Python) reads the same choices."""
    from dlm_decode.models import LLaDAConfig

    cfg = LLaDAConfig(**{k: v for k, v in llada_config(alibi=True).items() if k not in ("architectures", "auto_map")})
    with pytest.raises(ValueError, match=r"alibi=True \(supported: False\)"):
        cfg.check_supported()
