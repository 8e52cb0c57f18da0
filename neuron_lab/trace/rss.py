"""The process's resident memory, read twice a tracked window: on Linux through one ``/proc/self/statm``
descriptor kept open (psutil opens the file at every read, which cost more than the rest of opening and closing
a cell's window); elsewhere through psutil.
"""

from __future__ import annotations

import os

import psutil

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_statm: tuple[int, int] | None = None  # (the pid that opened it, the descriptor): a forked child opens its own


def rss() -> int:
    """Resident bytes of this process now."""
    global _statm
    pid = os.getpid()
    if _statm is None or _statm[0] != pid:
        try:
            _statm = (pid, os.open("/proc/self/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))
        except OSError:  # no procfs (macOS)
            return psutil.Process().memory_info().rss
    return int(os.pread(_statm[1], 64, 0).split()[1]) * _PAGE
