"""``dlm-decode batch``: OpenAI batch files through the engine. Every line's answer equals ``generate`` of that
request alone; bad lines get their own 400 entry and the others run; output in input order; ``--resume``."""

from __future__ import annotations

import json

import pytest

import dlm_decode
from dlm_decode.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

CHAT = [{"role": "user", "content": "Sort: pear, apple, fig"}]
LINES = [
    {"custom_id": "a", "url": "/v1/chat/completions",
     "body": {"messages": CHAT, "max_tokens": 32, "sampler": "threshold", "sampler_options": {"threshold": 0.9}}},
    {"custom_id": "b", "url": "/v1/completions", "body": {"prompt": [5, 6, 7], "max_tokens": 48, "seed": 3,
                                                          "temperature": 0.7, "top_p": 0.9}},
    {"custom_id": "bad-field", "url": "/v1/completions", "body": {"prompt": "hi", "logit_bias": {"1": 2}}},
    {"custom_id": "bad-sampler", "url": "/v1/completions", "body": {"prompt": [4], "sampler": "nope"}},
    {"custom_id": "c", "url": "/v1/chat/completions",
     "body": {"messages": [{"role": "user", "content": "Reverse: a b c"}], "max_tokens": 32, "steps": 32,
              "sampler": "low_confidence", "block_length": 16, "cache": "none"}},
    {"custom_id": "bad-url", "url": "/v1/embeddings", "body": {"input": "x"}},
    {"custom_id": "d", "url": "/v1/chat/completions",  # several blocks in flight, the exact cache
     "body": {"messages": CHAT, "max_tokens": 64, "sampler": "threshold", "block_length": 8,
              "sampler_options": {"threshold": 0.9, "block_add_threshold": 0.5, "decoded_token_threshold": 0.9}}},
    {"custom_id": "bad-attention", "url": "/v1/completions",  # D2F's attention on a block-causal model
     "body": {"prompt": [5, 6], "attention": "answer_block_causal"}},
]  # fmt: skip


def write(path, lines):
    path.write_text("".join(json.dumps({"method": "POST"} | x) + "\n" for x in lines) + "not json\n")


def alone(model, tok, line):
    body = dict(line["body"])
    chat = "messages" in body
    prompt = body.pop("messages" if chat else "prompt")
    kw = {{"max_tokens": "gen_length"}.get(k, k): v for k, v in body.items()}
    return dlm_decode.generate(model, [prompt], tokenizer=tok, chat=chat, **kw).rows[0]


def test_batch_file_lines_equal_generate_alone(tmp_path, capsys):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(src, LINES)
    assert main(["batch", "demo-llada2", "-i", str(src), "-o", str(dst), "--max-batch", "2"]) == 0
    out = [json.loads(x) for x in dst.read_text().splitlines()]
    assert [o["custom_id"] for o in out] == [x["custom_id"] for x in LINES] + [None]  # input order, bad line kept
    model, tok = dlm_decode.load_model("demo-llada2")
    for line, o in zip(LINES, out, strict=False):
        if line["custom_id"].startswith("bad"):
            assert o["response"]["status_code"] == 400 and o["error"]["message"]
            continue
        row, body = alone(model, tok, line), o["response"]["body"]
        assert o["response"]["status_code"] == 200 and o["error"] is None
        text = body["choices"][0]["message"]["content"] if "messages" in line["body"] else body["choices"][0]["text"]
        assert text == row.text and body["dlm"]["nfe"] == row.nfe
        assert body["dlm"]["completion_ids"] == row.generated_ids[: len(body["dlm"]["completion_ids"])]
        assert body["usage"]["completion_tokens"] == len(body["dlm"]["completion_ids"])
    assert "logit_bias" in out[2]["error"]["message"] and "nope" in out[3]["error"]["message"]
    assert "url" in out[5]["error"]["message"] and "not JSON" in out[-1]["error"]["message"]
    assert "block-causal already" in out[7]["error"]["message"]


def test_resume_skips_written_lines(tmp_path):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(src, LINES[:2])
    first = json.dumps({"custom_id": "a", "response": {"status_code": 200, "body": {"marker": 1}}, "error": None})
    dst.write_text(first + "\n")
    # an existing output without --resume is refused before loading
    assert main(["batch", "demo-llada2", "-i", str(src), "-o", str(dst)]) == 2
    assert main(["batch", "demo-llada2", "-i", str(src), "-o", str(dst), "--resume"]) == 0
    out = [json.loads(x) for x in dst.read_text().splitlines()]
    assert out[0]["response"]["body"] == {"marker": 1}  # kept, not redone
    assert [o["custom_id"] for o in out] == ["a", "b", None]


def test_bad_batch_arguments_fail_before_loading(tmp_path, capsys):
    code = main(["batch", "demo-llada2", "-i", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "o.jsonl")])
    assert code == 2 and "missing.jsonl" in capsys.readouterr().err
    assert main(["batch", "demo-llada2", "-i", str(tmp_path / "o.jsonl"), "-o", "x", "--max-batch", "0"]) == 2


@pytest.mark.slow
def test_two_processes_write_what_one_writes(tmp_path):
    """Under torchrun (as under accelerate launch) two CPU processes split the lines and merge in input order."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    src, one, two = tmp_path / "in.jsonl", tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    write(src, LINES)
    assert main(["batch", "demo-llada2", "-i", str(src), "-o", str(one)]) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29531"]
    cmd = [*launch, "-m", "dlm_decode.cli", "batch", "demo-llada2", "-i", str(src), "-o", str(two)]
    proc = subprocess.run(cmd, env=env, timeout=600, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]

    def strip(path):  # the timings and creation times differ between runs
        out = []
        for x in path.read_text().splitlines():
            line = json.loads(x)
            body = line["response"]["body"]
            if "dlm" in body:
                body.pop("created")
                body["dlm"].pop("seconds")
                body.pop("id")
            out.append(line)
        return out

    assert strip(one) == strip(two)
    assert not list(tmp_path.glob("two.jsonl.part*"))
