"""Decoding configuration shared by every sampler and cache (a frozen dataclass; change it with ``replace``)."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from dlm_decode.options import is_int, is_real

ATTENTIONS = (None, "answer_block_causal")  # the model's own, or D2F's answer-block-causal pattern


@dataclass(frozen=True)
class DecodeConfig:
    """What the loop needs to know, independent of the sampler's own hyperparameters.

    gen_length: generation slots after the prompt (L).
    block_length: semi-autoregressive block size; None picks the sampler's default (``resolve_lengths``: 32, or L
        for the Dream orderings, which have no blocks in their reference).
    steps: total step budget over all blocks for fixed-budget samplers (LLaDA / Dream schedules); None = L.
        Threshold-style samplers ignore it (their bound is one token per step).
    temperature, top_p, top_k: token sampling; temperature 0 is greedy and ignores the seed. ``top_k`` 0 and
        ``top_p`` 1.0 turn the filter off; None (unset) leaves it to the sampler's reference: the Dream orderings
        take what Dream's ``diffusion_generate`` would for the checkpoint (``model.sampling_defaults``: top-k 50
        unless config.json says otherwise), every other sampler filters nothing.
    seed: seeds the ``torch.Generator`` for every random draw of the call.
    stop_at_eos: once a row has committed EOS with everything before it decoded, fill the rest with EOS.
    cfg_scale: classifier-free guidance (LLaDA): ``un + (cfg + 1) * (cond - un)`` with the prompt masked in ``un``.
    attention: None (the model's own) or ``"answer_block_causal"``: D2F's pattern on a bidirectional model (LLaDA,
        Dream, LLaDA-MoE): the prompt one bidirectional block, the answer in blocks of ``block_length`` from the
        prompt's end, each seeing the prompt, the earlier blocks and itself (``models.visibility``); the ``prefix``
        cache is then exact, as on block-causal models.
    """

    gen_length: int = 128
    block_length: int | None = None
    steps: int | None = None
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop_at_eos: bool = False
    cfg_scale: float = 0.0
    attention: str | None = None

    def __post_init__(self) -> None:
        for name in ("gen_length", "block_length", "steps", "top_k", "seed", "temperature", "top_p", "cfg_scale"):
            _plain(self, name)  # numpy / torch scalars as Python numbers (e.g. a length read from an array)
        if not is_int(self.gen_length) or self.gen_length < 1:
            raise ValueError(f"gen_length must be a positive integer, got {self.gen_length!r}")
        if self.block_length is not None and (not is_int(self.block_length) or self.block_length < 1):
            raise ValueError(f"block_length must be a positive integer or None, got {self.block_length!r}")
        if self.steps is not None and (not is_int(self.steps) or self.steps < 1):
            raise ValueError(f"steps must be a positive integer or None, got {self.steps!r}")
        if not is_real(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if self.top_p is not None and not (is_real(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k is not None and (not is_int(self.top_k) or self.top_k < 0):
            raise ValueError(f"top_k must be an integer >= 0 (0: no top-k filter) or None, got {self.top_k!r}")
        if self.seed is not None and not is_int(self.seed):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        if not isinstance(self.stop_at_eos, bool):
            raise ValueError(f"stop_at_eos must be True or False, got {self.stop_at_eos!r}")
        if not is_real(self.cfg_scale) or self.cfg_scale < 0:
            raise ValueError(f"cfg_scale must be >= 0, got {self.cfg_scale!r}")
        if self.attention not in ATTENTIONS:
            allowed = ", ".join(repr(a) for a in ATTENTIONS)
            raise ValueError(f"attention must be one of {allowed}, got {self.attention!r}")


def _plain(cfg: DecodeConfig, name: str) -> None:
    """Replace a numpy or torch integer / real scalar in field ``name`` with the Python int / float of it (bools and
    other types are left for the checks to judge)."""
    x = getattr(cfg, name)
    if isinstance(x, bool | int | float) or x is None:
        return
    if isinstance(x, numbers.Integral):
        object.__setattr__(cfg, name, int(x))
    elif isinstance(x, numbers.Real):
        object.__setattr__(cfg, name, float(x))


DEFAULT_BLOCK_LENGTH = 32  # blockwise samplers' block when none is given (LLaDA / Fast-dLLM references)


def resolve_lengths(
    gen_length: int, block_length: int | None = None, steps: int | None = None, *, blockwise: bool = True
) -> tuple[int, int]:
    """The one rule for unset lengths: ``(block length, total steps)`` a request decodes with.

    ``block_length`` as given, else ``DEFAULT_BLOCK_LENGTH`` (at most ``gen_length``) for blockwise samplers and
    ``gen_length`` for the others (the Dream orderings: one block); ``steps`` as given, else ``gen_length``.
    """
    block = block_length or (min(DEFAULT_BLOCK_LENGTH, gen_length) if blockwise else gen_length)
    return block, steps if steps is not None else gen_length
