"""The bad-input matrix of ``../shared/docs/BAD_INPUTS.md`` (151 cases a new user tried, issue 50) kept as tests, one
parametrized case per row, so no change can bring back a traceback, a vague message or a silent wrong answer.

Each case names its row number. CLI cases run ``dlm_decode.cli.main`` in-process and expect exit 2 with exactly one
``dlm-decode <cmd>: error: ...`` line holding the given words, and no traceback; argparse's own refusals (an unknown
flag, a value outside ``choices``) exit 2 through ``SystemExit``. Python cases expect the given exception and words.
Cases that decide a behaviour instead of an error (a notice, an implied flag) have their own tests below. Left out:
row 69 (README's ``--chat`` form: issue 50 item 1), the eval rows 116-122 run only with ``-m slow`` (lm-eval's
start-up takes a minute on the shared machine).

    pytest tests/test_bad_inputs_matrix.py
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from checkpoints import llada_config, llada_state_dict, write_checkpoint, write_tokenizer
from conftest import SHARED_DATA

import dlm_decode
from dlm_decode import DecodeConfig
from dlm_decode.cli import main
from dlm_decode.models.loading import demo_model_path
from dlm_decode.parallelbench import runner
from dlm_decode.samplers.presets import get_preset

needs_data = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="official ParallelBench data not present")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device makes --device cuda valid")
pytestmark = pytest.mark.usefixtures("one_thread")
IDS = ["--input-ids", "5,6", "--gen-length", "8"]  # a valid tiny request on the test checkpoints
DEMO = ["generate", "demo-llada", "--input-ids", "5,6,7", "--gen-length", "16", "--block-length", "8"]


# ------------------------------------------------------------------------------------------------ files


@pytest.fixture(scope="module")
def f(tmp_path_factory) -> SimpleNamespace:
    """Every damaged or odd file the matrix needs, written once: checkpoints, data directories, sweep files."""
    root = tmp_path_factory.mktemp("matrix")
    cfg = llada_config()
    sd = llada_state_dict(cfg)
    good = write_checkpoint(root / "good", cfg, sd)

    def variant(name: str, config: dict | None = None, weights: bytes | None = None, tok: bool = False) -> str:
        path = root / name
        shutil.copytree(good, path)
        if config is not None:
            (path / "config.json").write_text(json.dumps(config))
        if weights is not None:
            (path / "model.safetensors").write_bytes(weights)
        if tok:
            write_tokenizer(path)
        return str(path)

    blob = (good / "model.safetensors").read_bytes()
    ns = SimpleNamespace(root=root, good=str(good))
    (root / "empty").mkdir()
    ns.empty = str(root / "empty")
    ns.no_weights = str(root / "no_weights")
    (root / "no_weights").mkdir()
    shutil.copy(good / "config.json", root / "no_weights")
    ns.truncated = variant("truncated", weights=blob[: len(blob) // 2])
    ns.random = variant("random", weights=bytes(range(256)) * 8)
    ns.zero = variant("zero", weights=b"")
    ns.nan = str(write_checkpoint(root / "nan", cfg, {k: torch.full_like(v, float("nan")) for k, v in sd.items()}))
    drop = lambda key: {k: v for k, v in cfg.items() if k != key}  # noqa: E731
    ns.no_d_model = variant("no_d_model", drop("d_model"))
    ns.no_mask = variant("no_mask", drop("mask_token_id"))
    ns.heads_four = variant("heads_four", llada_config(n_heads="four"))
    ns.gpt2 = variant("gpt2", {"model_type": "gpt2"})
    ns.no_type = variant("no_type", drop("model_type"))
    ns.bad_json = variant("bad_json")
    (Path(ns.bad_json) / "config.json").write_text('{"model_type": "llada",')
    ns.vocab_neg = variant("vocab_neg", llada_config(vocab_size=-5))
    ns.short = variant("short", llada_config(max_sequence_length=16))
    ns.no_config = variant("no_config")
    (Path(ns.no_config) / "config.json").unlink()
    ns.renamed = variant("renamed", {("num_layers" if k == "n_layers" else k): v for k, v in cfg.items()})
    ns.vocab_1000 = variant("vocab_1000", llada_config(vocab_size=1000, embedding_size=1000))
    ns.tok = variant("tok", tok=True)
    ns.grid_bad_key = str(root / "grid_bad_key.json")
    Path(ns.grid_bad_key).write_text('{"blocks": [32]}')
    ns.grid_bad_json = str(root / "grid_bad_json.json")
    Path(ns.grid_bad_json).write_text('{"top_k": [1,}')
    ns.afile = str(root / "afile")
    Path(ns.afile).write_text("x")
    ns.binary = str(root / "binary.jsonl")
    Path(ns.binary).write_bytes(bytes(range(256)))
    if SHARED_DATA.is_dir():
        _data_dirs(ns, root)
    return ns


def _data_dirs(ns: SimpleNamespace, root: Path) -> None:
    """Copies of the waiting-line group of the official data, each broken one way."""

    def data(name: str, copy_text: str | bytes | None = None, config: str | None = None) -> str:
        d = root / name / "waiting_line"
        d.mkdir(parents=True)
        shutil.copy(SHARED_DATA / "waiting_line" / "task_config.yaml", d)
        shutil.copy(SHARED_DATA / "first_last_names.yaml", d.parent)
        lines = (SHARED_DATA / "waiting_line" / "copy.jsonl").read_text().splitlines()[:3]
        text = copy_text if copy_text is not None else "\n".join(lines) + "\n"
        (d / "copy.jsonl").write_bytes(text if isinstance(text, bytes) else text.encode())
        if config is not None:
            (d / "task_config.yaml").write_text(config)
        return str(d.parent)

    good = (SHARED_DATA / "waiting_line" / "copy.jsonl").read_text().splitlines()[:3]
    no_answer = [json.dumps({k: v for k, v in json.loads(line).items() if k != "answer"}) for line in good]
    ns.data_ok = data("data_ok")
    ns.data_bad_line = data("data_bad_line", "{not json\n" + good[1] + "\n")
    ns.data_bytes = data("data_bytes", b'{"input": "\xff\xfe"}\n' + (good[0] + "\n").encode())
    ns.data_empty_jsonl = data("data_empty_jsonl", "")
    ns.data_bad_yaml = data("data_bad_yaml", config="waiting_line/copy: [unclosed\n")
    ns.data_no_answer = data("data_no_answer", "\n".join(no_answer) + "\n")


# ------------------------------------------------------------------------------------------------ runners


def cli_error(capsys, argv: list[str]) -> str:
    """``main(argv)`` exits 2 with one error line (no traceback); the line."""
    rc = main(argv)
    out = capsys.readouterr()
    assert rc == 2, out.err + out.out
    assert "Traceback" not in out.err
    errors = [ln for ln in out.err.splitlines() if ln.startswith(f"dlm-decode {argv[0]}: error: ")]
    assert len(errors) == 1, out.err
    return errors[0]


def argparse_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


def fill(argv: list[str], ns: SimpleNamespace) -> list[str]:
    """``{name}`` in an argument -> the fixture's path of that name."""
    return [a.format(**vars(ns)) if "{" in a else a for a in argv]


