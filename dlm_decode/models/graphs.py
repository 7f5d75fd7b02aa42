"""CUDA graphs for a decode's cached steps: one graph per fixed step shape, replayed instead of relaunching.

    out = dlm_decode.generate(model, prompts, sampler="threshold", cache="dual", cuda_graphs=True)

Why: at batch 1 on a GPU a cached step's forward is host-bound. At LLaDA-8B widths in bf16 a 32-token forward takes
~30 ms against ~4.5 ms of weight traffic on an H100, the host thread busy the whole time dispatching ~1,500
operators (``benchmarks/RESULTS.md``; compiling the layer pieces does not change that).
A CUDA graph records the forward's kernels once and replays them with one launch.
Measured there (same file): ``threshold`` + ``dual`` at 94.2 tok/s with graphs against 46.6 eager and 50.3 for the
re-stated Fast-dLLM dual-cache loop, 17.5 ms a forward.

What is graphed: a step's ``denoise`` call (``decode.forward.run_model`` asks ``StepGraphs.takes``) whose shapes
and slot offsets repeat, i.e. the steps inside a block (with ``prefix`` and ``dual``: the same computed slots, region
and key run at every step of the block, writing the call's own K/V store in place; without a cache: the whole canvas
at every step). ``window`` and the ``dkv`` caches compute a set of slots that changes from step to step, so their
steps stay eager. The first call of a shape runs eagerly (a shape met once, such as a block's full refresh, is never
captured); the second runs eagerly on a side stream (the step's real result, and the warm-up the capture needs) and
is captured; later ones copy the step's inputs (canvas, positions, key mask) into the graph's buffers and replay.
Replaying rewrites the computed slots' K/V in the store, as the eager step does.

What it changes in the loop: shapes must not vary from step to step, so the forward's narrowing to the rows and
slots a sampler reads (``decode.forward.subset``) is off while graphs are on (``fixed_shapes``): every row's whole
region gets logits. Samplers that read only their candidates see the same logits at those slots.

Not graphed (eager as before): calls on another store than the call's (the draft copies of draft-and-verify
samplers), forwards that leave the store unwritten (``write=False`` plans) or run a subset of its rows
(``KVAccess``), slot-id (tensor) compute or key sets, ``read`` subsets, and anything under autograd. On a CPU
there is nothing to capture (a ``RuntimeWarning`` says so): the same fixed-shape path runs, with the step's
inputs copied into the buffers and the recorded function called again (how the tests check the plumbing);
``captured`` and ``replayed`` count the same events.

If a capture fails (an operator that cannot be recorded), one ``RuntimeWarning`` says why, the step runs eagerly and
so does the rest of the call (``GenerateOutput.graphs["error"]``).

Graphs live for one ``generate`` call (they hold the store's addresses); each has its own memory pool, ~the
activations of one step's forward plus its logits.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from dlm_decode.cache.store import KVAccess, KVStore
from dlm_decode.models.common import Index


@dataclass
class _Entry:
    uses: int = 0
    canvas: torch.Tensor | None = None  # [B, T] input buffers the graph reads
    positions: torch.Tensor | None = None
    key_mask: torch.Tensor | None = None
    out: torch.Tensor | None = None  # [B, R, V] the graph's output buffer (CUDA)
    replay: Callable[[], torch.Tensor] | None = None


@dataclass
class StepGraphs:
    """The graphs of one ``generate`` call over ``store`` (see the module docstring)."""

    store: Any  # the call's KVStore (None without a cache)
    eager: int = 0  # calls of a fixed shape run eagerly (first use)
    captured: int = 0  # graphs recorded (each at its shape's second use)
    replayed: int = 0  # calls served by a replay
    error: str | None = None  # why a capture failed (then the rest of the call runs eagerly)
    _entries: dict[tuple, _Entry] = field(default_factory=dict)

    def takes(
        self,
        canvas: torch.Tensor,
        compute: Index,
        store: KVAccess | KVStore | None,
        key_index: torch.Tensor | slice | None,
        read: torch.Tensor | None,
    ) -> bool:
        """Whether this ``denoise`` call (``store``: what it does with the K/V store, as ``denoise`` takes it) has a
        fixed shape that a graph can serve."""
        kv = KVAccess(store) if isinstance(store, KVStore) else store
        if self.error is not None or (kv.store if kv is not None else None) is not self.store:
            return False
        if kv is not None and (not kv.write or kv.rows is not None):  # a frozen store, or a subset of its rows
            return False
        return (
            isinstance(compute, slice)
            and (key_index is None or isinstance(key_index, slice))
            and read is None
            and not torch.is_grad_enabled()
        )

    def run(
        self,
        denoise: Callable[..., torch.Tensor],  # the model's ``denoise``
        canvas: torch.Tensor,  # [B, T]
        positions: torch.Tensor,  # [B, T]
        *,
        compute: slice,
        region: tuple[int, int],
        key_mask: torch.Tensor | None,  # [B, T]
        key_index: slice | None,
        block_length: int | None = None,  # block-causal models: the mask's block
    ) -> torch.Tensor:  # [B, R, V]
        t = canvas.shape[1]
        key = (
            tuple(canvas.shape),
            compute.indices(t),
            tuple(region),
            None if key_index is None else key_index.indices(t),
            None if key_mask is None else tuple(key_mask.shape),
            block_length,
        )
        e = self._entries.setdefault(key, _Entry())
        e.uses += 1
        kwargs = dict(compute=compute, region=region, store=self.store, key_index=key_index)
        if block_length is not None:
            kwargs["block_length"] = block_length
        if e.uses == 1:
            self.eager += 1
            return denoise(canvas, positions, key_mask=key_mask, **kwargs)
        if e.replay is None:
            e.canvas, e.positions = canvas.clone(), positions.clone()
            e.key_mask = None if key_mask is None else key_mask.clone()

            def forward() -> torch.Tensor:
                return denoise(e.canvas, e.positions, key_mask=e.key_mask, **kwargs)

            if not _can_capture(canvas):
                e.replay = forward
                logits = forward()
            else:
                try:
                    logits = self._capture(e, forward)
                except RuntimeError as exc:  # e.g. an operator that cannot be captured: eager from here on
                    self.error = f"{type(exc).__name__}: {exc}"
                    warnings.warn(f"CUDA graph capture failed, decoding eagerly: {self.error}", RuntimeWarning, 2)
                    self._entries.clear()
                    return denoise(canvas, positions, key_mask=key_mask, **kwargs)
            self.captured += 1
            return logits
        e.canvas.copy_(canvas)
        e.positions.copy_(positions)
        if e.key_mask is not None:
            e.key_mask.copy_(key_mask)
        self.replayed += 1
        return e.replay()

    @staticmethod
    def _capture(e: _Entry, forward: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Run ``forward`` once on a side stream (this step's logits; the warm-up), then record it."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            logits = forward()
        torch.cuda.current_stream().wait_stream(side)
        logits.record_stream(torch.cuda.current_stream())  # used (and freed) on the main stream
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # records, runs nothing: the store is not written twice
            e.out = forward()

        def replay() -> torch.Tensor:
            graph.replay()
            return e.out.clone()  # the next replay overwrites the buffer

        e.replay = replay
        return logits

    def counts(self) -> dict[str, Any]:
        return {"eager": self.eager, "captured": self.captured, "replayed": self.replayed, "error": self.error}


def _can_capture(canvas: torch.Tensor) -> bool:
    """Whether a graph can be recorded for tensors like ``canvas`` (CUDA); elsewhere the buffers are replayed
    by calling the forward again."""
    return canvas.is_cuda


def active_graphs(model: Any) -> StepGraphs | None:
    """The step graphs of the ``generate`` call ``model`` is decoding in (``using_graphs``), else None."""
    return getattr(model, "step_graphs", None)


def fixed_shapes(model: Any) -> bool:
    """True while ``model`` decodes with step graphs: the loop then leaves every step's shape whole."""
    return active_graphs(model) is not None


@contextlib.contextmanager
def using_graphs(model: Any, store: Any, enabled: bool) -> Iterator[StepGraphs | None]:
    """Step graphs on ``model`` for one call over ``store`` (None and no change when not ``enabled``)."""
    if not enabled:
        yield None
        return
    device = next(model.parameters()).device
    if device.type != "cuda":
        warnings.warn(
            f"cuda_graphs=True on a {device.type} model: nothing is captured there; the steps run eagerly at fixed "
            "shapes (no narrowing to the read slots), which only costs time off a GPU",
            RuntimeWarning,
            3,
        )
    graphs = StepGraphs(store)
    model.step_graphs = graphs
    try:
        yield graphs
    finally:
        model.step_graphs = None
