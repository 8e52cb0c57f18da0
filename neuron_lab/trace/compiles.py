"""What torch.compile did in a window, from dynamo's own callbacks and metrics (no log scraping).

- ``torch._dynamo.callback.callback_handler`` start/end callbacks time every frame compile;
- ``torch._dynamo.utils.get_compilation_metrics()`` gives each compiled frame, its recompile
  reason (the guard that failed) and the reasons it restarted after a graph break; a resumed frame
  (``torch_dynamo_resume_in_<fn>_at_<line>``) marks where a break happened;
- graphs compiled through :func:`observed` backends also carry dynamo's ``compile_subgraph_reason``
  with the user stack of the break, which names breaks the metrics leave without a reason;
- the backend's own lowering time (``NeuronBackend.lowering_us``, passed in) adds what a backend lowers lazily,
  after dynamo's window closed.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from neuron_lab.report.model import Compiles, GraphBreak, Recompile, Site
from neuron_lab.trace.sites import Locator

_RESUME = re.compile(r"^torch_dynamo_resume_in_(?P<fn>.+)_at_(?P<line>\d+)$")
_active: list[CompileTrace] = []
_active_lock = threading.Lock()
_observed: dict[str, Callable] = {}


def short_reason(text: str) -> str:
    """Dynamo's first line plus its explanation, without hints and URLs."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return "graph break"
    head = lines[0]
    if head.endswith(":") and len(lines) > 1:  # "backend='neuron' raised:" says what raised; the next line says what
        head = f"{head} {lines[1]}"
    for ln in lines[1:]:
        if ln.startswith("Explanation:"):
            return f"{head}: {ln.removeprefix('Explanation:').strip()}"
    return head


def observed(backend: str | Callable) -> Callable:
    """A backend that reports each graph to the active windows, then compiles it with ``backend``.

    One wrapper per backend name, so caches that key on the backend stay warm across cells.
    """
    from torch._dynamo.backends.registry import lookup_backend

    key = backend if isinstance(backend, str) else f"{getattr(backend, '__name__', 'backend')}@{id(backend)}"
    wrapper = _observed.get(key)
    if wrapper is None:
        inner = lookup_backend(backend) if isinstance(backend, str) else backend

        def wrapper(gm, example_inputs, **kwargs):
            reason = getattr(gm, "compile_subgraph_reason", None)
            with _active_lock:
                traces = list(_active)
            for t in traces:
                t._on_graph(reason)
            return inner(gm, example_inputs, **kwargs)

        wrapper.__name__ = getattr(inner, "__name__", "backend")  # dynamo's errors name it: say the user's backend
        _observed[key] = wrapper
    return wrapper


