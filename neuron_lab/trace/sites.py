"""Which line of the user's code issued an op: the innermost frame that belongs to the user.

A locator answers "is this code object the user's, and which site is it" from a code object and
a line, with a cache per code object so the common case is one dict lookup per frame. Backward
kernels run on autograd's device thread, whose stack has no user frame; their site is the line
the main thread is blocked on (the ``loss.backward()`` call).
"""

from __future__ import annotations

import linecache
import os
import sys
import threading
from types import CodeType, FrameType

import torch

from neuron_lab.report.model import Site

_LIBRARY_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch, sys.modules["neuron_lab"]) if m.__file__)
_STDLIB_DIR = os.path.dirname(os.__file__) + os.sep
_SITE_PACKAGES = os.sep + "site-packages" + os.sep


class Locator:
    """Maps frames to user sites. Subclasses decide what counts as user code."""

    def __init__(self) -> None:
        self._is_user: dict[CodeType, bool] = {}

    def is_user_file(self, filename: str) -> bool:
        raise NotImplementedError

    def is_user_code(self, code: CodeType) -> bool:
        return self.is_user_file(code.co_filename)

    def site(self, filename: str, line: int) -> Site:
        return Site(filename, line, linecache.getline(filename, line).strip())

    def user_frame(self, frame: FrameType | None) -> FrameType | None:
        """The innermost user frame at or above ``frame``; on a non-main thread, the main thread's."""
        f = self._innermost_user(frame)
        if f is None and frame is not None and threading.current_thread() is not threading.main_thread():
            # autograd's device threads run no user code: the op was caused by what the main thread runs
            f = self._innermost_user(sys._current_frames().get(threading.main_thread().ident))
        return f

    def _innermost_user(self, frame: FrameType | None) -> FrameType | None:
        known = self._is_user
        f = frame
        while f is not None:
            code = f.f_code
            user = known.get(code)
            if user is None:
                user = known[code] = self.is_user_code(code)
            if user:
                return f
            f = f.f_back
        return None

    def locate(self, frame: FrameType | None) -> Site | None:
        f = self.user_frame(frame)
        return None if f is None else self.site(f.f_code.co_filename, f.f_lineno)

    def stack(self, frame: FrameType, depth: int) -> tuple[str, ...]:
        """Up to ``depth`` frames ending at the user frame, outermost first, as "where: source"."""
        out: list[str] = []
        f: FrameType | None = self.user_frame(frame)
        while f is not None and len(out) < depth:
            s = self.site(f.f_code.co_filename, f.f_lineno)
            out.append(f"{s.label} in {f.f_code.co_name}: {s.source}")
            f = f.f_back
        return tuple(reversed(out))


class FileLocator(Locator):
    """Scripts and tests: user code is anything outside installed packages and the standard library."""

    def is_user_file(self, fn: str) -> bool:
        if fn.startswith("<"):
            return False  # <frozen ...>, <string>, generated code
        return not (fn.startswith(_LIBRARY_DIRS) or fn.startswith(_STDLIB_DIR) or _SITE_PACKAGES in fn)
