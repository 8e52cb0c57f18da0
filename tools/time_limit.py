"""A deadline on Python code run on the main thread (SIGALRM), for the sweeps that run one foreign test or sample
after another (``tests/opinfo_sweep.py`` and the sweeps built on it, ``bench/upstream_agreement.py``): the one that
hangs is cut off and named, and the sweep goes on."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def time_limit(seconds: float, error: type[Exception], what: str) -> Iterator[None]:
    """Raise ``error("<what> ran past <seconds> s")`` in Python code still running after ``seconds`` (C calls finish
    first); off the main thread, where no signal is delivered, the block runs without one."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise error(f"{what} ran past {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
