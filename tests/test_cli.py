"""The ``dlm-decode generate`` command on tiny official-format checkpoints."""

from __future__ import annotations

import json
import shutil

import pytest
from checkpoints import write_tokenizer

from dlm_decode.cli import main
from dlm_decode.samplers import SAMPLERS

BASELINES = ["low_confidence", "random", "origin", "maskgit_plus", "topk_margin", "entropy"]


@pytest.mark.parametrize("sampler", BASELINES)
@pytest.mark.parametrize("which", ["llada_dir", "dream_dir"])
def test_generate_json_with_every_baseline(request, capsys, which, sampler):
    path = request.getfixturevalue(which)
    rc = main(
        [
            "generate",
            str(path),
            "--input-ids",
            "5,6,7",
            "--input-ids",
            "8,9",
            "--sampler",
            sampler,
            "--gen-length",
            "8",
            "--block-length",
            "8",
            "--steps",
            "8",
            "--json",
            "--seed",
            "1",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["prompt_ids"] for r in out["rows"]] == [[5, 6, 7], [8, 9]]
    assert all(len(r["generated_ids"]) == 8 and 63 not in r["generated_ids"] for r in out["rows"])
    assert out["nfe"] <= 8 and out["sampler"]["name"] == sampler and out["cache"]["name"] == "none"
    assert isinstance(out["seconds"], float) and all(isinstance(r["nfe"], int) for r in out["rows"])


@pytest.mark.parametrize(
    "which, sampler, extra, top_k",
    [
        ("dream_dir", "maskgit_plus", [], 50),  # Dream's diffusion_generate default (transformers 4.x)
        ("dream_dir", "entropy", ["--top-k", "0"], 0),  # explicitly off
        ("dream_dir", "topk_margin", ["--top-k", "7"], 7),
        ("dream_dir", "low_confidence", [], None),  # LLaDA's rule: its reference has no top-k
        ("llada_dir", "maskgit_plus", [], None),  # a LLaDA checkpoint has no diffusion_generate defaults
    ],
)
def test_generate_json_reports_the_effective_sampling_options(request, capsys, which, sampler, extra, top_k):
    path = request.getfixturevalue(which)
    argv = ["generate", str(path), "--input-ids", "5,6,7", "--sampler", sampler, "--gen-length", "8", "--json"]
    assert main(argv + extra) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["top_k"] == top_k and out["config"]["temperature"] == 0.0
    assert out["config"]["gen_length"] == out["config"]["block_length"] == 8
    if sampler != "low_confidence":
        assert out["sampler"]["eps"] == 1e-3 and out["sampler"]["alg_temp"] is None
        assert out["config"]["top_p"] == (1.0 if which == "dream_dir" else None)


def test_generate_is_reproducible_and_takes_options(llada_dir, capsys):
    args = [
        "generate",
        str(llada_dir),
        "--input-ids",
        "5,6,7",
        "--sampler",
        "maskgit_plus",
        "--sampler-opt",
        "alg_temp=0.5",
        "--gen-length",
        "8",
        "--steps",
        "4",
        "--temperature",
        "0.7",
        "--seed",
        "5",
        "--json",
    ]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out.split('"seconds"')[0] == first.split('"seconds"')[0]
    assert json.loads(first)["sampler"]["alg_temp"] == 0.5


def test_text_prompts_with_chat_template(llada_dir, tmp_path, capsys):
    path = tmp_path / "withtok"
    shutil.copytree(llada_dir, path)
    write_tokenizer(path)
    assert main(["generate", str(path), "w7 w8 w9", "w10", "--chat", "--gen-length", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["rows"]) == 2 and out["rows"][0]["prompt_ids"][0] == 3  # bos from the chat template
    assert all(isinstance(r["text"], str) for r in out["rows"])


def test_prompts_after_options(llada_dir, tmp_path, capsys):
    """argparse gives PROMPT an empty list when an option follows MODEL; texts after the options are still prompts,
    in order, and decode as the same texts given before the options; an unknown option after them is still refused."""
    path = tmp_path / "withtok"
    shutil.copytree(llada_dir, path)
    write_tokenizer(path)
    before = ["generate", str(path), "w7 w8 w9", "w10", "--chat", "--gen-length", "8", "--json"]
    after = ["generate", str(path), "--chat", "w7 w8 w9", "--gen-length", "8", "w10", "--json"]
    assert main(before) == 0
    want = json.loads(capsys.readouterr().out)["rows"]
    assert main(after) == 0
    got = json.loads(capsys.readouterr().out)["rows"]
    assert [r["prompt_ids"] for r in got] == [r["prompt_ids"] for r in want] and len(got) == 2
    assert [r["generated_ids"] for r in got] == [r["generated_ids"] for r in want]
    with pytest.raises(SystemExit) as e:
        main(["generate", str(path), "--chat", "w7", "--no-such-flag"])
    assert e.value.code == 2 and "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--sampler", "nope"], "valid samplers"),
        (["--cache", "nope"], "valid caches"),
        (["--sampler-opt", "alg_temp"], "KEY=VALUE"),
        (["--dtype", "float32", "--gen-length", "7", "--block-length", "4"], "multiple of block_length"),
        (["--preset", "nope"], "valid presets"),
        (["--preset", "prophet", "--sampler", "threshold"], "drop --sampler"),
        (["--preset", "fast_dllm_threshold", "--sampler-opt", "threshold=1.5"], "threshold"),
    ],
)
def test_bad_flags_exit_2_with_a_message(llada_dir, capsys, args, needle):
    assert main(["generate", str(llada_dir), "--input-ids", "5,6", *args]) == 2
    assert needle in capsys.readouterr().err


