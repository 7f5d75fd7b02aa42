"""One K/V store shared by the engine's requests (``Arena``): a row per request, handed out and taken back.

A request decoded by the engine keeps its keys and values in a row of one ``KVStore`` of ``rows`` rows and
``length`` slots, so that requests can share a forward (``decode.merged``: the forward's attention runs over the
arena's rows at once). A request's own store is a view of its row (``row_store``): the cache policies write into it
as into a store of their own, with the request's canvas length. A leaving request's row is free for the next one
at once; the next occupant's slots are zeroed when it takes the row, so its view starts as a fresh store would, and
its key mask hides the slots past its canvas in a shared forward.

The arena grows (``grow``: a new store, the rows copied, every view handed out re-pointed) when a request needs more
slots than it has; it never shrinks. ``nbytes`` is what it holds now.
"""

from __future__ import annotations

import torch

from dlm_decode.cache.store import KVStore


class Arena:
    """A ``KVStore`` of ``rows`` request rows, each lent whole to one request at a time."""

    def __init__(
        self, n_layers: int, rows: int, n_kv_heads: int, head_dim: int, *, dtype: torch.dtype, device: torch.device
    ) -> None:
        if rows < 1:
            raise ValueError(f"an arena needs at least one row, got {rows}")
        self.shape = (n_layers, n_kv_heads, head_dim)
        self.dtype, self.device = dtype, device
        self.store = KVStore(n_layers, rows, n_kv_heads, 0, head_dim, dtype=dtype, device=device)
        self.free = list(range(rows))
        self.lent: dict[int, tuple[KVStore, int]] = {}  # row -> (its view, its length)

    @property
    def rows(self) -> int:
        return self.store.batch

    @property
    def length(self) -> int:
        return self.store.k.shape[3]

    @property
    def nbytes(self) -> int:
        return self.store.nbytes

    def bytes_for(self, length: int) -> int:
        """The arena's size once it holds ``length`` slots per row."""
        n_layers, n_kv, hd = self.shape
        return 2 * n_layers * self.rows * n_kv * max(length, self.length) * hd * self.store.k.element_size()

    def take(self, length: int) -> tuple[int, KVStore]:
        """A free row and its view as a store of ``length`` slots (the arena grows first when it is shorter)."""
        if not self.free:
            raise RuntimeError("no free row in the K/V arena")
        if length > self.length:
            self.grow(length)
        row = self.free.pop(0)
        view = KVStore.__new__(KVStore)
        view.k, view.v = self._views(row, length)
        view.k.zero_()
        view.v.zero_()  # as a fresh store: a policy may read a slot before its first write
        self.lent[row] = (view, length)
        return row, view

    def give_back(self, row: int) -> None:
        """Return a row: free for the next request."""
        if self.lent.pop(row, None) is not None:
            self.free.append(row)
            self.free.sort()

    def window(self, lo: int, hi: int, length: int) -> KVStore:
        """Rows ``[lo, hi)`` and slots ``[0, length)`` as one store (a view: writes land in the arena)."""
        out = KVStore.__new__(KVStore)
        out.k, out.v = self.store.k[:, lo:hi, :, :length], self.store.v[:, lo:hi, :, :length]
        return out

    def grow(self, length: int) -> None:
        """Room for ``length`` slots per row: a new store with the old slots copied; the lent views re-pointed."""
        n_layers, n_kv, hd = self.shape
        new = KVStore(n_layers, self.rows, n_kv, length, hd, dtype=self.dtype, device=self.device)
        old = self.length
        new.k[:, :, :, :old] = self.store.k
        new.v[:, :, :, :old] = self.store.v
        self.store = new
        for row, (view, n) in self.lent.items():
            view.k, view.v = self._views(row, n)

    def _views(self, row: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.store.k[:, row : row + 1, :, :length], self.store.v[:, row : row + 1, :, :length]
