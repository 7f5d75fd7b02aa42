"""A checkpoint's decoding defaults (``generation_config.json``, ``core.generation_config``): read in one place,
validated with errors naming the file and the key, used by ``generate``, the CLI and the ParallelBench runner when
the caller gives no length; explicit lengths always win."""

from __future__ import annotations

import json
import shutil

import pytest

import dlm_decode
from dlm_decode.cli import main
from dlm_decode.core.generation_config import GenerationDefaults, fill_lengths, read_generation_defaults
from dlm_decode.decode.request import check_request
from dlm_decode.models.loading import demo_model_path, model_facts


@pytest.fixture
def with_config(llada_dir, tmp_path):
    """A copy of the tiny LLaDA checkpoint whose generation_config.json sets gen length 12, block 4."""
    path = tmp_path / "ckpt"
    shutil.copytree(llada_dir, path)
    (path / "generation_config.json").write_text(json.dumps({"gen_length": 12, "block_length": 4, "bos_token_id": 1}))
    return path


def test_reader_without_a_file_or_keys_sets_nothing(llada_dir, tmp_path):
    assert read_generation_defaults(llada_dir) == GenerationDefaults()
    assert read_generation_defaults(None) == GenerationDefaults()
    (tmp_path / "generation_config.json").write_text('{"bos_token_id": 1, "max_new_tokens": 20}')
    assert read_generation_defaults(tmp_path) == GenerationDefaults()  # transformers' own keys are left alone


@pytest.mark.parametrize(
    "text, match",
    [
        ("{not json", r"generation_config.json is not valid JSON \(line 1"),
        ("[32]", r"generation_config.json: the generation config must be a JSON object"),
        ('{"gen_length": 0}', r"generation_config.json: gen_length must be a positive integer, got 0"),
        ('{"block_length": "32"}', r"generation_config.json: block_length must be a positive integer, got '32'"),
        ('{"steps": true}', r"generation_config.json: steps must be a positive integer, got True"),
        ('{"gen_length": 32, "block_length": 12}', r"gen_length \(32\) must be a multiple of block_length \(12\)"),
        ('{"chat": "yes"}', r"generation_config.json: chat must be true or false, got 'yes'"),
    ],
)
def test_a_malformed_file_is_a_clear_error_before_loading(llada_dir, tmp_path, capsys, text, match):
    path = tmp_path / "ckpt"
    shutil.copytree(llada_dir, path)
    (path / "generation_config.json").write_text(text)
    with pytest.raises(ValueError, match=match) as e:
        model_facts(path)
    assert str(path / "generation_config.json") in str(e.value)
    assert main(["generate", str(path), "--input-ids", "5,6"]) == 2  # the CLI: exit 2, one line naming the file
    assert str(path / "generation_config.json") in capsys.readouterr().err


def test_fill_rule():
    d = GenerationDefaults(gen_length=32, block_length=16, steps=8)
    assert fill_lengths(d, None, None, None) == {"gen_length": 32, "block_length": 16, "steps": 8}
    assert fill_lengths(d, 64, None, None) == {"block_length": 16}  # its steps only with its gen length
    assert fill_lengths(d, 8, None, None) == {"block_length": 8}  # the block clipped to the caller's gen length
    assert fill_lengths(d, 64, 32, 64) == {}  # given lengths win
    assert fill_lengths(d, None, None, None, blockwise=False) == {"gen_length": 32, "steps": 8}


def test_generate_uses_the_checkpoint_lengths_unless_given(with_config, llada_dir):
    model, _ = dlm_decode.load_model(with_config)
    out = dlm_decode.generate(model, [[5, 6, 7]], sampler="low_confidence")
    assert len(out.rows[0].generated_ids) == 12 and out.nfe == 12  # gen 12, steps = gen
    assert out.to_json()["config"]["block_length"] == 4
    out = dlm_decode.generate(model, [[5, 6, 7]], gen_length=8, steps=4)  # explicit lengths win
    assert len(out.rows[0].generated_ids) == 8 and out.nfe == 4 and out.to_json()["config"]["block_length"] == 4
    cfg = dlm_decode.DecodeConfig(gen_length=16, block_length=16)  # a DecodeConfig is explicit too
    assert check_request(model_facts(with_config), config=cfg).block_length == 16
    plain = check_request(model_facts(llada_dir), [[5, 6, 7]])  # no file: the usual defaults
    assert (plain.config.gen_length, plain.block_length) == (128, 32)
    dream_order = check_request(model_facts(with_config), sampler="origin")  # one block, as Dream's reference
    assert (dream_order.config.gen_length, dream_order.block_length) == (12, 12)


