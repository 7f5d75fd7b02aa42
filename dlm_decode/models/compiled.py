"""Optional ``torch.compile`` of the decoding forward's per-layer pieces, with the eager path as the fallback.

    out = dlm_decode.generate(model, prompts, sampler="threshold", cache="dual", compile=True)   # one call
    set_compile(model, True)         # every later forward of ``model`` (ParallelBench, lm-eval, ...)

What is compiled: ``common.layer_input`` (attention norm, q/k/v projections, RoPE) and ``common.layer_output``
(output projection, residual, MLP norm, gated MLP, residual): the elementwise work around a layer's matmuls, which
eager PyTorch runs as some thirty small kernels per layer (pow, mean, rsqrt, mul, cat, neg, silu, add, copies) and
inductor fuses into four or five; the matmuls stay library calls. Each piece is one graph (``fullgraph=True``, no
graph break) shared by every layer of a model, whose weights are graph inputs rather than constants, and
``dynamic=True``, so the sizes that change from step to step (slots computed, slots read, rows taking part) do not
recompile. What does recompile: PyTorch's size-0/1 specialisations (one row, one slot read), whether a forward
wants every row's output or some (the last layer), and the model class; a decode meets a handful of graphs, compiled
on first use (seconds each on a CPU) and reused for the rest of the process. ``generate`` lifts dynamo's recompile
limit to ``RECOMPILE_LIMIT`` for its call so that no variant falls back to eager silently, and turns duck sizing off
(two sizes that happen to be equal, say 32 slots read and a head dimension of 32, would share a symbol).

Not compiled: the attention and the K/V store (``common.attend``: the store is written in place, and on CUDA the
attention is the Triton kernel), the embedding, the RoPE tables, the final norm and the LM head, and the decode loop.

Fallback: if compiling fails (no C++ compiler, an unsupported op, a dynamo error), the piece runs eagerly, one
``RuntimeWarning`` says why, and that model decodes eagerly from then on (``CompiledLayers.error``). The pieces have no
side effects, so the failed call is simply run again eagerly; tokens are those of the eager path. With gradients
enabled (training) the eager pieces always run.

Numerics: inductor's fused kernels compute the same fp32 formulas but may round a reduction (RMSNorm's mean) in a
different order, a last-bit difference in the logits; the tests decode the same tokens and NFE compiled and eager
(``tests/test_compile.py``), but identity is not guaranteed for every model and prompt the way it is between eager
runs.

When it pays (docs/caches.md, "Compiled forward"): on one CPU thread at demo size the fused elementwise ops are a small
share of a forward that the matmuls dominate. CUDA-graph modes (``reduce-overhead``, ``max-autotune``) are refused:
every new step size would record a new graph, and the store is written between the pieces.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from dlm_decode.models.common import EAGER, EagerLayers, Index, Layer, layer_input, layer_output

MODES = ("default", "max-autotune-no-cudagraphs")  # torch.compile modes without CUDA graphs
RECOMPILE_LIMIT = 64  # dynamo's per-function limit while ``generate`` runs compiled (its default is 8)


def resolve_mode(compile: bool | str | None) -> str | None:
    """``compile`` -> a ``torch.compile`` mode, or None for eager (None / False). True is ``"default"``."""
    if compile is None or compile is False:
        return None
    if compile is True:
        return "default"
    if isinstance(compile, str) and compile in MODES:
        return compile
    raise ValueError(
        f"compile must be True, False or one of {', '.join(MODES)}, got {compile!r} (CUDA-graph modes are not "
        "supported: each step size would record a new graph)"
    )


@functools.cache
def _compiled(mode: str, backend: str) -> tuple[Any, Any]:
    kw: dict[str, Any] = {"dynamic": True, "fullgraph": True, "backend": backend}
    if mode != "default":
        kw["mode"] = mode
    return torch.compile(layer_input, **kw), torch.compile(layer_output, **kw)


def _as_ids(rows: Index | None, h: torch.Tensor) -> torch.Tensor | None:
    """A slice of rows as [B, N] ids (a gather of the same values), so that its bounds are no recompile guard; laid
    out as the ids samplers pass (contiguous), so that strides are none either."""
    if not isinstance(rows, slice):
        return rows
    return torch.arange(*rows.indices(h.shape[1]), device=h.device).repeat(h.shape[0], 1)


class CompiledLayers(EagerLayers):
    """``common.layer_input`` / ``layer_output`` through ``torch.compile``, eager after a failure (``error``)."""

    def __init__(self, mode: str = "default", backend: str = "inductor") -> None:
        self.mode, self.backend = mode, backend
        self.error: str | None = None  # why compiling failed; the pieces run eagerly from then on

    def input(self, block: Layer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rows: Index | None):
        if self.error is None and not torch.is_grad_enabled():
            try:
                return _compiled(self.mode, self.backend)[0](block, h, cos, sin, _as_ids(rows, h))
            except Exception as e:  # any failure to compile: the eager piece
                self._fail(e)
        return layer_input(block, h, cos, sin, rows)

    def output(self, block: Layer, attn: torch.Tensor, h: torch.Tensor, rows: Index | None) -> torch.Tensor:
        if self.error is None and not torch.is_grad_enabled():
            try:
                if attn._base is not None:  # a view only when the heads' transpose needed no copy (one slot)
                    attn = attn.clone()  # else the view's base would be one more recompile guard
                return _compiled(self.mode, self.backend)[1](block, attn, h, _as_ids(rows, h))
            except Exception as e:
                self._fail(e)
        return layer_output(block, attn, h, rows)

    def _fail(self, e: Exception) -> None:
        first = (str(e).strip().splitlines() or [""])[0][:300]
        self.error = f"{type(e).__name__}: {first}"
        warnings.warn(
            f"dlm_decode: torch.compile of the decoding forward failed ({self.error}); decoding eagerly instead "
            "(same tokens, no speed-up)",
            RuntimeWarning,
            stacklevel=4,
        )


def compiled_layers(model: Any, compile: bool | str | None) -> EagerLayers:
    """The pieces for ``model`` under ``compile`` (``resolve_mode``): ``common.EAGER``, or the model's own
    ``CompiledLayers`` for that mode (kept on the model, so a failure is reported once and not retried)."""
    mode = resolve_mode(compile)
    if mode is None:
        return EAGER
    if not hasattr(model, "layer_pieces"):
        raise ValueError(f"compile: {type(model).__name__} is not a dlm_decode model (LLaDA or Dream)")
    kept = model.__dict__.setdefault("_compiled_layers", {})
    if mode not in kept:
        kept[mode] = CompiledLayers(mode)
    return kept[mode]


def set_compile(model: Any, compile: bool | str | None) -> EagerLayers:
    """Make every later forward of ``model`` run its layer pieces compiled (True or a mode) or eagerly (False /
    None); returns the pieces. ``generate(compile=...)`` overrides it for one call."""
    pieces = compiled_layers(model, compile)
    if compile is None or compile is False:
        if "layer_pieces" in model.__dict__:
            del model.layer_pieces  # back to the class default, ``common.EAGER``
        return EAGER
    model.layer_pieces = pieces
    return pieces


@contextlib.contextmanager
def using(model: Any, compile: bool | str | None) -> Iterator[EagerLayers]:
    """Run ``model`` with the pieces ``compile`` asks for (None: the model's own setting) until the block ends; while
    they are compiled, dynamo may keep up to ``RECOMPILE_LIMIT`` graphs per piece."""
    own = getattr(model, "layer_pieces", EAGER)
    pieces = own if compile is None else compiled_layers(model, compile)
    with contextlib.ExitStack() as stack:
        if isinstance(pieces, CompiledLayers):
            import torch._dynamo
            import torch.fx.experimental._config as fx_config

            limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
            stack.enter_context(torch._dynamo.config.patch(recompile_limit=limit))
            stack.enter_context(fx_config.patch(use_duck_shape=False))  # no recompile when two sizes coincide
        if pieces is own:
            yield pieces
            return
        kept = model.__dict__.get("layer_pieces")
        model.layer_pieces = pieces
        try:
            yield pieces
        finally:
            if kept is None:
                model.__dict__.pop("layer_pieces", None)
            else:
                model.layer_pieces = kept
