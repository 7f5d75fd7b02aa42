"""Samplers: one file per decoding rule, all behind ``get_sampler(name, options)``."""

from dlm_decode.samplers.base import SAMPLERS, Sampler, Selection, get_sampler, register_sampler

__all__ = ["SAMPLERS", "Sampler", "Selection", "get_sampler", "register_sampler"]
