"""Rows of the next steps built ahead by forked worker processes (``run.row_workers``).

The stream's rows are a function of (seed, step, mix), so prefetching changes only when they are built, never which:
the batches are the same with any number of workers.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

_WORKER_STREAM: Any = None  # the RowStream a row worker builds from (set before the fork)


def _worker_rows(step: int, mix: Any) -> list:
    return _WORKER_STREAM.rows(step, mix)


class RowSource:
    """``rows(step, mix)`` of a RowStream, built ``ahead`` steps in advance by ``workers`` forked processes.

    The stream's rows are a function of (seed, step, mix), so prefetching changes only when they are built: the
    training loop asks for consecutive steps, and a request that is not the prefetched one (a stage change, a resume)
    is built on the spot. ``workers=0`` builds every step in the calling process."""

    def __init__(self, stream: Any, workers: int = 0, ahead: int | None = None) -> None:
        self.stream = stream
        self.ahead = ahead if ahead is not None else 4 * workers
        self.pending: dict[int, tuple[Any, Any]] = {}
        self.pool = None
        if workers > 0:
            if "fork" not in multiprocessing.get_all_start_methods():
                raise ValueError("run.row_workers needs the 'fork' start method (Linux); set it to 0 here")
            global _WORKER_STREAM
            _WORKER_STREAM = stream
            self.pool = multiprocessing.get_context("fork").Pool(workers)

    def rows(self, step: int, mix: Any, upcoming: Any = None) -> list:
        """The rows of ``step``; ``upcoming(s)`` gives the mix of a later step ``s`` (or None past the end)."""
        if self.pool is None:
            return self.stream.rows(step, mix)
        want = self.pending.pop(step, None)
        for s in [s for s in self.pending if s < step]:  # a jump (resume) leaves older prefetches unused
            del self.pending[s]
        if upcoming is not None:
            for s in range(step + 1, step + 1 + self.ahead):
                m = upcoming(s)
                if m is not None and s not in self.pending:
                    self.pending[s] = (m, self.pool.apply_async(_worker_rows, (s, m)))
        if want is not None and want[0] == mix:
            return want[1].get()
        return self.stream.rows(step, mix)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool = None