# (row, argv, words of the error line); ``{name}`` is a path of the ``f`` fixture
CLI_CASES = [
    ("1", ["generate", "/no/such/model", "hi"], "is neither a checkpoint directory nor a shipped demo model"),
    ("2", ["generate", "demo-lada", "hi"], "'demo-lada' is neither a checkpoint directory"),
    ("3", ["generate", "{empty}", *IDS], "has no config.json"),
    ("4", ["generate", "{no_weights}", *IDS], "has no model.safetensors"),
    ("5", ["generate", "{truncated}", *IDS], "model.safetensors is damaged or not a safetensors file"),
    ("6", ["generate", "{random}", *IDS], "model.safetensors is damaged or not a safetensors file"),
    ("7", ["generate", "{zero}", *IDS], "model.safetensors is damaged or not a safetensors file"),
    ("9", ["generate", "{no_d_model}", *IDS], "config.json: required key 'd_model' is missing"),
    ("10", ["generate", "{no_mask}", *IDS], "required key 'mask_token_id' is missing (the official LLaDA"),
    ("11", ["generate", "{heads_four}", *IDS], "key 'n_heads' must be an integer, got 'four'"),
    ("12", ["generate", "{gpt2}", *IDS], "config model_type 'gpt2' is not supported"),
    ("13", ["generate", "{no_type}", *IDS], "config model_type None is not supported"),
    ("14", ["generate", "{bad_json}", *IDS], "config.json is not valid JSON"),
    ("15", ["generate", "{vocab_neg}", *IDS], "key 'vocab_size' must be >= 1, got -5"),
    ("16", ["generate", "{short}", "--input-ids", "5,6"], "> the model's maximum sequence length 16"),
    ("17", ["generate", "{no_config}", *IDS], "has no config.json"),
    ("18", ["generate", "{good}", "hello", "--gen-length", "8"], "ships no tokenizer: pass --input-ids"),
    ("19", [*DEMO, "--sampler", "nope"], "unknown sampler 'nope'; valid samplers:"),
    ("20", [*DEMO, "--cache", "nope"], "unknown cache 'nope'"),
    ("21", [*DEMO, "--preset", "nope"], "unknown preset 'nope'"),
    ("22", [*DEMO, "--sampler", "threshold", "--sampler-opt", "treshold=0.9"], "has no option(s) treshold"),
    ("23", [*DEMO, "--sampler", "threshold", "--sampler-opt", "threshold=high"], "threshold"),
    ("24", [*DEMO, "--sampler", "threshold", "--sampler-opt", "threshold=1.5"], "threshold"),
    ("25", [*DEMO, "--sampler", "threshold", "--sampler-opt", "threshold"], "'threshold' is not KEY=VALUE"),
    ("26", [*DEMO, "--cache", "dual", "--cache-opt", "nope=1"], "has no option(s) nope"),
    ("28", [*DEMO[:4], "--gen-length", "-8"], "gen_length must be a positive integer, got -8"),
    ("29", [*DEMO[:4], "--gen-length", "0"], "gen_length must be a positive integer, got 0"),
    ("30", [*DEMO[:4], "--gen-length", "100000000"], "maximum sequence length 512"),
    ("32", [*DEMO[:4], "--gen-length", "12", "--block-length", "8"], "gen_length (12) must be a multiple of"),
    ("33", [*DEMO[:4], "--gen-length", "8", "--block-length", "16"], "block_length (16) must be <= gen_length (8)"),
    ("34", [*DEMO[:4], "--block-length", "0"], "block_length must be a positive integer"),
    ("35", [*DEMO, "--steps", "0"], "steps must be a positive integer"),
    ("36", [*DEMO, "--steps", "32"], "steps (32) must be <= gen_length (16)"),
    ("37", ["generate", "demo-llada", "--input-ids", ",".join(["5"] * 600)], "maximum sequence length 512"),
    ("38", ["generate", "demo-llada", "word " * 600], "maximum sequence length 512"),
    ("39", ["generate", "demo-llada", "", "--gen-length", "8"], "prompt 0 is empty text"),
    ("40", ["generate", "demo-llada"], "nothing to decode: give prompt texts or --input-ids"),
    ("41", ["generate", "demo-llada", "--input-ids", ""], "prompt 0 is empty"),
    ("42", ["generate", "demo-llada", "--input-ids", "5,x,7"], "--input-ids expects comma-separated integers"),
    ("43", ["generate", "demo-llada", "--input-ids", "5,-1"], "outside the vocabulary [0, 1332): [-1]"),
    ("44", ["generate", "demo-llada", "--input-ids", "5,9999"], "outside the vocabulary [0, 1332): [9999]"),
    ("45", ["generate", "demo-llada", "--input-ids", "5,2"], "contains the MASK id 2 at position 1"),
    pytest.param("46", [*DEMO, "--device", "cuda"], "--device 'cuda': CUDA is not available", marks=no_cuda),
    ("47", [*DEMO, "--device", "gpu"], "--device 'gpu' is not a torch device"),
    ("49", [*DEMO, "--temperature", "-1"], "temperature must be a finite number >= 0, got -1.0"),
    ("50", [*DEMO, "--temperature", "nan"], "temperature must be a finite number >= 0"),
    ("51", [*DEMO, "--top-p", "1.5"], "top_p must be in (0, 1], got 1.5"),
    ("52", [*DEMO, "--preset", "fast_dllm_threshold", "--sampler", "factor"], "drop --sampler factor"),
    ("53", [*DEMO, "--preset", "learn2pd"], "preset 'learn2pd' needs the sampler option 'filter'"),
    ("54", [*DEMO, "--sampler", "learned_filter", "--sampler-opt", "filter=/no/f"], "learned filter not found"),
    ("55", [*DEMO, "--sampler", "lossless", "--temperature", "1"], "lossless"),
    ("56", [*DEMO, "--sampler", "lossless", "--cache", "window"], "lossless"),
    ("58", ["generate", "{renamed}", *IDS], "required key 'n_layers' is missing"),
    ("59", ["generate", "{vocab_1000}", *IDS], "does not match"),
    ("60", ["generate", "{tok}", *IDS, "--sampler", "learned_filter", "--sampler-opt", "filter=shipped"], "shipped"),
    ("61", ["generate", "demo-llada", "caf\udcff", "--gen-length", "8"], "prompt 0 is not valid UTF-8 text"),
    ("63", [*DEMO, "--cache", "dkv_decode", "--cache-opt", "refresh_interval=0"], "refresh_interval"),
    ("64", [*DEMO[:4], "--gen-length", "16", "--block-length", "8", "--steps", "3"], "multiple of the number"),
    ("65", ["generate", "demo-dream", *IDS, "--sampler", "maskgit_plus", "--sampler-opt", "eps=1.5"], "eps must be"),
    ("86", ["parallelbench", "--threads", "0"], "--threads must be >= 1, got 0"),
    ("85", ["parallelbench", "--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    ("83", ["parallelbench", "--limit", "0"], "--limit must be >= 1"),
    ("84", ["parallelbench", "--limit", "-3"], "--limit must be >= 1"),
    pytest.param("87", ["parallelbench", "--device", "cuda"], "CUDA is not available", marks=no_cuda),
    ("91", ["parallelbench", "--sampler", "nope", "--limit", "1"], "unknown sampler 'nope'"),
    # the default data directory (the official files) must exist, or its error comes before the --out checks
    pytest.param("97", ["parallelbench", "--sweep", "quick", "--limit", "1"], "--sweep needs --out", marks=needs_data),
    pytest.param(
        "98",
        ["parallelbench", "--sweep", "quick", "--out", "/sys/dlm_decode_test/pb.jsonl"],
        "cannot be written",
        marks=needs_data,
    ),
    pytest.param(
        "99",
        ["parallelbench", "--sweep", "quick", "--out", "{afile}/pb.jsonl"],
        "is a file, not a directory",
        marks=needs_data,
    ),
    ("100", ["parallelbench", "--plot", "/no/such/pb.jsonl"], "sweep file /no/such/pb.jsonl not found"),
    ("101", ["parallelbench", "--plot", "{binary}"], "binary.jsonl is not UTF-8 text"),
    ("102", ["parallelbench", "--out", "{root}/pb.jsonl", "--limit", "1"], "add --sweep GRID"),
    ("68b", ["parallelbench", "--sweep", "quick", "--out", "{root}/pb.jsonl", "--outputs"], "a sweep's rows hold"),
    ("102b", ["parallelbench", "--append", "--limit", "1"], "--append adds a sweep's rows"),
    ("110", ["demo", "--samples", "0"], "--samples must be >= 1, got 0"),
    ("111", ["demo", "--model", "/no/such/model"], "is neither a checkpoint directory"),
    ("113", ["demo", "--max-configs", "0"], "--max-configs must be >= 1"),
    pytest.param("114", ["demo", "--device", "cuda"], "CUDA is not available", marks=no_cuda),
    ("115", ["demo", "--threads", "-1"], "--threads must be >= 1, got -1"),
]


@pytest.mark.parametrize("row,argv,words", CLI_CASES, ids=[getattr(c, "values", c)[0] for c in CLI_CASES])
def test_cli_case(row, argv, words, f, capsys):
    assert words in cli_error(capsys, fill(argv, f))


DATA_CASES = [
    ("70", ["--data", "/no/such/dir"], "ParallelBench data directory not found"),
    ("71", ["--data", "{empty}"], "no ParallelBench task in"),
    ("72", ["--data", "{data_ok}/waiting_line/copy.jsonl"], "is a file, not a directory"),
    ("73", ["--data", "{data_bad_line}"], "copy.jsonl:1: invalid JSON"),
    ("74", ["--data", "{data_bytes}"], "copy.jsonl:1: not UTF-8 text (byte 0xff"),
    ("76", ["--data", "{data_bad_yaml}"], "task_config.yaml is not valid YAML (line 2"),
    ("77", ["--data", "{data_no_answer}"], "copy.jsonl:1: a ParallelBench sample is an object with an 'input'"),
    ("78", ["--data", "{data_ok}/waiting_line"], "one task group; pass its parent"),
    ("79", ["--data", "{data_ok}", "--tasks", "waiting_line/cpy"], "unknown ParallelBench task 'waiting_line/cpy'"),
    ("80", ["--data", "{data_ok}", "--tasks", "waiting_line"], "unknown ParallelBench task 'waiting_line'"),
    ("81", ["--data", "{data_ok}", "--tasks", ""], "--tasks '' names no task"),
    ("88", ["--data", "{data_ok}", "--model", "/no/such"], "is neither a checkpoint directory"),
    ("89", ["--data", "{data_ok}", "--model", "{truncated}"], "ships no tokenizer"),
    ("90", ["--data", "{data_ok}", "--model", "{good}"], "ships no tokenizer: ParallelBench needs one"),
    ("92", ["--data", "{data_ok}", "--gen-length", "24", "--block-length", "16"], "must be a multiple of"),
    ("93", ["--data", "{data_ok}", "--gen-length", "640"], "maximum sequence length 512"),
    ("95", ["--data", "{data_ok}", "--sweep", "/no/grid.json", "--out", "{root}/s.jsonl"], "unknown sweep grid"),
    ("96", ["--data", "{data_ok}", "--sweep", "papr", "--out", "{root}/s.jsonl"], "unknown sweep grid 'papr'"),
    ("66", ["--data", "{data_ok}", "--sweep", "{grid_bad_key}", "--out", "{root}/s.jsonl"], "unknown key(s) blocks"),
    ("67", ["--data", "{data_ok}", "--sweep", "{grid_bad_json}", "--out", "{root}/s.jsonl"], "is not valid JSON"),
    ("109", ["--data", "{data_ok}", "--tasks", "waiting_line/cpy"], "unknown ParallelBench task"),
]


@needs_data
@pytest.mark.parametrize("row,argv,words", DATA_CASES, ids=[c[0] for c in DATA_CASES])
def test_parallelbench_data_case(row, argv, words, f, capsys):
    argv = ["parallelbench", "--limit", "1", *argv] if row != "109" else ["demo", *argv]
    assert words in cli_error(capsys, fill(argv, f))


@needs_data
def test_demo_empty_data_dir_112(f, capsys):
    assert "no ParallelBench task" in cli_error(capsys, ["demo", "--data", f.empty])


@pytest.mark.parametrize(
    "row,argv,words",
    [
        ("27", [*DEMO, "--gen-lenght", "8"], "unrecognized arguments: --gen-lenght"),
        ("31", [*DEMO[:4], "--gen-length", "8.5"], "invalid int value: '8.5'"),
        ("48", [*DEMO, "--dtype", "fp8"], "invalid choice: 'fp8'"),
        ("57", [*DEMO, "--compile", "turbo"], "invalid choice: 'turbo'"),
        ("62", [*DEMO, "--top-k", "2.5"], "invalid int value: '2.5'"),
    ],
)
def test_argparse_case(row, argv, words, capsys):
    err = argparse_error(capsys, argv)
    assert words in err
    assert err.startswith("usage: dlm-decode generate ") and "dlm-decode generate: error: " in err  # its own usage


def test_unknown_flag_shows_the_sub_commands_usage_27(capsys):
    err = argparse_error(capsys, ["parallelbench", "--limt", "3"])
    assert err.startswith("usage: dlm-decode parallelbench ")
    assert err.strip().endswith("dlm-decode parallelbench: error: unrecognized arguments: --limt 3")


@pytest.mark.parametrize("row,env", [("103", None), ("106", "/no/such/pb_data")])
@pytest.mark.parametrize("argv", [[], ["--generate-seed", "1"], ["--list-tasks"]], ids=["run", "104", "105"])
def test_no_data_dir_103_to_106(row, env, argv, monkeypatch, capsys):
    monkeypatch.delenv(runner.DATA_ENV, raising=False)
    if env is None:
        monkeypatch.setattr(runner, "default_data_dir", lambda: None)
    else:
        monkeypatch.setenv(runner.DATA_ENV, env)
    line = cli_error(capsys, ["parallelbench", "--limit", "1", *argv])
    assert ("no ParallelBench data directory" if env is None else "data directory not found") in line


@needs_data
def test_broken_line_mid_file_on_resume_107(f, capsys):
    out = f.root / "mid.jsonl"
    out.write_text("{broken\n" + json.dumps({"a": 1}) + "\n")
    argv = ["parallelbench", "--data", f.data_ok, "--limit", "1", "--sweep", "quick", "--out", str(out)]
    assert "mid.jsonl:1: not a JSON line" in cli_error(capsys, argv)


# ------------------------------------------------------------------------------------------------ behaviours


def test_nan_weights_stop_the_row_with_an_error_8(f, capsys):
    assert main(["generate", f.nan, *IDS, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"]
    assert "non-finite logits" in rows[0]["error"]


@needs_data
def test_empty_jsonl_and_text_task_are_skipped_with_one_notice_75_82(f, capsys):
    assert main(["parallelbench", "--data", f.data_empty_jsonl, "--limit", "1"]) == 0
    err = capsys.readouterr().err
    assert "notice: 1 task not scored (skipped): waiting_line/copy: no samples" in err


# ------------------------------------------------------------------------------------------------ Python API


@pytest.fixture(scope="module")
def demo():
    return dlm_decode.load_model("demo-llada")


def _gen(demo, prompts, **kw):
    model, tok = demo
    return dlm_decode.generate(model, prompts, tokenizer=kw.pop("tokenizer", tok), gen_length=kw.pop("g", 8), **kw)


PY_CASES = [
    # (row, call(demo, f), exception, words)
    ("123", lambda d, f: dlm_decode.load_model("/no/such"), FileNotFoundError, "neither a checkpoint directory"),
    ("125", lambda d, f: dlm_decode.load_model("demo-llada", dtype="float8"), ValueError, "dtype 'float8'"),
    ("126", lambda d, f: dlm_decode.load_model("demo-llada", layout="rows"), ValueError, "layout"),
    ("127", lambda d, f: dlm_decode.load_model(f.no_mask), ValueError, "'mask_token_id' is missing"),
    ("128", lambda d, f: dlm_decode.load_model(f.heads_four), ValueError, "'n_heads' must be an integer"),
    ("129", lambda d, f: demo_model_path("demo-lama"), ValueError, "unknown demo model 'demo-lama'"),
    ("130", lambda d, f: _gen(d, []), ValueError, "empty batch"),
    ("131", lambda d, f: _gen(d, [[5, 6]], gen_lenght=8), ValueError, "unknown decoding option(s) gen_lenght"),
    ("132", lambda d, f: _gen(d, ["hi"], tokenizer=None), ValueError, "no tokenizer was given"),
    ("133", lambda d, f: _gen(d, "hello"), ValueError, "not a single string"),
    ("134", lambda d, f: _gen(d, [5, 6, 7]), ValueError, "prompt 0"),
    ("135", lambda d, f: _gen(d, [[5, 6]], sampler="nope"), ValueError, "unknown sampler 'nope'"),
    ("136", lambda d, f: _gen(d, [[5, 6]], sampler_options={"x": 1}), ValueError, "has no option(s) x"),
    ("137", lambda d, f: _gen(d, [[5, 6]], sampler_options=0.9), ValueError, "options must be a dict"),
    ("138", lambda d, f: _gen(d, [[5, 6]], cache="nope"), ValueError, "unknown cache 'nope'"),
    ("139", lambda d, f: _gen(d, [[5, 6]], g=8.0), ValueError, "gen_length must be a positive integer"),
    ("140", lambda d, f: _gen(d, [[5, 6]], g="8"), ValueError, "gen_length must be a positive integer"),
    ("141", lambda d, f: _gen(d, [[5, 6]], g=-8), ValueError, "gen_length must be a positive integer"),
    ("142", lambda d, f: _gen(d, [[5, 6]], g=True), ValueError, "gen_length must be a positive integer"),
    ("143", lambda d, f: _gen(d, [[5, 6]], temperature="0.5"), ValueError, "temperature must be a finite number"),
    (
        "144",
        lambda d, f: dlm_decode.generate(d[0], [[5, 6]], config=DecodeConfig(gen_length=8), gen_length=16),
        ValueError,
        "gen_length=16 (config has 8)",
    ),
    ("145", lambda d, f: DecodeConfig(gen_length=-1), ValueError, "gen_length must be a positive integer, got -1"),
    ("146", lambda d, f: DecodeConfig(gen_lenght=8), TypeError, "gen_lenght"),
    ("147", lambda d, f: get_preset("nope"), ValueError, "unknown preset 'nope'"),
    ("148", lambda d, f: _gen(d, [[{"role": "wizard", "content": "hi"}]]), ValueError, "role 'wizard' is not one"),
    ("149", lambda d, f: _gen(d, [[{"role": "user"}]]), ValueError, "needs 'content' text, got no 'content'"),
    ("150", lambda d, f: _gen(d, None), ValueError, "prompts must be a list with one entry per row"),  # issue 78
    ("151", lambda d, f: _gen(d, [[5, 6]], device="cuda"), ValueError, "unknown decoding option(s) device"),
]
if not torch.cuda.is_available():
    PY_CASES.append(("124", lambda d, f: dlm_decode.load_model("demo-llada", device="cuda"), ValueError, "CUDA"))


@pytest.mark.parametrize("row,call,exc,words", PY_CASES, ids=[c[0] for c in PY_CASES])
def test_python_case(row, call, exc, words, demo, f):
    with pytest.raises(exc) as e:
        call(demo, f)
    assert words in str(e.value) and "\n" not in str(e.value)


# ------------------------------------------------------------------------------------------------ eval (slow)

EVAL = ["eval", "--model", "dlm_decode", "--tasks", "dlm_tiny_mc", "--model_args"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "row,model_args,words",
    [
        ("116", "pretrained=/no/such", "is neither a checkpoint directory"),
        ("117", "pretrained=demo-llada,sampler=nope", "model_args: unknown sampler 'nope'"),
        ("118", "pretrained=demo-llada,foo=1", "has no option(s) foo"),
        ("122", "pretrained=demo-llada,gen_length=512", "gen_length 512 leaves no room for a prompt"),
    ],
)
def test_eval_case(row, model_args, words, capsys):
    rc = main([*EVAL, model_args])
    err = capsys.readouterr().err
    # lm-eval's log handler keeps the stderr of an earlier test's capture: its "--- Logging error ---" report (with a
    # traceback of the closed stream) is a test artefact; any other traceback fails
    assert rc == 2 and err.count("Traceback") == err.count("--- Logging error ---"), err
    errors = [ln for ln in err.splitlines() if ln.startswith("dlm-decode eval: error: ")]
    assert len(errors) == 1 and words in errors[0], err
