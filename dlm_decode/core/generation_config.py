"""A checkpoint's decoding defaults: the lengths it decodes well at, read from its ``generation_config.json``.

    {"gen_length": 32, "block_length": 32}            # e.g. a model trained on 32-token answers

The keys (all optional, positive integers): ``gen_length`` (generation slots after the prompt), ``block_length`` and
``steps`` (the total step budget of fixed-budget samplers), and ``chat`` (true or false: whether a plain text prompt is
wrapped as one user turn of the chat template when the caller does not say; for models trained on chat prompts
only, such as the shipped demo models). The special ids transformers keeps there (``mask_token_id``,
``eos_token_id``, ``pad_token_id``, ``bos_token_id``) are not read for decoding (the ids come from ``config.json``):
they are checked against the vocabulary, and one that differs from the id decoding uses gets one notice naming where
the value must go (``core.special_ids``, applied by ``ModelFacts.in_checkpoint``). A key that looks like one of ours
but is not (``gen_len``, ``block_size``, ...) gets one notice naming the key we read; any other key (transformers'
``temperature``, ...) is left alone. ``read_generation_defaults`` is the one reader; ``fill_lengths`` the one rule for
using them (``decode.request.check_request`` applies it, so ``generate``, the CLI and the ParallelBench runner get the
same; the lm-eval plugin sets every length itself): a length the caller gives always wins; an unset gen length takes
the checkpoint's, and with it its steps; an unset block length takes the checkpoint's, clipped to the gen length (for
blockwise samplers: the Dream orderings decode in one block, as their reference).
A checkpoint without the file (or without a key) keeps the usual defaults (``DecodeConfig``, ``resolve_lengths``).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlm_decode.core.config import DecodeConfig
from dlm_decode.core.files import read_json_object
from dlm_decode.core.special_ids import SPECIAL_IDS, notice
from dlm_decode.options import is_int

GENERATION_CONFIG = "generation_config.json"
KEYS = ("gen_length", "block_length", "steps")
# names other diffusion-LM code uses for our keys (a near miss of ours is caught by spelling as well)
ALIASES = {
    "gen_len": "gen_length",
    "generation_length": "gen_length",
    "block_size": "block_length",
    "block_len": "block_length",
    "num_steps": "steps",
    "diffusion_steps": "steps",
    "sampling_steps": "steps",
    "apply_chat_template": "chat",
}


@dataclass(frozen=True)
class GenerationDefaults:
    """A checkpoint's decoding lengths (None: the file does not set it)."""

    gen_length: int | None = None
    block_length: int | None = None
    steps: int | None = None
    chat: bool | None = None  # text prompts as chat turns by default (None: the file does not say)
    # the special ids the file sets (checked against the model in ``ModelFacts.in_checkpoint``, never used)
    ids: dict[str, Any] = field(default_factory=dict, compare=False)


def read_generation_defaults(checkpoint_dir: str | Path | None) -> GenerationDefaults:
    """The lengths ``checkpoint_dir/generation_config.json`` sets (none without the directory or the file); a bad
    value is a ``ValueError`` naming the file and the key."""
    if checkpoint_dir is None:
        return GenerationDefaults()
    path = Path(checkpoint_dir) / GENERATION_CONFIG
    if not path.is_file():
        return GenerationDefaults()
    data = read_json_object(path, "generation config")
    values = {k: data.get(k) for k in KEYS}
    for k, v in values.items():
        if v is not None and (not is_int(v) or v < 1):
            raise ValueError(f"{path}: {k} must be a positive integer, got {v!r}")
    chat = data.get("chat")
    if chat is not None and not isinstance(chat, bool):
        raise ValueError(f"{path}: chat must be true or false, got {chat!r}")
    gen, block = values["gen_length"], values["block_length"]
    if gen is not None and block is not None and (block > gen or gen % block):
        raise ValueError(f"{path}: gen_length ({gen}) must be a multiple of block_length ({block})")
    ids = {k: data[k] for k in SPECIAL_IDS if data.get(k) is not None}
    for k, v in ids.items():  # the vocabulary is checked by ModelFacts.in_checkpoint
        if not (is_int(v) or (isinstance(v, list) and all(map(is_int, v)))) or any(x < 0 for x in _listed(v)):
            raise ValueError(f"{path}: {k} must be a token id >= 0 (or a list of them), got {v!r}")
    for message in lookalikes(data, path):
        notice(message)
    return GenerationDefaults(**values, chat=chat, ids=ids)


def _listed(v: Any) -> list[Any]:
    return v if isinstance(v, list) else [v]


def lookalikes(data: dict[str, Any], path: Path) -> list[str]:
    """One notice per key of ``data`` that is not read but looks like one that is (``ALIASES``, or a near miss)."""
    ours = (*KEYS, "chat")
    out = []
    for key in data:
        if key in ours or key in SPECIAL_IDS:
            continue
        meant = ALIASES.get(key) or next(iter(difflib.get_close_matches(key, ours, n=1, cutoff=0.8)), None)
        if meant is not None:
            out.append(f"{path}: key {key!r} is not read (ignored); the {meant} goes in key {meant!r}")
    return out


def fill_lengths(
    defaults: GenerationDefaults,
    gen_length: int | None,
    block_length: int | None,
    steps: int | None,
    *,
    blockwise: bool = True,
) -> dict[str, int]:
    """The lengths to decode with that the checkpoint supplies: those the caller left unset (None) and the
    checkpoint sets. Its steps come only with its gen length (a step budget is meant for that length); its block
    length only for a ``blockwise`` sampler (the Dream orderings keep their one block, as their reference)."""
    out: dict[str, int] = {}
    if gen_length is None and defaults.gen_length is not None:
        out["gen_length"] = gen_length = defaults.gen_length
        if steps is None and defaults.steps is not None:
            out["steps"] = defaults.steps
    if blockwise and block_length is None and defaults.block_length is not None:
        gen = gen_length if gen_length is not None else DecodeConfig.gen_length  # the config's own default
        out["block_length"] = min(defaults.block_length, gen)
    return out


def resolve_chat(defaults: GenerationDefaults, chat: bool | None) -> bool:
    """Whether text prompts are chat turns: the caller's choice, else the checkpoint's ``chat``, else False."""
    if chat is not None:
        if not isinstance(chat, bool):
            raise ValueError(f"chat must be True, False or None, got {chat!r}")
        return chat
    return bool(defaults.chat)
