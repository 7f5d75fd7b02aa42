"""Elastic-Cache (Nguyen-Tri, Ranjan, Shen 2025, "Attention Is All You Need for KV Cache in Diffusion LLMs", arXiv
2510.14973, VILA-Lab): decide *when* to refresh the K/V cache with an attention-aware drift test on the most-attended
tokens, and *where* with a depth-aware schedule that recomputes every slot from the drifting layer on while the
shallow layers and the masks beyond a sliding window stay cached.

What it follows (the paper's Algorithm 1 and the reference ``generate_with_elastic_cache`` as described in public
reconstructions of VILA-Lab/Elastic-Cache; the repository itself could not be read here):

* The call's first step is a full forward that fills the K/V store and a cache of every layer's input hidden states.
* Every later step queries only: the **sliding window** ``M_beta`` (each row's first ``window_length`` masks), the
  tokens decoded by the previous step, and the **tracked** tokens. With ``block_caching`` (default) the masks
  beyond the window keep their cached K/V (the paper's block-wise caching of distant MASK tokens); without it every
  mask is queried each step (the window still bounds what may be committed).
* At every layer, each row picks the ``track_num`` decoded slots (prompt included) the window's masks attend to
  most; the union over layers is the next step's tracked set (``T_t``).
* Drift test (``models.depth``): at each layer the tracked tokens' attention rows of the previous state (their
  cached input and the cached keys) are compared with those of this step; ``sigma`` = cosine similarity over the
  keys, mean over heads and tracked tokens. Where ``sigma < gamma`` the row recomputes every slot from that layer
  on, its deeper layers' inputs taken from the hidden-state cache with the fresh query rows written in.
* Defaults: ``gamma`` 0.9, ``window_length`` 16, ``track_num`` 1, ``block_caching`` on (the reference's). Pair it
  with ``threshold`` 0.9 as the paper does; any sampler works.

Deliberate differences: (1) the refresh starts *at* the layer whose test failed (the layer is run again for every
slot of the row), not at the next one as in the reference: a failure at the first layer then refreshes everything
from the embeddings, so ``gamma`` > 1 reproduces decoding without a cache token for token (the reference's layer 0
would stay stale). (2) The decision is per row (a batch decodes as its rows would alone); the reference decodes one
sequence. (3) The cosine is taken over the keys per head, the paper's ``cos(S_{t-1}[T], S_t[T])``; a public
reconstruction of the reference takes it over heads. (4) The sampler's region (the block) bounds what is committed,
as for every policy: only window masks inside the region are candidates, and at the block's last allowed step every
mask of the region is computed so the loop can finish the block (the reference has no blocks). (5) With Dream's
shifted logits the slot before each candidate is queried too. (6) The attention weights for the test and the picks
are computed apart from the attention kernel (which keeps none): two small extra attentions per layer, counted in
the wall clock. The statistics (``GenerateOutput.cache_stats``): full refreshes, how many row-steps refreshed from
each layer, row-steps that reused every layer, the mean ``sigma`` per layer and the (slot, layer) pairs computed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dlm_decode.cache.base import CachePolicy, StepPlan
from dlm_decode.cache.depth_plan import DepthMemory, DepthProgram
from dlm_decode.cache.plans import keys_from_mask, mask_ranks, region_mask, rows_to_index, with_predecessors
from dlm_decode.core.state import DecodeState
from dlm_decode.options import check_count, is_real


@dataclass(frozen=True)
class ElasticCache(CachePolicy):
    gamma: float = 0.9  # drift threshold on the attention cosine (> 1: refresh from the first layer every step)
    window_length: int = 16  # beta: each row's first masks queried (and committable) per step
    track_num: int = 1  # most-attended tokens tracked per layer
    block_caching: bool = True  # masks beyond the window keep their cached K/V (False: queried every step)

    name: ClassVar[str] = "elastic"

    def __post_init__(self) -> None:
        owner = f"cache {self.name!r}"
        if not is_real(self.gamma):
            raise ValueError(f"{owner}: gamma must be a finite number (a cosine threshold; > 1 always refreshes)")
        check_count(owner, "window_length", self.window_length)
        check_count(owner, "track_num", self.track_num)
        if not isinstance(self.block_caching, bool):
            raise ValueError(f"{owner}: block_caching must be true or false, got {self.block_caching!r}")

    def count_bounds(self, block, block_steps, gen_length, prompt) -> dict[str, tuple[int, str]]:
        out = {"window_length": (gen_length, "the gen length")}  # the first masks of the generation queried per step
        if prompt is not None:  # tracked among the tokens decoded at the first step: the prompt's
            out["track_num"] = (prompt, "the shortest prompt's length")
        return out

    def _memory(self, state: DecodeState) -> dict[str, Any]:
        mem = state.scratch.get(f"cache/{self.name}")
        if mem is None:
            mem = {"depth": DepthMemory(), "track": None, "masked": None, "stats": None, "full_steps": 0}
            state.scratch[f"cache/{self.name}"] = mem
        return mem

    def plan(self, state: DecodeState, region: tuple[int, int]) -> StepPlan:
        mem = self._memory(state)
        masked = state.is_masked()  # [B, T]
        live = state.valid & ~state.finished[:, None]
        window = masked & live & (mask_ranks(masked & live) <= self.window_length)  # [B, T]
        ids, ok = keys_from_mask(window)  # [B, W]
        track = mem["track"]
        program = DepthProgram(
            mem["depth"],
            state.positions,
            ids,
            ok,
            state.valid & ~masked,
            self.track_num,
            self.gamma,
            track is None,
            track,
        )
        previous, mem["masked"] = mem["masked"], masked.clone()
        mem["active"] = ~state.finished
        if track is None:  # the call's first step: every slot through every layer
            mem["full_steps"] += 1
            return StepPlan(
                compute=slice(0, state.total_length), key_mask=state.key_mask(), refresh=True, layers=program
            )
        in_region = region_mask(state, region)
        targets = window & in_region
        last = state.block_step + 1 >= state.block_limit  # the loop finishes the block: every region mask computed
        if last:
            targets = targets | (masked & in_region & live)
        need = window | (previous & ~masked) | with_predecessors(targets, state.logit_shift)
        if not self.block_caching:
            need |= masked & live
        need = need & state.valid
        need.scatter_(1, track, True)  # the tracked tokens are queried for the drift test
        return StepPlan(
            compute=rows_to_index(need),  # [B, Q]
            key_mask=state.key_mask(),
            candidates=None if last else targets,
            layers=program,
        )

    def after_step(self, state: DecodeState, committed: torch.Tensor) -> None:
        mem = self._memory(state)
        depth = mem["depth"]
        b = state.batch  # under classifier-free guidance the model's rows [B, 2B) are the unconditional copies
        mem["track"] = torch.cat(depth.picks, dim=1)[:b].sort(dim=1).values  # [B, L * track_num]
        sigma, boundary = depth.sigma[:, :b], depth.boundary[:b]  # [L, B], [B]
        n_layers = sigma.shape[0]
        if mem["stats"] is None:
            mem["stats"] = {k: torch.zeros(n_layers + 1, device=state.device) for k in ("from", "sum", "n")}
        st = mem["stats"]
        tested = ~sigma.isnan()  # [L, B]
        st["sum"][:n_layers] += sigma.nan_to_num(0.0).sum(1)
        st["n"][:n_layers] += tested.sum(1)
        if state.step > 1:  # a reuse step: where each row that took part refreshed from (L: nowhere)
            rows = tested.any(0) & mem["active"]  # [B]
            st["from"].index_add_(0, boundary[rows], torch.ones_like(boundary[rows], dtype=torch.float))

    def report(self, state: DecodeState) -> dict[str, Any]:
        mem = state.scratch.get(f"cache/{self.name}")
        if mem is None or mem["stats"] is None:
            return {}
        st = {k: v.tolist() for k, v in mem["stats"].items()}
        n_layers = len(st["from"]) - 1
        mean = [s / n if n else math.nan for s, n in zip(st["sum"][:n_layers], st["n"][:n_layers], strict=True)]
        return {
            "full_refreshes": mem["full_steps"],
            "refresh_from_layer": [int(x) for x in st["from"][:n_layers]],  # row-steps refreshing from each layer
            "reused_all_layers": int(st["from"][n_layers]),  # row-steps whose every layer kept its cache
            "drift_mean": [None if math.isnan(m) else round(m, 4) for m in mean],  # mean sigma per layer
            "drift_tests": [int(x) for x in st["n"][:n_layers]],
            "slot_layers": mem["depth"].slot_layers,
        }
