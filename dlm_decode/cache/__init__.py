"""Cache policies for diffusion decoding and the K/V store they share."""

from dlm_decode.cache.base import CACHES, CachePolicy, StepPlan, get_cache, register_cache
from dlm_decode.cache.store import KVStore

__all__ = ["CACHES", "CachePolicy", "KVStore", "StepPlan", "get_cache", "register_cache"]
