"""An engine request: its options checked on the caller's thread, and what it gives back.

``check_submission`` turns ``Engine.submit``'s prompt and options into token ids and a checked
``decode.request.Request`` (every check ``generate`` makes, with the same messages), before anything reaches the
engine thread. ``EngineResult`` is what a finished request gives back: its ``generate`` row, its own forwards and
timings, and why it ended.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from dlm_decode.core.generation_config import resolve_chat
from dlm_decode.core.inputs import ModelFacts, Prompt, encode_prompts
from dlm_decode.decode.request import CONFIG_FIELDS, Request, check_request

#: the options a request may carry besides its prompt (``DecodeConfig`` fields, sampler, cache and chat)
REQUEST_OPTIONS = (*CONFIG_FIELDS, "sampler", "sampler_options", "cache", "cache_options", "chat")
_ids = itertools.count()


@dataclass(frozen=True)
class Submission:
    """A checked request, as the engine thread receives it."""

    id: str
    prompt_ids: list[int]
    request: Request
    options: dict[str, Any]  # as given (with the engine's defaults under them)


@dataclass
class EngineResult:
    """A finished request: its tokens, text, forwards and why it ended."""

    id: str
    prompt_ids: list[int]
    generated_ids: list[int]  # the gen_length slots after the prompt (as ``generate``'s rows)
    text: str | None
    nfe: int  # forwards this request took part in (as alone)
    token_forwards: int  # query slots the model computed for it
    finish_reason: str  # "stop" (an EOS ended it), "length", "cancelled" or "error"
    error: str | None = None
    accepted_steps: int = 0
    queued_seconds: float = 0.0  # from submit to its first step
    seconds: float = 0.0  # from its first step to its end
    stats: dict[str, Any] = field(default_factory=dict)  # sampler, cache and config decoded with
    commits: list[int] = field(default_factory=list)  # per forward it took part in, the slots it committed
    trace: list[int] | None = None  # per generation slot, the request's step that committed it (-1: none)

    @property
    def completion_ids(self) -> list[int]:
        """The answer's ids: the generated ids up to (without) the first end id, or all of them."""
        return self.generated_ids[: self.stats.get("answer_length", len(self.generated_ids))]


def check_submission(
    facts: ModelFacts, tokenizer: Any | None, prompt: Prompt, defaults: dict[str, Any], options: dict[str, Any]
) -> Submission:
    """The request's ids and checked options; ``ValueError`` naming the option and what is allowed."""
    unknown = sorted(set(options) - set(REQUEST_OPTIONS))
    if unknown:
        raise ValueError(f"unknown request option(s) {', '.join(unknown)}; valid: {', '.join(REQUEST_OPTIONS)}")
    merged = defaults | {k: v for k, v in options.items() if v is not None}
    kw = dict(merged)
    chat = kw.pop("chat", None)
    if isinstance(prompt, list | tuple) and prompt and isinstance(prompt[0], dict):
        prompts = [list(prompt)]  # one chat
    else:
        prompts = [prompt]
    rows = encode_prompts(prompts, tokenizer, resolve_chat(facts.generation, chat))
    req = check_request(
        facts,
        rows,
        sampler=kw.pop("sampler", "low_confidence"),
        sampler_options=kw.pop("sampler_options", None),
        cache=kw.pop("cache", None),
        cache_options=kw.pop("cache_options", None),
        **kw,
    )
    return Submission(f"req-{next(_ids)}", rows[0], req, merged)
