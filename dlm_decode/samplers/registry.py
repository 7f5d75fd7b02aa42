"""The sampler registry: name -> class, and ``get_sampler`` to build one from a name and options."""

from __future__ import annotations

from typing import Any

from dlm_decode.options import build, resolve
from dlm_decode.samplers.adaptive_block import AdaptiveBlock
from dlm_decode.samplers.base import Sampler
from dlm_decode.samplers.dream_entropy import DreamEntropy
from dlm_decode.samplers.dream_maskgit_plus import DreamMaskGitPlus
from dlm_decode.samplers.dream_origin import DreamOrigin
from dlm_decode.samplers.dream_topk_margin import DreamTopkMargin
from dlm_decode.samplers.early_commit import EarlyCommit
from dlm_decode.samplers.entropy_threshold import EntropyThreshold
from dlm_decode.samplers.factor import Factor
from dlm_decode.samplers.fast_dllm_v2 import FastDLLMV2
from dlm_decode.samplers.learned_filter import LearnedFilter
from dlm_decode.samplers.llada2 import LLaDA2
from dlm_decode.samplers.local_leap import LocalLeap
from dlm_decode.samplers.lossless import Lossless
from dlm_decode.samplers.low_confidence import LowConfidence
from dlm_decode.samplers.random_remask import RandomRemask
from dlm_decode.samplers.sdar import SDAR
from dlm_decode.samplers.threshold import Threshold
from dlm_decode.samplers.token_editing import TokenEditing

# ``samplers.oracle.Oracle`` is not registered: it needs each row's reference answer (see ``decode.oracle``)
SAMPLERS: dict[str, type[Sampler]] = {
    "low_confidence": LowConfidence,
    "random": RandomRemask,
    "origin": DreamOrigin,
    "maskgit_plus": DreamMaskGitPlus,
    "topk_margin": DreamTopkMargin,
    "entropy": DreamEntropy,
    "threshold": Threshold,
    "factor": Factor,
    "local_leap": LocalLeap,
    "early_commit": EarlyCommit,
    "adaptive_block": AdaptiveBlock,
    "learned_filter": LearnedFilter,
    "entropy_threshold": EntropyThreshold,
    "lossless": Lossless,
    "llada2": LLaDA2,
    "token_editing": TokenEditing,
    "sdar": SDAR,
    "fast_dllm_v2": FastDLLMV2,
}


def get_sampler(name: str | Sampler, options: dict[str, Any] | None = None) -> Sampler:
    """A sampler by registered name with options (strings are converted), or an instance passed through."""
    if isinstance(name, Sampler):
        if options:
            raise ValueError("options given together with a sampler instance; use dataclasses.replace instead")
        return name
    return build(resolve(SAMPLERS, name, "sampler"), options, "sampler")


def register_sampler(name: str, cls: type[Sampler]) -> None:
    """Register a ``Sampler`` subclass under ``name`` (for plugins)."""
    SAMPLERS[name] = cls
