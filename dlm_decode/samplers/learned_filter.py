"""Learned parallel-decoding filter with End-of-Text Prediction (Bao et al. 2025, "Learning to Parallel: Accelerating
Diffusion Large Language Models via Learnable Parallel Decoding", Learn2PD).

Reference: ``generate_learn2parallel`` and ``generate_l2p_eot`` in Learn2PD's ``llada/generate.py``. Per step, the
block's confidence vector (probability of the proposed token at **every** block slot, decoded or not) goes through a
small filter ``f`` (2-layer MLP ``block -> block -> block``); masked slots with ``sigmoid(f(conf)) > accept`` (strict,
default 0.96) are committed, together with LLaDA's fixed-budget top-k (``steps`` per block, one per step when
``steps == gen_length``) so every step makes progress. Filters are trained by ``recipes/learn2pd`` on the oracle's
records (``samplers/oracle.py``) and stored as ``<name>.safetensors`` plus ``<name>.json`` (config); they are loaded
only through safetensors, and a filter trained for another block length is refused.

End-of-Text Prediction (``eotp=True``, ``generate_l2p_eot``): after the step's commits, if a slot the **filter**
accepted predicts EOS, the canvas is cut right after the first such slot; otherwise, if any still-masked slot of the
whole canvas (before this step's commits, any block) predicts EOS, the canvas is cut right after the most confident
such slot (that slot itself stays and is decoded later). Slots after a cut are filled with the fill id and never
decoded (``Selection.cut_at``), which is where the speed-up at long generation lengths comes from. EoTP needs the
logits of the whole remaining canvas, so with ``eotp`` the sampler's region runs to the end of the canvas.

Differences from the reference: confidences are float64 softmax probabilities cast to float32 for the filter (the
reference uses the model dtype); the EOS set is the call's end ids (the reference checks ``<|endoftext|>`` only);
the activation between the two layers is ReLU (the reference module file is not public in our sources; the config
records it); the reference's top-k can select slots outside the block when the filter already committed more than
the schedule left (we never commit outside the block); its cut inside a block with masks before the cut feeds the
filter a shorter vector (we keep the block's full confidence vector). ``filter=None`` accepts nothing: the sampler
is then LLaDA's low-confidence rule (plus EoTP when enabled). ``filter="shipped"`` names the filter shipped beside
the model's weights (``<checkpoint>/learn2pd_filter.safetensors``, as ``recipes/learn2pd/ship_demo.sh`` writes for
the demo models), resolved against the checkpoint directory the model was loaded from, so one sweep grid serves
every model.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from dlm_decode.core.config import DecodeConfig
from dlm_decode.core.files import check_shapes, read_json_object, safetensors_shapes
from dlm_decode.core.inputs import ModelFacts
from dlm_decode.core.state import DecodeState
from dlm_decode.samplers.base import SamplerTraits, Selection, block_slots, block_vectors, candidates, top_k_per_row
from dlm_decode.samplers.low_confidence import LowConfidence

FORMAT = "learn2pd-filter"
SHIPPED = "shipped"  # the ``filter`` value that names the filter shipped beside the model
SHIPPED_FILE = "learn2pd_filter.safetensors"  # its file name in a checkpoint directory
ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}


class FilterMLP(nn.Module):
    """``conf [N, block] -> logits [N, block]``: Linear(block, hidden), activation, Linear(hidden, block)."""

    def __init__(self, block_length: int, hidden: int | None = None, activation: str = "relu") -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown filter activation {activation!r}; valid: {', '.join(ACTIVATIONS)}")
        self.block_length, self.hidden, self.activation = block_length, hidden or block_length, activation
        self.net = nn.Sequential(
            nn.Linear(block_length, self.hidden), ACTIVATIONS[activation](), nn.Linear(self.hidden, block_length)
        )

    def forward(self, conf: torch.Tensor) -> torch.Tensor:
        return self.net(conf)

    def config(self) -> dict:
        return {
            "format": FORMAT,
            "block_length": self.block_length,
            "hidden": self.hidden,
            "activation": self.activation,
        }


def _paths(path: str | Path) -> tuple[Path, Path]:
    p = Path(path)
    if p.suffix == ".json":
        p = p.with_suffix(".safetensors")
    elif p.suffix != ".safetensors":
        p = p.with_name(p.name + ".safetensors")
    return p, p.with_suffix(".json")


def save_filter(module: FilterMLP, path: str | Path, **meta) -> Path:
    """Write ``<path>.safetensors`` and ``<path>.json`` (config plus ``meta``, e.g. training statistics)."""
    weights, config = _paths(path)
    weights.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().float().contiguous().cpu() for k, v in module.state_dict().items()}, str(weights))
    config.write_text(json.dumps(module.config() | meta, indent=2) + "\n")
    return weights


def filter_config(path: str | Path) -> dict:
    weights, config = _paths(path)
    if not weights.is_file():
        raise ValueError(
            f"learned filter not found: {weights} does not exist (a filter is {weights.name} + {config.name})"
        )
    if not config.is_file():
        raise ValueError(
            f"learned filter {weights} has no config {config} next to it (save_filter / recipes/learn2pd write both)"
        )
    cfg = read_json_object(config, f"{FORMAT} config")
    if cfg.get("format") != FORMAT or not isinstance(cfg.get("block_length"), int):
        raise ValueError(f"{config} is not a {FORMAT} config (needs format and block_length)")
    return cfg


def load_filter(path: str | Path, block_length: int | None = None) -> FilterMLP:
    """Load a filter (safetensors only); ``block_length`` given: refuse a filter trained for another one."""
    cfg = filter_config(path)
    if block_length is not None and cfg["block_length"] != block_length:
        raise ValueError(
            f"learned filter {path} was trained for block length {cfg['block_length']}, "
            f"but decoding uses block length {block_length}"
        )
    module = FilterMLP(cfg["block_length"], cfg.get("hidden"), cfg.get("activation", "relu"))
    weights = _paths(path)[0]
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    against = f"the {FORMAT} described by {_paths(path)[1]}"
    check_shapes(safetensors_shapes(weights, f"{FORMAT} weights"), expected, str(weights), against)
    module.load_state_dict(load_file(str(weights)))
    return module.eval()


@dataclass(frozen=True)
class LearnedFilter(LowConfidence):
    filter: str | None = None  # path to <name>.safetensors (with <name>.json next to it)
    accept: float = 0.96
    eotp: bool = False

    name: ClassVar[str] = "learned_filter"
    # the filter reads every block slot's confidence
    traits: ClassVar[SamplerTraits] = SamplerTraits(fixed_budget=True, reads_candidates_only=False)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.accept) and 0.0 <= self.accept < 1.0):
            raise ValueError(f"{self.name}: accept must be in [0, 1), got {self.accept!r}")
        if self.block_add_threshold is not None or self.decoded_token_threshold is not None:
            raise ValueError(
                f"{self.name}: block_add_threshold / decoded_token_threshold (several blocks in flight) do not apply: "
                "the filter decides over one block at a time; they apply to threshold, entropy_threshold and "
                "low_confidence"
            )

    def multi_block(self) -> None:
        return None

    def with_model(self, facts: ModelFacts | None) -> LearnedFilter:
        """``filter="shipped"`` -> the path of the filter in the model's checkpoint directory (checked to exist)."""
        if self.filter != SHIPPED or facts is None:
            return self
        if facts.checkpoint_dir is None:
            raise ValueError(
                f'{self.name}: filter="{SHIPPED}" names the filter shipped beside the model\'s weights, but this model '
                "was not loaded from a checkpoint directory; give filter=PATH"
            )
        path = Path(facts.checkpoint_dir) / SHIPPED_FILE
        if not path.is_file():
            raise ValueError(
                f'{self.name}: filter="{SHIPPED}": {facts.checkpoint_dir} ships no Learn2PD filter ({SHIPPED_FILE}); '
                "train one with recipes/learn2pd and give filter=PATH"
            )
        return dataclasses.replace(self, filter=str(path))

    def check(self, config: DecodeConfig, num_blocks: int) -> None:
        super().check(config, num_blocks)
        if self.filter is not None and self.filter != SHIPPED:  # "shipped" is checked once the model is known
            load_filter(self.filter, config.gen_length // num_blocks)

    def begin_block(self, state: DecodeState) -> None:
        super().begin_block(state)
        key = f"{self.name}/filter"
        if self.filter == SHIPPED:  # only a request checked without its model gets here
            raise ValueError(f'{self.name}: filter="{SHIPPED}" was not resolved against a model (check_request)')
        if self.filter is not None and key not in state.scratch:
            state.scratch[key] = load_filter(self.filter, state.block_length).to(state.device)

    def region(self, state: DecodeState) -> tuple[int, int]:
        # the filter reads the whole block; EoTP reads every remaining slot of the canvas
        # (a block-causal model's rows may end their blocks at different slots: the widest one bounds the region)
        return (state.block_start, state.total_length) if self.eotp else state.region()

    def select(self, state: DecodeState, logits: torch.Tensor, r0: int) -> Selection:
        x0, conf = self.proposals(state, logits)  # [B, R], [B, R] float64
        cand = candidates(state, r0, r0 + logits.shape[1])
        accepted = torch.zeros_like(cand)
        module = state.scratch.get(f"{self.name}/filter")
        if module is not None:  # each row's block as block_length columns (base.block_slots)
            idx, inside = slots = block_slots(state, r0, r0 + logits.shape[1])  # [B, block]
            with torch.no_grad():
                probs = torch.sigmoid(module(block_vectors(conf, slots).float()))  # [B, block]
            hits = torch.zeros(accepted.shape, dtype=torch.long, device=accepted.device)  # clamped columns repeat
            accepted = hits.scatter_add_(1, idx, ((probs > self.accept) & inside).long()) > 0
            accepted &= cand
        sched = state.scratch[self.name]  # LowConfidence's schedule, stored under our name
        k = sched[:, min(state.block_step, sched.shape[1] - 1)]
        commit = accepted | (top_k_per_row(torch.where(cand, conf, float("-inf")), k) & cand)
        cut_at = self.cut(state, x0, conf, accepted, r0) if self.eotp else None
        return Selection(commit=commit, tokens=x0, cut_at=cut_at)

    def cut(self, state, x0, conf, accepted, r0) -> torch.Tensor:
        """[B] absolute cut slot (one after the EOS kept) or -1 (``generate_l2p_eot``)."""
        is_eos = torch.isin(x0, state.eos_ids)  # [B, R]
        by_filter = accepted & is_eos
        first = by_filter.float().argmax(1)  # first accepted EOS
        masked = state.is_masked()[:, r0 : r0 + x0.shape[1]] & ~state.finished[:, None]
        predicted = torch.where(masked & is_eos, conf, -1.0)
        best = predicted.argmax(1)  # most confident masked EOS (first on ties)
        pos = torch.where(by_filter.any(1), first, best)
        hit = by_filter.any(1) | (masked & is_eos).any(1)
        return torch.where(hit, r0 + pos + 1, torch.full_like(pos, -1))
