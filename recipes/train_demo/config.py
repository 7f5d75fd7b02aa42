"""The training recipe's configuration: a YAML file loaded into frozen dataclasses, the only home of every default.

A config has five sections (see ``configs/*.yaml``)::

    model:    family, attention, block_length, size (d_model ...), rope_theta, tie_embeddings, tokenizer
    data:     short_format, short_batch, full_batch, short_share, short_icl, task_weights, self_rows, t_sampling,
              uniform_lengths, state_scoring, shuffle_answer
    optim:    lr, warmup, stage_warmup, decay_steps, weight_decay, train_only
    stages:   a list of {kind: short | full, steps: N, tasks: [...], and per-stage options}
    run:      seed, eval_every, eval_samples, save_every, export_every, keep_exports, threads, row_workers,
              time_limit, stop_after

A key left out takes the dataclass default below; an unknown key, a wrong type or a value out of range is a
``ValueError`` naming the key (``stages[1].share``), raised before anything is loaded. ``apply_overrides`` changes a
loaded config with ``section.key=value`` strings (the value read as YAML), the command line's ``--set``.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from recipes.train_demo.self_rows import STATE_SCORING
from recipes.train_demo.stream import AUX_TASKS, SELF, SHUFFLE_ANSWERS, STAGE_TASKS, list_lengths

# the longest canvas a stage may pad to: the official prompts (up to ~240 tokens) plus this fit the demo models' 512
MAX_CANVAS = 256
FAMILIES = ("llada", "dream", "llada2")  # llada2: the block-causal LLaDA2 MoE (dlm_decode.models.llada2)
ATTENTIONS = ("bidirectional", "block_causal")


@dataclass(frozen=True)
class ModelConfig:
    """The architecture of a fresh model (ignored, but for ``rope_theta``, when the run starts from ``init``)."""

    family: str = "llada"  # llada | dream | llada2
    attention: str = "bidirectional"  # bidirectional (LLaDA, Dream) | block_causal (llada2, with block_length)
    block_length: int | None = None  # block-causal attention's block; None for bidirectional attention
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None  # None: n_heads (llada), n_heads // 2 (dream)
    mlp_hidden: int = 384
    max_len: int = 512
    rope_theta: float | None = None  # None: 10,000 fresh, the init model's own with init; a value replaces it
    tie_embeddings: bool = False  # llada only: output projection = input embedding (weight_tying)
    init: str | None = None  # start from this exported model (its architecture); optimizer and schedule fresh
    tokenizer: str | None = None  # tokenizer directory (tokenizer.py); None: the init model's own
    # llada2 only (LLaDA2MoeConfig keys in brackets): the MoE and attention of a fresh model
    n_experts: int = 4  # routed experts (num_experts)
    experts_per_tok: int = 2  # (num_experts_per_tok); >= 2 keeps the upcycled MoE equal to the dense MLP
    n_group: int = 2  # expert groups of the group-limited top-k (n_group)
    topk_group: int = 2  # groups kept (topk_group)
    moe_hidden: int = 96  # width of one routed expert (moe_intermediate_size)
    n_shared_experts: int = 4  # the shared expert's width is moe_hidden * this (num_shared_experts)
    first_dense: int = 1  # leading dense layers (first_k_dense_replace)
    routed_scale: float = 2.5  # (routed_scaling_factor)
    qk_norm: bool = True  # RMSNorm per head on q and k (use_qk_norm)
    partial_rotary: float = 0.5  # share of head_dim rotated (partial_rotary_factor); 1.0 is LLaDA's full RoPE
    upcycle: str | None = None  # llada2: a fresh model initialised from this LLaDA checkpoint (upcycle.py)
    grow_after: tuple[int, ...] = ()  # with init: a zero-output copy of each listed layer after it (model.grown)

    @property
    def kv_heads(self) -> int:
        if self.n_kv_heads is not None:
            return self.n_kv_heads
        return self.n_heads if self.family == "llada" else max(self.n_heads // 2, 1)


@dataclass(frozen=True)
class DataConfig:
    """What a step's batch holds (stream.py's ``Mix``), unless a stage says otherwise."""

    short_format: str = "bare"  # chat | bare | bare-padded: how short rows are written (stream.py)
    short_batch: int = 64  # batch size of short stages
    full_batch: int = 64  # batch size of full stages
    short_share: float = 0.25  # share of short rows in a full stage's batch
    short_icl: float = 0.0  # share of short rows shown the sample's in-context example first
    task_weights: dict[str, float] = field(default_factory=dict)  # task (op name or full name) -> weight, default 1
    self_rows: tuple[str, ...] = ()  # certainty_forcing/trajectories.py train.jsonl files, for stages naming self
    t_sampling: str = "uniform"  # uniform | stratified mask ratios per batch
    # True: every waiting-line row draws its list length uniformly from its range. False (the data of the shipped
    # stages up to demo-llada2's tenth): the generator's official length buckets fill over the few rows a task gets
    # in a step, first bucket first, so a task with one row a step only ever sees its shortest lists
    uniform_lengths: bool = False
    # which slots of a decode-order self row are scored: block (its scored list: every open slot of the block being
    # decoded) | next (its next list: the slots the decoder committed from that state)
    state_scoring: str = "block"
    # shuffle's training target: random (a fresh valid order per row) | swap_first | rotate | reverse
    # (stream.SHUFFLE_RULES: one fixed valid order per list); a fixed rule also drops the self rows' shuffle answers,
    # which are other orders
    shuffle_answer: str = "random"


@dataclass(frozen=True)
class OptimConfig:
    """AdamW (betas 0.9 / 0.95, clip 1.0) under a warm-up / constant / linear-decay schedule."""

    lr: float = 1e-3  # peak rate; a stage's lr replaces it for its steps
    warmup: int = 100
    stage_warmup: int = 200  # steps of a fresh ramp at the start of every later stage (0: none)
    decay_steps: int | None = None  # linear decay to a tenth over the last N steps; None: 15% of the steps
    weight_decay: float = 0.1
    train_only: tuple[str, ...] | None = None  # regular expressions: only matching parameters train


@dataclass(frozen=True)
class Stage:
    """One stage of the curriculum: ``steps`` steps of ``kind`` rows (short: short rows only; full: the official
    prompts plus ``share`` short rows) over ``tasks`` (None: the twelve benchmark tasks). Options left None take
    ``data``'s value. ``lengths``: people per waiting-line list (a length curriculum); ``gap``: the most filler words
    after a short row's list; ``aux_chat=False`` keeps training-only rows out of the official slots; ``aux_pad``:
    whether training-only rows are EOS-padded (default: as ``pad``); ``canvas``: full rows padded to a length drawn
    up to N tokens; ``reset``: fresh optimizer moments at the stage's start; ``stale``: the share of rows trained
    the way a Fast-dLLM prefix or dual cache serves them at decode time, in blocks of ``stale_block`` tokens
    (``stale.py``; bidirectional models); ``clean_context``: the share of rows scored on one block with the response
    before it clean, the state a block is decoded in (``objective.py``; block-causal models); ``whole_names``: the
    share of rows whose people are masked whole (a last name takes its first name's draw; ``objective.py``);
    ``noisy_prefix``: the share of clean-context rows whose block before the scored one stays partly masked, the state
    a block is decoded in with several blocks in flight (``objective.clean_context_rows``)."""

    kind: str
    steps: int
    tasks: tuple[str, ...] | None = None
    lr: float | None = None
    share: float | None = None
    icl: float | None = None
    pad: bool | None = None
    reset: bool = False
    gap: int | None = None
    lengths: tuple[int, int] | None = None
    aux_chat: bool = True
    aux_pad: bool | None = None
    canvas: int = 0
    stale: float = 0.0
    stale_block: int = 32
    clean_context: float = 0.0
    whole_names: float = 0.0
    noisy_prefix: float = 0.0


@dataclass(frozen=True)
class RunConfig:
    seed: int = 0
    eval_every: int = 500  # steps between held-out evaluations and at the end (0: never)
    eval_samples: int = 12  # held-out samples per task per evaluation
    save_every: int = 50  # steps between atomic checkpoints
    export_every: int = 500  # steps between exports (0: only at the end)
    keep_exports: bool = False  # keep every periodic export as export-stepN/
    threads: int = 2
    row_workers: int = 0  # forked processes that build the next steps' rows (same rows with any number)
    time_limit: float | None = None  # seconds from start-up: checkpoint, export and stop at the first step past it
    stop_after: int | None = None  # end the run after this step, saved and exported (as a time-limited run)


@dataclass(frozen=True)
class TrainConfig:
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    optim: OptimConfig = OptimConfig()
    stages: tuple[Stage, ...] = (Stage("short", 2500, ("waiting_line/copy", "waiting_line/reverse")),)
    run: RunConfig = RunConfig()

    @property
    def total_steps(self) -> int:
        return sum(st.steps for st in self.stages)


# ------------------------------------------------------------------------------------------------ loading


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Read a YAML config (ValueError naming the file on a bad one), apply ``--set`` overrides, check it."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--config: {path} is not a file")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"--config {path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"--config {path}: expected a mapping of sections, got {type(raw).__name__}")
    for item in overrides:
        _set(raw, item)
    try:
        return config_from_dict(raw)
    except ValueError as e:
        raise ValueError(f"--config {path}: {e}") from None


def _set(raw: dict, item: str) -> None:
    key, eq, value = item.partition("=")
    parts = key.strip().split(".")
    if not eq or len(parts) != 2 or parts[0] not in ("model", "data", "optim", "run"):
        raise ValueError(f"--set: expected SECTION.KEY=VALUE (section model, data, optim or run), got {item!r}")
    section = raw.setdefault(parts[0], {})
    if not isinstance(section, dict):
        raise ValueError(f"--set {item!r}: section {parts[0]} is not a mapping")
    section[parts[1]] = yaml.safe_load(value)


def config_from_dict(raw: dict[str, Any]) -> TrainConfig:
    """The checked config from a mapping shaped like the YAML file."""
    _only(raw, {f.name for f in dataclasses.fields(TrainConfig)}, "")
    stages = raw.get("stages")
    if stages is not None and (not isinstance(stages, list) or not stages):
        raise ValueError("stages: give a non-empty list of {kind, steps, ...} entries")
    cfg = TrainConfig(
        model=_build(ModelConfig, raw.get("model"), "model"),
        data=_build(DataConfig, raw.get("data"), "data"),
        optim=_build(OptimConfig, raw.get("optim"), "optim"),
        stages=tuple(_stage(s, f"stages[{i}]") for i, s in enumerate(stages)) if stages else TrainConfig.stages,
        run=_build(RunConfig, raw.get("run"), "run"),
    )
    check_config(cfg)
    return cfg


def _only(raw: Any, allowed: set[str], where: str) -> None:
    if not isinstance(raw, dict):
        raise ValueError(f"{where or 'config'}: expected a mapping, got {raw!r}")
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ValueError(f"{where or 'config'}: unknown key(s) {unknown}; allowed: {', '.join(sorted(allowed))}")


def _build(cls: type, raw: dict | None, where: str) -> Any:
    raw = {} if raw is None else raw
    hints = typing.get_type_hints(cls)
    _only(raw, set(hints), where)
    return cls(**{k: _coerce(v, hints[k], f"{where}.{k}") for k, v in raw.items()})


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """``value`` as type ``hint`` (YAML reads 1e-3 as a string, lists as lists); a mismatch names ``where``."""
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        if value is None and type(None) in args:
            return None
        return _coerce(value, next(a for a in args if a is not type(None)), where)
    origin = typing.get_origin(hint)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ValueError(f"{where}: expected a list, got {value!r}")
        inner = args[0]
        return tuple(_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected a mapping, got {value!r}")
        return {str(k): _coerce(v, args[1], f"{where}.{k}") for k, v in value.items()}
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: expected true or false, got {value!r}")
        return value
    if hint in (int, float):
        try:
            out = hint(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: expected a number, got {value!r}") from None
        if isinstance(value, bool) or (hint is int and out != float(value)):
            raise ValueError(f"{where}: expected a whole number, got {value!r}")
        return out
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected text, got {value!r}")
    return value


def _stage(raw: Any, where: str) -> Stage:
    """A stage entry; its tasks may be op names (``sort``) or full names (``waiting_line/sort``), ``lengths`` a
    range ``2-3``."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping like {{kind: full, steps: 1000}}, got {raw!r}")
    raw = dict(raw)
    if "lengths" in raw and raw["lengths"] is not None:
        raw["lengths"] = list(list_lengths(str(raw["lengths"]), where))
    if "tasks" in raw and raw["tasks"] is not None:
        raw["tasks"] = [task_name(str(t), f"{where}.tasks") for t in raw["tasks"]]
    for key in ("kind", "steps"):
        if key not in raw:
            raise ValueError(f"{where}: needs {key}")
    return _build(Stage, raw, where)


