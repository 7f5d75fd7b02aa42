"""``generate``: the one decode loop, every sampler with every cache, on batches of mixed prompt lengths.

    out = generate(model, ["What is 2+2?"], tokenizer=tok, chat=True, sampler="threshold",
                   sampler_options={"threshold": 0.9}, cache="dual", gen_length=256, block_length=32)

Check the request (``check_request``), ``prepare`` the state and K/V store, then run the batch as one unit of the
step scheduler (``decode.scheduler``, the one decode loop, which the engine runs with a unit per request) until it is
done: each block runs steps until no row has a MASK in it, so the rows of a batch share block boundaries, as in the
references' batched loops. Every block has a step bound (the sampler's
``max_block_steps``): at the last allowed step every remaining mask of the block is committed with its proposal, so
the loop always ends and never leaves a MASK. A row whose logits turn non-finite is stopped with an error message;
the other rows go on.

Decoding options (``gen_length``, ``block_length``, ``steps``, ``temperature``, ``top_p``, ``top_k``, ``seed``,
``stop_at_eos``, ``cfg_scale``) come as keywords or as a ``DecodeConfig``. Lengths left unset (or None) are the
checkpoint's own where its ``generation_config.json`` sets them (``core.generation_config``: the shipped demo models
decode at gen length 32), else gen length 128 and the sampler's block; given ones always win. ``chat``: a text prompt
is wrapped as one user turn of the chat template when True; None (default) follows the checkpoint's
``generation_config.json`` (``chat``: the demo models were trained on chat prompts only), else False.
``cuda_graphs``: replay a block's fixed-shape steps as CUDA graphs on a GPU (``models.graphs``; no cache, ``prefix``,
``dual``; counts in ``GenerateOutput.graphs``). ``progress``: a tqdm bar of committed slots.

``compile=True`` (or a mode, ``models.compiled.MODES``) runs the layers' elementwise pieces through ``torch.compile``
for this call, falling back to eager with one warning when compiling fails; None keeps the model's own setting
(``models.compiled.set_compile``, default eager). See ``models/compiled.py`` for what is compiled and when it pays.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from tqdm.auto import tqdm

from dlm_decode.cache import CachePolicy
from dlm_decode.core.config import DecodeConfig
from dlm_decode.core.generation_config import resolve_chat
from dlm_decode.core.inputs import ModelFacts, Prompt, encode_prompts
from dlm_decode.core.special_ids import check_call_ids
from dlm_decode.decode.loop import Unit
from dlm_decode.decode.output import GenerateOutput, build_output
from dlm_decode.decode.prepare import prepare
from dlm_decode.decode.request import check_request
from dlm_decode.decode.scheduler import Scheduler
from dlm_decode.models.compiled import resolve_mode, using
from dlm_decode.models.graphs import using_graphs
from dlm_decode.samplers import Sampler


@torch.no_grad()
def generate(
    model: Any,
    prompts: list[Prompt] | torch.Tensor,
    *,
    tokenizer: Any | None = None,
    chat: bool | None = None,
    sampler: str | Sampler = "low_confidence",
    sampler_options: dict[str, Any] | None = None,
    cache: str | CachePolicy | None = None,
    cache_options: dict[str, Any] | None = None,
    config: DecodeConfig | None = None,
    trace: bool = False,
    progress: bool = False,
    compile: bool | str | None = None,
    cuda_graphs: bool = False,
    **config_kwargs: Any,
) -> GenerateOutput:
    """Decode a batch. ``prompts``: texts, chats, token-id lists, or a [B, P] tensor of ids (no padding). The
    options are described in the module docstring."""
    resolve_mode(compile)  # a bad mode fails before any work
    if not isinstance(cuda_graphs, bool):
        raise ValueError(f"cuda_graphs must be True or False, got {cuda_graphs!r}")
    facts = ModelFacts.of_model(model)
    check_call_ids(model, tokenizer)
    rows = encode_prompts(prompts, tokenizer, resolve_chat(facts.generation, chat))
    req = check_request(
        facts,
        rows,
        sampler=sampler,
        sampler_options=sampler_options,
        cache=cache,
        cache_options=cache_options,
        config=config,
        **config_kwargs,
    )
    state, store = prepare(model, rows, req, tokenizer)
    start = time.perf_counter()
    graphs = _run(model, Unit(state, req.sampler, req.cache, store), progress, compile, cuda_graphs)
    out = build_output(state, rows, req, store, time.perf_counter() - start, tokenizer=tokenizer, trace=trace)
    if graphs is not None:
        out.graphs = graphs.counts()
    return out


def _run(model: Any, unit: Unit, progress: bool, compile: bool | str | None, cuda_graphs: bool) -> Any:
    """Run the batch's unit through the step scheduler until it is done; the call's step graphs (or None)."""
    state = unit.state
    if progress:
        unit.bar = tqdm(
            total=state.batch * state.gen_length, desc=f"{unit.sampler.name}/{unit.cache.name}", leave=False
        )
    with using(model, compile), using_graphs(model, unit.store, cuda_graphs) as graphs:
        sched = Scheduler(model)
        sched.add(0, unit)
        while sched.units:
            sched.step()
    if unit.bar is not None:
        unit.bar.close()
    return graphs
