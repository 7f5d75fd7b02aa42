"""Every shell and Python example of README.md and docs/*.md runs (issue 50): an example changes with its test.

A fenced block tagged ``bash``/``sh``/``shell`` is one bash script (``-e -o pipefail``) run from the repository root
with the venv's ``bin`` first on ``PATH`` (so ``dlm-decode`` and ``python`` are this interpreter's) and the checkout
on ``PYTHONPATH``; a ``python`` block runs as a script in a fresh interpreter the same way. Blocks tagged ``text``
(synopses, the layout) are not commands. Each block must exit 0, and the blocks in ``EXPECT`` must print what the
docs say they print.

Two tables keep the rest honest:
- ``REWRITES``: where an example would take minutes (every official sample of a task, a full sweep, benchmark
  repeats), the test shortens it with the flags listed, and says why. Each rule must still match some example.
- ``NOT_RUN``: blocks not run, each with the reason (the set-up commands themselves, GPU-only, multi-process).
Blocks that read the official ParallelBench files skip, saying so, when ``$DLM_PARALLELBENCH_DATA`` /
``../shared/data/parallelbench`` is absent; ``dlm-decode eval`` examples skip without the ``.[eval]`` extra, and
``dlm-decode serve`` examples without the ``.[serve]`` extra and the ``openai`` client.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
SHELL_TAGS = {"bash", "sh", "shell"}
RUN_TAGS = SHELL_TAGS | {"python"}
TIMEOUT_S = 1200


@dataclass(frozen=True)
class Block:
    file: str
    line: int  # line of the opening fence, 1-based
    lang: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Rewrite:
    """Shortens the command lines (continuations joined, comments dropped) that match ``where``: ``sub`` replaces a
    pattern, ``append`` adds flags at the end (argparse keeps the last value of a repeated flag)."""

    where: str
    why: str
    append: str = ""
    sub: tuple[str, str] | None = None


REWRITES = (
    Rewrite(
        r"^dlm-decode parallelbench (?!.*--(plot|list-tasks))(?!.*--limit)",
        "every official sample of a task (100) takes minutes per sampler: 1 sample a task",
        append="--limit 1",
    ),
    Rewrite(r"^dlm-decode parallelbench .*--limit ([2-9]|\d\d)", "1 sample a task", sub=(r"--limit \d+", "--limit 1")),
    Rewrite(
        r"^dlm-decode parallelbench .*--sweep (?!.*--tasks)",
        "a sweep grid over every task: one task, one sample",
        append="--tasks waiting_line/copy --limit 1",
    ),
    Rewrite(r"^(\w+=\S+ )*dlm-decode eval (?!ls)(?!.*--limit)", "a whole lm-eval task: 1 sample", append="--limit 1"),
    Rewrite(r"^(\w+=\S+ )*dlm-decode eval .*--limit ([2-9]|\d\d)", "1 sample", sub=(r"--limit \d+", "--limit 1")),
    Rewrite(r"^\s*limit=\d\d", "lm-eval's simple_evaluate on 20 samples: 1", sub=(r"limit=\d+", "limit=1")),
    Rewrite(
        r"^python benchmarks/bench_speed\.py (?!.*--versus-reference)",
        "16 prompts x every sampler x cache x 3 timed passes: 1 prompt, gen 32, threshold with every cache, 1 pass",
        append="--prompts 1 --gen-length 32 --batch-size 1 --samplers threshold --repeats 1 --warmup 1",
    ),
    Rewrite(
        r"^python benchmarks/bench_speed\.py .*--versus-reference",
        "gen 256-1024 x 5 passes of both loops: gen 32, batch 1, the threshold+dual row, 1 pass",
        append="--vr-configs 32x1 --vr-steps 32 --vr-rows threshold+dual --repeats 1 --warmup 0",
    ),
    Rewrite(
        r"^python benchmarks/bench_caches\.py",
        "gen 256 x batch 8 x two samplers x every cache: gen 32, batch 1, threshold, 1 pass",
        append="--gen-lengths 32 --batches 1 --samplers threshold --repeats 1",
    ),
    Rewrite(
        r"^python benchmarks/bench_lossless\.py",
        "6 tasks x 8 samples x 3 passes: one task, one sample, one pass",
        append="--tasks waiting_line/copy --limit 1 --repeats 1 --warmup 0",
    ),
    Rewrite(
        r"^python benchmarks/bench_(weight_layout|fused_projections)\.py",
        "5 interleaved timing rounds at 5 row counts: one round at 1 and 32 rows",
        append="--repeats 1 --rows 1,32",
    ),
    Rewrite(
        r"^python benchmarks/bench_block_diffusion\.py (?!.*--model)",
        "hidden 128 / 1024 x batch 1 / 8 x gen 256 x 2 passes: hidden 64, batch 1, gen 32, 1 pass",
        append="--widths 64 --batches 1 --gen 32 --repeats 1",
    ),
    Rewrite(
        r"^python benchmarks/bench_block_diffusion\.py .*--model",
        "2 official prompts a task x 3 passes: 1 prompt a task, 1 pass",
        append="--samples 1 --repeats 1",
    ),
    Rewrite(
        r"^python benchmarks/forward_bound\.py",
        "hidden 1024, gen 256, three ways x 3 passes: hidden 64, gen 32, 1 pass, two row counts",
        append="--hidden 64 --gen 32 --repeats 1 --rows 1,32",
    ),
    Rewrite(r"^python benchmarks/prompt_blind\.py", "10 samples a task, twice: 1", append="--limit 1"),
    Rewrite(r"^python benchmarks/profile_decode\.py", "gen 256 x 5 repeats: gen 32, 1", append="--gen 32 --repeats 1"),
    Rewrite(
        r"^python benchmarks/cache_ratios\.py",
        "12 tasks x 3 samples x 10 caches x 2 interleaved rounds: one task, one sample, one round",
        append="--tasks waiting_line/copy --limit 1 --batch-size 1 --rounds 1",
    ),
    Rewrite(
        r"^python benchmarks/elastic_drift\.py",
        "12 tasks x 3 samples x 3 gammas: one task, one sample",
        append="--tasks waiting_line/copy --limit 1",
    ),
)

NOT_RUN = {
    ("README.md", "make demo"): "the set-up commands themselves: `make test` is this suite (and its lint); `make demo` "
    "builds .venv and runs `dlm-decode demo`, run here as `dlm-decode demo --quick` (README, Commands)",
    ("docs/benchmarks.md", "gpu_checks.sh"): "GPU-only: needs a CUDA machine (`pytest -m gpu` and gpu_checks.sh there)",
    ("docs/block_diffusion.md", "gpu_checks.sh"): "GPU-only: needs a CUDA machine (its CPU pieces: "
    "tests/test_benchmark_scripts.py)",
    ("docs/eval.md", "accelerate launch"): "two-process data-parallel launches: tests/test_eval_plugin.py runs the "
    "two-process evaluation (slow)",
}

EXPECT = {  # block (file, text it contains) -> what its stdout must contain
    ("README.md", "dlm_decode.load_model"): '["Mary Johnson", "David Smith", "Lisa Brown"]',
    ("README.md", 'generate demo-llada --chat "$COPY"'): '["Mary Johnson", "David Smith", "Lisa Brown"]',
    ("docs/samplers.md", 'generate demo-llada --chat "$COPY"'): "Mary Johnson",
    ("README.md", "eng = Engine(model, tok, max_batch=4)"): '["Mary Johnson", "David Smith", "Lisa Brown"]',
    ("README.md", "dlm-decode serve demo-llada2"): '"object":"chat.completion"',
    # the lossless examples say what they print: the copy without a cache, entropy's dual-cache output with one
    ("docs/samplers.md", "rule=entropy\n"): '["Mary Johnson", "David Smith", "Lisa Brown"]',
    ("docs/samplers.md", "rule=entropy --cache dual"): '["Mary Harrison", "David Smith", "Lisa Brown"]',
    ("README.md", "--input-ids 5,6,7 --preset fast_dllm_threshold"): "(empty answer: the text ends at once",
    ("README.md", '"$COPY" --preset llada2 --cache none --json'): 'Mary Johnson\\", \\"David Smith',
    ("docs/block_diffusion.md", '"$COPY" --preset llada21'): 'Mary Johnson\\", \\"David Smith',
}

NEEDS_DATA = re.compile(
    r"dlm-decode (parallelbench|eval)|\.\./shared|parallelbench_|bench_lossless|bench_speed\.py"
    r"|cache_ratios|elastic_drift|prompt_blind|bench_block_diffusion.*--data"
)
NEEDS_EVAL = re.compile(r"dlm-decode eval|import lm_eval")
NEEDS_SERVE = re.compile(r"dlm-decode serve|from openai")
SERVE_MODULES = ("fastapi", "uvicorn", "prometheus_client", "openai")


def parse_blocks(file: str) -> list[Block]:
    """The fenced code blocks of one Markdown file, with their language tag."""
    blocks, lang, start, body = [], None, 0, []
    for i, line in enumerate((ROOT / file).read_text().splitlines(), 1):
        fence = re.match(r"^```(\S*)\s*$", line)
        if fence and lang is None:
            lang, start, body = fence.group(1) or "", i, []
        elif line.startswith("```") and lang is not None:
            blocks.append(Block(file, start, lang, "\n".join(body) + "\n"))
            lang = None
        elif lang is not None:
            body.append(line)
    return blocks


def all_blocks() -> list[Block]:
    return [b for f in DOC_FILES for b in parse_blocks(f)]


def not_run_reason(block: Block) -> str | None:
    return next((why for (f, needle), why in NOT_RUN.items() if f == block.file and needle in block.text), None)


def logical_lines(text: str) -> list[str]:
    """Shell lines with continuations joined and trailing comments dropped."""
    lines = re.sub(r"\s*\\\n\s*", " ", text).splitlines()
    return [re.sub(r"\s+#\s.*$", "", line).rstrip() for line in lines]


def rewrite(block: Block, tmp: Path, used: set[int] | None = None) -> str:
    """The block as run: shortened by ``REWRITES``, run outputs (``runs/``) under ``tmp``."""
    lines = logical_lines(block.text) if block.lang in SHELL_TAGS else block.text.splitlines()
    out = []
    for line in lines:
        for i, rule in enumerate(REWRITES):
            if re.search(rule.where, line.strip()):
                if rule.sub:
                    line = re.sub(rule.sub[0], rule.sub[1], line)
                if rule.append:
                    line = f"{line} {rule.append}"
                if used is not None:
                    used.add(i)
        out.append(re.sub(r"(?<![\w/.])runs/", f"{tmp}/runs/", line))
    return "\n".join(out) + "\n"


def data_dir() -> Path:
    return Path(os.environ.get("DLM_PARALLELBENCH_DATA") or ROOT.parent / "shared" / "data" / "parallelbench")


def run_block(block: Block, tmp: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    script = rewrite(block, tmp)
    if block.lang in SHELL_TAGS:
        argv = ["bash", "-e", "-o", "pipefail", "-c", script]
    else:
        argv = [sys.executable, "-c", script]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


RUN_BLOCKS = [b for b in all_blocks() if b.lang in RUN_TAGS]


def test_docs_have_examples_and_every_block_is_accounted_for() -> None:
    """Each table entry still matches a block (a stale entry fails), and only known tags are used."""
    blocks = all_blocks()
    assert len(RUN_BLOCKS) >= 10, [b.id for b in blocks]
    tags = {b.lang for b in blocks}
    assert tags <= RUN_TAGS | {"text"}, f"untagged or unknown code blocks: {tags - RUN_TAGS - {'text'}}"
    for file, needle in NOT_RUN:
        assert any(b.file == file and needle in b.text for b in RUN_BLOCKS), f"NOT_RUN entry matches no block: {needle}"
    for file, needle in EXPECT:
        assert any(b.file == file and needle in b.text for b in RUN_BLOCKS), f"EXPECT entry matches no block: {needle}"
    used: set[int] = set()
    for b in RUN_BLOCKS:
        if not_run_reason(b) is None:
            rewrite(b, Path("/tmp/x"), used)
    stale = [REWRITES[i].where for i in range(len(REWRITES)) if i not in used]
    assert not stale, f"rewrite rules that match no example: {stale}"


def test_rewrite_shortens_and_redirects() -> None:
    block = Block(
        "x.md",
        1,
        "bash",
        "dlm-decode parallelbench --model demo-llada \\\n    --sweep paper --out runs/pb.jsonl  # c\n",
    )
    got = rewrite(block, Path("/tmp/t"))
    assert got == (
        "dlm-decode parallelbench --model demo-llada --sweep paper --out /tmp/t/runs/pb.jsonl "
        "--limit 1 --tasks waiting_line/copy --limit 1\n"
    )


@pytest.mark.slow
@pytest.mark.parametrize("block", RUN_BLOCKS, ids=[b.id for b in RUN_BLOCKS])
def test_doc_example_runs(block: Block, tmp_path: Path) -> None:
    reason = not_run_reason(block)
    if reason:
        pytest.skip(f"not run: {reason}")
    if NEEDS_DATA.search(block.text) and not data_dir().is_dir():
        pytest.skip(f"needs the official ParallelBench files ($DLM_PARALLELBENCH_DATA or {data_dir()})")
    if NEEDS_EVAL.search(block.text) and importlib.util.find_spec("lm_eval") is None:
        pytest.skip('needs the eval extra: pip install -e ".[eval]"')
    if NEEDS_SERVE.search(block.text) and not all(importlib.util.find_spec(m) for m in SERVE_MODULES):
        pytest.skip('needs the serve extra and the openai client: pip install -e ".[serve]" openai')
    result = run_block(block, tmp_path)
    assert result.returncode == 0, (
        f"{block.id} exited {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    for (file, needle), want in EXPECT.items():
        if block.file == file and needle in block.text:
            assert want in result.stdout, f"{block.id}: expected {want!r} in its output\n{result.stdout[-3000:]}"
