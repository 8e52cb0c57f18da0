"""When ``torch._dynamo`` loads: it costs about two seconds and 70 MiB, so nothing loads it before the first compile.

A cell's compile trace needs dynamo's callbacks, but a cell that compiles nothing must not pay for them: while
dynamo is not loaded, a finder on ``sys.meta_path`` waits for its import (whoever makes it: ``torch.compile``,
``%%neuron compile``, a library), says when it began (a first compile's progress line reads
:func:`loading_since`) and which library imported it where that was no compile (:func:`importer`: torch.optim's
constructors import it to keep their own code from being compiled), and, once it is done, calls back whoever asked
(:func:`when_loaded`).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

DYNAMO = "torch._dynamo"
_lock = threading.Lock()
_waiting: list[Callable[[], None]] = []
_since: float | None = None  # perf_counter when dynamo began loading; None when not loading
load_s = 0.0  # how long loading dynamo took, once it loaded through here
_by: str | None = None  # the library that imported dynamo (importer()), while it loads and after
_NOT_THE_IMPORTER = ("importlib", "torch._compile", __name__)  # the import machinery, torch's lazy-import wrapper


def loaded() -> bool:
    return DYNAMO in sys.modules and _since is None


def loading_since() -> float | None:
    """When dynamo began loading, while it loads (perf_counter seconds); else None. Safe from any thread."""
    return _since


def importer() -> str | None:
    """The library whose import of dynamo loads (or loaded) it, as its package and module ("torch.optim",
    "transformers.utils"); None where a compile imported it (``torch.compile``, neuron_lab) or the user's code did."""
    return _by


def _importing_library() -> str | None:
    """The first module on the stack, above the import machinery, that imports dynamo; None for a compile's or
    the user's own import."""
    f = sys._getframe(1)
    while f is not None and str(f.f_globals.get("__name__", "")).startswith(_NOT_THE_IMPORTER):
        f = f.f_back
    name = str(f.f_globals.get("__name__", "")) if f is not None else ""
    if name in ("torch", "__main__", "") or name.startswith(("neuron_lab", "torch._dynamo")):
        return None  # torch.compile, %%neuron compile, a cell or script: a compile, or the user's own import
    return ".".join(name.split(".")[:2])


def when_loaded(fn: Callable[[], None]) -> Callable[[], None]:
    """Call ``fn`` once dynamo is loaded: now if it is, else right after its import; returns a function that
    cancels the wait."""
    if loaded():
        fn()
        return lambda: None
    with _lock:
        _waiting.append(fn)
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)
    return lambda: _cancel(fn)


def _cancel(fn: Callable[[], None]) -> None:
    with _lock:
        if fn in _waiting:
            _waiting.remove(fn)
        if not _waiting and _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds ``torch._dynamo`` as the path finder does, with a loader that says when it starts and ends."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != DYNAMO:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        by = _importing_library()

        def timed(module: Any) -> None:
            global _since, load_s, _by
            _by, _since = by, time.perf_counter()
            try:
                exec_module(module)
            finally:
                load_s, _since = time.perf_counter() - _since, None
                _loaded()

        spec.loader = _Loader(spec.loader, timed)
        return spec


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any, exec_module: Callable[[Any], None]) -> None:
        self._inner, self._exec = inner, exec_module

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._exec(module)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, ...: the path loader's own
        return getattr(self._inner, name)


def _loaded() -> None:
    with _lock:
        if _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)
        waiting = list(_waiting)
        _waiting.clear()
    if DYNAMO not in sys.modules:  # the import failed: nothing to tell
        return
    for fn in waiting:
        fn()


_FINDER = _Finder()
