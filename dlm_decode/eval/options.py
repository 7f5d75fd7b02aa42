"""``model_args`` of the ``dlm_decode`` lm-eval model: parsed and fully validated before any model is loaded.

Keys (lm-eval's own ``--batch_size``, ``--max_batch_size`` and ``--device`` flags arrive separately):

    pretrained=PATH|demo-llada|demo-dream   dtype=float32|bfloat16|float16   device=cpu|cuda|cuda:0
    sampler=NAME  sampler.KEY=VALUE ...      (or sampler_options=KEY:VALUE;KEY:VALUE, or a dict in Python)
    cache=NAME    cache.KEY=VALUE ...        (or cache_options=KEY:VALUE;KEY:VALUE)
    gen_length=N block_length=N steps=N temperature=T top_p=P top_k=K seed=S stop_at_eos=BOOL cfg_scale=S
    attention=answer_block_causal
    chat=BOOL (alias apply_chat_template)    max_batch=N  max_length=N  stats_path=FILE  progress=BOOL
    mc_num=N  ll_method=auto|llada|dream  sampling_eps=E  greedy_check=BOOL

Prefixed keys (``sampler.threshold=0.9``) are the CLI-friendly form: lm-eval splits ``--model_args`` on commas and
rejects braces that are not valid JSON, so nested dicts do not survive the command line.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from dlm_decode.cache import get_cache
from dlm_decode.core.config import DEFAULT_BLOCK_LENGTH, DecodeConfig
from dlm_decode.core.inputs import ModelFacts
from dlm_decode.decode import check_request
from dlm_decode.models.loading import DTYPES
from dlm_decode.options import build
from dlm_decode.samplers import get_sampler

LL_METHODS = ("auto", "llada", "dream")


@dataclass(frozen=True)
class EvalOptions:
    """Every ``model_args`` key with its type and default (see the module docstring)."""

    name: ClassVar[str] = "model_args"

    pretrained: str | None = None  # checkpoint directory, hub-style id passed to load_model, or a demo name
    dtype: str = "float32"
    device: str | None = None  # None: lm-eval's --device, else cuda when available, else cpu
    # decoding (generate_until)
    sampler: str = "low_confidence"
    sampler_options: Any = None  # dict, or "key:value;key:value"
    cache: str = "none"
    cache_options: Any = None
    gen_length: int | None = None  # None: the task's max_gen_toks rounded up to a whole block (128 without one)
    block_length: int | None = None
    steps: int | None = None
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    seed: int = 0
    stop_at_eos: bool = False
    cfg_scale: float = 0.0
    attention: str | None = None  # "answer_block_causal": D2F's attention (``DecodeConfig.attention``)
    chat: bool = False  # wrap each plain-text context as one user turn of the chat template
    # likelihood (loglikelihood, loglikelihood_rolling)
    mc_num: int = 128
    ll_method: str = "auto"  # llada: stratified masked count; dream: continuous time; auto: by model family
    sampling_eps: float = 1e-3  # dream method: mask ratio t is drawn from [eps, 1]
    greedy_check: bool = True  # compute is_greedy (one extra decode per request); False answers is_greedy=False
    # execution
    max_batch: int = 32  # rows per model forward (generation rows, Monte Carlo rows)
    max_length: int | None = None  # context + generation cap (default: 4096, at most the model's maximum)
    stats_path: str | None = None  # append per-request decoding statistics here as JSONL
    progress: bool = True


def _split_kv(value: Any, key: str) -> dict[str, Any]:
    """``"a:1;b:x"`` (or a dict) -> ``{"a": "1", "b": "x"}``."""
    if value is None or value == "":
        return {}
    if isinstance(value, dict):
        return dict(value)
    if not isinstance(value, str):
        raise ValueError(f"model_args: {key} expects 'key:value;key:value' or a dict, got {value!r}")
    out: dict[str, Any] = {}
    for part in value.split(";"):
        if not part.strip():
            continue
        if ":" not in part:
            raise ValueError(f"model_args: {key} item {part!r} is not key:value (items are separated by ';')")
        k, v = part.split(":", 1)
        out[k.strip()] = v.strip()
    return out


def parse_model_args(args: dict[str, Any]) -> EvalOptions:
    """Validate ``model_args`` (unknown keys, types, sampler/cache names and options, decoding config) without
    touching a model. Raises ``ValueError`` with what was wrong and what is allowed."""
    args = dict(args)
    if "batch_size" in args:
        raise ValueError(
            "model_args: batch_size is lm-eval's own option (--batch_size, or simple_evaluate(batch_size=...)); "
            "use max_batch=N to cap the rows of one model forward"
        )
    if "apply_chat_template" in args:
        if "chat" in args:
            raise ValueError("model_args: give either chat or its alias apply_chat_template, not both")
        args["chat"] = args.pop("apply_chat_template")
    args.pop("trust_remote_code", None)  # lm-eval's --trust_remote_code lands here; no remote code is ever run
    prefixed: dict[str, dict[str, Any]] = {"sampler": {}, "cache": {}}
    for key in list(args):
        head, dot, tail = key.partition(".")
        if dot and head in prefixed:
            if not tail:
                raise ValueError(f"model_args: {key!r} needs an option name after the dot (e.g. {head}.NAME=VALUE)")
            prefixed[head][tail] = args.pop(key)
    for kind in ("sampler", "cache"):
        merged = _split_kv(args.get(f"{kind}_options"), f"{kind}_options")
        both = sorted(set(merged) & set(prefixed[kind]))
        if both:
            raise ValueError(
                f"model_args: {kind} option(s) {', '.join(both)} given twice ({kind}_options and {kind}.*)"
            )
        args[f"{kind}_options"] = merged | prefixed[kind] or None
    opts = build(EvalOptions, args, "dlm_decode")
    if opts.ll_method not in LL_METHODS:
        raise ValueError(f"model_args: ll_method must be one of {', '.join(LL_METHODS)}, got {opts.ll_method!r}")
    for key in ("mc_num", "max_batch"):
        if getattr(opts, key) < 1:
            raise ValueError(f"model_args: {key} must be >= 1, got {getattr(opts, key)}")
    if opts.max_length is not None and opts.max_length < 2:
        raise ValueError(f"model_args: max_length must be >= 2, got {opts.max_length}")
    if opts.dtype not in DTYPES:
        raise ValueError(f"model_args: dtype must be one of {', '.join(DTYPES)}, got {opts.dtype!r}")
    if not 0.0 <= opts.sampling_eps < 1.0:
        raise ValueError(f"model_args: sampling_eps must be in [0, 1), got {opts.sampling_eps}")
    check_decoding(opts)
    return opts


def decode_config(opts: EvalOptions, gen_length: int) -> DecodeConfig:
    return DecodeConfig(
        gen_length=gen_length,
        block_length=opts.block_length,
        steps=opts.steps,
        temperature=opts.temperature,
        top_p=opts.top_p,
        top_k=opts.top_k,
        seed=opts.seed,
        stop_at_eos=opts.stop_at_eos,
        cfg_scale=opts.cfg_scale,
        attention=opts.attention,
    )


def check_decoding(opts: EvalOptions, facts: ModelFacts | None = None) -> None:
    """What model_args (and the model's ``facts``, read from config.json before loading) decide, checked by
    ``check_request``; without gen_length (each task decides it) only the sampler, cache and sampling options."""
    try:
        if opts.gen_length is not None:
            kw = dict(sampler_options=opts.sampler_options, cache=opts.cache, cache_options=opts.cache_options)
            check_request(facts, sampler=opts.sampler, config=decode_config(opts, opts.gen_length), **kw)
        else:
            smp = get_sampler(opts.sampler, opts.sampler_options).with_model(facts)
            pol = get_cache(opts.cache, opts.cache_options)
            cfg = decode_config(opts, opts.block_length or DEFAULT_BLOCK_LENGTH)  # any valid gen_length checks the rest
            if facts is not None:  # what the model family decides (a cache for bidirectional models on LLaDA2, ...)
                pol.check(cfg, smp, facts)
                smp.check_cache(pol)
    except ValueError as e:
        raise ValueError(f"model_args: {e}") from None


LIKELIHOOD_REQUESTS = ("loglikelihood", "loglikelihood_rolling")
DECODING_KEYS = ("sampler", "sampler_options", "cache", "cache_options")


def check_request_type(opts: EvalOptions, request_type: str) -> None:
    """Refuse model_args that do not apply to ``request_type`` (an lm-eval request type): likelihood requests are
    Monte Carlo ELBO estimates (``eval.likelihood``), which run no sampler and no cache, so naming one for them is an
    error rather than a silently ignored option."""
    if request_type not in LIKELIHOOD_REQUESTS:
        return
    defaults = EvalOptions()
    given = [f"{k}={getattr(opts, k)}" for k in DECODING_KEYS if getattr(opts, k) not in (getattr(defaults, k), {}, "")]
    if given:
        verb = "does" if len(given) == 1 else "do"
        raise ValueError(
            f"model_args: {', '.join(given)} {verb} not apply to {request_type} requests (likelihood tasks are scored "
            "by a Monte Carlo ELBO with no sampler and no cache); drop them, or evaluate the likelihood tasks in a "
            "separate run from the generation tasks"
        )


def describe(opts: EvalOptions) -> dict[str, Any]:
    return {f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)}
