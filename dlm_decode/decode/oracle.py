"""The oracle's driver: both passes of Learn2PD's "extremely greedy parallel" bound (``samplers.oracle.Oracle``).

    ref, out, records = oracle_generate(model, prompts, gen_length=32, block_length=8, record=True)

Used by the ParallelBench runner (the oracle NFE every sampler is read against) and the Learn2PD recipes (the
filter's training data).
"""

from __future__ import annotations

from typing import Any

import torch

from dlm_decode.decode.generate import generate
from dlm_decode.decode.output import GenerateOutput
from dlm_decode.samplers.oracle import Oracle


def oracle_generate(
    model: Any, prompts: Any, *, record: bool = False, reference_steps: int | None = None, **kwargs: Any
) -> tuple[GenerateOutput, GenerateOutput, tuple[torch.Tensor, torch.Tensor] | None]:
    """Both passes: returns (reference output, oracle output, records).

    ``kwargs`` go to ``generate`` for both passes (``gen_length``, ``block_length``, ``tokenizer``, ``chat``,
    ``cache``...); the first pass uses ``low_confidence`` with ``reference_steps`` (default ``gen_length``: one token
    per step). ``records`` is ``(conf [N, block] float32, label [N, block] float32)`` when ``record``.
    """
    kwargs = dict(kwargs)
    for key in ("sampler", "sampler_options", "steps"):
        if key in kwargs:
            raise ValueError(f"oracle_generate chooses {key} itself")
    gen_length = kwargs.get("gen_length", 128)
    ref = generate(model, prompts, sampler="low_confidence", steps=reference_steps or gen_length, **kwargs)
    reference = tuple(tuple(row.generated_ids) for row in ref.rows)
    out = generate(model, prompts, sampler=Oracle(reference=reference, record=record), **kwargs)
    records = None
    if record:
        mem = out.scratch.get(Oracle.name, {"conf": [], "label": []})
        if mem["conf"]:
            records = (torch.cat(mem["conf"]), torch.cat(mem["label"]).float())
        else:
            block = out.config["block_length"]  # as resolved for the oracle pass
            records = (torch.zeros(0, block), torch.zeros(0, block))
    return ref, out, records
