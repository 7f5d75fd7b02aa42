"""The cache registry: name -> class, and ``get_cache`` to build a policy from a name and options."""

from __future__ import annotations

from typing import Any

from dlm_decode.cache.base import CachePolicy
from dlm_decode.cache.delayed import DelayedCache
from dlm_decode.cache.dkv import DKVDecode, DKVGreedy, DKVPrefill, DKVPrefillDecode
from dlm_decode.cache.dual import DualCache
from dlm_decode.cache.elastic import ElasticCache
from dlm_decode.cache.none import NoCache
from dlm_decode.cache.prefix import PrefixCache
from dlm_decode.cache.sub_block import SubBlockCache
from dlm_decode.cache.window import WindowCache
from dlm_decode.options import build, resolve

CACHES: dict[str, type[CachePolicy]] = {
    "none": NoCache,
    "prefix": PrefixCache,
    "dual": DualCache,
    "dkv_decode": DKVDecode,
    "dkv_greedy": DKVGreedy,
    "dkv_prefill": DKVPrefill,
    "dkv_pd": DKVPrefillDecode,
    "window": WindowCache,
    "elastic": ElasticCache,
    "delayed": DelayedCache,
    "sub_block": SubBlockCache,  # Fast-dLLM v2's approximate sub-block cache: its sampler and models only
}


def get_cache(name: str | CachePolicy | None, options: dict[str, Any] | None = None) -> CachePolicy:
    """A cache policy by registered name with options, or an instance passed through; None means ``none``."""
    if name is None:
        name = "none"
    if isinstance(name, CachePolicy):
        if options:
            raise ValueError("options given together with a cache instance; use dataclasses.replace instead")
        return name
    return build(resolve(CACHES, name, "cache"), options, "cache")


def register_cache(name: str, cls: type[CachePolicy]) -> None:
    """Register a ``CachePolicy`` subclass under ``name`` (for plugins)."""
    CACHES[name] = cls
