"""What ``generate`` returns: the final canvas, per-row results and the call's statistics."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from dlm_decode.cache import KVStore
from dlm_decode.core.state import DecodeState
from dlm_decode.decode.request import Request
from dlm_decode.options import describe


@dataclass
class RowResult:
    prompt_ids: list[int]
    generated_ids: list[int]  # the gen_length slots after the prompt
    text: str | None
    nfe: int  # forwards this row took part in while unfinished
    error: str | None = None
    accepted_steps: int = 0  # steps of the followed rule its commits stand for (= nfe but for draft-and-verify)


@dataclass
class GenerateOutput:
    sequences: torch.Tensor  # [B, T] final canvas (left-padded prompts + generation)
    rows: list[RowResult]
    nfe: int  # sequential model forwards (a classifier-free-guidance pair and a batch of drafts count once)
    seconds: float
    tokens_per_step: list[list[int]]  # per step, tokens committed in each row
    token_forwards: int  # query slots computed by the model, summed over rows and steps
    cache_bytes: int  # K/V store allocated for the call (0 without a cache)
    refreshes: int  # steps that recomputed every slot
    sampler: dict[str, Any] = field(default_factory=dict)
    cache: dict[str, Any] = field(default_factory=dict)
    cache_stats: dict[str, Any] = field(default_factory=dict)  # the policy's own statistics (``CachePolicy.report``)
    config: dict[str, Any] = field(default_factory=dict)  # the DecodeConfig decoded with (unset options filled in)
    trace: torch.Tensor | None = None  # [B, L] step that committed each generation slot (-1: cut / filled)
    scratch: dict[str, Any] = field(default_factory=dict)  # the call's sampler / cache memory (records, statistics)
    # with ``cuda_graphs``: forwards run eagerly at a shape's first use, graphs captured, forwards replayed, and why a
    # capture failed (None: none did)
    graphs: dict[str, Any] = field(default_factory=dict)

    @property
    def generated(self) -> torch.Tensor:  # [B, L]
        return self.sequences[:, self.sequences.shape[1] - len(self.rows[0].generated_ids) :]

    @property
    def texts(self) -> list[str | None]:
        return [r.text for r in self.rows]

    def committed_tokens(self) -> int:
        return sum(sum(s) for s in self.tokens_per_step)

    @property
    def sequential_forwards(self) -> int:
        """The latency measure: forwards run one after another (= ``nfe``)."""
        return self.nfe

    @property
    def accepted_steps_per_call(self) -> float | None:
        """Steps of the followed rule per forward a row took part in (1.0 but for draft-and-verify samplers)."""
        calls = sum(r.nfe for r in self.rows)
        return sum(r.accepted_steps for r in self.rows) / calls if calls else None

    def to_json(self) -> dict[str, Any]:
        return (
            {
                "rows": [
                    {
                        "prompt_ids": r.prompt_ids,
                        "generated_ids": r.generated_ids,
                        "text": r.text,
                        "nfe": r.nfe,
                        "error": r.error,  # None, or why the row stopped early (its slots are then not an answer)
                        "accepted_steps": r.accepted_steps,
                    }
                    for r in self.rows
                ],
                "nfe": self.nfe,
                "sequential_forwards": self.sequential_forwards,
                "accepted_steps_per_call": self.accepted_steps_per_call,
                "seconds": self.seconds,
                "token_forwards": self.token_forwards,
                "cache_bytes": self.cache_bytes,
                "sampler": self.sampler,
                "cache": self.cache,
                "config": self.config,
            }
            | ({"graphs": self.graphs} if self.graphs else {})
            | ({"cache_stats": self.cache_stats} if self.cache_stats else {})
        )


def build_output(
    state: DecodeState,
    rows: list[list[int]],
    req: Request,
    store: KVStore | None,
    seconds: float,
    *,
    tokenizer: Any | None = None,
    trace: bool = False,
) -> GenerateOutput:
    """The call's result from its final state (the statistics leave the device here, once)."""
    p, stats = state.prompt_len, state.stats
    eos = set(state.eos_ids.tolist())
    errors, row_steps, accepted = stats.failures(), stats.row_steps.tolist(), stats.accepted_steps.tolist()
    results = []
    canvas = state.canvas[:, : p + state.gen_length]  # block-causal canvases run to the end of the last grid block
    for i, ids in enumerate(canvas[:, p:].tolist()):
        text = None
        if tokenizer is not None:
            end = next((j for j, tkn in enumerate(ids) if tkn in eos), len(ids))
            text = tokenizer.decode([x for x in ids[:end] if x != state.mask_id], skip_special_tokens=True)
        results.append(RowResult(rows[i], ids, text, row_steps[i], errors[i], accepted[i]))
    return GenerateOutput(
        sequences=canvas,
        rows=results,
        nfe=state.step,
        seconds=seconds,
        tokens_per_step=stats.tokens_per_step(),
        token_forwards=stats.token_forwards,
        cache_bytes=store.nbytes if store is not None else 0,
        refreshes=stats.refreshes,
        sampler=describe(req.sampler),
        cache=describe(req.cache),
        cache_stats=req.cache.report(state),
        config=dataclasses.asdict(state.config) | {"block_length": state.block_length},
        trace=stats.trace if trace else None,
        scratch=state.scratch,
    )