def task_name(name: str, where: str) -> str:
    """The full task name of ``name`` (``sort`` -> ``waiting_line/sort``); an unknown one is a ValueError."""
    full = {t.split("/", 1)[1]: t for t in STAGE_TASKS} | {t: t for t in STAGE_TASKS}
    if name not in full:
        raise ValueError(f"{where}: unknown task {name!r}; known: {', '.join(full)}")
    return full[name]


# ------------------------------------------------------------------------------------------------ checks


def check_config(cfg: TrainConfig) -> None:
    """ValueError naming the first bad key; run before any data, tokenizer or model is loaded."""
    _check_model(cfg.model)
    _check_data(cfg.data)
    _check_optim(cfg.optim)
    for i, st in enumerate(cfg.stages):
        _check_stage(st, f"stages[{i}]")
        if st.stale and cfg.model.family == "llada2":
            raise ValueError(f"stages[{i}].stale: llada2's cache is exact; no stale rows (llada, dream only)")
        if st.noisy_prefix and not st.clean_context:
            raise ValueError(f"stages[{i}].noisy_prefix: a share of the clean-context rows; set clean_context too")
        if st.clean_context and cfg.model.family != "llada2":
            raise ValueError(
                f"stages[{i}].clean_context: rows for block-causal models (llada2), not {cfg.model.family}"
            )
    _check_run(cfg.run)
    names_self = any(SELF in (st.tasks or ()) for st in cfg.stages)
    if names_self and not cfg.data.self_rows:
        raise ValueError("a stage names self; give the files of its rows in data.self_rows (trajectories.py)")
    if cfg.data.self_rows and not names_self:
        raise ValueError("data.self_rows given, but no stage names self (add self to a full stage's tasks)")


