"""Ctrl-C inside a check stops the user's code at once, and never the bookkeeping that puts things back.

A check swaps copies into the notebook's namespace, patches ``nn.Module.__call__`` and
``Tensor.backward``, moves the default device and the random generators, and undoes all of it in
``finally`` blocks. Python raises a SIGINT's ``KeyboardInterrupt`` between any two bytecodes, so a
Ctrl-C that lands in one of those ``finally`` blocks, or between a context manager's ``__enter__``
and the registration of its ``__exit__``, leaves a copy where the user's object was. A second Ctrl-C
while the first unwinds does the same.

:func:`guarded` wraps the whole check. While it is active (on the main thread, where Python delivers
signals), SIGINT goes through a handler that looks at where it landed: inside the user's code (below
:func:`user_code`, nearer than any guarded frame) it is delivered at once, as Python would deliver it;
anywhere else it is kept and delivered at the next safe point: the next entry into user code, or when
the outermost guard ends, after everything is back. The user's own code stays interruptible; only the
check's own short stretches wait.
"""

from __future__ import annotations

import _signal
import functools
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

_roots: list[FrameType] = []  # the frames that entered each active guard, outermost first
_pending = [False]  # a SIGINT arrived outside user code and waits
_previous: list[Any] = []  # the handler the outermost guard replaced (empty: no handler of ours is installed)


def _lands_in_user_code(frame: FrameType | None) -> bool:
    """Whether the innermost of (a user_code() call, a guard's frame) above ``frame`` is a user_code() call."""
    roots = {id(f) for f in _roots}
    f = frame
    while f is not None:
        if f.f_code is user_code.__code__:
            return True
        if id(f) in roots:
            return False
        f = f.f_back
    return False


def _handler(signum: int, frame: FrameType | None) -> None:
    if _previous and _lands_in_user_code(frame):
        _previous[0](signum, frame)  # default_int_handler: KeyboardInterrupt, right there
    else:
        _pending[0] = True


def _deliver() -> None:
    """A SIGINT kept back is delivered now, through the handler it would have met."""
    if _pending[0]:
        _pending[0] = False
        handler = _previous[0] if _previous else signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, sys._getframe(1))


@contextmanager
def guarded() -> Iterator[None]:
    """SIGINT waits while the block's own code runs, and stops only code run through :func:`user_code`.

    A no-op off the main thread, or where SIGINT is not handled in Python (ignored, or the default action).
    Guards nest: an inner one (a check inside a checked cell) protects its own bookkeeping the same way.
    """
    outermost = _enter(sys._getframe(2))  # the frame that entered the guard (past contextmanager's __enter__)
    if outermost is None:
        yield
        return
    try:
        yield
    finally:
        _exit(outermost)


def _enter(root: FrameType) -> bool | None:
    """A guard starts, entered at ``root``: whether it is the outermost (None: no guard here, off the main thread or
    where SIGINT is not handled in Python)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    outermost = not _previous
    if outermost:
        # _signal: the functions signal wraps; the wrappers turn each handler into an enum member by raising and
        # catching ValueError (~30 k instructions a call, and the session's cell hooks swap the handler each cell)
        current = _signal.getsignal(signal.SIGINT)
        if not callable(current):
            return None
        _signal.signal(signal.SIGINT, _handler)  # first: a SIGINT from here on waits (a Ctrl-C between the two
        _previous.append(current)  # lines the other way round left _previous set for good, and every guard inner)
    _roots.append(root)
    return outermost


def _exit(outermost: bool) -> None:
    """The innermost guard ends: the outermost puts the handler back; a SIGINT kept back is delivered."""
    _roots.pop()
    if outermost:
        _signal.signal(signal.SIGINT, _previous.pop())
    _deliver()


def user_code(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run the user's code: the one place inside a guard where Ctrl-C is delivered at once.

    A Ctrl-C that waited during the bookkeeping before is delivered here first, before the code starts.
    """
    __tracebackhide__ = True  # noqa: F841
    if _pending[0] and _previous and threading.current_thread() is threading.main_thread():
        _deliver()
    return fn(*args, **kwargs)


def guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: ``fn`` runs :func:`guarded` (the checks' entry points)."""

    @functools.wraps(fn)
    def guarded_call(*args: Any, **kwargs: Any) -> Any:  # guarded() without a context manager's calls (every cell)
        __tracebackhide__ = True  # noqa: F841
        outermost = _enter(sys._getframe())
        if outermost is None:
            return fn(*args, **kwargs)
        try:
            return fn(*args, **kwargs)
        finally:
            _exit(outermost)

    return guarded_call
