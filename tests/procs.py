"""Child processes a test talks to: every read has a deadline, and signals reach the child whoever started the suite.

A background job (``make test &``, CI's runner) starts with SIGINT ignored, and a child inherits that: a test that
interrupts a child sets the child's SIGINT back to its default itself (:func:`default_sigint`), so the suite behaves
the same from a terminal, a background job or CI. A plain ``readline()`` waits forever when the child stops
printing; :class:`Lines` reads on a thread and fails saying what it waited for.
"""

from __future__ import annotations

import queue
import signal
import threading
import time
from typing import IO


def default_sigint() -> None:
    """``preexec_fn`` for a child the test interrupts: SIGINT at its default (Python then raises KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Lines:
    """The lines of a child's stream, read on a thread so that each :meth:`next` has a deadline."""

    def __init__(self, stream: IO[str]) -> None:
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._ended = False
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put(None)

    def next(self, timeout: float, what: str) -> str:
        """The next line ('' at the end of the stream); fails after ``timeout`` s naming ``what`` it waited for."""
        if self._ended:
            return ""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line from the child within {timeout:g} s: waited for {what}") from None
        if line is None:
            self._ended = True
            return ""
        return line

    def rest(self, timeout: float, what: str) -> str:
        """Everything up to the end of the stream, within ``timeout`` s in all."""
        deadline, out = time.monotonic() + timeout, []
        while line := self.next(max(deadline - time.monotonic(), 0.001), what):
            out.append(line)
        return "".join(out)
