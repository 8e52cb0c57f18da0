"""Who hears of the emulated device's out-of-memory errors as they happen, caught or not.

Both cores raise ``torch.OutOfMemoryError`` with one message ("out of memory (emulated)"): the pure-Python core from
its allocator, the compiled core from C++, whose error Python makes into the exception object when it reaches
Python code. Either way the exception's ``__init__`` runs once, so while anyone watches, a wrapper around it tells
them; a retry loop that catches the error leaves a trace. With no watcher, ``torch.OutOfMemoryError`` is untouched.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

_OURS = "out of memory (emulated)"
_watchers: list[Callable[[BaseException], None]] = []
_lock = threading.Lock()
_had_own_init = False
_init: Any = None


def _heard(self: BaseException, *args: Any, **kwargs: Any) -> None:
    _init(self, *args, **kwargs)
    if args and isinstance(args[0], str) and _OURS in args[0]:
        for watcher in list(_watchers):
            try:
                watcher(self)
            except Exception:  # noqa: BLE001  a watcher never turns the user's error into another one
                pass


def subscribe(watcher: Callable[[BaseException], None]) -> Callable[[], None]:
    """Call ``watcher`` with each emulated out-of-memory error from now on; returns the call that stops it."""
    global _had_own_init, _init
    with _lock:
        if not _watchers:
            cls = torch.OutOfMemoryError
            _had_own_init, _init = "__init__" in cls.__dict__, cls.__init__
            cls.__init__ = _heard
        _watchers.append(watcher)

    def unsubscribe() -> None:
        with _lock:
            if watcher not in _watchers:
                return
            _watchers.remove(watcher)
            if not _watchers:
                if _had_own_init:
                    torch.OutOfMemoryError.__init__ = _init
                else:
                    del torch.OutOfMemoryError.__init__

    return unsubscribe
