"""DiffuCoder and Dream-Coder: tiny checkpoints in their published format (Dream's, ``coder_checkpoints``) load with
our Dream implementation, their remote ``DreamTokenizer`` as Qwen2's tokenizer (no remote code, no prompt), and
decode with their published settings (presets ``diffucoder`` / ``dream_coder``: ``entropy``, one token per step, their
temperatures, top-p 0.95): at temperature 0 token for token with Dream's ``diffusion_generate`` re-stated
(``reference_generate.dream_sample``), through ``generate`` and the CLI."""

from __future__ import annotations

import json

import pytest
import torch
from coder_checkpoints import DLM_PAD, ENDOFTEXT, IM_END, MASK, write_coder
from reference_generate import dream_sample

import dlm_decode
from dlm_decode.cli import main
from dlm_decode.models import DreamModel
from dlm_decode.models.loading import load_model, load_tokenizer, model_facts
from dlm_decode.samplers.presets import get_preset

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILIES = ["diffucoder", "dream_coder"]
PUBLISHED = {"diffucoder": (256, 0.4), "dream_coder": (768, 0.1)}  # README: max_new_tokens = steps, temperature
PROMPTS = torch.tensor([[59, 20, 18, 4, 17, 37, 3], [5, 9, 17, 3, 40, 22, 11]])


@pytest.fixture(scope="module", params=FAMILIES)
def coder(request, tmp_path_factory):
    path = write_coder(tmp_path_factory.mktemp(request.param) / "m", request.param, seed=4)
    model, tok = load_model(path)
    return request.param, path, model, tok


def _cli(capsys, path, args):
    assert main(["generate", str(path), "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_loads_with_the_dream_model_and_tokenizer_without_remote_code(coder):
    family, path, model, tok = coder
    assert type(model) is DreamModel and model.mask_token_id == MASK
    assert type(tok).__name__ == "Qwen2Tokenizer"  # Dream's remote DreamTokenizer is Qwen2's BPE
    assert tok.mask_token_id == MASK and tok.convert_tokens_to_ids("<|im_end|>") == IM_END
    assert tok.decode(tok("def f(x): return x+1\n").input_ids) == "def f(x): return x+1\n"
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    # DiffuCoder pads its answers with <|dlm_pad|> (its README cuts there): an end of the answer for it alone
    assert model.eos_token_ids == ([ENDOFTEXT, DLM_PAD] if family == "diffucoder" else [ENDOFTEXT])
    assert (tok.pad_token_id == DLM_PAD) == (family == "diffucoder")
    assert model_facts(path).sampling_defaults["top_k"] == 50  # as diffusion_generate on this config.json


def test_presets_are_the_published_settings():
    for family, (length, temperature) in PUBLISHED.items():
        kw = get_preset(family).generate_kwargs()
        assert kw["sampler"] == "entropy" and kw["sampler_options"] == {"alg_temp": 0.0}
        assert kw["gen_length"] == kw["steps"] == length and "block_length" not in kw
        assert kw["temperature"] == temperature and kw["top_p"] == 0.95
        short = get_preset(family).generate_kwargs(gen_length=16, temperature=0.0)
        assert short["steps"] == 16 and short["temperature"] == 0.0  # one token per step kept; the caller's win


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("gen", [16, 24])
def test_preset_at_temperature_zero_equals_diffusion_generate(coder, batch, gen):
    """The published rule (entropy, steps = tokens, top-p 0.95, the checkpoint's top-k 50) at temperature 0 gives
    the reference's tokens."""
    family, path, model, _ = coder
    config = json.loads((path / "config.json").read_text())
    prompt = PROMPTS[:batch]
    raw = lambda ids: model(ids).logits  # noqa: E731
    ref = dream_sample(raw, prompt, gen, gen, MASK, alg="entropy", config=config, temperature=0.0, top_p=0.95)
    out = dlm_decode.generate(model, prompt, **get_preset(family).generate_kwargs(gen_length=gen, temperature=0.0))
    assert torch.equal(out.sequences, ref)
    assert out.nfe == gen


def test_cli_preset_samples_at_the_published_temperature(coder, capsys):
    """The CLI takes the preset's temperature and top-p unless given; seeded runs repeat; --temperature 0 is the
    reference's greedy decode."""
    family, path, model, _ = coder
    args = ["--input-ids", ",".join(map(str, PROMPTS[0].tolist())), "--preset", family, "--gen-length", "16"]
    out = _cli(capsys, path, [*args, "--seed", "3"])
    assert out["sampler"]["name"] == "entropy" and out["nfe"] == 16
    assert out["config"]["temperature"] == PUBLISHED[family][1] and out["config"]["top_p"] == 0.95
    assert _cli(capsys, path, [*args, "--seed", "3"])["rows"] == out["rows"]
    hot = [*args, "--temperature", "2"] if family == "dream_coder" else args  # 0.1 is all but greedy here
    seeds = {tuple(_cli(capsys, path, [*hot, "--seed", str(s)])["rows"][0]["generated_ids"]) for s in range(4)}
    assert len(seeds) > 1  # it samples
    greedy = _cli(capsys, path, [*args, "--temperature", "0"])
    config = json.loads((path / "config.json").read_text())
    ref = dream_sample(
        lambda x: model(x).logits, PROMPTS[:1], 16, 16, MASK, "entropy", config, temperature=0.0, top_p=0.95
    )
    assert greedy["config"]["temperature"] == 0.0
    assert greedy["rows"][0]["generated_ids"] == ref[0, PROMPTS.shape[1] :].tolist()


def test_cli_text_prompt_through_the_chat_template(coder, capsys):
    family, path, _, _ = coder
    out = _cli(capsys, path, ["def f(x):", "--chat", "--preset", family, "--gen-length", "8"])
    row = out["rows"][0]
    assert row["prompt_ids"][:1] == [59] and len(row["generated_ids"]) == 8 and isinstance(row["text"], str)


def test_a_remote_tokenizer_we_cannot_stand_in_for_is_a_clear_error(tmp_path):
    path = write_coder(tmp_path / "m", "dream_coder")
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    cfg |= {"tokenizer_class": "FancyTokenizer", "auto_map": {"AutoTokenizer": ["tokenization_fancy.Fancy", None]}}
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        ValueError, match=r"tokenizer_config\.json: the tokenizer class 'FancyTokenizer' is remote code"
    ):
        load_tokenizer(path)


def test_lm_eval_plugin_decodes_with_the_preset_settings(coder):
    """The lm-eval plugin loads the published format by path (tokenizer included) and decodes with the preset's
    sampler and temperature 0: the answer is ``generate``'s."""
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance

    from dlm_decode.eval.lm import DLMDecodeLM

    family, path, _, _ = coder
    lm = DLMDecodeLM(pretrained=str(path), sampler="entropy", gen_length=16, steps=16, top_p=0.95, progress=False)
    assert type(lm.tokenizer).__name__ == "Qwen2Tokenizer"
    req = Instance("generate_until", {}, ("def f(x):", {"until": [], "max_gen_toks": 16}), 0, ("t", 0, 1))
    ids = lm.tokenizer("def f(x):")["input_ids"]
    kw = get_preset(family).generate_kwargs(gen_length=16, temperature=0.0)
    direct = dlm_decode.generate(lm.model, [ids], tokenizer=lm.tokenizer, **kw)
    assert lm.generate_until([req]) == [direct.rows[0].text]
