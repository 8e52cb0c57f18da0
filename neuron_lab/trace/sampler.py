"""Samples of the device's allocated bytes while a cell runs, views open or not: what draws a cell's climb on the
memory timeline instead of a flat line from its start to its end.

One daemon thread for the session, idle between cells. A sample is two counter reads (``memory_sample``: no
synchronize, safe from any thread) and a list append. Between two samples the allocator's peak counter tells
whether a new high came and went; it is added between them, so a peak shorter than the interval still shows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from neuron_lab.trace.timeline import Timeline

Read = Callable[[], tuple[int, int]]  # (allocated, peak) bytes, now


class MemorySampler:
    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline
        self.error: BaseException | None = None  # the thread's last failure (a thread must not print)
        self._wake = threading.Condition()
        self._read: Read | None = None  # set while a cell runs
        self._interval_s = 0.0
        self._generation = 0  # which cell the thread is sampling: a stale read is dropped
        self._thread: threading.Thread | None = None
        self._closed = False

    def start(self, read: Read, interval_s: float) -> None:
        """Sample every ``interval_s`` until :meth:`stop` (0: not at all)."""
        if interval_s <= 0:
            return
        with self._wake:
            self._read, self._interval_s = read, interval_s
            self._generation += 1
            self._wake.notify()
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="neuron_lab-memory", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._read = None
            self._generation += 1

    def close(self) -> None:
        with self._wake:
            self._closed, self._read = True, None
            self._wake.notify()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5)
        self._thread = None

    def _run(self) -> None:
        last: tuple[float, int] | None = None  # (time, peak) of the cell's previous sample
        generation = -1
        while True:
            with self._wake:
                while self._read is None and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                read, interval, gen = self._read, self._interval_s, self._generation
            if gen != generation:
                generation, last = gen, None
            try:
                allocated, peak = read()
            except Exception as e:  # noqa: BLE001  (kept for inspection; the cell's own samples still come)
                self.error = e
                self.stop()
                continue
            t = self.timeline.now()
            with self._wake:
                if gen != self._generation:  # the cell ended while we read: its end sample is the exact one
                    continue
            if last is not None and peak > last[1]:  # a high between the two reads
                self.timeline.sample(peak, (last[0] + t) / 2)
            last = (t, peak if last is None else max(peak, last[1]))
            self.timeline.sample(allocated, t)
            with self._wake:
                if self._generation == gen and not self._closed:
                    self._wake.wait(interval)
