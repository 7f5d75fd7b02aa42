"""Cache policies for diffusion decoding and the K/V store they share (``get_cache`` in ``registry``)."""

from dlm_decode.cache.base import CachePolicy, StepPlan
from dlm_decode.cache.registry import CACHES, get_cache, register_cache
from dlm_decode.cache.store import KVAccess, KVStore

__all__ = ["CACHES", "CachePolicy", "KVAccess", "KVStore", "StepPlan", "get_cache", "register_cache"]