class CompileTrace:
    """Collects :class:`Compiles` between :meth:`start` and :meth:`stop`."""

    def __init__(self, locator: Locator | None, lowering_us: Callable[[], int] | None = None) -> None:
        self.locator = locator
        self._backend_lowering_us = lowering_us  # the backend's lowering time so far (NeuronBackend.lowering_us)
        self._lock = threading.Lock()
        self._t0: dict[str, tuple[float, int]] = {}
        self._triggers: dict[str, Site | None] = {}  # compile id -> the user line whose call compiled it
        self._lowering_at_start = 0
        self._lowering_inside_us = 0
        self._result = Compiles()
        self._observed_breaks: list[GraphBreak] = []
        self._seen_metrics: set[int] = set()
        self._callbacks: tuple[Callable, Callable] | None = None

    def start(self) -> None:
        from torch._dynamo.callback import callback_handler
        from torch._dynamo.utils import get_compilation_metrics

        self._seen_metrics = {id(m) for m in get_compilation_metrics()}
        self._lowering_at_start = self._lowering_us()
        on_start = callback_handler.register_start_callback(self._on_start)
        on_end = callback_handler.register_end_callback(self._on_end)
        self._callbacks = (on_start, on_end)
        with _active_lock:
            _active.append(self)

    def stop(self) -> Compiles:
        from torch._dynamo.callback import callback_handler
        from torch._dynamo.utils import get_compilation_metrics

        with _active_lock:
            if self in _active:
                _active.remove(self)
        if self._callbacks is not None:
            on_start, on_end = self._callbacks
            if on_start in callback_handler.start_callbacks:
                callback_handler.remove_start_callback(on_start)
            if on_end in callback_handler.end_callbacks:
                callback_handler.remove_end_callback(on_end)
            self._callbacks = None
        new = [m for m in get_compilation_metrics() if id(m) not in self._seen_metrics and m.compile_id]
        self._from_metrics(new)
        # Backends may lower a graph at its first call, after dynamo's window closed (the emulator's
        # Inductor does); that time is compile time too. Lowering inside a window is counted once.
        outside_us = self._lowering_us() - self._lowering_at_start - self._lowering_inside_us
        self._result.compile_s += max(outside_us, 0) / 1e6
        return self._result

    def _lowering_us(self) -> int:
        return self._backend_lowering_us() if self._backend_lowering_us is not None else 0

    # -- callbacks ----------------------------------------------------------------------------
    def _on_start(self, args: Any) -> None:
        trigger = self.locator.locate(sys._getframe(1)) if self.locator is not None else None
        lowering = self._lowering_us()
        with self._lock:
            self._t0[str(args.compile_id)] = (time.perf_counter(), lowering)
            self._triggers[str(args.compile_id)] = trigger
            # a lazily compiled backward is compile time of the same frame, not another frame
            if getattr(args.callback_trigger, "name", None) != "LAZY_BACKWARD":
                self._result.frames += 1

    def _on_end(self, args: Any) -> None:
        lowering = self._lowering_us()
        with self._lock:
            start = self._t0.pop(str(args.compile_id), None)
            if start is not None:
                self._result.compile_s += time.perf_counter() - start[0]
                self._lowering_inside_us += lowering - start[1]

    def _on_graph(self, reason: Any) -> None:
        if reason is None or not getattr(reason, "graph_break", False):
            return
        site = None
        for fs in reversed(getattr(reason, "user_stack", None) or []):
            if self.locator is None or self.locator.is_user_file(fs.filename):
                site = self._site(fs.filename, fs.lineno)
                break
        with self._lock:
            self._observed_breaks.append(GraphBreak(short_reason(reason.reason), site))

    # -- metrics ------------------------------------------------------------------------------
    def _site(self, filename: str | None, line: int | None) -> Site | None:
        if not filename or not line:
            return None
        if self.locator is None:
            return Site(filename, line, "")
        return self.locator.site(filename, line)

    def _from_metrics(self, metrics: list) -> None:
        res = self._result
        breaks: dict[tuple[str, int] | None, GraphBreak] = {}
        for b in self._observed_breaks:
            breaks.setdefault((b.site.filename, b.site.line) if b.site else None, b)
        last_restart: dict[str, str] = {}  # co_filename -> the latest restart reason seen in it
        for m in metrics:
            res.graphs += 1 if (m.graph_op_count or 0) > 0 else 0
            code, where = self._code_and_site(m)
            if m.fail_reason:
                at = f" (called at {where.label}: {where.source})" if where else ""
                res.failures.append(f"{code}{at}: {short_reason(m.fail_reason)}")
            resumed = _RESUME.match(m.co_name or "")
            if resumed:
                line = int(resumed["line"])
                key = (m.co_filename, line)
                if key not in breaks:
                    why = last_restart.get(m.co_filename or "", "graph break (dynamo recorded no reason)")
                    breaks[key] = GraphBreak(why, self._site(m.co_filename, line))
            if m.restart_reasons:
                last_restart[m.co_filename or ""] = short_reason(sorted(m.restart_reasons)[0])
            if m.recompile_reason:
                reason = m.recompile_reason.strip().split("\n")[0]
                res.recompiles.append(Recompile(code, reason, where))
        res.breaks = list(breaks.values())

    def _code_and_site(self, m: Any) -> tuple[str, Site | None]:
        """What was compiled and the user line to show: its own, or the line whose call compiled it."""
        trigger = self._triggers.get(str(m.compile_id))
        resumed = _RESUME.match(m.co_name or "")
        if m.co_filename and self.locator is not None and self.locator.is_user_file(m.co_filename):
            line = int(resumed["line"]) if resumed else m.co_firstlineno
            return m.co_name or "?", self._site(m.co_filename, line)
        return m.co_name or "?", trigger or self._site(m.co_filename, m.co_firstlineno)
