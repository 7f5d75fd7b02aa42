"""The ParallelBench runner on the issue-76 families (``dlm-decode parallelbench``, end to end): tiny random
checkpoints of SDAR, Fast-dLLM v2 and LLaDA-MoE in their published formats, each with a word-level tokenizer and a
chat template, decoded with their presets on official samples of a waiting-line and a puzzle task.

The tiny models write garbage, so scores are about 0; what is checked is the bookkeeping: every sample has an answer
and a score, the task's NFE is the mean of its samples', tokens per step is the gen length over it, and every sample's
answer and forwards equal ``dlm_decode.generate`` of that sample alone with the same options (the runner decodes on
the engine, batched), the cache named in the JSON being the one that ran (the exact ``prefix`` on the block-causal
families by default).
"""

from __future__ import annotations

import json

import pytest
from checkpoints import write_tokenizer
from conftest import SHARED_DATA
from fast_dllm_v2_reference import write_fdllm
from llada_moe_reference import write_llada_moe
from sdar_reference import write_sdar

import dlm_decode
from dlm_decode.cli import main
from dlm_decode.parallelbench.runner import load_tasks
from dlm_decode.samplers.presets import get_preset

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="official ParallelBench data not present"),
]

TASKS = ["waiting_line/copy", "puzzle/sudoku_n4_12"]
LIMIT = 3


def _sdar(path):
    write_sdar(path, seed=0, head_scale=2.5, max_position_embeddings=1024)
    write_tokenizer(path)  # MASK 63 and EOS 1, the tiny SDAR format's ids
    return path


def _fdllm(path):
    write_fdllm(path, seed=0, max_position_embeddings=1024, bd_size=8)
    write_tokenizer(path)  # MASK 63; the stop token 2 is the tokenizer's <|eot_id|>
    return path


def _llada_moe(path):
    return write_llada_moe(path, seed=0, max_position_embeddings=1024)


# family, checkpoint writer, the decoding flags, the cache and block length the run must name (SDAR's: its preset's
# block 4 and 4 steps a block, kept although ParallelBench sets the gen length per task)
CASES = {
    "sdar": (_sdar, ["--preset", "sdar", "--temperature", "1.0", "--seed", "3"], "prefix", 4),
    "fast_dllm_v2": (
        _fdllm,
        ["--preset", "fast_dllm_v2", "--block-length", "8", "--sampler-opt", "small_block_size=4"],
        "prefix",
        8,
    ),  # fmt: skip
    "llada_moe": (
        _llada_moe,
        ["--sampler", "threshold", "--sampler-opt", "threshold=0.5", "--cache", "dual", "--block-length", "8"],
        "dual",
        8,
    ),  # fmt: skip
}


def _kwargs(flags: list[str]) -> dict:
    """The ``generate`` keyword arguments the flags mean (to decode each sample alone)."""
    kw: dict = {}
    it = iter(flags)
    for flag in it:
        value = next(it)
        if flag == "--preset":  # ParallelBench keeps a block-causal preset's block and steps, not a gen length
            kw |= get_preset(value).generate_kwargs()
            kw.pop("gen_length", None)
        elif flag == "--sampler":
            kw["sampler"] = value
        elif flag == "--sampler-opt":
            k, v = value.split("=")
            kw.setdefault("sampler_options", {})[k] = int(v) if v.isdigit() else float(v)
        elif flag == "--cache":
            kw["cache"] = value
        else:
            kw[flag[2:].replace("-", "_")] = float(value) if "." in value else int(value)
    return kw


@pytest.mark.parametrize("oracle", [False, True], ids=["engine", "oracle"])
@pytest.mark.parametrize("family", list(CASES))
def test_runner_scores_every_sample_of_the_new_families(family, oracle, tmp_path, capsys):
    """Without ``--oracle`` the runner decodes on the engine; with it, in static ``generate`` batches beside the
    oracle's two passes: both give each sample what it gets alone."""
    write, flags, cache, block = CASES[family]
    path = write(tmp_path / family)
    argv = ["parallelbench", "--model", str(path), "--data", str(SHARED_DATA), "--tasks", ",".join(TASKS)]
    argv += ["--limit", str(LIMIT), "--batch-size", "2", "--outputs", *flags] + (["--oracle"] if oracle else [])
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [t["task"] for t in out["tasks"]] == TASKS and not out["skipped"]
    assert out["decoding"]["cache"] == cache and out["decoding"]["block_length"] == block
    model, tok = dlm_decode.load_model(path)
    kw = _kwargs(flags)
    for entry, task in zip(out["tasks"], load_tasks(SHARED_DATA, TASKS, limit=LIMIT), strict=True):
        assert entry["n"] == LIMIT and len(entry["outputs"]) == LIMIT and entry["errors"] == 0
        assert entry["cache"]["name"] == cache
        for sample in entry["outputs"]:
            assert isinstance(sample["text"], str) and 0.0 <= sample["score"] <= 1.0 and sample["nfe"] >= 1
        nfe = [s["nfe"] for s in entry["outputs"]]
        assert entry["nfe"] == pytest.approx(sum(nfe) / LIMIT)
        assert entry["tokens_per_step"] == pytest.approx(entry["gen_length"] / entry["nfe"])
        assert entry["score"] == pytest.approx(100 * sum(s["score"] for s in entry["outputs"]) / LIMIT)
        if oracle:  # the bound: one forward a token at most, at least one a block
            blocks = entry["gen_length"] // min(block, entry["gen_length"])
            assert blocks <= entry["oracle_nfe"] <= entry["gen_length"] and 0 <= entry["oracle_score"] <= 100
        for i, sample in enumerate(entry["outputs"]):  # each sample as it decodes alone
            alone = dlm_decode.generate(
                model, [task.messages(i)], tokenizer=tok, chat=True, gen_length=entry["gen_length"], **kw
            )
            assert (alone.rows[0].text or "", alone.rows[0].nfe) == (sample["text"], sample["nfe"])
