"""Special token ids against the vocabulary they index (issue 78), for every model family, before any weight is read.

``config.json`` ids (MASK, EOS as an int or a list, PAD, BOS) outside ``[0, vocab_size)`` are one ``ValueError``
naming the file and the key (exit 2 in the CLI); so are the built-in fallbacks a model would decode with (LLaDA2's
reference MASK 156895, a family's default PAD), a tokenizer's ids, and an id set on a loaded model's config. LLaDA2's
fallback EOS outside a small vocabulary is dropped: the model decodes to the gen length with one notice. The weights of
every checkpoint here that must fail are garbage, so an error that names the ids proves no weight was read.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
from checkpoints import VOCAB, dream_config, llada_config, write_tokenizer
from llada2_reference import llada2_config, write_llada2

import dlm_decode
from dlm_decode.cli import main
from dlm_decode.core.special_ids import Notice, check_special_ids, check_tokenizer_ids
from dlm_decode.models.loading import load_model, model_facts

FAMILIES = {"llada": llada_config, "dream": dream_config, "llada2": llada2_config}
GARBAGE = b"not a safetensors file" * 4
WEIGHTS_ERROR = "is damaged or not a safetensors file"


def checkpoint(path: Path, family: str, drop: tuple[str, ...] = (), **over) -> Path:
    """config.json of ``family`` with ``over`` set and ``drop`` removed; garbage weights (never read by a check)."""
    path.mkdir(parents=True, exist_ok=True)
    cfg = FAMILIES[family]() | over
    for key in drop:
        cfg.pop(key, None)
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "model.safetensors").write_bytes(GARBAGE)
    return path


BAD_IDS = [
    ("mask_token_id", VOCAB + 10),
    ("eos_token_id", VOCAB),
    ("eos_token_id", [1, 99999]),
    ("pad_token_id", 99999),
    ("bos_token_id", VOCAB + 1),
]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("key,value", BAD_IDS, ids=[f"{k}={v}" for k, v in BAD_IDS])
def test_config_id_outside_the_vocabulary_is_one_error_before_weights(tmp_path, family, key, value):
    path = checkpoint(tmp_path / family, family, **{key: value})
    for read in (model_facts, load_model):
        with pytest.raises(ValueError) as e:
            read(path)
        msg = str(e.value)
        assert f"{path / 'config.json'}: " in msg and key in msg and "\n" not in msg
        assert f"[0, {VOCAB})" in msg or f"must be < vocab_size ({VOCAB})" in msg
        assert WEIGHTS_ERROR not in msg


@pytest.mark.parametrize("family", FAMILIES)
def test_cli_refuses_an_eos_outside_the_vocabulary_with_exit_2(tmp_path, capsys, family):
    path = checkpoint(tmp_path / family, family, eos_token_id=99999)
    rc = main(["generate", str(path), "--input-ids", "5,6,7", "--gen-length", "8", "--block-length", "8", "--json"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    (line,) = [x for x in err.splitlines() if x.startswith("dlm-decode generate: error: ")]
    assert "config.json: eos_token_id 99999 lies outside the vocabulary [0, 64)" in line


def test_llada2_fallback_mask_outside_the_vocabulary_names_the_fallback(tmp_path):
    """No mask_token_id in config.json and no tokenizer: the reference default 156895 is not in a 64-token vocabulary
    (it used to end in an IndexError inside the model)."""
    path = checkpoint(tmp_path / "m", "llada2", drop=("mask_token_id",))
    with pytest.raises(ValueError, match=r"config\.json: mask_token_id 156895 \(no mask_token_id is set.*fallback\)"):
        model_facts(path)


def test_a_family_default_pad_outside_the_vocabulary_is_an_error(tmp_path):
    """LLaDA2's config class defaults pad_token_id to 126081: a config.json without one would index past a small
    embedding as soon as a batch needs left padding."""
    path = checkpoint(tmp_path / "m", "llada2", drop=("pad_token_id",))
    default = r"pad_token_id 126081 \(set in the config, or the family's default when config\.json sets none\)"
    with pytest.raises(ValueError, match=default):
        model_facts(path)


@pytest.mark.parametrize("family,default", [("llada", 126081), ("dream", 151643)])
def test_a_family_default_eos_outside_the_vocabulary_is_an_error(tmp_path, family, default):
    path = checkpoint(tmp_path / family, family, drop=("eos_token_id",))
    with pytest.raises(ValueError, match=rf"eos_token_id {default} \(set in the config, or the family's default"):
        model_facts(path)


def test_llada_without_an_eos_decodes_to_the_gen_length_with_one_notice(llada_dir, tmp_path):
    """``eos_token_id: null`` and no tokenizer: no id ends an answer; said once."""
    import shutil

    path = tmp_path / "m"
    shutil.copytree(llada_dir, path)
    cfg = json.loads((path / "config.json").read_text()) | {"eos_token_id": None}
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.warns(Notice, match="no usable EOS id.*decodes to the full gen length"):
        assert model_facts(path).eos_ids == ()


def test_llada2_without_a_usable_eos_decodes_to_the_gen_length_with_one_notice(tmp_path):
    path = write_llada2(tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    del cfg["eos_token_id"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.warns(Notice, match="no usable EOS id") as seen:
        facts = model_facts(path)
    assert facts.eos_ids == () and len([w for w in seen if w.category is Notice]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Notice)
        model, _ = load_model(path)
    assert model.eos_token_ids == []  # never the fallback 156892, which this model cannot write
    out = dlm_decode.generate(model, [[5, 6, 7]], gen_length=8, block_length=4, stop_at_eos=True)
    assert len(out.rows[0].generated_ids) == 8 and all(0 <= t < VOCAB for t in out.rows[0].generated_ids)


def test_an_id_set_on_a_loaded_models_config_is_checked_by_generate(llada):
    model = llada
    saved = model.config.eos_token_id
    model.config.eos_token_id = 4000
    try:
        with pytest.raises(ValueError, match=r"config\.json: eos_token_id 4000 .*lies outside the vocabulary \[0, 64"):
            dlm_decode.generate(model, [[5, 6]], gen_length=8, block_length=8)
    finally:
        model.config.eos_token_id = saved


def test_tokenizer_ids_are_checked_against_the_model(tmp_path):
    tok = SimpleNamespace(mask_token_id=None, eos_token_id=70, pad_token_id=1, bos_token_id=None)
    with pytest.raises(ValueError, match=r"^T/tokenizer_config\.json: eos_token_id 70 lies outside .*\[0, 64\)"):
        check_tokenizer_ids(tok, 64, "T/tokenizer_config.json")
    check_tokenizer_ids(SimpleNamespace(eos_token_id=63), 64, "T")  # the last id is inside
    path = checkpoint(tmp_path / "m", "llada")
    write_tokenizer(path)  # its ids lie inside the 64-token vocabulary: the check passes, the weights are not read
    assert model_facts(path).eos_ids == (1,)


def test_a_tokenizer_with_an_eos_past_the_vocabulary_fails_before_weights(tmp_path):
    from transformers import AutoTokenizer

    path = tmp_path / "m"
    path.mkdir()
    demo = dlm_decode.demo_model_path("demo-llada")
    (path / "config.json").write_text((demo / "config.json").read_text())
    (path / "model.safetensors").write_bytes(GARBAGE)
    tok = AutoTokenizer.from_pretrained(demo)
    tok.add_special_tokens({"eos_token": "<|new_end|>"})  # the next id: 1332, one past demo-llada's vocabulary
    tok.save_pretrained(path)
    for read in (model_facts, load_model):
        with pytest.raises(ValueError, match=r"tokenizer_config\.json: eos_token_id 1332 lies outside .*\[0, 1332\)"):
            read(path)


def test_the_one_helper_checks_any_family_config():
    """``check_special_ids`` is what every family's schema calls; a new family gets it by declaring vocab_size."""
    check_special_ids({"eos_token_id": [0, 9], "mask_token_id": None}, 10, "X")
    for values in ({"eos_token_id": [0, 10]}, {"pad_token_id": -1}, {"bos_token_id": 10}):
        with pytest.raises(ValueError, match=r"^X: \w+_token_id .* lies outside the vocabulary \[0, 10\)"):
            check_special_ids(values, 10, "X")