def _check_model(m: ModelConfig) -> None:
    if m.family not in FAMILIES:
        raise ValueError(f"model.family: {m.family!r}; choose one of {', '.join(FAMILIES)}")
    if m.attention not in ATTENTIONS:
        raise ValueError(f"model.attention: {m.attention!r}; choose one of {', '.join(ATTENTIONS)}")
    if m.family == "llada2":
        _check_llada2(m)
    else:
        if m.attention == "block_causal":
            raise ValueError(f"model.attention: block_causal needs family llada2; {m.family} attends bidirectionally")
        if m.block_length is not None:
            raise ValueError("model.block_length is for block_causal attention; leave it out for bidirectional models")
        if m.upcycle is not None:
            raise ValueError("model.upcycle builds a llada2 model from a LLaDA checkpoint; set model.family: llada2")
    for key in ("d_model", "n_layers", "n_heads", "mlp_hidden", "max_len"):
        if getattr(m, key) < 1:
            raise ValueError(f"model.{key} must be >= 1, got {getattr(m, key)}")
    if m.d_model % m.n_heads or m.n_heads % m.kv_heads:
        raise ValueError(f"model: n_heads {m.n_heads} must divide d_model {m.d_model}; kv heads must divide n_heads")
    if m.tie_embeddings and m.family != "llada":
        raise ValueError("model.tie_embeddings is for family llada (weight_tying); Dream checkpoints here are untied")
    if m.rope_theta is not None and m.rope_theta <= 0:
        raise ValueError(f"model.rope_theta must be > 0, got {m.rope_theta}")
    if m.grow_after and m.init is None:
        raise ValueError("model.grow_after deepens the model of model.init (or --init); give one")
    if m.init is None and m.tokenizer is None and m.upcycle is None:
        raise ValueError("model.tokenizer: a fresh model (no model.init, no --init) needs a tokenizer (tokenizer.py)")


