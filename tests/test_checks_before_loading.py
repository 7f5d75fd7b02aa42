"""Bad decoding input fails before any weight is read: one check (``decode.request.check_request``) against the facts
of ``config.json`` (vocabulary, MASK id, maximum length) and the prompts, made by every entry point.

The checkpoint used here has a valid ``config.json`` and tokenizer but garbage in ``model.safetensors``: an argument
error that came after reading the weights would show up as the damaged-weights error instead.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from checkpoints import EOS, MASK, write_tokenizer
from conftest import SHARED_DATA

import dlm_decode
from dlm_decode.cli import main

needs_data = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="official ParallelBench data not present")
WEIGHTS_ERROR = "is damaged or not a safetensors file"


@pytest.fixture(scope="module")
def no_weights(llada_dir, tmp_path_factory) -> Path:
    """config.json and tokenizer of the tiny LLaDA checkpoint; model.safetensors is garbage."""
    path = tmp_path_factory.mktemp("noweights") / "llada"
    shutil.copytree(llada_dir, path)
    write_tokenizer(path)
    (path / "model.safetensors").write_bytes(b"not a safetensors file" * 4)
    return path


def cli_error(capsys, argv: list[str]) -> str:
    """Run the CLI, expect exit 2 with one error line and no traceback; return the line."""
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith(f"dlm-decode {argv[0]}: error: ")]
    assert len(errors) == 1, err
    return errors[0]


IDS = ["--input-ids", "5,6"]
GENERATE_CASES = [
    ([*IDS, "--gen-length", "12", "--block-length", "8"], "gen_length (12) must be a multiple of block_length (8)"),
    ([*IDS, "--gen-length", "8", "--block-length", "16"], "block_length (16) must be <= gen_length (8)"),
    ([*IDS, "--gen-length", "16", "--block-length", "8", "--steps", "3"], "multiple of the number of blocks"),
    ([*IDS, "--gen-length", "0"], "gen_length must be a positive integer, got 0"),
    ([*IDS, "--steps", "0"], "steps must be a positive integer"),
    ([*IDS, "--temperature", "-1"], "temperature must be a finite number >= 0, got -1.0"),
    ([*IDS, "--top-p", "1.5"], "top_p must be in (0, 1], got 1.5"),
    ([*IDS, "--top-k", "-1"], "top_k must be"),
    ([*IDS, "--cfg-scale", "-1"], "cfg_scale must be >= 0"),
    ([*IDS, "--sampler", "learned_filter", "--sampler-opt", "filter=/nonexistent/f"], "learned filter not found"),
    ([*IDS, "--input-ids", "9999"], "prompt 1 has token ids outside the vocabulary [0, 64): [9999]"),
    ([*IDS, "--input-ids", f"5,{MASK},6"], f"prompt 1 contains the MASK id {MASK} at position 1"),
    (["--input-ids", ",".join(["5"] * 250), "--gen-length", "16"], "266 > the model's maximum sequence length 256"),
    ([*IDS, "--gen-length", "256", "--block-length", "256"], "maximum sequence length 256"),
    (["w5 " * 250, "--gen-length", "16"], "prompt 0 has 250 tokens"),  # a text prompt, tokenized before loading
]  # fmt: skip


@pytest.mark.parametrize("args,needle", GENERATE_CASES, ids=[c[1][:40] for c in GENERATE_CASES])
def test_generate_cli_checks_arguments_before_reading_weights(no_weights, capsys, args, needle):
    line = cli_error(capsys, ["generate", str(no_weights), *args])
    assert needle in line and WEIGHTS_ERROR not in line


def test_generate_cli_text_prompt_without_tokenizer_fails_before_weights(no_weights, tmp_path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(no_weights / f, bare / f)
    line = cli_error(capsys, ["generate", str(bare), "w5 w6"])
    assert f"{bare} ships no tokenizer: pass --input-ids" in line


def test_generate_cli_good_arguments_do_reach_the_weights(no_weights, capsys):
    """The control: with nothing wrong in the request, the damaged weights are what fails."""
    line = cli_error(capsys, ["generate", str(no_weights), "--input-ids", "5,6", "--gen-length", "8"])
    assert WEIGHTS_ERROR in line and str(no_weights / "model.safetensors") in line


def test_python_api_facts_come_from_config_json_alone(no_weights):
    from dlm_decode.core.inputs import ModelFacts
    from dlm_decode.decode import check_request
    from dlm_decode.models.loading import model_facts

    facts = model_facts(no_weights)  # the weights are garbage: reading them would fail
    want = ModelFacts(
        vocab_size=64,
        mask_id=MASK,
        max_length=256,
        model_type="llada",
        checkpoint_dir=str(no_weights),
        eos_ids=(EOS,),
        pad_id=EOS,
    )
    assert facts == want
    ok = check_request(facts, [[5, 6]], gen_length=16, block_length=8)
    assert (ok.block_length, ok.num_blocks, ok.config.gen_length) == (8, 2, 16)
    for rows, kw, match in [
        ([[5, MASK]], {}, f"contains the MASK id {MASK} at position 1"),
        ([[5, 64]], {}, r"outside the vocabulary \[0, 64\): \[64\]"),
        ([[5] * 250], {"gen_length": 16}, "maximum sequence length 256"),
        (None, {"gen_length": 256, "block_length": 256}, "gen_length 256 leaves no room for a prompt"),
        ([[5]], {"temperature": -1.0}, "temperature must be a finite number >= 0"),
        ([[5]], {"gen_lenght": 8}, "unknown decoding option.*gen_lenght; valid: gen_length"),
    ]:
        with pytest.raises(ValueError, match=match):
            check_request(facts, rows, **kw)


def test_loaded_model_has_the_same_facts_as_its_config(llada_dir, dream_dir):
    from dlm_decode.core.inputs import ModelFacts
    from dlm_decode.models.loading import model_facts

    for path in (llada_dir, dream_dir):
        assert model_facts(path) == ModelFacts.of_model(dlm_decode.load_model(path, tokenizer=False)[0])


def test_lm_eval_plugin_checks_model_args_against_config_before_weights(no_weights):
    from dlm_decode.eval.lm import DLMDecodeLM

    with pytest.raises(ValueError, match="model_args: gen_length 256 leaves no room for a prompt") as e:
        DLMDecodeLM(pretrained=str(no_weights), gen_length=256, block_length=32, device="cpu", progress=False)
    assert WEIGHTS_ERROR not in str(e.value)


def _request(kind: str, args: tuple):
    from types import SimpleNamespace

    return SimpleNamespace(request_type=kind, args=args)


@pytest.mark.parametrize(
    "model_args,refused",
    [
        (dict(cache="dual"), "cache=dual does"),
        (dict(sampler="threshold"), "sampler=threshold does"),
        (dict(cache="prefix", cache_options="refresh_interval:2"), "cache=prefix, cache_options=.* do"),
    ],
)
@pytest.mark.parametrize("kind", ["loglikelihood", "loglikelihood_rolling"])
def test_lm_eval_plugin_refuses_a_sampler_or_cache_for_likelihoods(no_weights, model_args, refused, kind):
    """Likelihood requests run no sampler and no cache: naming one is refused at the first such request, before the
    (garbage) weights are read; the model loads lazily, so constructing the plugin reads none either."""
    from dlm_decode.eval.lm import DLMDecodeLM

    lm = DLMDecodeLM(pretrained=str(no_weights), device="cpu", progress=False, **model_args)
    args = ("w5 w6", " w7") if kind == "loglikelihood" else ("w5 w6 w7",)
    with pytest.raises(ValueError, match=f"model_args: {refused}.* not apply to {kind} requests") as e:
        getattr(lm, kind)([_request(kind, args)])
    assert WEIGHTS_ERROR not in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match=WEIGHTS_ERROR):  # a generation request would now read the weights
        lm.generate_until([_request("generate_until", ("w5 w6", {"until": ["w9"], "max_gen_toks": 8}))])


def test_lm_eval_plugin_refuses_a_cache_for_the_model_family_before_weights(tmp_path):
    """A cache with no rule for block-causal models, on a LLaDA2 checkpoint, with no gen_length in model_args (each
    task decides it): refused while constructing, before the (garbage) weights are read."""
    from llada2_reference import llada2_config

    from dlm_decode.eval.lm import DLMDecodeLM

    path = tmp_path / "llada2"
    path.mkdir()
    (path / "config.json").write_text(__import__("json").dumps(llada2_config()))
    (path / "model.safetensors").write_bytes(b"garbage" * 8)
    write_tokenizer(path)
    for cache in ("dual", "dkv_decode", "elastic"):
        with pytest.raises(ValueError, match=f"model_args: cache '{cache}' does not apply to the block-causal") as e:
            DLMDecodeLM(pretrained=str(path), cache=cache, device="cpu", progress=False)
        assert WEIGHTS_ERROR not in str(e.value)


def test_eval_cli_refuses_a_cache_for_a_likelihood_task_with_one_line(no_weights, capsys):
    pytest.importorskip("lm_eval")
    argv = ["eval", "--tasks", "dlm_tiny_mc", "--model_args", f"pretrained={no_weights},cache=dual", "--limit", "1"]
    line = cli_error(capsys, argv)
    assert "cache=dual does not apply to loglikelihood requests" in line and WEIGHTS_ERROR not in line


@needs_data
@pytest.mark.parametrize(
    "args,needle",
    [
        (["--temperature", "-1"], "temperature must be a finite number >= 0"),
        (["--gen-length", "256", "--block-length", "256"], "waiting_line/copy: prompt 0 has"),
        (["--sweep", "quick", "--out", "SWEEP", "--gen-length", "256"], "waiting_line/copy: prompt 0 has"),
    ],
)
def test_parallelbench_cli_checks_before_reading_weights(no_weights, tmp_path, capsys, args, needle):
    args = [str(tmp_path / "sweep.jsonl") if a == "SWEEP" else a for a in args]
    base = ["parallelbench", "--model", str(no_weights), "--data", str(SHARED_DATA), "--tasks", "waiting_line/copy"]
    line = cli_error(capsys, [*base, "--limit", "2", *args])
    assert needle in line and WEIGHTS_ERROR not in line
    assert not (tmp_path / "sweep.jsonl").exists()


@needs_data
def test_run_benchmark_checks_every_prompt_before_any_forward(llada_dir, tmp_path):
    from dlm_decode.parallelbench.runner import load_tasks, run_benchmark

    path = tmp_path / "llada"
    shutil.copytree(llada_dir, path)
    write_tokenizer(path)
    model, tok = dlm_decode.load_model(path)
    calls = []
    model.get_input_embeddings().register_forward_pre_hook(lambda *a: calls.append(1))
    tasks = load_tasks(SHARED_DATA, ["waiting_line/copy"], limit=2)
    with pytest.raises(ValueError, match="waiting_line/copy: prompt 0 has .* maximum sequence length 256"):
        run_benchmark(model, tok, tasks, {"gen_length": 256, "block_length": 256})
    assert calls == []  # not even the warm-up ran


def test_eval_cli_checks_model_args_against_the_shipped_tasks_request_types():
    """A mixed task list: the likelihood task's refusal comes before lm-eval runs the generation task (and loads)."""
    pytest.importorskip("lm_eval")
    from dlm_decode.eval.cli import check_before_running, shipped_request_types

    types = shipped_request_types()
    assert types["dlm_tiny_mc"] == {"loglikelihood"} and types["parallelbench"] == {"generate_until"}
    args = ["--model", "dlm_decode", "--tasks", "parallelbench_waiting_line_copy,dlm_tiny_mc", "--model_args"]
    with pytest.raises(ValueError, match="model_args: sampler=threshold does not apply to loglikelihood requests"):
        check_before_running([*args, "pretrained=demo-llada,sampler=threshold"])
    check_before_running([*args, "pretrained=demo-llada"])  # no sampler or cache named: fine
    check_before_running(["--model", "dlm_decode", "--tasks", "parallelbench", "--model_args", "cache=dual"])
    check_before_running(["--model", "hf", "--tasks", "dlm_tiny_mc", "--model_args", "cache=dual"])  # not ours


def test_lm_eval_plugin_checks_each_generation_tasks_lengths_before_weights(no_weights):
    """Without gen_length in model_args each task decides it: the request's lengths and prompts are checked against
    the options (a draft count past the block's steps) before the (garbage) weights are read."""
    from dlm_decode.eval.lm import DLMDecodeLM

    opts = dict(sampler="lossless", sampler_options={"drafts": 100}, block_length=8)
    lm = DLMDecodeLM(pretrained=str(no_weights), device="cpu", progress=False, **opts)
    request = _request("generate_until", ("w5 w6", {"until": ["w9"], "max_gen_toks": 16}))
    with pytest.raises(ValueError, match=r"lossless: drafts \(100\) must be <= the steps of one block \(8\)") as e:
        lm.generate_until([request])
    assert WEIGHTS_ERROR not in str(e.value)