@pytest.mark.parametrize("bad", [None, 5, {"role": "user"}, "just text", 3.5])
def test_generate_with_prompts_that_are_not_a_list_says_what_prompts_may_be(llada, bad):
    with pytest.raises(ValueError, match=r"prompts must be a list with one entry per row .*token ids") as e:
        dlm_decode.generate(llada, bad, gen_length=8, block_length=8)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("key,value", [("eos_token_id", 63), ("eos_token_id", [1, 63]), ("pad_token_id", 63)])
def test_an_eos_or_pad_equal_to_the_mask_id_is_refused(tmp_path, family, key, value):
    """MASK 63 as EOS: decoding never writes MASK, so no answer could end (it used to run silently to the cap)."""
    path = checkpoint(tmp_path / family, family, mask_token_id=63, **{key: value})
    with pytest.raises(ValueError, match=rf"config\.json: mask_token_id 63 is also the {key}; .* a token of its own"):
        model_facts(path)


@pytest.mark.parametrize(
    "sampler,options,match",
    [
        ("early_commit", {"prefix_ids": (5, 999), "prefix_offset": 0}, r"prefix_ids \(5, 999\) holds 999, outside"),
        ("early_commit", {"prefix_ids": (-1,), "prefix_offset": 0}, r"prefix_ids \(-1,\) holds -1, outside"),
        ("early_commit", {"prefix_ids": (63,), "prefix_offset": 0}, r"prefix_ids \(63,\) holds the MASK id 63"),
        ("adaptive_block", {"delimiter_ids": (64,)}, r"delimiter_ids \(64,\) holds 64, outside the vocabulary \[0, 64"),
    ],
)
def test_sampler_options_holding_token_ids_are_checked_against_the_model(llada, sampler, options, match):
    """Forced prefix tokens past the vocabulary used to be an IndexError inside the model; a MASK among them was
    decoded over; a delimiter past the vocabulary never matched."""
    with pytest.raises(ValueError, match=f"^{sampler}: {match}"):
        dlm_decode.generate(llada, [[5, 6]], sampler=sampler, sampler_options=options, gen_length=8, block_length=8)


def test_in_memory_models_and_tokenizers_are_checked_by_generate_and_the_engine(llada, tok_dir):
    """A model built in memory with no usable EOS gets the notice from generate and the engine too; a tokenizer
    handed in whose ids lie past the vocabulary is refused before any work."""
    from dlm_decode.engine import Engine

    saved = llada.config.eos_token_id
    llada.config.eos_token_id = None
    try:
        with pytest.warns(Notice, match="no usable EOS id"):
            dlm_decode.generate(llada, [[5, 6, 7]], gen_length=8, block_length=8)
        with pytest.warns(Notice, match="no usable EOS id"):
            Engine(llada)
    finally:
        llada.config.eos_token_id = saved
    tok = dlm_decode.load_model(tok_dir)[1]
    bad = SimpleNamespace(
        **{k: getattr(tok, k, None) for k in ("bos_token_id", "pad_token_id")}, eos_token_id=VOCAB + 5
    )
    with pytest.raises(ValueError, match="tokenizer"):
        dlm_decode.generate(llada, [[5, 6, 7]], tokenizer=bad, gen_length=8, block_length=8)
    with pytest.raises(ValueError, match="tokenizer"):
        Engine(llada, bad)
