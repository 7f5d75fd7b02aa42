"""Every check a decoding request gets, in one place, made before any model work (and, from the entry points,
before any weights are read).

    facts = ModelFacts.of_model(model)               # or models.loading.model_facts(path): config.json only
    req = check_request(facts, rows, sampler="threshold", sampler_options={"threshold": 0.9}, gen_length=64)

``check_request`` resolves the sampler and cache (names and options), builds the ``DecodeConfig`` (gen / block length,
steps, temperature, top-p / top-k, ...; lengths the caller leaves unset come from the checkpoint's
``generation_config.json`` when it sets them, ``with_model_lengths``), lays out the blocks
(``core.config.resolve_lengths``), runs the sampler's and the cache's own checks (options that count tokens or steps
of a block against the block: ``check_counts``), checks the prompt rows against what
``config.json`` decides (the vocabulary, the MASK id and the maximum sequence length) and fills the options the caller
left unset with the sampler's reference defaults (``fill_defaults``).
Each failure is a ``ValueError`` naming the option and what is allowed.
``generate`` calls it; so do the CLI's ``generate`` and ``parallelbench``, the ParallelBench runner and the lm-eval
plugin, with facts read from ``config.json`` before loading.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from dlm_decode.cache import CachePolicy, get_cache
from dlm_decode.core.config import DecodeConfig, resolve_lengths
from dlm_decode.core.generation_config import fill_lengths
from dlm_decode.core.inputs import ModelFacts, check_prompts
from dlm_decode.core.special_ids import check_option_ids
from dlm_decode.options import check_bounded
from dlm_decode.samplers import Sampler, get_sampler


@dataclass(frozen=True)
class Request:
    """A checked request: what the loop runs (unset options filled in)."""

    config: DecodeConfig
    sampler: Sampler
    cache: CachePolicy
    block_length: int
    num_blocks: int
    steps: int  # total step budget of fixed-budget samplers


CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(DecodeConfig))


def decode_config(config: DecodeConfig | None = None, **kwargs: Any) -> DecodeConfig:
    """A ``DecodeConfig`` from keywords, or ``config`` itself; unknown keywords list the valid ones. A keyword that
    disagrees with ``config`` is an error (neither silently wins); one that repeats its value is accepted."""
    unknown = sorted(set(kwargs) - set(CONFIG_FIELDS))
    if unknown:
        raise ValueError(f"unknown decoding option(s) {', '.join(unknown)}; valid: {', '.join(CONFIG_FIELDS)}")
    if config is None:
        return DecodeConfig(**kwargs)
    if not isinstance(config, DecodeConfig):
        raise ValueError(f"config must be a DecodeConfig or None, got {type(config).__name__}")
    clash = [f"{k}={v!r} (config has {getattr(config, k)!r})" for k, v in kwargs.items() if v != getattr(config, k)]
    if clash:
        raise ValueError(
            f"decoding option(s) given both in config= and as keywords with other values: {', '.join(clash)}; "
            "give each option once (change a DecodeConfig with dataclasses.replace)"
        )
    return config


def fill_defaults(
    sampler: Sampler, config: DecodeConfig, model_defaults: dict[str, Any]
) -> tuple[Sampler, DecodeConfig]:
    """``sampler`` and ``config`` with every option the caller left unset (None) filled in: from the model's
    reference defaults when the sampler follows them (``DecodeConfig`` fields go to the config, the rest to the
    sampler), then from the sampler's ``traits.option_defaults``. A default of None leaves the option unset."""
    given = {k: v for k, v in model_defaults.items() if v is not None} if sampler.traits.follows_model_defaults else {}
    own = {f.name for f in dataclasses.fields(sampler)}
    to_config = {k: v for k, v in given.items() if hasattr(config, k) and getattr(config, k) is None}
    merged = dict(sampler.traits.option_defaults) | given
    to_sampler = {k: v for k, v in merged.items() if k in own and getattr(sampler, k) is None}
    if to_sampler:
        sampler = dataclasses.replace(sampler, **to_sampler)
    return sampler, (dataclasses.replace(config, **to_config) if to_config else config)


def default_cache(facts: ModelFacts | None) -> str:
    """The cache a request gets when it names none: ``prefix`` on block-causal models (exact there), else ``none``."""
    return "prefix" if facts is not None and facts.block_causal else "none"


def with_model_lengths(
    facts: ModelFacts | None, sampler: Sampler, config: DecodeConfig | None, config_kwargs: dict[str, Any]
) -> dict[str, Any]:
    """The lengths the caller left unset (None or absent, in ``config_kwargs`` and in ``config``) that the
    checkpoint's ``generation_config.json`` sets (``core.generation_config.fill_lengths``)."""
    if facts is None:
        return {}
    given = (dataclasses.asdict(config) if config is not None else {}) | config_kwargs  # what the caller set
    lengths = {k: given.get(k) for k in ("gen_length", "block_length", "steps")}
    DecodeConfig(**{k: v for k, v in lengths.items() if v is not None})  # the caller's own first ("8": not a length)
    return fill_lengths(facts.generation, **lengths, blockwise=sampler.traits.blockwise)


