"""Tiny random DiffuCoder (apple/DiffuCoder-7B-Base / -Instruct / -cpGRPO) and Dream-Coder
(Dream-org/Dream-Coder-v0-Base-7B / -Instruct-7B) checkpoints in their published format: Dream's.

What the published repositories ship and these copy: config.json with ``model_type: Dream``, ``architectures:
["DreamModel"]``, the ``auto_map`` to Dream's remote files, the Qwen2.5 keys (here with Qwen's extra keys that Dream
ignores: ``use_sliding_window``, ``sliding_window``, ``max_window_layers``, ``use_cache``) and ``mask_token_id``; a
``generation_config.json`` of transformers' own keys; the tokenizer as Dream's remote class ``DreamTokenizer``
(``tokenization_dream.py``, Qwen2's byte-level BPE: vocab.json + merges.txt + tokenizer_config.json with the
``auto_map`` and ``added_tokens_decoder``, no tokenizer.json), the special tokens numbered after the vocabulary as
in Qwen's (``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, then Dream's ``<|beginoftext|>`` and ``<|mask|>``),
and Qwen's chat template. DiffuCoder's differences: ``<|dlm_pad|>`` after ``<|mask|>``, the tokenizer's pad token
and config.json's ``pad_token_id`` (its Instruct answers end in a run of them; its README cuts the text at the first).
Weights: ``checkpoints.dream_state_dict`` (the Dream parameter names).
"""

from __future__ import annotations

import json
from pathlib import Path

from checkpoints import dream_config, dream_state_dict, write_checkpoint

ENDOFTEXT, IM_START, IM_END, BEGINOFTEXT, MASK, DLM_PAD = 58, 59, 60, 61, 62, 63
WORDS = 58  # byte-level vocabulary entries 0..57; the special tokens follow, as in Qwen's vocabulary
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def coder_config(family: str, **over) -> dict:
    cfg = dream_config(
        mask_token_id=MASK,
        bos_token_id=ENDOFTEXT,
        eos_token_id=ENDOFTEXT,
        pad_token_id=DLM_PAD if family == "diffucoder" else ENDOFTEXT,
        use_sliding_window=False,
        sliding_window=256,
        max_window_layers=2,
        use_cache=True,
        initializer_range=0.02,
        attention_dropout=0.0,
        transformers_version="4.52.0",
    )
    cfg.update(over)
    return cfg


def write_coder(path: Path, family: str, seed: int = 0, **over) -> Path:
    """A ``family`` ("diffucoder" or "dream_coder") checkpoint with its tokenizer and generation_config.json."""
    assert family in ("diffucoder", "dream_coder")
    cfg = coder_config(family, **over)
    write_checkpoint(path, cfg, dream_state_dict(cfg, seed))
    gen = {"bos_token_id": ENDOFTEXT, "eos_token_id": ENDOFTEXT, "pad_token_id": cfg["pad_token_id"]}
    (path / "generation_config.json").write_text(json.dumps(gen | {"transformers_version": "4.52.0"}))
    write_dream_tokenizer(path, dlm_pad=family == "diffucoder")
    return path


def _byte_level_words() -> list[str]:
    """58 single byte-level symbols: letters, digits, some punctuation, and the space / newline marks Ġ / Ċ."""
    words = list("abcdefghijklmnopqrstuvwxyz0123456789") + ["Ġ", "Ċ"] + list("().:=_,'[]+-*/<>#\"!?")
    assert len(words) == WORDS
    return words


def write_dream_tokenizer(path: Path, dlm_pad: bool) -> None:
    """Dream's tokenizer files (remote class ``DreamTokenizer``), DiffuCoder's ``<|dlm_pad|>`` with ``dlm_pad``."""
    (path / "vocab.json").write_text(json.dumps({w: i for i, w in enumerate(_byte_level_words())}))
    (path / "merges.txt").write_text("#version: 0.2\n")
    specials = {
        ENDOFTEXT: "<|endoftext|>",
        IM_START: "<|im_start|>",
        IM_END: "<|im_end|>",
        BEGINOFTEXT: "<|beginoftext|>",
        MASK: "<|mask|>",
    }
    if dlm_pad:
        specials[DLM_PAD] = "<|dlm_pad|>"
    added = {
        str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
        | {"special": True}
        for i, t in specials.items()
    }
    config = {
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "auto_map": {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]},
        "bos_token": "<|beginoftext|>",
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>",
        "errors": "replace",
        "mask_token": "<|mask|>",
        "model_max_length": 131072,
        "pad_token": "<|dlm_pad|>" if dlm_pad else "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "DreamTokenizer",
        "unk_token": None,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    keep = ("bos_token", "eos_token", "mask_token", "pad_token", "additional_special_tokens")
    (path / "special_tokens_map.json").write_text(json.dumps({k: config[k] for k in keep}))
