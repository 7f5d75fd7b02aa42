"""Run ParallelBench tasks through ``dlm_decode.generate`` and score them the benchmark's way.

    from dlm_decode.parallelbench.runner import load_tasks, run_benchmark, format_table
    tasks = load_tasks("/path/to/parallelbench", ["waiting_line/copy"], limit=8)          # or generate_seed=S
    results = run_benchmark(model, tok, tasks, {"sampler": "threshold", "sampler_options": {"threshold": 0.9}})
    print(format_table(results))

The CLI is ``dlm-decode parallelbench`` (:mod:`dlm_decode.parallelbench.cli`).

Per task: every sample's chat is built by ``build_messages`` and rendered by the model's chat template (``chat=True``);
the samples are decoded by the continuous-batching engine (``dlm_decode.engine``), ``batch_size`` at a time, a
finished one's row taken at once by the next (each decodes exactly as it would alone, so batching never changes an
answer). The oracle and the reference pass (and options the engine does not take) run ``generate`` in static
batches of ``batch_size``, sorted by prompt length to cut padding. ``gen_length`` is the task's ``max_new_tokens``
(32 waiting line, 64 puzzles and text) unless the decoding options set one (the task's budget is the benchmark's, so a
checkpoint's ``generation_config.json`` gen length does not replace it); a block longer than the generation is clipped
to it. An unset block length is the checkpoint's (``generation_config.json``, clipped to the task's gen length;
``decode.request.with_model_lengths``), else the sampler's default. ``k`` (tokens per step of the fixed-budget samplers)
sets ``steps = gen_length // k`` per task. Scores come from ``score_sample`` (lenient and strict, mean x 100). NFE is
the mean over samples of the forwards each row took part in; tokens per step is the paper's ``max_tokens / NFE`` on that
mean. Text tasks whose metric is unavailable are not decoded: they come back with ``skipped`` set and the CLI prints a
notice. Every result records the torch thread count it was timed with (``threads``): CPU timings depend on it far more
than on the rule.

Oracle bound (Learn2PD's "extremely greedy parallel", ALGORITHMS.md section 5), run by
``dlm_decode.decode.oracle.oracle_generate`` with the sampler ``dlm_decode.samplers.oracle.Oracle``: decode one token
per step (``low_confidence``, ``steps = gen_length``, same block length, no cache, temperature 0) to get the reference
``y``; re-decode committing, at every step, exactly the masked block slots whose current proposal equals ``y`` (with
``y``'s token). When a step's block proposals repeat the previous step's (the model is stuck), the block is filled
with ``y``, as Learn2PD's reference does; a block is also bounded by ``2 * block_length`` forwards. The oracle
therefore reproduces ``y`` exactly: its score is the one-token-per-step score and its NFE is the per-sample bound
every sampler's NFE is read against. ``sampler="oracle"`` runs the oracle itself as the method.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from dlm_decode.core.inputs import ModelFacts, encode_prompts
from dlm_decode.core.words import plural
from dlm_decode.decode import check_request, generate, oracle_generate
from dlm_decode.decode.request import default_cache
from dlm_decode.engine import REQUEST_OPTIONS, Engine
from dlm_decode.parallelbench.generator import generate_task, load_names, sample_key
from dlm_decode.parallelbench.metrics import MetricUnavailable, score_sample
from dlm_decode.parallelbench.tasks import Task, answer_text, list_tasks, load_task, max_new_tokens, task_kind

DATA_ENV = "DLM_PARALLELBENCH_DATA"
GENERATABLE_KINDS = ("waiting_line", "puzzle")


# ------------------------------------------------------------------------------------------------ tasks


def default_data_dir() -> Path | None:
    """``$DLM_PARALLELBENCH_DATA``, else ``../shared/data/parallelbench`` beside the repository, else None."""
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env)
    here = Path(__file__).resolve().parents[3] / "shared" / "data" / "parallelbench"
    return here if here.is_dir() else None


def require_data_dir(data_dir: str | Path | None) -> Path:
    path = Path(data_dir) if data_dir is not None else default_data_dir()
    if path is None:
        raise FileNotFoundError(
            "no ParallelBench data directory: pass --data DIR (official files: task_config.yaml per group and the "
            f"names file; needed for the task prompts even with --generate-seed) or set ${DATA_ENV}"
        )
    if path.exists() and not path.is_dir():
        raise ValueError(
            f"ParallelBench data directory {str(path)!r} is a file, not a directory; pass the folder holding "
            "<group>/task_config.yaml and <group>/<task>.jsonl files"
        )
    if not path.is_dir():
        raise FileNotFoundError(f"ParallelBench data directory not found: {str(path)!r}")
    return path


def task_names(root: Path) -> list[str]:
    """Every task of the data directory ``root``; a directory holding none (one level too high or too low) is an
    error that says where the tasks are."""
    names = list_tasks(root)
    if names:
        return names
    below = sorted({str(c.parent.parent) for c in root.glob("*/*/task_config.yaml")})
    if (root / "task_config.yaml").is_file():
        hint = f"it holds task_config.yaml, so it is one task group; pass its parent {str(root.parent)!r}"
    elif below:
        hint = "the task groups lie one level down; pass " + " or ".join(repr(b) for b in below)
    else:
        hint = "a data directory holds <group>/task_config.yaml and <group>/<task>.jsonl files"
    raise ValueError(f"no ParallelBench task in {str(root)!r}: {hint}")


def task_seed(seed: int, name: str) -> int:
    """One seed per task derived from a run seed (stable across Python versions and processes)."""
    return int(hashlib.sha256(f"{seed}:{name}".encode()).hexdigest()[:12], 16)


def load_tasks(
    data_dir: str | Path | None,
    names: list[str] | None = None,
    *,
    limit: int | None = None,
    generate_seed: int | None = None,
    exclude_official: bool = False,
) -> list[Task]:
    """Tasks from the official files under ``data_dir``, or regenerated from their configs with ``generate_seed``.

    ``names`` defaults to every task of ``data_dir`` (every waiting-line and puzzle task when generating). Generated
    tasks have ``limit`` samples (default: the config's ``num_samples``), drawn with ``task_seed(generate_seed, name)``;
    ``exclude_official`` skips any generated sample whose input equals an official test sample's.
    """
    root = require_data_dir(data_dir)
    available = task_names(root)
    if generate_seed is None:
        return [load_task(root, n, limit) for n in (names or available)]
    if names is None:
        names = [n for n in available if task_kind(n) in GENERATABLE_KINDS]
    out = []
    for name in names:
        official = load_task(root, name, limit=None if exclude_official else 0)
        people = None
        if task_kind(name) == "waiting_line":
            people = load_names(root / official.config.get("words", "first_last_names.yaml"))
        exclude = {sample_key(s) for s in official.samples}
        seed = task_seed(generate_seed, name)
        samples = generate_task(name, official.config, people, n=limit, seed=seed, exclude=exclude)
        out.append(Task(name=name, config=official.config, samples=samples))
    return out


def skip_reason(task: Task) -> str | None:
    """Why a task cannot be scored here (text metrics), or None."""
    if not task.samples:
        return "no samples"
    try:
        score_sample(task.config if "metric" in task.config else task.name, "", task.samples[0])
    except MetricUnavailable as e:
        return str(e)
    return None


# ------------------------------------------------------------------------------------------------ oracle


def oracle_kwargs(kw: dict[str, Any]) -> dict[str, Any]:
    """The run's gen length, block length, seed and guidance, no cache, greedy: both oracle passes decode with these
    (``oracle_generate`` adds the sampler and the reference pass's one-token-per-step budget)."""
    keep = ("gen_length", "block_length", "seed", "cfg_scale")
    return {k: kw[k] for k in keep if k in kw} | {"cache": "none", "cache_options": {}, "temperature": 0.0}


def reference_kwargs(kw: dict[str, Any]) -> dict[str, Any]:
    """One token per step with the run's gen length and block length: the oracle's reference decode."""
    ref = oracle_kwargs(kw)
    return ref | {"sampler": "low_confidence", "sampler_options": {}, "steps": ref["gen_length"]}


# ------------------------------------------------------------------------------------------------ running


@dataclass
class TaskResult:
    """One task under one decoding configuration (``to_json`` gives the CLI's per-task entry)."""

    task: str
    n: int
    gen_length: int
    score: float | None = None  # mean x 100 (None: not scored)
    score_strict: float | None = None
    nfe: float | None = None  # mean sequential forwards per sample (the latency measure)
    tokens_per_step: float | None = None  # gen_length / nfe
    token_forwards: float | None = None  # mean query slots computed per sample (the compute; drafts count each)
    accepted_steps_per_call: float | None = None  # steps of the followed rule per forward (> 1: draft-and-verify)
    seconds: float = 0.0  # decoding time of the task (all batches)
    tokens_per_second: float | None = None  # n * gen_length / seconds
    errors: int = 0  # rows that stopped with an error (scored 0)
    threads: int | None = None  # torch intra-op threads while timing (CPU timings depend on it)
    oracle_nfe: float | None = None
    oracle_score: float | None = None
    skipped: str | None = None
    sampler: dict[str, Any] = field(default_factory=dict)
    cache: dict[str, Any] = field(default_factory=dict)
    outputs: list[dict[str, Any]] = field(default_factory=list)  # per sample: text, score, nfe
    trace: list[int] | None = None  # decoding order of the task's first sample: step that committed each slot

    @property
    def nfe_ratio(self) -> float | None:
        return self.nfe / self.oracle_nfe if self.nfe and self.oracle_nfe else None

    def to_json(self, outputs: bool = False) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["nfe_ratio"] = self.nfe_ratio
        if not outputs:
            d.pop("outputs")
        return d


def task_kwargs(decoding: dict[str, Any], task: str, k: int | None = None) -> dict[str, Any]:
    """Generate keyword arguments for one task: its gen length, the block clipped to it, steps from ``k``."""
    kw = dict(decoding)
    gen = kw.get("gen_length") or max_new_tokens(task)
    kw["gen_length"] = gen
    if kw.get("block_length") and kw["block_length"] > gen:
        kw["block_length"] = gen
    if k is not None:
        if k < 1 or gen % k:
            raise ValueError(f"{task}: tokens per step k={k} must divide gen_length {gen}")
        kw["steps"] = gen // k
    return kw


def check_task_kwargs(
    kw: dict[str, Any], task: Task | str, facts: ModelFacts | None = None, tokenizer: Any = None
) -> None:
    """``check_request`` (the one validation ``generate`` runs), so a bad configuration fails before any decoding.
    Given the model's ``facts`` and ``tokenizer``, a scored task's prompts are checked too (vocabulary, length with its
    gen_length). Errors start with the task name."""
    name = task if isinstance(task, str) else task.name
    if kw.get("sampler") == "oracle":
        kw = reference_kwargs(kw)  # the oracle's own sampler is built per batch; its reference decode is checked
    rows = None
    if facts is not None and tokenizer is not None and isinstance(task, Task) and skip_reason(task) is None:
        rows = encode_prompts([task.messages(i) for i in range(len(task))], tokenizer, chat=True)
    try:
        check_request(facts, rows, **kw)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


def short_budget(task: Task, gen_length: int, tokenizer: Any) -> str | None:
    """A warning when ``gen_length`` is shorter than some of ``task``'s reference answers (tokenized alone): those
    samples cannot score, so a run would report a low score for a budget reason; None when every answer fits."""
    lengths = []
    for sample in task.samples:
        try:
            lengths.append(len(tokenizer(answer_text(sample["answer"]), add_special_tokens=False)["input_ids"]))
        except (ValueError, KeyError, TypeError):  # an answer without one reference text (scored by rule)
            continue
    longer = sum(n > gen_length for n in lengths)
    if not longer:
        return None
    return (
        f"{task.name}: gen_length {gen_length} is shorter than {plural(longer, 'reference answer')} of "
        f"{plural(len(lengths), 'sample')} (up to {max(lengths)} tokens); those samples cannot score"
    )


def _is_reference(kw: dict[str, Any], facts: ModelFacts | None) -> bool:
    """Whether the run itself is the oracle's reference decode (then it is reused, not decoded twice). A run that
    names no cache gets the model's default (the exact ``prefix`` on block-causal models), so it is the reference's
    uncached decode only where that default is ``none``."""
    ref = reference_kwargs(kw)
    have = kw | {"steps": kw.get("steps") or kw["gen_length"], "cache": kw.get("cache") or default_cache(facts)}
    have.setdefault("sampler", "low_confidence")
    have.setdefault("temperature", 0.0)
    same = all(have.get(k) == v for k, v in ref.items() if k not in ("sampler_options", "cache_options"))
    return same and not kw.get("sampler_options") and not kw.get("cache_options") and not kw.get("stop_at_eos")


def _score(result: TaskResult, task: Task, texts: list[str], nfe: list[int]) -> None:
    """Score the answers into ``result``: mean and strict score, forwards, tokens per step, per-sample outputs."""
    n, gen = len(task), result.gen_length
    scores = [score_sample(_metric_key(task), texts[i], task.samples[i]) for i in range(n)]
    result.score = 100.0 * sum(s["score"] for s in scores) / n
    result.score_strict = 100.0 * sum(s["score_strict"] for s in scores) / n
    result.nfe = sum(nfe) / n
    result.tokens_per_step = gen / result.nfe if result.nfe else None
    result.outputs = [{"text": texts[i], "score": scores[i]["score"], "nfe": nfe[i]} for i in range(n)]


def run_task(
    model: Any,
    tokenizer: Any,
    task: Task,
    decoding: dict[str, Any] | None = None,
    *,
    k: int | None = None,
    batch_size: int = 8,
    oracle: bool = False,
    progress: bool = False,
) -> TaskResult:
    """Decode and score every sample of ``task``. ``decoding``: ``generate`` keyword arguments (sampler, cache,
    block_length, steps, temperature, seed, ...); ``sampler="oracle"`` runs the oracle itself as the method."""
    kw = task_kwargs(decoding or {}, task.name, k)
    gen = kw["gen_length"]
    reason = skip_reason(task)
    if reason is not None:
        return TaskResult(task.name, len(task), gen, skipped=reason)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    as_oracle = kw.get("sampler") == "oracle" and "reference" not in (kw.get("sampler_options") or {})
    want_oracle = oracle or as_oracle
    is_ref = _is_reference(kw, ModelFacts.of_model(model))
    chats = [task.messages(i) for i in range(len(task))]
    order = sorted(range(len(chats)), key=lambda i: sum(len(m["content"]) for m in chats[i]))
    bar = tqdm(total=len(chats), desc=task.name, unit="sample", disable=not progress)
    if not want_oracle and not is_ref and set(kw) <= set(REQUEST_OPTIONS):
        got = _engine_answers(model, tokenizer, chats, order, kw, batch_size, bar)
    else:
        ways = (want_oracle, as_oracle, is_ref)
        got = _batch_answers(model, tokenizer, chats, order, kw, batch_size, bar, ways, task.name)
    bar.close()
    result = TaskResult(task.name, len(task), gen, sampler=got.sampler, cache=got.cache)
    texts, nfe = got.texts, got.nfe
    _score(result, task, texts, nfe)
    n = len(task)
    result.token_forwards = got.token_forwards / n
    result.accepted_steps_per_call = got.accepted / got.calls if got.calls else None
    result.seconds = got.seconds
    result.tokens_per_second = n * gen / got.seconds if got.seconds > 0 else None
    result.errors, result.threads, result.trace = got.errors, torch.get_num_threads(), got.trace0
    if want_oracle:
        _score_oracle(result, task, got.ref_texts, got.oracle_nfe)
    return result


@dataclass
class _Answers:
    """A task's decoded answers and the statistics ``run_task`` reports (per sample, in task order)."""

    texts: list[str]
    nfe: list[int]
    sampler: dict[str, Any] = field(default_factory=dict)
    cache: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    errors: int = 0
    token_forwards: int = 0
    accepted: int = 0
    calls: int = 0
    trace0: list[int] | None = None
    ref_texts: list[str] = field(default_factory=list)
    oracle_nfe: list[int] = field(default_factory=list)


def _engine_answers(model, tokenizer, chats, order, kw, batch_size, bar) -> _Answers:
    """The method's answers from the continuous-batching engine (``batch_size`` requests at a time, each as it
    decodes alone, a finished one's row taken at once by the next)."""
    eng = Engine(model, tokenizer, max_batch=batch_size)
    start = time.perf_counter()
    handles = {i: eng.submit(chats[i], chat=True, **kw) for i in order}
    done = 0
    while eng.step():
        now = sum(h.done for h in handles.values())
        bar.update(now - done)
        done = now
    bar.update(len(chats) - done)
    got = _Answers([""] * len(chats), [0] * len(chats), seconds=time.perf_counter() - start)
    for i, h in handles.items():
        r = h.result()
        got.texts[i], got.nfe[i] = r.text or "", r.nfe
        got.errors += r.error is not None
        got.token_forwards += r.token_forwards
        got.accepted += r.accepted_steps
        got.calls += r.nfe
        got.sampler, got.cache = r.stats["sampler"], r.stats["cache"]
    got.trace0 = handles[0].result().trace if 0 in handles else None
    return got


def _batch_answers(model, tokenizer, chats, order, kw, batch_size, bar, ways, name) -> _Answers:
    """The answers from static batches of ``generate`` (the reference and oracle passes, and options the engine
    does not take). ``ways``: (the oracle wanted, the oracle as the method, the method is the reference)."""
    want_oracle, as_oracle, is_ref = ways
    got = _Answers([""] * len(chats), [0] * len(chats), ref_texts=[""] * len(chats), oracle_nfe=[0] * len(chats))
    for b0 in range(0, len(order), batch_size):
        idx = order[b0 : b0 + batch_size]
        batch = [chats[i] for i in idx]
        ref = None
        if want_oracle:
            ref, orc, _ = oracle_generate(model, batch, tokenizer=tokenizer, chat=True, trace=True, **oracle_kwargs(kw))
            if not torch.equal(orc.generated, ref.generated):
                raise RuntimeError(f"{name}: the oracle did not reproduce its reference answer")
            for j, i in enumerate(idx):
                got.oracle_nfe[i] = orc.rows[j].nfe
                got.ref_texts[i] = ref.rows[j].text or ""
        elif is_ref:
            ref = generate(model, batch, tokenizer=tokenizer, chat=True, trace=True, **reference_kwargs(kw))
        if as_oracle:
            out = orc
            out.seconds += ref.seconds  # the bound needs both passes
        elif ref is not None and is_ref:
            out = ref
        else:
            out = generate(model, batch, tokenizer=tokenizer, chat=True, trace=True, **kw)
        got.seconds += out.seconds
        got.token_forwards += out.token_forwards
        got.accepted += sum(r.accepted_steps for r in out.rows)
        got.calls += sum(r.nfe for r in out.rows)
        got.sampler = {"name": "oracle"} if as_oracle else out.sampler
        got.cache = out.cache
        for j, i in enumerate(idx):
            row = out.rows[j]
            got.texts[i], got.nfe[i] = row.text or "", row.nfe
            got.errors += row.error is not None
            if i == 0:
                got.trace0 = out.trace[j].tolist()
        bar.update(len(idx))
    return got


def _score_oracle(result: TaskResult, task: Task, ref_texts: list[str], oracle_nfe: list[int]) -> None:
    """The per-sample oracle bound into ``result``: its forwards and its reference answers' score."""
    n = len(task)
    result.oracle_nfe = sum(oracle_nfe) / n
    ref_scores = [score_sample(_metric_key(task), ref_texts[i], task.samples[i])["score"] for i in range(n)]
    result.oracle_score = 100.0 * sum(ref_scores) / n


def warm_up(model: Any, tokenizer: Any, tasks: list[Task]) -> None:
    """One short untimed decode, so one-time costs (allocator growth, lazy init) stay out of the first timing."""
    task = next((t for t in tasks if t.samples), None)
    if task is not None:
        gen = max_new_tokens(task.name)
        generate(model, [task.messages(0)], tokenizer=tokenizer, chat=True, gen_length=gen, steps=4)


def _metric_key(task: Task) -> Any:
    return task.config if "metric" in task.config else task.name


def run_benchmark(
    model: Any,
    tokenizer: Any,
    tasks: list[Task],
    decoding: dict[str, Any] | None = None,
    *,
    k: int | None = None,
    batch_size: int = 8,
    oracle: bool = False,
    progress: bool = False,
) -> list[TaskResult]:
    """``run_task`` over ``tasks`` after checking the configuration against every task (fails before any work);
    ``progress``: one bar per task. Ctrl-C raises :class:`Interrupted` carrying the finished tasks' results."""
    for t in tasks:
        check_task_kwargs(task_kwargs(decoding or {}, t.name, k), t, ModelFacts.of_model(model), tokenizer)
    results: list[TaskResult] = []
    try:
        warm_up(model, tokenizer, [t for t in tasks if skip_reason(t) is None])
        for t in tasks:
            kw = dict(k=k, batch_size=batch_size, oracle=oracle, progress=progress)
            results.append(run_task(model, tokenizer, t, decoding, **kw))
    except KeyboardInterrupt as e:
        raise Interrupted(results) from e
    return results


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during ``run_benchmark`` or ``run_sweep``; still a KeyboardInterrupt. ``results``: what finished before
    it (``TaskResult`` objects, or a sweep's rows of this run); the task being decoded is dropped. ``path``: the
    sweep's JSONL, where every finished row already is."""

    def __init__(self, results: list[Any], path: Path | None = None) -> None:
        super().__init__(f"interrupted after {len(results)} finished")
        self.results, self.path = results, path


# ------------------------------------------------------------------------------------------------ reporting


def summarize(results: list[TaskResult]) -> dict[str, Any]:
    """Means over the scored tasks (scores x 100, NFE, tokens per step) and totals."""
    done = [r for r in results if r.skipped is None and r.score is not None]
    if not done:
        return {"tasks": 0}

    def mean(vals: list[float | None]) -> float | None:
        vals = [v for v in vals if v is not None]
        return sum(vals) / len(vals) if vals else None

    seconds = sum(r.seconds for r in done)
    tokens = sum(r.n * r.gen_length for r in done)
    threads = sorted({r.threads for r in done if r.threads is not None})
    return {
        "tasks": len(done),
        "score": mean([r.score for r in done]),
        "score_strict": mean([r.score_strict for r in done]),
        "nfe": mean([r.nfe for r in done]),
        "tokens_per_step": mean([r.tokens_per_step for r in done]),
        "token_forwards": mean([r.token_forwards for r in done]),
        "accepted_steps_per_call": mean([r.accepted_steps_per_call for r in done]),
        "oracle_nfe": mean([r.oracle_nfe for r in done]),
        "oracle_tokens_per_step": mean([r.gen_length / r.oracle_nfe for r in done if r.oracle_nfe]),
        "seconds": seconds,
        "tokens_per_second": tokens / seconds if seconds > 0 else None,
        "errors": sum(r.errors for r in done),
        "threads": threads[0] if len(threads) == 1 else (threads or None),
    }


def _fmt(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def format_table(results: list[TaskResult]) -> str:
    """Per-task table (task, n, score, strict, NFE, tokens/step, seconds; oracle columns when computed) and, with more
    than one scored task, a ``mean`` row: every column's mean over them (seconds too; ``summarize`` keeps the total)."""
    with_oracle = any(r.oracle_nfe is not None for r in results)
    head = ["task", "n", "score", "strict", "NFE", "tok/step", "seconds"]
    if with_oracle:
        head += ["oracle NFE", "NFE/oracle"]
    rows = []
    for r in results:
        if r.skipped is not None:
            rows.append([r.task, str(r.n), "skipped", "", "", "", ""] + (["", ""] if with_oracle else []))
            continue
        row = [r.task, str(r.n), _fmt(r.score), _fmt(r.score_strict), _fmt(r.nfe, 2), _fmt(r.tokens_per_step, 2)]
        row.append(_fmt(r.seconds, 2))
        if with_oracle:
            row += [_fmt(r.oracle_nfe, 2), _fmt(r.nfe_ratio, 2)]
        rows.append(row)
    s = summarize(results)
    if s.get("tasks", 0) > 1:
        row = ["mean", "", _fmt(s["score"]), _fmt(s["score_strict"]), _fmt(s["nfe"], 2)]
        row += [_fmt(s["tokens_per_step"], 2), _fmt(s["seconds"] / s["tasks"], 2)]  # a mean, as every column here
        if with_oracle:
            ratio = s["nfe"] / s["oracle_nfe"] if s["oracle_nfe"] else None
            row += [_fmt(s["oracle_nfe"], 2), _fmt(ratio, 2)]
        rows.append(row)
    return render_table(head, rows)


def render_table(head: list[str], rows: list[list[str]]) -> str:
    """Plain aligned columns: text left-aligned in the first column, the rest right-aligned."""
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=False)]

    def line(cells: list[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        parts = [str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in pairs]
        return "  ".join(parts).rstrip()

    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(r) for r in rows])
