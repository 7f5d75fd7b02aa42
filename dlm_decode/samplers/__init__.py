"""Samplers: one file per decoding rule, all behind ``get_sampler(name, options)`` (``registry``)."""

from dlm_decode.samplers.base import Drafts, Sampler, SamplerTraits, Selection
from dlm_decode.samplers.registry import SAMPLERS, get_sampler, register_sampler

__all__ = ["SAMPLERS", "Drafts", "Sampler", "SamplerTraits", "Selection", "get_sampler", "register_sampler"]
