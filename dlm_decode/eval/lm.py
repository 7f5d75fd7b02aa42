"""The ``dlm_decode`` model for lm-evaluation-harness 0.4.13: every sampler and cache behind lm-eval's LM interface.

    import lm_eval, dlm_decode.eval
    lm_eval.simple_evaluate(model="dlm_decode", model_args="pretrained=demo-llada,sampler=low_confidence",
                            tasks=["dlm_tiny_mc"], task_manager=dlm_decode.eval.task_manager())
    # or an instance: lm_eval.simple_evaluate(model=DLMDecodeLM(pretrained="demo-llada"), ...)
    # or the CLI:     dlm-decode eval --model_args pretrained=demo-llada --tasks dlm_tiny_mc

``generate_until`` decodes every request on the continuous-batching engine (``dlm_decode.engine``: ``batch_size``
requests in flight, a finished one's row taken at once by the next, answers returned in request order; each request
decodes as it would alone, so the batch size never changes an answer), cuts at every ``until`` string, and records
per-request statistics. ``loglikelihood`` is the
Monte Carlo ELBO of :mod:`dlm_decode.eval.likelihood`. ``loglikelihood_rolling`` splits a text into windows of
``max_length - 1`` tokens and scores each window as the continuation of one prefix token (BOS, else EOS); windows are
independent (no context carried across), so long-document perplexity is an upper bound from the ELBO.

Answers are plain ``str`` (lm-eval casts gold answers to the answer's type). lm-eval 0.4.13 has no hook for a model
to add fields to logged samples, so statistics live in ``lm.request_stats`` (one dict per generate request), in
``stats_path`` as JSONL (``dlm-decode eval`` sets it next to ``--output_path``), in ``results["config"]["dlm_decode"]``
(summary, via ``get_model_info``), and on lm-eval's request objects, from which the shipped tasks
(:class:`dlm_decode.eval.answers.StatsTask`) report ``nfe`` and ``tokens_per_step`` metrics (per sample in the logged
samples, averaged in the results table).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict
from typing import Any

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from tqdm.auto import tqdm

from dlm_decode.cache import get_cache
from dlm_decode.core.config import DEFAULT_BLOCK_LENGTH, resolve_lengths
from dlm_decode.core.inputs import ModelFacts
from dlm_decode.decode import check_request
from dlm_decode.engine import Engine
from dlm_decode.eval import likelihood
from dlm_decode.eval.answers import answer_stats, append_jsonl, attach_stats, cut_answer
from dlm_decode.eval.options import (
    EvalOptions,
    check_decoding,
    check_request_type,
    decode_config,
    describe,
    parse_model_args,
)
from dlm_decode.models.loading import check_device, load_model, load_tokenizer, model_facts
from dlm_decode.samplers import get_sampler

log = logging.getLogger(__name__)
DEFAULT_MAX_LENGTH = 4096  # LLaDA's harness default; Dream's config allows 131072, far past what MC scoring can afford


class ChatPrompt(str):
    """A context already rendered with the chat template by the harness (``--apply_chat_template``)."""


def _parse_batch_size(batch_size: Any, max_batch: int) -> int:
    if batch_size is None:
        return 1
    if isinstance(batch_size, str) and batch_size.strip().lower().startswith("auto"):
        log.info("dlm_decode: batch_size=%s -> max_batch=%d requests per call", batch_size, max_batch)
        return max_batch
    try:
        value = int(batch_size)
    except (TypeError, ValueError):
        raise ValueError(f"batch_size must be a positive integer or 'auto', got {batch_size!r}") from None
    if value < 1:
        raise ValueError(f"batch_size must be >= 1, got {value}")
    return value


def _harness_device(device: str | None) -> str:
    """lm-eval's ``--device`` (its CLI defaults to ``cuda:0`` even without a GPU): CUDA falls back to the CPU when
    there is none; ``device=`` in model_args is taken as given."""
    if device and not (str(device).startswith("cuda") and not torch.cuda.is_available()):
        return str(device)
    if device:
        log.warning("dlm_decode: --device %s but CUDA is not available; using cpu", device)
    return "cuda" if torch.cuda.is_available() else "cpu"


@register_model("dlm_decode")
class DLMDecodeLM(LM):
    """lm-eval model over a dlm_decode LLaDA/Dream model. Constructor keywords are the ``model_args`` keys
    (:mod:`dlm_decode.eval.options`) plus lm-eval's ``batch_size``, ``max_batch_size`` and ``device``; a loaded
    ``model`` and ``tokenizer`` may be passed instead of ``pretrained`` (Python API only)."""

    def __init__(
        self,
        batch_size: Any = None,
        max_batch_size: int | None = None,
        device: str | None = None,
        *,
        model: Any = None,
        tokenizer: Any = None,
        **model_args: Any,
    ) -> None:
        super().__init__()
        self.options: EvalOptions = parse_model_args(model_args)  # every check before any loading
        opts = self.options
        if model is None and not opts.pretrained:
            raise ValueError(
                "model_args: pretrained=PATH (checkpoint directory or demo-llada / demo-dream) is required"
            )
        if model is not None and (isinstance(model, str) or not hasattr(model, "denoise")):
            raise ValueError("model= takes a loaded dlm_decode model; pass a path or demo name as pretrained=")
        if isinstance(tokenizer, str):
            raise ValueError("tokenizer= takes a loaded tokenizer; the checkpoint directory's own tokenizer is used")
        self.batch_size = _parse_batch_size(batch_size, opts.max_batch)
        del max_batch_size  # only meaningful for lm-eval's own auto batch search
        self.sampler = get_sampler(opts.sampler, opts.sampler_options)
        self.cache = get_cache(opts.cache, opts.cache_options)
        self.accelerator = None
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            from accelerate import Accelerator

            self.accelerator = Accelerator()
            self._rank = self.accelerator.process_index
            self._world_size = self.accelerator.num_processes
            target = self.accelerator.device
        else:
            target = opts.device or _harness_device(device)
        self._model, self._target = None, str(check_device(target))  # a bad device fails here, not at a request
        if model is None:  # weights load at the first request, once its type is checked (``_loaded``)
            facts = model_facts(opts.pretrained)
            check_decoding(opts, facts)  # config.json against model_args, before the weights
            tokenizer = tokenizer if tokenizer is not None else load_tokenizer(opts.pretrained)
            max_length, shift = facts.max_length, facts.logit_shift
        else:
            self._model = model.to(target).eval()
            facts = ModelFacts.of_model(self._model)
            check_decoding(opts, facts)
            max_length, shift = model.max_sequence_length, getattr(model, "logit_shift", 0)
        if tokenizer is None:
            raise ValueError(f"{opts.pretrained or type(model).__name__}: no tokenizer (lm-eval works on text)")
        self.tokenizer, self._facts = tokenizer, facts
        self._device = torch.device(target)
        self.max_length = min(opts.max_length or DEFAULT_MAX_LENGTH, max_length)
        self.ll_method = opts.ll_method
        if self.ll_method == "auto":
            self.ll_method = "dream" if shift == 1 else "llada"
        self._warned: set[str] = set()
        self.request_stats: list[dict[str, Any]] = []

    @property
    def model(self) -> Any:
        """The model; a ``pretrained=`` one is loaded on first use (every check is made before, ``_loaded``)."""
        if self._model is None:
            opts = self.options
            self._model, _ = load_model(opts.pretrained, dtype=opts.dtype, device=self._target, tokenizer=False)
        return self._model

    def _loaded(self, request_type: str) -> Any:
        """The model, for requests of ``request_type``, once the model_args are checked against it (one line, before
        any weight is read): likelihoods are Monte Carlo ELBO estimates, which run no sampler and no cache."""
        check_request_type(self.options, request_type)
        return self.model

    # ------------------------------------------------------------------------------------ lm-eval plumbing
    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> DLMDecodeLM:
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict[str, Any], additional_config: dict | None = None) -> DLMDecodeLM:
        args = dict(arg_dict)
        if "batch_size" in args:  # reject here: lm-eval would otherwise pass it twice or as if it were its flag
            parse_model_args(args)
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
        if "device" in args and "device" in extra:
            log.info(
                "dlm_decode: model_args device=%s takes precedence over --device %s", args["device"], extra["device"]
            )
            extra.pop("device")
        return cls(**extra, **args)

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", "tokenizer")).replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return getattr(self.tokenizer, "chat_template", None)

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        import jinja2

        kw = dict(tokenize=False, add_generation_prompt=add_generation_prompt)
        if not add_generation_prompt:
            kw["continue_final_message"] = True
        try:
            text = self.tokenizer.apply_chat_template(chat_history, **kw)
        except jinja2.exceptions.TemplateError:  # templates without a system role (as lm-eval's HF model does)
            text = self.tokenizer.apply_chat_template([m for m in chat_history if m["role"] != "system"], **kw)
        return ChatPrompt(text)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world_size <= 1:
            return tensor
        return self.accelerator.gather(tensor)

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        if self.world_size <= 1:
            return [obj]
        result = [None] * self.world_size if self.rank == dst else None
        torch.distributed.gather_object(obj=obj, object_gather_list=result, dst=dst)
        return result

    def barrier(self) -> None:
        if self.world_size > 1:
            self.accelerator.wait_for_everyone()

    def get_model_info(self) -> dict[str, Any]:
        """Merged into ``results["config"]``: the decoding configuration and a summary of the statistics."""
        stats = self.request_stats
        summary: dict[str, Any] = {"generate_requests": len(stats)}
        if stats:
            summary["mean_nfe"] = sum(s["nfe"] for s in stats) / len(stats)
            summary["mean_tokens_per_step"] = sum(s["tokens_per_step"] for s in stats) / len(stats)
        info = describe(self.options) | {"ll_method_resolved": self.ll_method, "summary": summary}
        return {"dlm_decode": info}

    def _warn_once(self, key: str, msg: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg, *args)

    def _bar(self, total: int, desc: str, disable: bool) -> tqdm:
        return tqdm(total=total, desc=desc, disable=disable or not self.options.progress or self.rank != 0)

    # ------------------------------------------------------------------------------------ tokenization
    def _render(self, context: str) -> tuple[str, bool]:
        """The context text the model sees and whether it is already chat-rendered (no special tokens added)."""
        if isinstance(context, ChatPrompt):
            if self.options.chat:
                self._warn_once("chat", "dlm_decode: lm-eval already applies the chat template; chat=true ignored")
            return str(context), True
        if self.options.chat:
            msgs = [{"role": "user", "content": context}]
            return self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False), True
        return context, False

    def _encode(self, text: str, rendered: bool) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=not rendered)["input_ids"])

    @property
    def prefix_token_id(self) -> int:
        for name in ("bos_token_id", "eos_token_id"):
            tid = getattr(self.tokenizer, name, None)
            if isinstance(tid, int):
                return tid
        if not self.model.eos_token_ids:
            raise ValueError("the tokenizer has no BOS or EOS id and the model no EOS id: nothing to put before a text")
        return self.model.eos_token_ids[0]

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Context and continuation ids; the continuation's ids are those of ``context + continuation`` past the
        context's (trailing context spaces move to the continuation, as lm-eval's ``TemplateLM`` does)."""
        text, rendered = self._render(context)
        n_spaces = len(text) - len(text.rstrip())
        if n_spaces and not rendered:
            continuation, text = text[-n_spaces:] + continuation, text[:-n_spaces]
        ctx = self._encode(text, rendered)  # an empty context still gets the tokenizer's BOS, if it adds one
        whole = self._encode(text + continuation, rendered)
        cont = whole[len(ctx) :]
        if not ctx:  # the model needs one visible token before the continuation (Dream's shift reads it)
            ctx = [self.prefix_token_id]
        return self._truncate(ctx, cont)

    def _truncate(self, ctx: list[int], cont: list[int]) -> tuple[list[int], list[int]]:
        room = self.max_length
        if len(cont) >= room:
            self._warn_once("cont", "dlm_decode: continuation longer than max_length; its first tokens are dropped")
            cont = cont[-(room - 1) :]
        if len(ctx) + len(cont) > room:
            self._warn_once("ctx", "dlm_decode: context truncated from the left to fit max_length=%d", room)
            ctx = ctx[-(room - len(cont)) :]
        return ctx, cont

    # ------------------------------------------------------------------------------------ generate_until
    def _gen_length(self, gen_kwargs: dict[str, Any]) -> int:
        opts = self.options
        if opts.gen_length is not None:
            return opts.gen_length
        want = int(gen_kwargs.get("max_gen_toks") or 128)
        block, _ = resolve_lengths(want, opts.block_length, blockwise=self.sampler.traits.blockwise)
        return -(-want // block) * block  # rounded up to whole blocks

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        if not requests:
            return []
        check_request_type(self.options, "generate_until")
        items = []
        ignored: set[str] = set()
        for i, req in enumerate(requests):
            context, gen_kwargs = req.args[0], dict(req.args[1] or {})
            until = gen_kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else [u for u in until if u]
            gen_length = self._gen_length(gen_kwargs)
            ignored |= set(gen_kwargs) - {"max_gen_toks"}
            text, rendered = self._render(context)
            ids = self._encode(text, rendered)
            room = self.max_length - gen_length
            if room < 1:
                raise ValueError(
                    f"gen_length {gen_length} leaves no room for a prompt within max_length {self.max_length}"
                )
            if len(ids) > room:
                self._warn_once("prompt", "dlm_decode: prompt truncated from the left to fit max_length=%d", room)
                ids = ids[-room:] if room > 0 else ids
            items.append((i, ids, until, gen_length, req))
        if ignored:
            self._warn_once(
                "gen_kwargs",
                "dlm_decode: decoding comes from model_args; ignored task gen_kwargs: %s",
                ", ".join(sorted(ignored)),
            )
        out: list[str] = [""] * len(requests)
        records: list[dict[str, Any]] = [{}] * len(requests)  # in request order
        groups: dict[int, list[Any]] = {}
        for it in items:
            groups.setdefault(it[3], []).append(it)
        for gen_length, group in groups.items():  # each task's lengths and prompts, before any weight is read
            kw = dict(sampler=self.sampler, cache=self.cache, config=decode_config(self.options, gen_length))
            check_request(self._facts, [it[1] for it in group], **kw)
        self._loaded("generate_until")
        bar = self._bar(len(requests), "generate_until", disable_tqdm)
        per_call = min(self.batch_size, self.options.max_batch)
        engine = Engine(self.model, self.tokenizer, max_batch=per_call, admission="longest")  # answers kept in order
        opts = {"sampler": self.sampler, "cache": self.cache}
        handles = [engine.submit(it[1], **opts, **asdict(decode_config(self.options, it[3]))) for it in items]
        done = 0
        while engine.step():  # every request queued at once, per_call decoded together, the longest first
            now = sum(h.done for h in handles)
            bar.update(now - done)
            done = now
        bar.update(len(items) - done)
        for (index, ids, until, gen_length, req), h in zip(items, handles, strict=True):
            result = h.result()
            text = cut_answer(result, until, self.tokenizer, self.model.mask_token_id)
            out[index], records[index] = str(text), answer_stats(req, result, len(ids), gen_length, per_call)
            self.cache_hook.add_partial("generate_until", req.args, text)
        bar.close()
        for req, stats in zip(requests, records, strict=True):  # a repeated request's records line up with its
            attach_stats(req, stats)  # responses
        self.request_stats.extend(records)
        if self.options.stats_path and records:
            append_jsonl(self.options.stats_path, records, self.rank, self.world_size)
        return out

    # ------------------------------------------------------------------------------------ likelihood
    def _loglikelihood_ids(
        self, pairs: list[tuple[list[int], list[int]]], desc: str, disable_tqdm: bool, greedy: bool
    ) -> list[tuple[float, bool]]:
        opts = self.options
        grid = opts.block_length or DEFAULT_BLOCK_LENGTH  # a block-causal model's ELBO grid (eval.block_likelihood)
        bar = self._bar(len(pairs), desc, disable_tqdm)
        start = time.perf_counter()
        scores = likelihood.loglikelihoods(
            self.model,
            pairs,
            mc_num=opts.mc_num,
            method=self.ll_method,
            seed=opts.seed,
            eps=opts.sampling_eps,
            cfg_scale=opts.cfg_scale,
            max_batch=opts.max_batch,
            on_done=bar.update,
            block_length=grid,
        )
        bar.close()
        flags = [False] * len(pairs)
        if greedy and opts.greedy_check:
            flags = likelihood.greedy_matches(
                self.model, pairs, cfg_scale=opts.cfg_scale, max_batch=opts.max_batch, block_length=grid
            )
        log.debug("dlm_decode: %d likelihoods in %.2fs", len(pairs), time.perf_counter() - start)
        return list(zip(scores, flags, strict=True))

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        if not requests:
            return []
        self._loaded("loglikelihood")
        pairs = [self._encode_pair(*req.args) for req in requests]
        out: list[tuple[float, bool]] = [(0.0, True)] * len(requests)
        todo = [i for i, (_, cont) in enumerate(pairs) if cont]  # an empty continuation has probability 1
        res = self._loglikelihood_ids([pairs[i] for i in todo], "loglikelihood", disable_tqdm, greedy=True)
        for i, r in zip(todo, res, strict=True):
            out[i] = r
            self.cache_hook.add_partial("loglikelihood", requests[i].args, r)
        return out

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        if not requests:
            return []
        self._loaded("loglikelihood_rolling")
        width = self.max_length - 1
        windows, owner = [], []
        for i, req in enumerate(requests):
            ids = self._encode(req.args[0], rendered=True)  # no BOS/EOS added: the prefix token is the context
            for s in range(0, len(ids), width):
                windows.append(([self.prefix_token_id], ids[s : s + width]))
                owner.append(i)
        res = self._loglikelihood_ids(windows, "loglikelihood_rolling", disable_tqdm, greedy=False)
        totals = [0.0] * len(requests)
        for i, (score, _) in zip(owner, res, strict=True):
            totals[i] += score
        for req, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals
