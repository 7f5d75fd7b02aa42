"""Turning prompts into token-id rows and a left-padded canvas, and checking the rows against what the model's
``config.json`` decides (``ModelFacts``: vocabulary, MASK id, maximum length)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dlm_decode.core.generation_config import GenerationDefaults, read_generation_defaults
from dlm_decode.core.special_ids import check_model_ids, check_special_ids, ignored_generation_ids, notice
from dlm_decode.options import is_int

Prompt = str | Sequence[int] | Sequence[dict[str, str]]
PROMPTS_ARE = (
    "prompts must be a list with one entry per row (each a text, a chat: a list of role/content messages, or a list "
    "of token ids), or a [B, P] tensor of token ids"
)


@dataclass(frozen=True)
class ModelFacts:
    """What a checkpoint's ``config.json`` decides about a decoding request."""

    vocab_size: int  # rows of the input embedding: valid token ids are [0, vocab_size)
    mask_id: int
    max_length: int  # max_sequence_length (LLaDA) / max_position_embeddings (Dream): prompt + generation
    model_type: str = "unknown"
    # what the model's own generate samples with when its caller leaves an option unset (``model.sampling_defaults``)
    sampling_defaults: dict[str, Any] = field(default_factory=dict)
    # the checkpoint directory the model was loaded from (files shipped beside the weights, e.g. a Learn2PD filter);
    # None when unknown (a model built in memory)
    checkpoint_dir: str | None = None
    # the decoding lengths its ``generation_config.json`` sets (``core.generation_config``)
    generation: GenerationDefaults = field(default_factory=GenerationDefaults)
    # block-causal attention (LLaDA2): decoded block by block on the absolute position grid, exact K/V of finished
    # blocks (``models.common.DiffusionLMMixin.block_causal``)
    block_causal: bool = False
    # the ids that end an answer (``model.eos_token_ids``: config.json's, inside the vocabulary) and the PAD id
    eos_ids: tuple[int, ...] = ()
    pad_id: int | None = None
    logit_shift: int = 0  # 1: hidden i-1 predicts slot i (Dream), 0: hidden i predicts slot i

    @classmethod
    def of_model(cls, model: Any) -> ModelFacts:
        """The facts of a model (a loaded one, or one built on the meta device from ``config.json`` alone); its
        special ids, fallbacks included, are checked against its vocabulary (``core.special_ids``)."""
        where = _checkpoint_dir(model)
        check_model_ids(model, f"{where}/config.json" if where else f"{type(model).__name__} config")
        pad = getattr(model.config, "pad_token_id", None)
        return cls.in_checkpoint(
            cls(
                vocab_size=int(model.get_input_embeddings().weight.shape[0]),
                mask_id=int(model.mask_token_id),
                eos_ids=tuple(int(i) for i in model.eos_token_ids),
                pad_id=int(pad) if is_int(pad) else None,
                logit_shift=int(getattr(model, "logit_shift", 0)),
                max_length=int(model.max_sequence_length),
                model_type=str(getattr(model.config, "model_type", type(model).__name__)),
                sampling_defaults=dict(getattr(model, "sampling_defaults", {}) or {}),
                block_causal=bool(getattr(model, "block_causal", False)),
            ),
            where,
        )

    def in_checkpoint(self, checkpoint_dir: str | Path | None) -> ModelFacts:
        """These facts for a model whose files are in ``checkpoint_dir`` (None: unknown), with the decoding
        defaults of its ``generation_config.json``; the special ids that file sets are checked against the vocabulary
        and noticed when they differ from the ids decoding uses (the file's ids are never read)."""
        path = None if checkpoint_dir is None else str(checkpoint_dir)
        generation = read_generation_defaults(path)
        if generation.ids:
            where = str(Path(str(path)) / "generation_config.json")
            check_special_ids(generation.ids, self.vocab_size, where)
            used = {"mask_token_id": self.mask_id, "eos_token_id": list(self.eos_ids), "pad_token_id": self.pad_id}
            for message in ignored_generation_ids(generation.ids, used, where):
                notice(message)
        return dataclasses.replace(self, checkpoint_dir=path, generation=generation)


def _checkpoint_dir(model: Any) -> str | None:
    """The directory ``from_pretrained`` read (``config._name_or_path``), when it is one."""
    name = getattr(getattr(model, "config", None), "_name_or_path", None)
    return str(name) if name and Path(str(name)).is_dir() else None


def encode_prompts(prompts: Sequence[Prompt] | torch.Tensor, tokenizer: Any | None, chat: bool) -> list[list[int]]:
    """Strings (tokenized; with ``chat`` wrapped as one user turn), chats (lists of role/content dicts, always
    rendered with the chat template) or token-id lists -> token-id lists."""
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() != 2:
            raise ValueError(f"input_ids tensor must be [B, P], got shape {tuple(prompts.shape)}")
        _check_id_dtype(prompts, "input_ids tensor")
        return [list(map(int, row)) for row in prompts.tolist()]
    if isinstance(prompts, str | dict | bytes) or not isinstance(prompts, Sequence):
        if isinstance(prompts, str | dict):
            raise ValueError(f"{PROMPTS_ARE}, not a single string or message (wrap one prompt in a list)")
        raise ValueError(f"{PROMPTS_ARE}; got {type(prompts).__name__}")
    if prompts and all(is_int(p) for p in prompts):
        one_row = "one row of token ids goes in a list: [[5, 6, 7]]"
        raise ValueError(f"prompt 0 is an int, not a row: {PROMPTS_ARE} ({one_row})")
    out: list[list[int]] = []
    for i, p in enumerate(prompts):
        if isinstance(p, str) or (isinstance(p, Sequence) and p and isinstance(p[0], dict)):
            if tokenizer is None:
                raise ValueError(f"prompt {i} is text but no tokenizer was given; pass token ids or a tokenizer")
            if isinstance(p, str) and not p.strip():  # even as a chat turn: an empty question is a mistake
                raise ValueError(f"prompt {i} is empty text; every row needs a prompt")
            if isinstance(p, str) and not chat:
                out.append(list(tokenizer(_text(p, f"prompt {i}"))["input_ids"]))
                continue
            msgs = [{"role": "user", "content": _text(p, f"prompt {i}")}] if isinstance(p, str) else _chat(p, i)
            text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
            out.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
        elif isinstance(p, torch.Tensor):
            _check_id_dtype(p, f"prompt {i}")
            out.append([int(t) for t in p.reshape(-1).tolist()])
        elif isinstance(p, Sequence):
            if not all(is_int(t) for t in p):
                raise ValueError(f"prompt {i}: token ids must be integers, got {list(p)[:8]!r}")
            out.append(list(p))
        else:
            raise ValueError(
                f"prompt {i}: expected text, a chat (list of messages) or token ids, got {type(p).__name__}"
            )
    return out


CHAT_ROLES = ("system", "user", "assistant")


def _text(text: str, what: str) -> str:
    """``text`` when it is valid Unicode; a command-line argument of undecodable bytes (Python keeps them as lone
    surrogates) is an error, not a tokenizer traceback."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{what} is not valid UTF-8 text (undecodable byte at character {e.start}; was it typed in another "
            "encoding?)"
        ) from None
    return text


def _chat(messages: Sequence[Any], i: int) -> list[dict[str, str]]:
    """A chat's messages, each ``{"role": system|user|assistant, "content": text}``; anything else is an error
    (the chat templates would silently render an unknown role, or fail on a missing content)."""
    out = []
    for j, m in enumerate(messages):
        where = f"prompt {i}, message {j}"
        if not isinstance(m, dict):
            raise ValueError(f"{where}: a chat message is a dict with 'role' and 'content', got {type(m).__name__}")
        if m.get("role") not in CHAT_ROLES:
            raise ValueError(f"{where}: role {m.get('role')!r} is not one of {', '.join(CHAT_ROLES)}")
        if not isinstance(m.get("content"), str):
            got = "no 'content'" if "content" not in m else f"content {m['content']!r}"
            raise ValueError(f"{where}: a chat message needs 'content' text, got {got}")
        out.append(m | {"content": _text(m["content"], where)})
    return out


def _check_id_dtype(ids: torch.Tensor, what: str) -> None:
    """Token ids come as an integer tensor; a float or bool one is refused (``int()`` would truncate 5.7 to 5)."""
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"{what} must hold integer token ids, got dtype {str(ids.dtype).removeprefix('torch.')}")


def build_canvas(
    rows: list[list[int]],
    *,
    gen_length: int,
    mask_id: int,
    pad_id: int,
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Left-pad prompts (checked by ``check_request``) and append ``gen_length`` MASK slots -> canvas, valid,
    positions [B, T], and P."""
    p = max(len(r) for r in rows)
    b, t = len(rows), p + gen_length
    canvas = torch.full((b, t), mask_id, dtype=torch.long)
    valid = torch.ones((b, t), dtype=torch.bool)
    for i, r in enumerate(rows):
        canvas[i, : p - len(r)] = pad_id
        canvas[i, p - len(r) : p] = torch.tensor(r, dtype=torch.long)
        valid[i, : p - len(r)] = False
    positions = (valid.long().cumsum(1) - 1).clamp(min=0)
    return canvas.to(device), valid.to(device), positions.to(device), p


def check_prompts(rows: list[list[int]] | None, facts: ModelFacts | None, gen_length: int) -> None:
    """Prompt token-id rows: non-empty, MASK-free, inside the vocabulary, and short enough for the generation."""
    if rows is not None and len(rows) == 0:
        raise ValueError("empty batch: give at least one prompt")
    for i, r in enumerate(rows or []):
        if len(r) == 0:
            raise ValueError(f"prompt {i} is empty; every row needs at least one prompt token")
        if facts is None:
            continue
        if facts.mask_id in r:
            raise ValueError(
                f"prompt {i} contains the MASK id {facts.mask_id} at position {r.index(facts.mask_id)}; "
                "prompts must be clean"
            )
        bad = [t for t in r if not 0 <= t < facts.vocab_size]
        if bad:
            raise ValueError(f"prompt {i} has token ids outside the vocabulary [0, {facts.vocab_size}): {bad[:5]}")
        if len(r) + gen_length > facts.max_length:
            raise ValueError(
                f"prompt {i} has {len(r)} tokens; with gen_length {gen_length} that is {len(r) + gen_length} "
                f"> the model's maximum sequence length {facts.max_length}"
            )
    if facts is not None and gen_length + 1 > facts.max_length:
        raise ValueError(
            f"gen_length {gen_length} leaves no room for a prompt: the model's maximum sequence length is "
            f"{facts.max_length} (prompt + gen_length)"
        )
