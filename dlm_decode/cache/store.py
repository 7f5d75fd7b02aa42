"""Preallocated K/V storage for one generate call: one buffer per model and batch, written in place.

Storage is separate from policy: a cache policy (``dlm_decode.cache``) decides which slots the model recomputes
in a step; the model writes the fresh K/V of exactly those slots here and attends over the whole store. Nothing
grows per step: ``nbytes`` is fixed at construction and reported in the decoding statistics.

``batch_rows`` (set by the loop for one forward, like ``frozen``) lets a forward run only some of the batch's rows:
its ``n`` rows are the store's rows ``batch_rows`` [n]; writes land there and reads gather them.
"""

from __future__ import annotations

import torch


class KVStore:
    """K and V of every layer for a [B, T] canvas: two [L, B, Hk, T, hd] tensors."""

    def __init__(
        self,
        n_layers: int,
        batch: int,
        n_kv_heads: int,
        length: int,
        head_dim: int,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        shape = (n_layers, batch, n_kv_heads, length, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.frozen = False  # when True, writes are dropped (the step attends to fresh K/V but keeps the cache)
        self.batch_rows: torch.Tensor | None = None  # [n] the store rows of a forward's n rows (None: all, in order)
        self._fresh: dict[int, tuple[torch.Tensor, torch.Tensor, slice | torch.Tensor]] = {}

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    def take_rows(self, rows: torch.Tensor) -> KVStore:
        """A new store holding copies of rows ``rows`` [N] of this one (draft-and-verify runs several canvases of a
        row side by side, each against the row's cache); writes to it never reach this store."""
        out = KVStore.__new__(KVStore)
        out.k, out.v = self.k[:, rows], self.v[:, rows]  # [L, N, Hk, T, hd] copies
        out.frozen = False
        out.batch_rows = None
        out._fresh = {}
        return out

    def write(self, layer: int, slots: slice | torch.Tensor | None, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v [B, Hk, Q, hd] at ``slots`` (a slice, or [B, Q] slot ids)."""
        if slots is None:
            slots = slice(0, k.shape[2])
        if self.frozen:
            self._fresh[layer] = (k, v, slots)
            return
        rows = self.batch_rows
        if rows is not None:  # [n, Hk, Q, hd] into rows ``rows`` of the [B, Hk, T, hd] layer buffers
            if isinstance(slots, slice):
                at = (rows, slice(None), slots)
            else:  # row, head and slot ids broadcast to [n, Hk, Q]
                at = (rows[:, None, None], torch.arange(k.shape[1], device=k.device)[None, :, None], slots[:, None])
            self.k[layer][at] = k
            self.v[layer][at] = v
        elif isinstance(slots, slice):
            self.k[layer, :, :, slots] = k
            self.v[layer, :, :, slots] = v
        else:
            idx = slots[:, None, :, None].expand_as(k)
            self.k[layer].scatter_(2, idx, k)
            self.v[layer].scatter_(2, idx, v)

    def keys(self, layer: int) -> torch.Tensor:
        return self._read(self.k, layer, 0)

    def values(self, layer: int) -> torch.Tensor:
        return self._read(self.v, layer, 1)

    def _read(self, buf: torch.Tensor, layer: int, which: int) -> torch.Tensor:
        rows = self.batch_rows
        held = buf[layer] if rows is None else buf[layer].index_select(0, rows)  # [B or n, Hk, T, hd]
        if not self.frozen or layer not in self._fresh:
            return held
        fresh = self._fresh[layer]
        out, slots = (held.clone() if rows is None else held), fresh[2]
        if isinstance(slots, slice):
            out[:, :, slots] = fresh[which]
        else:
            out.scatter_(2, slots[:, None, :, None].expand_as(fresh[which]), fresh[which])
        return out

    def end_step(self) -> None:
        self._fresh.clear()
