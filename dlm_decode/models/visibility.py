"""D2F's attention pattern for the bidirectional models (LLaDA, Dream, LLaDA-MoE): the prompt is one block, the
answer is cut into blocks of ``block_length``, and a query sees its own block and the earlier ones.

Paper: Wang, Xu, Jin, Jin, Zhang, Deng, "Diffusion LLMs Can Do Faster-Than-AR Inference via Discrete Diffusion
Forcing" (D2F, arXiv 2508.09192). Reference: zhijie-group/Discrete-Diffusion-Forcing ``D2F-eval/eval_llada.py`` (and
``eval_dream.py``), ``create_full_block_attention_mask`` / ``build_custom_float_attention_mask``: a dense additive
[B, 1, T, T] mask, 0 where a query may look and -inf elsewhere; the prompt ``[0, P)`` sees itself (every query sees
the whole prompt), and answer block ``j`` (slots ``[P + jB, P + (j+1)B)``, the last one cut at the canvas end) sees
the prompt, the answer blocks before it and itself. Under that mask a finished block's K/V never depend on later
blocks, which is what lets D2F cache them exactly.

Here the rule is a function of canvas slots: ``id(slot) = 0`` for ``slot < P`` and ``1 + (slot - P) // B`` after,
and a key is visible iff ``id(key) <= id(query)``. Batches share canvas coordinates (prompts left-padded to the
common ``P``, ``core.state``), so one ``AnswerBlocks`` holds for every row; the key-padding mask hides the padding on
top of it. Differences, on purpose: none in what a real token sees. A padding query (never read) sees the valid
prompt keys, where the reference, which does not pad, has no such query.

``common.attention_mask`` turns the rule into the [B, 1, N, S] bool mask of one forward (its computed slots, the
store's slots, gathered key sets); the models then attend with PyTorch's SDPA under that mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AnswerBlocks:
    """D2F's block-causal-over-answer-blocks rule on canvas slots (see the module docstring)."""

    prompt_end: int  # P: the first answer slot (the left-padded prompt length shared by every row)
    block_length: int  # B: answer slots per block, on the grid starting at P

    def __post_init__(self) -> None:
        for name, low in (("prompt_end", 0), ("block_length", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"answer_blocks.{name} must be an integer >= {low}, got {value!r}")

    def block_ids(self, slots: torch.Tensor) -> torch.Tensor:  # same shape as ``slots``, long
        """0 for prompt slots, 1 + (slot - P) // B for answer slots."""
        answer = torch.div(slots - self.prompt_end, self.block_length, rounding_mode="floor") + 1
        return answer.clamp(min=0)  # every prompt slot's floor is <= -1 + 1 = 0

    def visible(self, q_slots: torch.Tensor, k_slots: torch.Tensor) -> torch.Tensor:
        """q_slots [..., N] and k_slots [..., S] (broadcasting leading dims) -> [..., N, S] bool: key visible to
        query iff its block id is <= the query's."""
        return self.block_ids(k_slots)[..., None, :] <= self.block_ids(q_slots)[..., :, None]
