"""Allocated device bytes over the session, with the cells and events (an out-of-memory error) marked: what the
memory timeline plots.

The session adds two exact samples per cell (before and after, read at the cell's one
synchronize) and its sampler (``trace/sampler.py``) adds samples while a cell runs. It is bounded without dropping the
session's start: when full, neighbouring samples merge, keeping the larger, so peaks survive.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class CellSpan:
    cell: int | None
    start_s: float  # seconds since the timeline began
    end_s: float


@dataclass(frozen=True)
class Mark:
    """A moment worth a marker on the timeline: ``kind`` (``"oom"``) at ``t_s``, described by ``label``."""

    kind: str
    t_s: float
    label: str


class Timeline:
    def __init__(self, max_samples: int = 4096, max_cells: int = 1024) -> None:
        self.t0 = time.perf_counter()
        self.max_samples = max_samples
        self.max_cells = max_cells
        self._lock = threading.Lock()
        self._samples: list[tuple[float, int]] = []
        self._cells: list[CellSpan] = []
        self._marks: list[Mark] = []

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def sample(self, nbytes: int, at_s: float | None = None) -> None:
        """Add a sample; safe from any thread."""
        t = self.now() if at_s is None else at_s
        with self._lock:
            self._samples.append((t, int(nbytes)))
            if len(self._samples) > self.max_samples:
                s = self._samples
                merged = [max(s[i], s[i + 1], key=lambda p: p[1]) for i in range(0, len(s) - 1, 2)]
                self._samples = merged + ([s[-1]] if len(s) % 2 else [])

    def mark_cell(self, cell: int | None, start_s: float, end_s: float) -> None:
        with self._lock:
            self._cells.append(CellSpan(cell, start_s, end_s))
            del self._cells[:-self.max_cells]

    def mark(self, kind: str, t: float, label: str) -> None:
        """Mark a moment (the session marks a cell that ended out of memory); safe from any thread."""
        with self._lock:
            self._marks.append(Mark(kind, t, label))
            del self._marks[:-self.max_cells]

    def marks(self) -> list[Mark]:
        with self._lock:
            return list(self._marks)

    def points(self, limit: int = 600) -> list[tuple[float, int]]:
        """At most ``limit`` samples in time order, each bucket keeping its largest value."""
        with self._lock:
            s = sorted(self._samples)
        if len(s) <= limit:
            return s
        step = len(s) / limit
        return [max(s[int(i * step):int((i + 1) * step)] or [s[-1]], key=lambda p: p[1]) for i in range(limit)]

    def cells(self) -> list[CellSpan]:
        with self._lock:
            return list(self._cells)

    def clear(self) -> None:
        with self._lock:
            self._samples.clear()
            self._cells.clear()
            self._marks.clear()
