"""Preallocated K/V storage for one generate call (``KVStore``), and how one forward uses it (``KVAccess``).

Storage is separate from policy: a cache policy (``dlm_decode.cache``) decides which slots the model recomputes
in a step; the model writes the fresh K/V of exactly those slots here and attends over the whole store. Nothing
grows per step: ``nbytes`` is fixed at construction and reported in the decoding statistics. The store keeps no
per-call state: what a forward does with it travels in a ``KVAccess`` the step builds and hands to ``denoise``.

``KVAccess.rows`` lets a forward run only some of the batch's rows: its ``n`` rows are the store's rows ``rows``
[n]. Writes land in those rows; reads return the whole batch, not a copy of the rows, so the attention runs over
the store's batch: ``spread`` puts the forward's queries (and key masks) at their rows, ``own_rows`` takes the
forward's rows of the result. The other rows' queries are zeros, a little attention spent to save copying every
layer's keys. ``KVAccess.write`` False (a plan with ``write=False``): the forward attends to its fresh K/V laid over
a copy of the stored ones, and the store is left as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Slots = slice | torch.Tensor  # a run of slots shared by all rows, or [N, Q] slot ids


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

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    def take_rows(self, rows: torch.Tensor) -> KVStore:
        """A new store holding copies of rows ``rows`` [N] of this one (draft-and-verify runs several canvases of a
        row side by side, each against the row's cache); writes to it never reach this store."""
        out = KVStore.__new__(KVStore)
        out.k, out.v = self.k[:, rows], self.v[:, rows]  # [L, N, Hk, T, hd] copies
        return out

    def write(
        self, layer: int, slots: Slots | None, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor | None = None
    ) -> None:
        """Store k, v [N, Hk, Q, hd] at ``slots`` (None: the first Q) of the store's rows ``rows`` [N] (None: all)."""
        slots = slice(0, k.shape[2]) if slots is None else slots
        _put(self.k[layer], rows, slots, k)
        _put(self.v[layer], rows, slots, v)

    def keys(self, layer: int) -> torch.Tensor:  # [B of the store, Hk, T, hd]
        return self.k[layer]

    def values(self, layer: int) -> torch.Tensor:  # [B of the store, Hk, T, hd]
        return self.v[layer]

    def laid_over(
        self, layer: int, slots: Slots | None, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the layer's stored K and V with k, v written as ``write`` would; the store is unchanged."""
        slots = slice(0, k.shape[2]) if slots is None else slots
        keys, values = self.k[layer].clone(), self.v[layer].clone()
        _put(keys, rows, slots, k)
        _put(values, rows, slots, v)
        return keys, values


@dataclass(frozen=True)
class KVAccess:
    """How one forward uses a ``KVStore``: built per forward by the step (``decode.forward.run_model``) and passed
    down to the model's attention; a bare ``KVStore`` handed to ``denoise`` means ``KVAccess(store)``."""

    store: KVStore
    rows: torch.Tensor | None = None  # [n] the store rows of the forward's n rows (None: all, in order)
    write: bool = True  # False: attend to the fresh K/V of the computed slots without storing them

    def update(
        self, layer: int, slots: Slots | None, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Hand the layer's fresh k, v [n, Hk, Q, hd] at ``slots`` to the store; the keys and values to attend
        over, [B of the store, Hk, T, hd] (stored, or with ``write`` False a copy with the fresh ones laid over)."""
        if not self.write:
            return self.store.laid_over(layer, slots, k, v, self.rows)
        self.store.write(layer, slots, k, v, self.rows)
        return self.store.keys(layer), self.store.values(layer)

    def spread(self, x: torch.Tensor | None, fill: bool | float = 0) -> torch.Tensor | None:
        """The forward's [n, ...] tensor at its rows of the store's batch, ``fill`` elsewhere (as is without
        ``rows``)."""
        if x is None or self.rows is None:
            return x
        out = x.new_full((self.store.batch, *x.shape[1:]), fill)
        return out.index_copy_(0, self.rows, x)

    def own_rows(self, x: torch.Tensor) -> torch.Tensor:
        """The forward's rows of a [B of the store, ...] tensor (as is without ``rows``)."""
        return x if self.rows is None else x.index_select(0, self.rows)


def _put(buf: torch.Tensor, rows: torch.Tensor | None, slots: Slots, x: torch.Tensor) -> None:
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