def test_missing_model_dir(tmp_path, capsys):
    assert main(["generate", str(tmp_path / "none"), "--input-ids", "1"]) == 2
    assert "neither a checkpoint directory" in capsys.readouterr().err


def test_every_registered_sampler_is_reachable_from_the_cli(llada_dir, capsys):
    for name in SAMPLERS:
        assert (
            main(["generate", str(llada_dir), "--input-ids", "5,6", "--sampler", name, "--gen-length", "8", "--json"])
            == 0
        ), name
        capsys.readouterr()


def test_preset_sets_sampler_options_and_lengths_unless_given(llada_dir, capsys):
    """A preset fills sampler, options and lengths; explicit flags win."""
    from dlm_decode.samplers.presets import get_preset

    demo = "demo-llada"  # 512 positions: room for the presets' gen length 256
    assert main(["generate", demo, "--input-ids", "5,6", "--preset", "prophet_gsm8k", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    preset = get_preset("prophet_gsm8k")
    assert out["sampler"]["name"] == "early_commit" and tuple(out["sampler"]["thresholds"]) == (8.0, 5.0, 3.5)
    assert len(out["rows"][0]["generated_ids"]) == preset.config["gen_length"] == 256
    argv = ["generate", str(llada_dir), "--input-ids", "5,6", "--preset", "fast_dllm_threshold", "--json"]
    assert main([*argv, "--gen-length", "16", "--block-length", "8", "--sampler-opt", "threshold=0.5"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sampler"] == {"name": "threshold", "threshold": 0.5}
    assert len(out["rows"][0]["generated_ids"]) == 16


def _run_without_lm_eval(argv: list[str]):
    """Run the CLI in a fresh interpreter where ``lm_eval`` cannot be imported (the base install)."""
    import subprocess
    import sys

    code = "import sys; sys.modules['lm_eval'] = None\nfrom dlm_decode.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)


def test_base_install_cli_works_without_the_eval_extra():
    # the README's main job (`dlm-decode demo`) must parse and run its sub-commands on a base-only install
    for argv in (["demo", "--help"], ["parallelbench", "--help"], ["generate", "--help"]):
        r = _run_without_lm_eval(argv)
        assert r.returncode == 0, (argv, r.stderr[-2000:])
        assert "usage:" in r.stdout


def test_eval_without_the_extra_says_what_to_install():
    r = _run_without_lm_eval(["eval", "--tasks", "dlm_tiny_mc", "--limit", "2"])
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert 'pip install -e ".[eval]"' in lines[0] and "dlm-decode eval" in lines[0]
