"""Preallocated K/V storage for one generate call: one buffer per model and batch, written in place.

Storage is separate from policy: a cache policy (``dlm_decode.cache``) decides which slots the model recomputes
in a step; the model writes the fresh K/V of exactly those slots here and attends over the whole store. Nothing
grows per step: ``nbytes`` is fixed at construction and reported in the decoding statistics.

``batch_rows`` (set by the loop for one forward, like ``frozen``) lets a forward run only some of the batch's rows:
its ``n`` rows are the store's rows ``batch_rows`` [n]. Writes land in those rows; reads return the whole batch, not
a copy of the rows, so the attention runs over the store's batch: ``spread`` puts the forward's queries (and key
masks) at their rows, ``own_rows`` takes the forward's rows of the result. The other rows' queries are zeros, a
little attention spent to save copying every layer's keys.
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
        """Store k, v [B, Hk, Q, hd] (the forward's rows) at ``slots`` (a slice, or [B, Q] slot ids)."""
        if slots is None:
            slots = slice(0, k.shape[2])
        if self.frozen:
            self._fresh[layer] = (k, v, slots)
            return
        _put(self.k[layer], self.batch_rows, slots, k)
        _put(self.v[layer], self.batch_rows, slots, v)

    def keys(self, layer: int) -> torch.Tensor:  # [B of the store, Hk, T, hd]
        return self._read(self.k, layer, 0)

    def values(self, layer: int) -> torch.Tensor:
        return self._read(self.v, layer, 1)

    def _read(self, buf: torch.Tensor, layer: int, which: int) -> torch.Tensor:
        if not self.frozen or layer not in self._fresh:
            return buf[layer]
        fresh = self._fresh[layer]
        out = buf[layer].clone()
        _put(out, self.batch_rows, fresh[2], fresh[which])
        return out

    def spread(self, x: torch.Tensor | None, fill: bool | float = 0) -> torch.Tensor | None:
        """The forward's [n, ...] tensor at its rows of the store's batch, ``fill`` elsewhere (as is without
        ``batch_rows``)."""
        if x is None or self.batch_rows is None:
            return x
        out = x.new_full((self.k.shape[1], *x.shape[1:]), fill)
        return out.index_copy_(0, self.batch_rows, x)

    def own_rows(self, x: torch.Tensor) -> torch.Tensor:
        """The forward's rows of a [B of the store, ...] tensor (as is without ``batch_rows``)."""
        return x if self.batch_rows is None else x.index_select(0, self.batch_rows)

    def end_step(self) -> None:
        self._fresh.clear()


def _put(buf: torch.Tensor, rows: torch.Tensor | None, slots: slice | torch.Tensor, x: torch.Tensor) -> None:
    """Write x [N, Hk, Q, hd] into buf [B, Hk, T, hd] at ``slots`` (a slice or [N, Q] ids) of rows ``rows`` [N]
    (None: rows 0..N-1 = all of them)."""
    if rows is None:
        if isinstance(slots, slice):
            buf[:, :, slots] = x
        else:
            buf.scatter_(2, slots[:, None, :, None].expand_as(x), x)
    elif isinstance(slots, slice):
        buf[rows, :, slots] = x
    else:  # row, head and slot ids broadcast to [N, Hk, Q]
        heads = torch.arange(x.shape[1], device=x.device)[None, :, None]
        buf[rows[:, None, None], heads, slots[:, None]] = x