def check_counts(
    smp: Sampler,
    pol: CachePolicy,
    block: int,
    block_steps: int,
    gen_length: int,
    rows: list[list[int]] | None,
    facts: ModelFacts | None,
) -> None:
    """Options that count tokens or steps of a block (or of the generation) against what they count
    (``options.check_bounded``: an error naming the bound; the shipped defaults exempt), and options holding token
    ids against the model's vocabulary and MASK id."""
    vocab, mask = (facts.vocab_size, facts.mask_id) if facts is not None else (None, None)
    prompt = min(map(len, rows)) if rows else None
    check_bounded(smp.name, smp, smp.count_bounds(block, block_steps, gen_length))
    defaults = {f.name: f.default for f in dataclasses.fields(smp)}
    for key, (ids, written) in smp.token_options().items():  # token ids an option holds (a shipped default: as is)
        if ids != defaults.get(key):
            check_option_ids(smp.name, key, ids, vocab, mask if written else None)
    check_bounded(f"cache {pol.name!r}", pol, pol.count_bounds(block, block_steps, gen_length, prompt))


EXACT_UNDER_BLOCKS = ("none", "prefix", "delayed")  # caches with a rule for D2F's attention / several open blocks


def check_attention_and_blocks(
    smp: Sampler, pol: CachePolicy, cfg: DecodeConfig, block_causal: bool, facts: ModelFacts | None
) -> None:
    """D2F's attention (``DecodeConfig.attention``) and several blocks in flight (``Sampler.multi_block``) against
    the model and the cache: the attention applies to bidirectional models; both run with ``none``, ``prefix``
    (exact under block-causal attention) and, on bidirectional models, ``delayed`` (d3LLM's)."""
    answer = cfg.attention == "answer_block_causal"
    if answer and block_causal:
        model = facts.model_type if facts is not None else "this model"
        raise ValueError(
            f"attention='answer_block_causal' (D2F's) applies to bidirectional models (LLaDA, Dream, LLaDA-MoE); "
            f"{model} is block-causal already, on its own grid: leave attention unset"
        )
    multi = smp.multi_block() is not None
    if (answer or multi) and pol.name not in EXACT_UNDER_BLOCKS:
        why = "attention='answer_block_causal'" if answer else f"{smp.name} with several blocks in flight"
        raise ValueError(
            f"cache {pol.name!r} does not apply to {why}; use one of: none, prefix (exact under block-causal "
            "attention), delayed (d3LLM's, bidirectional models)"
        )
    if multi and pol.name == "prefix" and not (answer or block_causal):
        raise ValueError(
            f"cache 'prefix' with {smp.name} and several blocks in flight is exact only under block-causal attention: "
            "set attention='answer_block_causal' (D2F), or use cache 'delayed' (d3LLM's) or 'none'"
        )
    if answer and pol.name == "prefix" and getattr(pol, "refresh_interval", None) is not None:
        raise ValueError(
            "cache 'prefix': refresh_interval does not apply under attention='answer_block_causal' (its cache is exact)"
        )


def check_request(
    facts: ModelFacts | None,
    rows: list[list[int]] | None = None,
    *,
    sampler: str | Sampler = "low_confidence",
    sampler_options: dict[str, Any] | None = None,
    cache: str | CachePolicy | None = None,
    cache_options: dict[str, Any] | None = None,
    config: DecodeConfig | None = None,
    **config_kwargs: Any,
) -> Request:
    """Check a request against the model's facts (None: only what the arguments decide) and the prompt ``rows``
    (token ids; None: no prompts yet, so only that the generation leaves room for one)."""
    smp = get_sampler(sampler, sampler_options).with_model(facts)
    unset = ("gen_length", "block_length", "steps")  # a length given as None is left to the config / checkpoint
    own = {k: v for k, v in config_kwargs.items() if v is not None or k not in unset}
    filled = with_model_lengths(facts, smp, config, own)
    cfg = decode_config(config, **own)
    if filled:  # the checkpoint's lengths go onto the config: a caller's DecodeConfig leaving them unset is no clash
        cfg = dataclasses.replace(cfg, **filled)
    pol = get_cache(default_cache(facts) if cache is None else cache, cache_options)
    block, steps = resolve_lengths(cfg.gen_length, cfg.block_length, cfg.steps, blockwise=smp.traits.blockwise)
    block_causal = facts is not None and facts.block_causal
    if block_causal:  # blocks on the absolute grid: any gen_length (a cap), any block (``decode.blocks``)
        num_blocks = -(-cfg.gen_length // block)
    else:
        if block > cfg.gen_length:
            raise ValueError(f"block_length ({block}) must be <= gen_length ({cfg.gen_length})")
        if cfg.gen_length % block:
            raise ValueError(f"gen_length ({cfg.gen_length}) must be a multiple of block_length ({block})")
        num_blocks = cfg.gen_length // block
    smp.check(cfg, num_blocks)
    pol.check(cfg, smp, facts)
    smp.check_cache(pol)
    check_attention_and_blocks(smp, pol, cfg, block_causal, facts)
    if rows is not None or facts is not None:
        check_prompts(rows, facts, cfg.gen_length)
    block_steps = steps // num_blocks if smp.traits.fixed_budget else block
    check_counts(smp, pol, block, block_steps, cfg.gen_length, rows, facts)
    smp, cfg = fill_defaults(smp, cfg, facts.sampling_defaults if facts is not None else {})
    return Request(cfg, smp, pol, block, num_blocks, steps)