def _check_llada2(m: ModelConfig) -> None:
    if m.attention != "block_causal" or m.block_length is None or m.block_length < 1:
        raise ValueError("model: family llada2 trains block-causally; set attention: block_causal, block_length >= 1")
    if m.init is not None and m.upcycle is not None:
        raise ValueError("model.init and model.upcycle: give one (init continues a llada2 run, upcycle starts one)")
    for key in ("n_experts", "experts_per_tok", "n_group", "topk_group", "moe_hidden", "n_shared_experts"):
        if getattr(m, key) < 1:
            raise ValueError(f"model.{key} must be >= 1, got {getattr(m, key)}")
    if m.n_experts % m.n_group or m.n_experts // m.n_group < 2:
        raise ValueError(f"model.n_group {m.n_group} must split n_experts {m.n_experts} into groups of >= 2")
    if not m.topk_group <= m.n_group or not m.experts_per_tok <= m.topk_group * (m.n_experts // m.n_group):
        raise ValueError("model.topk_group must be <= n_group and experts_per_tok <= the experts of the kept groups")
    if not 0 <= m.first_dense <= m.n_layers:
        raise ValueError(f"model.first_dense must be in [0, n_layers], got {m.first_dense}")
    if m.routed_scale <= 0:
        raise ValueError(f"model.routed_scale must be > 0, got {m.routed_scale}")
    rope = m.d_model // m.n_heads * m.partial_rotary
    if not 0 < m.partial_rotary <= 1 or rope != int(rope) or int(rope) % 2:
        raise ValueError(f"model.partial_rotary: {m.partial_rotary} must make an even rotated width in (0, head_dim]")


def _check_data(d: DataConfig) -> None:
    if d.short_format not in ("chat", "bare", "bare-padded"):
        raise ValueError(f"data.short_format: {d.short_format!r}; choose chat, bare or bare-padded")
    for key in ("short_share", "short_icl"):
        if not 0.0 <= getattr(d, key) <= 1.0:
            raise ValueError(f"data.{key} must be in [0, 1], got {getattr(d, key)}")
    for key in ("short_batch", "full_batch"):
        if getattr(d, key) < 1:
            raise ValueError(f"data.{key} must be >= 1, got {getattr(d, key)}")
    for name, w in d.task_weights.items():
        task_name(name, "data.task_weights")
        if w < 0:
            raise ValueError(f"data.task_weights.{name} must be >= 0, got {w}")
    if d.t_sampling not in ("uniform", "stratified"):
        raise ValueError(f"data.t_sampling: {d.t_sampling!r}; choose uniform or stratified")
    if d.state_scoring not in STATE_SCORING:
        raise ValueError(f"data.state_scoring: {d.state_scoring!r}; choose one of {', '.join(STATE_SCORING)}")
    if d.shuffle_answer not in SHUFFLE_ANSWERS:
        raise ValueError(f"data.shuffle_answer: {d.shuffle_answer!r}; choose one of {', '.join(SHUFFLE_ANSWERS)}")


def _check_optim(o: OptimConfig) -> None:
    if o.lr <= 0:
        raise ValueError(f"optim.lr must be > 0, got {o.lr}")
    for key in ("warmup", "stage_warmup", "decay_steps"):
        if (getattr(o, key) or 0) < 0:
            raise ValueError(f"optim.{key} must be >= 0, got {getattr(o, key)}")
    if o.warmup < 1:
        raise ValueError(f"optim.warmup must be >= 1 step, got {o.warmup}")
    if o.train_only is not None:
        if not o.train_only:
            raise ValueError("optim.train_only: give at least one regular expression (or leave it out)")
        for pat in o.train_only:
            try:
                re.compile(pat)
            except re.error as e:
                raise ValueError(f"optim.train_only: {pat!r}: {e}") from None


def _check_stage(st: Stage, where: str) -> None:
    if st.kind not in ("short", "full"):
        raise ValueError(f"{where}.kind: {st.kind!r}; choose short or full")
    if st.steps < 1:
        raise ValueError(f"{where}.steps must be >= 1, got {st.steps}")
    if st.tasks is not None and not st.tasks:
        raise ValueError(f"{where}.tasks: give at least one task (or leave it out for the twelve)")
    for key in ("share", "icl", "stale", "clean_context", "whole_names", "noisy_prefix"):
        value = getattr(st, key)
        if value is not None and not 0.0 <= value <= 1.0:
            raise ValueError(f"{where}.{key} must be in [0, 1], got {value}")
    if st.lr is not None and st.lr <= 0:
        raise ValueError(f"{where}.lr must be > 0, got {st.lr}")
    if st.gap is not None and st.gap < 0:
        raise ValueError(f"{where}.gap must be a whole number of words >= 0, got {st.gap}")
    if st.stale_block < 1:
        raise ValueError(f"{where}.stale_block must be >= 1 token, got {st.stale_block}")
    if st.canvas and not 1 <= st.canvas <= MAX_CANVAS:
        raise ValueError(f"{where}.canvas must be a token count in [1, {MAX_CANVAS}], got {st.canvas}")
    tasks = st.tasks or STAGE_TASKS
    puzzles = [t for t in tasks if not t.startswith(("waiting_line/", "aux/"))]
    if st.lengths is not None and puzzles:
        raise ValueError(f"{where}.lengths sets list lengths of waiting-line rows; the stage also names {puzzles}")
    if not st.aux_chat and not [t for t in tasks if t not in AUX_TASKS]:
        raise ValueError(f"{where}.aux_chat false needs an official task for the full rows")


def _check_run(r: RunConfig) -> None:
    for key in ("eval_every", "save_every", "export_every", "row_workers"):
        if getattr(r, key) < 0:
            raise ValueError(f"run.{key} must be >= 0, got {getattr(r, key)}")
    for key in ("eval_samples", "threads"):
        if getattr(r, key) < 1:
            raise ValueError(f"run.{key} must be >= 1, got {getattr(r, key)}")
    if r.save_every < 1:
        raise ValueError(f"run.save_every must be >= 1, got {r.save_every}")
    if r.time_limit is not None and r.time_limit <= 0:
        raise ValueError(f"run.time_limit must be > 0 seconds, got {r.time_limit}")
    if r.stop_after is not None and r.stop_after < 1:
        raise ValueError(f"run.stop_after must be >= 1, got {r.stop_after}")
