"""Special token ids (MASK, EOS, PAD, BOS) checked against the vocabulary they index, before any weight is read.

An id outside ``[0, vocab_size)`` is never a token the model can read or write: as MASK or PAD it indexes past the
embedding (an ``IndexError`` deep in the model, or only once a batch needs left padding), as EOS it can never be
written, so decoding never stops. The one rule for every family (LLaDA, Dream, LLaDA2 and any family added later):

* ``check_special_ids(values, vocab_size, where)``: the ids a file sets (``config.json`` through the family's
  ``models.schema.ConfigSchema``, ``generation_config.json``); one ``ValueError`` naming the file and the key.
* ``check_model_ids(model, where)``: the ids a model (built from its config, on the meta device or loaded) decodes
  with, its built-in fallbacks included (``model.mask_token_id``, ``model.eos_token_ids``, ``config.pad_token_id``);
  a family whose fallback EOS lies outside the vocabulary drops it (``usable_ids``), the caller then says so once
  (``no_eos_notice``).
* ``check_tokenizer_ids(tokenizer, vocab_size, where)``: the tokenizer's MASK / EOS / PAD / BOS ids.
* ``ignored_generation_ids``: ids ``generation_config.json`` sets that differ from the ones decoding uses (it reads
  them from ``config.json``): one notice each, naming where the value must go.

Notices are ``Notice`` warnings (``notice``): the CLI prints them as one ``dlm-decode: notice: ...`` line.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from dlm_decode.options import is_int

SPECIAL_IDS = ("mask_token_id", "eos_token_id", "pad_token_id", "bos_token_id")


class Notice(UserWarning):
    """A documented behaviour the user should know about (not an error): printed once, as one line by the CLI."""


def notice(message: str) -> None:
    """Emit ``message`` once per process (the warnings registry keeps one per text and call site)."""
    warnings.warn(message, Notice, stacklevel=2)


def as_ids(value: Any) -> list[int]:
    """An id or a list of ids as a list (None: empty); non-integers are left for the type checks to report."""
    if value is None:
        return []
    values = list(value) if isinstance(value, list | tuple) else [value]
    return [v for v in values if is_int(v)]


def usable_ids(value: Any, vocab_size: int) -> list[int]:
    """The ids of ``value`` inside ``[0, vocab_size)``."""
    return [v for v in as_ids(value) if 0 <= v < vocab_size]


def _outside(key: str, value: Any, vocab_size: int, where: str, how: str = "") -> None:
    bad = [v for v in as_ids(value) if not 0 <= v < vocab_size]
    if bad:
        which = f" (id {bad[0]})" if isinstance(value, list | tuple) else ""
        raise ValueError(
            f"{where}: {key} {value!r}{which}{how} lies outside the vocabulary [0, {vocab_size}); a token id must be "
            f"an integer from 0 to {vocab_size - 1} (fix {key}, or vocab_size)"
        )


def check_special_ids(
    values: Mapping[str, Any], vocab_size: int, where: str, keys: Iterable[str] = SPECIAL_IDS
) -> None:
    """Raise ``ValueError`` naming ``where`` (the file) and the first of ``keys`` that ``values`` sets (an id or a list
    of ids) outside ``[0, vocab_size)``, or that is also the MASK id (``distinct_from_mask``). Unset or null keys
    pass."""
    for key in keys:
        _outside(key, values.get(key), vocab_size, where)
    distinct_from_mask(values, where)


def distinct_from_mask(values: Mapping[str, Any], where: str) -> None:
    """The MASK id (``values["mask_token_id"]``) must be no EOS, PAD or BOS id of ``values``: decoding never writes
    MASK (an EOS equal to it could never end an answer) and a prompt or its padding may not hold it."""
    mask = values.get("mask_token_id")
    if not is_int(mask):
        return
    for key in SPECIAL_IDS[1:]:
        if mask in as_ids(values.get(key)):
            raise ValueError(
                f"{where}: mask_token_id {mask} is also the {key}; the MASK id must be a token of its own "
                "(decoding never writes it)"
            )


def vocabulary(model: Any) -> int:
    """The ids a model can read: the rows of its input embedding (meta or loaded)."""
    return int(model.get_input_embeddings().weight.shape[0])


def check_model_ids(model: Any, where: str) -> None:
    """The MASK, PAD and EOS ids ``model`` decodes with (set in its config or the family's built-in fallbacks) inside
    its vocabulary, else ``ValueError`` naming ``where`` and the key; a fallback is named as such."""
    vocab, config = vocabulary(model), model.config
    mask = model.mask_token_id
    unset = getattr(config, "mask_token_id", None) is None  # the family's fallback (LLaDA2's reference default)
    how = " (no mask_token_id is set, in config.json or by the tokenizer: the built-in fallback)" if unset else ""
    _outside("mask_token_id", mask, vocab, where, how)
    default = " (set in the config, or the family's default when config.json sets none)"
    _outside("pad_token_id", getattr(config, "pad_token_id", None), vocab, where, default)
    _outside("eos_token_id", getattr(config, "eos_token_id", None), vocab, where, default)
    _outside("eos_token_id", list(model.eos_token_ids), vocab, where)  # with a family's extra or fallback EOS ids
    used = {"eos_token_id": list(model.eos_token_ids), "pad_token_id": getattr(config, "pad_token_id", None)}
    distinct_from_mask({"mask_token_id": mask, **used, "bos_token_id": getattr(config, "bos_token_id", None)}, where)


def check_option_ids(owner: str, key: str, ids: Iterable[Any], vocab_size: int | None, mask_id: int | None) -> None:
    """Token ids a sampler option holds (forced or looked-for tokens): integers inside ``[0, vocab_size)`` (``>= 0``
    while the model is unknown) and, with ``mask_id`` (ids written into the canvas), never the MASK id, else
    ``ValueError`` naming ``owner`` and ``key``."""
    ids = tuple(ids)
    where = f"[0, {vocab_size})" if vocab_size is not None else "[0, ...)"
    for i in ids:
        if not is_int(i) or i < 0 or (vocab_size is not None and i >= vocab_size):
            raise ValueError(f"{owner}: {key} {ids!r} holds {i!r}, outside the vocabulary {where}")
    if mask_id is not None and mask_id in ids:
        raise ValueError(f"{owner}: {key} {ids!r} holds the MASK id {mask_id}; a token option names real tokens")


def no_eos_notice(where: str) -> None:
    """The one notice for a model with no usable EOS id: it decodes every row to the full gen length."""
    notice(
        f"{where}: no usable EOS id (config.json sets no eos_token_id inside the vocabulary and the tokenizer names "
        "none): every row decodes to the full gen length; set eos_token_id in config.json to stop at an answer's end"
    )


def check_tokenizer_ids(tokenizer: Any, vocab_size: int, where: str) -> None:
    """The tokenizer's special ids inside the model's vocabulary, else ``ValueError`` naming ``where``."""
    if tokenizer is None:
        return
    values = {k: getattr(tokenizer, k, None) for k in SPECIAL_IDS}
    check_special_ids({k: v for k, v in values.items() if is_int(v)}, vocab_size, where)


# where each id decoding uses comes from (named in the notice for a generation_config.json value that differs)
USED_FROM = {
    "mask_token_id": "config.json's mask_token_id",
    "eos_token_id": "config.json's eos_token_id, plus the tokenizer's EOS and end-of-turn tokens",
    "pad_token_id": "config.json's pad_token_id",
}


def ignored_generation_ids(values: Mapping[str, Any], used: Mapping[str, Any], where: str) -> list[str]:
    """Notices for the MASK / EOS / PAD ids ``values`` (``generation_config.json``) sets that are not among the
    ``used`` ones (key -> the id or ids decoding uses; a file naming one of several EOS ids in use is fine): decoding
    reads them from ``USED_FROM``, never from this file. A BOS id there is checked against the vocabulary only
    (decoding writes no BOS)."""
    out = []
    for key in SPECIAL_IDS:
        value = values.get(key)
        if value is None or key not in USED_FROM or set(as_ids(value)) <= set(as_ids(used[key])):
            continue  # the file repeats (some of) the ids in use
        out.append(
            f"{where}: {key} {value!r} is not read from this file (decoding uses {used[key]!r}, from "
            f"{USED_FROM[key]}); to change it, set {key} in config.json"
        )
    return out


def check_call_ids(model: Any, tokenizer: Any | None) -> None:
    """For a model handed to ``generate`` or the engine in memory (the loading paths check their files): the
    tokenizer's special ids inside the model's vocabulary, and the one notice when neither the model nor the
    tokenizer has a usable EOS id."""
    vocab = vocabulary(model)
    check_tokenizer_ids(tokenizer, vocab, "tokenizer")
    eos = usable_ids(getattr(model, "eos_token_ids", []), vocab)
    if not eos and not usable_ids(getattr(tokenizer, "eos_token_id", None), vocab):
        no_eos_notice(type(model).__name__)