def test_cli_uses_the_checkpoint_lengths_unless_given(with_config, capsys):
    assert main(["generate", str(with_config), "--input-ids", "5,6", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["config"]["gen_length"], out["config"]["block_length"]) == (12, 4)
    assert main(["generate", str(with_config), "--input-ids", "5,6", "--gen-length", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["config"]["gen_length"], out["config"]["block_length"]) == (8, 4)


def test_runner_keeps_the_task_gen_length_and_takes_the_checkpoint_block(with_config):
    from dlm_decode.parallelbench.runner import task_kwargs

    kw = task_kwargs({"sampler": "low_confidence"}, "puzzle/latin_square_n4")
    req = check_request(model_facts(with_config), **kw)
    assert (req.config.gen_length, req.block_length) == (64, 4)
    kw = task_kwargs({"sampler": "low_confidence", "block_length": 8}, "waiting_line/copy")
    assert check_request(model_facts(with_config), **kw).block_length == 8


@pytest.mark.parametrize("name", ["demo-llada", "demo-dream"])
def test_demo_models_carry_their_trained_lengths(name):
    """Both decode at the length their answers were padded to in training (32 for the waiting line)."""
    want = GenerationDefaults(gen_length=32, block_length=32, chat=True)
    assert read_generation_defaults(demo_model_path(name)) == want


def test_demo_llada2_carries_its_open_ended_cap_and_chat():
    """Open-ended with a 128-slot cap, block 32, one token per step, and text prompts as chats by default."""
    want = GenerationDefaults(gen_length=128, block_length=32, steps=128, chat=True)
    assert read_generation_defaults(demo_model_path("demo-llada2")) == want


COPY_PROMPT = (
    "You are managing a waiting line at a customer service desk.\n"
    "You need to record the following people in the order they arrived:\n"
    '["Mary Johnson", "David Smith", "Lisa Brown"]\n'
    "Please copy the list exactly and provide only the final list.\n"
)


@pytest.mark.parametrize("name", ["demo-llada", "demo-dream", "demo-llada2"])
def test_demo_model_answers_a_plain_prompt_with_no_flags(name, capsys):
    """`dlm-decode generate demo-llada "<prompt>"`: the checkpoint's chat and length defaults make it answer."""
    assert main(["generate", name, COPY_PROMPT]) == 0
    assert '["Mary Johnson", "David Smith", "Lisa Brown"]' in capsys.readouterr().out
    # --no-chat overrides the checkpoint: the bare text is not the model's format, and the answer is not the list
    assert main(["generate", name, COPY_PROMPT, "--no-chat"]) == 0
    assert '["Mary Johnson", "David Smith", "Lisa Brown"]' not in capsys.readouterr().out


def test_chat_default_follows_the_checkpoint_unless_given(llada_dir, tmp_path):
    tok = dlm_decode.models.loading.load_tokenizer("demo-llada")
    model, _ = dlm_decode.load_model("demo-llada", tokenizer=False)
    plain = dlm_decode.generate(model, [COPY_PROMPT], tokenizer=tok, chat=False).rows[0]
    chat = dlm_decode.generate(model, [COPY_PROMPT], tokenizer=tok).rows[0]
    explicit = dlm_decode.generate(model, [COPY_PROMPT], tokenizer=tok, chat=True).rows[0]
    assert chat.prompt_ids == explicit.prompt_ids != plain.prompt_ids
    with pytest.raises(ValueError, match="chat must be True, False or None"):
        dlm_decode.generate(model, [COPY_PROMPT], tokenizer=tok, chat="yes")


def test_a_config_leaving_lengths_unset_takes_the_checkpoint_lengths_without_a_clash(with_config):
    """The lm-eval plugin passes a DecodeConfig with the block unset: the checkpoint's block fills it (no
    'given both in config= and as keywords' error), and a length the config sets still wins."""
    from dlm_decode.core.config import DecodeConfig

    facts = model_facts(with_config)
    req = check_request(facts, config=DecodeConfig(gen_length=64))
    assert req.block_length == facts.generation.block_length != DecodeConfig.block_length
    assert check_request(facts, config=DecodeConfig(gen_length=64, block_length=8)).block_length == 8


# ---- special ids and look-alike keys (issue 78): checked like config.json, never silently ignored


def gen_config(llada_dir, tmp_path, data: dict):
    path = tmp_path / "ids"
    shutil.copytree(llada_dir, path)
    (path / "generation_config.json").write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    "data,match",
    [
        ({"mask_token_id": 5000}, r"generation_config\.json: mask_token_id 5000 lies outside the vocabulary \[0, 64\)"),
        ({"eos_token_id": [1, 64]}, r"generation_config\.json: eos_token_id \[1, 64\] \(id 64\) lies outside"),
        ({"pad_token_id": 99999}, r"generation_config\.json: pad_token_id 99999 lies outside"),
        ({"bos_token_id": 70}, r"generation_config\.json: bos_token_id 70 lies outside"),
        ({"mask_token_id": "x"}, r"generation_config\.json: mask_token_id must be a token id >= 0"),
        ({"eos_token_id": -1}, r"generation_config\.json: eos_token_id must be a token id >= 0"),
    ],
)
def test_an_id_in_generation_config_is_checked_like_config_json(llada_dir, tmp_path, capsys, data, match):
    path = gen_config(llada_dir, tmp_path, data)
    with pytest.raises(ValueError, match=match):
        model_facts(path)
    assert main(["generate", str(path), "--input-ids", "5,6", "--gen-length", "8", "--block-length", "8"]) == 2
    assert "generation_config.json" in capsys.readouterr().err


def test_an_id_generation_config_sets_but_decoding_does_not_use_gets_one_notice(llada_dir, tmp_path):
    from dlm_decode.core.special_ids import Notice

    path = gen_config(llada_dir, tmp_path, {"mask_token_id": 7, "eos_token_id": 1, "pad_token_id": 1})
    with pytest.warns(Notice) as seen:
        facts = model_facts(path)
    (only,) = [str(w.message) for w in seen if w.category is Notice]  # the EOS and PAD agree with config.json
    assert "mask_token_id 7 is not read from this file (decoding uses 63" in only
    assert "set mask_token_id in config.json" in only and facts.mask_id == 63


def test_keys_that_look_like_ours_get_a_notice_naming_ours(llada_dir, tmp_path):
    from dlm_decode.core.special_ids import Notice

    data = {"gen_len": 64, "block_size": 8, "gen_lenght": 8, "temperature": 0.5, "max_new_tokens": 9}
    path = gen_config(llada_dir, tmp_path, data)
    with pytest.warns(Notice) as seen:
        got = read_generation_defaults(path)
    said = sorted(str(w.message).split(": ", 1)[1] for w in seen if w.category is Notice)
    assert said == [
        "key 'block_size' is not read (ignored); the block_length goes in key 'block_length'",
        "key 'gen_len' is not read (ignored); the gen_length goes in key 'gen_length'",
        "key 'gen_lenght' is not read (ignored); the gen_length goes in key 'gen_length'",
    ]  # transformers' own keys (temperature, max_new_tokens) are left alone
    assert got == GenerationDefaults()


def test_the_shipped_generation_configs_raise_no_notice():
    import warnings

    from dlm_decode.core.special_ids import Notice

    with warnings.catch_warnings():
        warnings.simplefilter("error", Notice)
        for name in ("demo-llada", "demo-dream", "demo-llada2"):  # demo-llada2's file repeats config.json's ids
            model_facts(name)


def test_a_generation_config_naming_one_of_several_eos_ids_in_use_is_quiet(llada_dir, tmp_path):
    """config.json ends answers at [1, 5] (DiffuCoder-style extra EOS); the file names 1: true, so no notice."""
    import warnings

    from dlm_decode.core.special_ids import Notice

    path = gen_config(llada_dir, tmp_path, {"eos_token_id": 1})
    cfg = json.loads((path / "config.json").read_text()) | {"eos_token_id": [1, 5]}
    (path / "config.json").write_text(json.dumps(cfg))
    with warnings.catch_warnings():
        warnings.simplefilter("error", Notice)
        assert model_facts(path).eos_ids == (1, 5)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 7]}))
    with pytest.warns(Notice, match=r"eos_token_id \[1, 7\] is not read from this file \(decoding uses \[1, 5\]"):
        model_facts(path)
