"""What torch.compile did in a window, from dynamo's own callbacks and metrics (no log scraping).

- ``torch._dynamo.callback.callback_handler`` start/end callbacks time every frame compile;
- ``torch._dynamo.utils.get_compilation_metrics()`` gives each compiled frame, its recompile
  reason (the guard that failed) and the reasons it restarted after a graph break; a resumed frame
  (``torch_dynamo_resume_in_<fn>_at_<line>``) marks where a break happened;
- graphs compiled through :func:`observed` backends also carry dynamo's ``compile_subgraph_reason``
  with the user stack of the break, which names breaks the metrics leave without a reason; a break inside a
  library is shown at its library line under the user line whose call reached it, and a ``step_unsupported``
  (the caller's graph ended at a call whose own trace broke) with the reason that function restarted for;
- the backend's own lowering time (``NeuronBackend.lowering_us``, passed in) adds what a backend lowers lazily,
  after dynamo's window closed.

Dynamo's own warnings about a graph break (``Graph break from `Tensor.item()` ...`` and its user
stack, the extension's frames included) are kept out of the cell's output while a window is open:
the report says the same per break, in plain words, with dynamo's hint (:func:`explain_break`).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
import types
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from neuron_lab import frames
from neuron_lab.backend.events import WindowAccount
from neuron_lab.report.model import Compiles, GraphBreak, Recompile, Site
from neuron_lab.trace import compiler_loading
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


_DECIDE_ELSEWHERE = ("compute both sides and choose with `torch.where(cond, a, b)` (or `torch.cond(pred, true_fn, "
                     "false_fn, operands)`), or decide outside the compiled code, on the host")
_ITEM = r"Tensor\.item\(\)"
# Dynamo's break reasons a newcomer meets most, in plain words: (pattern on dynamo's text, sentence, our hint, which
# wins over dynamo's: the same break reads the same whether dynamo's text came with hints, as a fullgraph error's
# does, or without, as a logged break's does; "" takes dynamo's). ``{name}`` is the first `quoted` name in dynamo's
# explanation.
_PLAIN: tuple[tuple[re.Pattern[str], str, str], ...] = tuple((re.compile(p, re.I), text, hint) for p, text, hint in (
    (r"generic_jump|data.dependent (branch|jump|control flow)",
     "Python `if`/`while` on a tensor's value: which way it goes depends on the data, which the compiler cannot "
     "see while tracing, so the graph ends here and Python decides at run time", _DECIDE_ELSEWHERE),
    (_ITEM,
     "`.item()` (or `int()`, `float()`, `bool()` of a tensor) turns a device value into a Python number, "
     "which a compiled graph cannot hold", ""),
    (r"logging\.Logger", "a call to a `logging.Logger` method (a library's log message, such as "
     "`logger.warning_once`), which the compiler does not trace", ""),
    (r"tolist\(\)", "`.tolist()` copies a tensor into a Python list, which a compiled graph cannot hold", ""),
    (r"numpy\(\)", "`.numpy()` copies a tensor into a NumPy array, which a compiled graph cannot hold", ""),
    (r"builtin operator", "a call to Python's `{name}`, which cannot be part of a compiled graph", ""),
    (r"marked as skipped", "a call to `{name}`, a function the compiler does not trace into (a Python builtin "
     "or a C extension)", "call it outside the compiled code; for a C extension of your own, register it as a "
     "custom op (`torch.library.custom_op`)"),
    (r"Dynamic shape operator", "`{name}` makes a tensor whose shape depends on the data (a boolean mask, "
     "`nonzero`, `unique`): a compiled graph needs its shapes before it runs", ""),
    (r"^step_unsupported$", "the compiler stopped at a call into a function it could not finish tracing", ""),
))
# A line whose Python decides on the value: capturing the scalar in the graph (capture_scalar_outputs) leaves the
# decision, and the break, where they are.
_BRANCHES = re.compile(r"^(if|elif|while|assert)\b|\bif\b.*\belse\b")
_BRANCH_HINT = ("the number decides a Python branch on this line, so `capture_scalar_outputs` would not remove this "
                "break: " + _DECIDE_ELSEWHERE)
_NO_HELP = ("Please report an issue", "please file an issue", "If it is ")  # not a fix, or only maybe one
_QUOTED = re.compile(r"`([^`]+?)\.?`")


def explain_break(text: str, source: str = "") -> tuple[str, str, str]:
    """(plain reason, dynamo's own words in one short line, a hint) for one of dynamo's break reasons, at the line
    whose source is ``source``.

    Dynamo's reasons are written for compiler developers ("generic_jump TensorVariable()"); a
    researcher needs what in their line broke the graph and what to write instead.
    """
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    if not lines:
        return "graph break (dynamo recorded no reason)", "", ""
    note = lines[0]
    explanation = next((ln.removeprefix("Explanation:").strip() for ln in lines if ln.startswith("Explanation:")), "")
    hints = [ln.removeprefix("Hint:").strip() for ln in lines if ln.startswith("Hint:")]
    hint = next((h for h in hints if not any(x.lower() in h.lower() for x in _NO_HELP)), "")
    quoted = _QUOTED.search(explanation)
    for pattern, plain, own_hint in _PLAIN:
        if pattern.search(note) or pattern.search(explanation):
            if "{name}" in plain:
                if quoted is None:
                    continue
                plain = plain.format(name=quoted.group(1))
            if pattern.pattern == _ITEM and _BRANCHES.search(source.strip()):
                hint = _BRANCH_HINT
            return plain, note, own_hint or hint
    return (explanation.rstrip(".") or note), note, hint


class _KeepDynamoBreakWarnings(logging.Filter):
    """On torch's log handlers: dynamo's graph-break warnings go to the open windows, not to stderr."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not record.name.startswith("torch._dynamo"):
            return True
        with _active_lock:
            traces = list(_active)
        if not traces:
            return True
        message = record.getMessage()
        if "graph break" not in message.lower():
            return True
        for t in traces:
            t.dynamo_warnings.append(message)
        return False


_quiet = _KeepDynamoBreakWarnings()
_held: dict[str, Any] = {}  # what the open windows installed, undone when the last one closes


def _show_unless_dynamo(message, category, filename, lineno, file=None, line=None):
    """``warnings.showwarning`` while windows are open: dynamo also warns this way about a call it cannot
    trace (``time.sleep``); the break's report says it."""
    if f"{os.sep}torch{os.sep}_dynamo{os.sep}" in str(filename):
        with _active_lock:
            traces = list(_active)
        for t in traces:
            t.dynamo_warnings.append(str(message))
        return
    _held["showwarning"](message, category, filename, lineno, file, line)


def _open_window(trace: CompileTrace) -> None:
    """The first open window puts the filter on the handlers dynamo's records reach and takes over
    ``warnings.showwarning``; every window is told of the graphs ``backend="neuron"`` gets directly."""
    with _active_lock:
        first = not _active
        _active.append(trace)
    held = _held.setdefault("handlers", [])
    for h in (h for name in ("torch._dynamo", "torch") for h in logging.getLogger(name).handlers):
        if h not in held:  # also a handler added since an earlier window opened (one still open elsewhere)
            h.addFilter(_quiet)
            held.append(h)
    if not first:
        return
    from neuron_lab.backend import dynamo

    _held["showwarning"] = warnings.showwarning
    warnings.showwarning = _show_unless_dynamo
    _held["unsubscribe"] = dynamo.on_graph(_report_graph)


def _close_window(trace: CompileTrace) -> None:
    with _active_lock:
        if trace not in _active:
            return
        _active.remove(trace)
        last = not _active
    if not last or not _held:
        return
    for h in _held.pop("handlers"):
        h.removeFilter(_quiet)
    shown = _held.pop("showwarning")
    if warnings.showwarning is _show_unless_dynamo:  # unless somebody replaced it meanwhile
        warnings.showwarning = shown
    _held.pop("unsubscribe")()


def _report_graph(gm: Any) -> None:
    """One graph reached a backend: tell the open windows (once, whichever path reported it)."""
    if getattr(gm, "_neuron_lab_reported", False):
        return
    gm._neuron_lab_reported = True
    reason = getattr(gm, "compile_subgraph_reason", None)
    with _active_lock:
        traces = list(_active)
    for t in traces:
        t._on_graph(reason)


def observed(backend: str | Callable) -> Callable:
    """A backend that reports each graph to the active windows, then compiles it with ``backend``.

    One wrapper per backend name, so caches that key on the backend stay warm across cells.
    """
    from torch._dynamo.backends.registry import lookup_backend

    key = backend if isinstance(backend, str) else f"{getattr(backend, '__name__', 'backend')}@{id(backend)}"
    wrapper = _observed.get(key)
    if wrapper is None:
        with loading_compiler():
            inner = lookup_backend(backend) if isinstance(backend, str) else backend

        def wrapper(gm, example_inputs, **kwargs):
            _report_graph(gm)
            return inner(gm, example_inputs, **kwargs)

        wrapper.__name__ = getattr(inner, "__name__", "backend")  # dynamo's errors name it: say the user's backend
        _observed[key] = wrapper
    return wrapper


@contextmanager
def loading_compiler() -> Iterator[None]:
    """Count the block as loading the compiler in the open windows: the backend registry's first listing or lookup
    imports AOTAutograd (a second or more) after dynamo itself loaded, before any frame compiles, and that is no part
    of running the cell. Import dynamo before the block: its own loading is counted already."""
    t0, modules = time.perf_counter(), len(sys.modules)
    try:
        yield
    finally:
        took = time.perf_counter() - t0
        with _active_lock:
            traces = list(_active) if len(sys.modules) > modules else []  # it imported: not a cached listing
        for t in traces:
            t.loaded_more(took)


def with_account(c: Compiles, account: WindowAccount) -> Compiles:
    """``c`` with what the backend itself said about the window's compiles: the device compiler's time, its NEFF
    cache's hits and misses, and graphs that failed on the device and ran eagerly (said, never hidden)."""
    c.neff_compile_s += account.neff_compile_us / 1e6
    c.neff_cache = account.neff_cache if account.neff_cache and any(account.neff_cache) else c.neff_cache
    c.failures += account.eager_graphs
    return c


class CompileTrace:
    """Collects :class:`Compiles` between :meth:`start` and :meth:`stop`."""

    def __init__(self, locator: Locator | None, lowering_us: Callable[[], int] | None = None,
                 metrics: Callable[[], list[dict[str, Any]]] | None = None) -> None:
        self.locator = locator
        self._backend_metrics = metrics  # the backend's per-graph records (NeuronBackend.dynamo_metrics)
        self._metrics_at_start = 0
        self._backend_lowering_us = lowering_us  # the backend's lowering time so far (NeuronBackend.lowering_us)
        self._lock = threading.Lock()
        self._t0: dict[str, tuple[float, int]] = {}
        self._triggers: dict[str, Site | None] = {}  # compile id -> the user line whose call compiled it
        self._trigger: Site | None = None  # the user line whose call dynamo compiles now
        self._lowering_at_start = 0
        self._lowering_inside_us = 0
        self._result = Compiles()
        self._observed_breaks: list[GraphBreak] = []
        self._seen_metrics: set[int] = set()
        self._callbacks: tuple[Callable, Callable] | None = None
        self.dynamo_warnings: list[str] = []  # dynamo's graph-break warnings, kept from the cell's output
        self._graphs_seen = 0  # graphs that reached an observed backend in this window
        self._compiling: tuple[str, float, int] | None = None  # (frame, start, graphs before) while dynamo compiles
        self._phase = ""  # what the compile in progress does: "tracing" (dynamo), "lowering" (the backend)
        self._trigger: Site | None = None  # the user line whose call is being compiled
        self._no_wait: Callable[[], None] = lambda: None

    def start(self) -> None:
        """Open the window; dynamo's callbacks join once dynamo is loaded (a cell that compiles nothing does
        not load it: :mod:`~neuron_lab.trace.compiler_loading`)."""
        self._lowering_at_start = self._lowering_us()
        self._metrics_at_start = len(self._backend_metrics()) if self._backend_metrics is not None else 0
        _open_window(self)
        if compiler_loading.loaded():
            self._attach()
        else:
            self._no_wait = compiler_loading.when_loaded(lambda: self._attach(loading_s=compiler_loading.load_s))

    def _attach(self, loading_s: float = 0.0) -> None:
        """Dynamo is loaded: its callbacks time each compile from here on; loading it (``loading_s``, when the window
        loaded it) is compile time too."""
        from torch._dynamo.callback import callback_handler
        from torch._dynamo.utils import get_compilation_metrics

        self._result.loading_s = loading_s
        self._result.compile_s += loading_s
        self._result.imported_by = (compiler_loading.importer() or "") if loading_s else ""

        self._seen_metrics = {id(m) for m in get_compilation_metrics()}
        on_start = callback_handler.register_start_callback(self._on_start)
        on_end = callback_handler.register_end_callback(self._on_end)
        self._callbacks = (on_start, on_end)

    def loaded_more(self, seconds: float) -> None:
        """The compiler's loading went on after dynamo loaded (a backend's imports): compile time of this window."""
        if not self._result.loading_s:  # dynamo itself loaded before this window: only the rest loads here
            self._result.loading_rest = True
        self._result.loading_s += seconds
        self._result.compile_s += seconds

    def stop(self) -> Compiles:
        _close_window(self)
        self._no_wait()
        if self._callbacks is not None:
            from torch._dynamo.callback import callback_handler
            from torch._dynamo.utils import get_compilation_metrics

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
        self._compiling = None
        if not self._result.frames:  # loaded for no compile (torch loads it for some functions): not compile time
            self._result.compile_s -= self._result.loading_s
            if not self._result.imported_by:  # a compile's loading whose compile did not come: nothing to say
                self._result.loading_s = 0.0
            self._result.loading_rest = False
        else:
            self._result.imported_by = ""  # compiled after all: the load is this compile's
        if self._backend_metrics is not None:  # a graph the backend could not lower as asked is said, not hidden
            for m in self._backend_metrics()[self._metrics_at_start:]:
                if m.get("unlowered"):
                    self._result.failures.append(self._would_fail(m))
                elif m.get("lowering_reason"):
                    self._result.failures.append(f"graph {m.get('graph_name', '?')} runs eagerly on the device: "
                                                 f"{m['lowering_reason']}")
        return self._result

    def _would_fail(self, m: Any) -> str:
        """A graph TorchNeuron would not lower: its ops and lines, and what each fallback-execution setting does."""
        ops = []
        for node in m["unlowered"]:
            site = self._site(node.get("file"), node.get("line"))
            ops.append(f"{node['op']} at {site.label}: {site.source}" if site is not None else node["op"])
        then = ("it ran eagerly, its ops falling back as in eager mode (TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0; "
                "1, the 2.33 default, raises)" if m.get("fallback_execution") else
                "it raised (TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=1, the 2.33 default; 0 runs the graph eagerly, "
                "its ops falling back as in eager mode)")
        return (f"graph {m.get('graph_name', '?')} would fail to compile on TorchNeuron: no lowering for "
                f"{'; '.join(ops)}; {then}")

    def compiling(self) -> dict[str, Any] | None:
        """What dynamo is compiling right now, for live views and the progress line; None when it compiles nothing.

        ``{"frame": the call being compiled ("PolarNet.__call__", also while a break inside it compiles forward),
        "graphs": graphs compiled so far in this window, "elapsed_s": seconds since this frame's compile began,
        "phase": "loading" (the compiler itself, at the first compile), "tracing" (dynamo reads the Python code),
        "lowering" (the backend compiles the graph) or "backward" (the backward graph, at the first ``backward()``),
        "site": the user line whose call compiles, or None}``.
        Plain reads of values the compiling thread replaces whole: safe to call from any thread, several
        times a second.
        """
        since = compiler_loading.loading_since()
        if since is not None and self._callbacks is None:
            return {"frame": None, "graphs": 0, "elapsed_s": time.perf_counter() - since, "phase": "loading",
                    "site": None, "by": compiler_loading.importer()}
        current = self._compiling
        if current is None:
            return None
        frame, t0, _ = current
        site = self._trigger
        return {"frame": frame, "graphs": self._graphs_seen, "elapsed_s": time.perf_counter() - t0,
                "phase": self._phase, "site": site.label if site is not None else None}

    def _lowering_us(self) -> int:
        return self._backend_lowering_us() if self._backend_lowering_us is not None else 0

    # -- callbacks ----------------------------------------------------------------------------
    def _on_start(self, args: Any) -> None:
        trigger = self.locator.locate(sys._getframe(1)) if self.locator is not None else None
        frame = _compiled_frame_name(sys._getframe(1))
        if frame is None and self._compiling is not None:
            frame = self._compiling[0]  # a lazily compiled backward: the same frame's
        if self._compiling is None:  # a compile inside another keeps the outer one's line
            self._trigger = trigger
        lazy = getattr(args.callback_trigger, "name", None) == "LAZY_BACKWARD"
        self._phase = "backward" if lazy else "tracing"
        self._compiling = (frame or "graph", time.perf_counter(), self._graphs_seen)
        lowering = self._lowering_us()
        with self._lock:
            self._t0[str(args.compile_id)] = (time.perf_counter(), lowering)
            self._triggers[str(args.compile_id)] = self._trigger = trigger
            # a lazily compiled backward is compile time of the same frame, not another frame
            if getattr(args.callback_trigger, "name", None) != "LAZY_BACKWARD":
                self._result.frames += 1

    def _on_end(self, args: Any) -> None:
        self._compiling = None
        lowering = self._lowering_us()
        with self._lock:
            start = self._t0.pop(str(args.compile_id), None)
            if start is not None:
                self._result.compile_s += time.perf_counter() - start[0]
                self._lowering_inside_us += lowering - start[1]

    def _on_graph(self, reason: Any) -> None:
        self._graphs_seen += 1
        self._phase = "lowering"
        if reason is None or not getattr(reason, "graph_break", False):
            return
        site = via = None
        for fs in reversed(getattr(reason, "user_stack", None) or []):
            if self.locator is None or self.locator.is_user_file(fs.filename):
                site = self._site(fs.filename, fs.lineno)
                break
            if via is None and not frames.is_internal(fs.filename):
                via = self._site(fs.filename, fs.lineno)  # the library line where the graph broke
        site = site or self._trigger  # broke inside a library: the user line whose call got there
        source = (via or site).source if via or site else ""
        with self._lock:
            self._observed_breaks.append(GraphBreak(**_break_words(reason.reason, source), site=site, via=via))

    # -- metrics ------------------------------------------------------------------------------
    def _site(self, filename: str | None, line: int | None) -> Site | None:
        if not filename or not line:
            return None
        if self.locator is None:
            return Site(filename, line, "")
        return self.locator.site(filename, line)

    def _from_metrics(self, metrics: list) -> None:
        res = self._result
        inner = _inner_restart(metrics)
        breaks: dict[tuple[Site | None, Site | None], GraphBreak] = {}
        for b in self._observed_breaks:
            if b.note == "step_unsupported" and inner:  # the called function's own break says why
                b = replace(b, **_break_words(inner, b.via.source if b.via else b.site.source if b.site else ""))
            breaks.setdefault((b.site, b.via), b)
        last_restart: dict[str, str] = {}  # co_filename -> the latest restart reason seen in it
        for m in metrics:
            res.graphs += 1 if (m.graph_op_count or 0) > 0 else 0
            code, where = self._code_and_site(m)
            if m.fail_reason:
                at = f" (called at {where.label}: {where.source})" if where else ""
                broke = self._break_that_failed(m)
                if broke is None:
                    res.failures.append(f"{code}{at}: {short_reason(m.fail_reason)}")
                else:  # fullgraph: the break is listed, where and why, as one without it would be
                    breaks.setdefault((broke.site, broke.via), broke)
                    line = broke.site.label if broke.site else "a line of its code"
                    res.failures.append(f"{code}{at}: a graph break at {line}, and fullgraph allows none")
            resumed = _RESUME.match(m.co_name or "")
            if resumed:
                at = self._site(m.co_filename, int(resumed["line"]))
                user = self.locator is None or self.locator.is_user_file(m.co_filename or "")
                site, via = (at, None) if user else (self._triggers.get(str(m.compile_id)), at)
                if (site, via) not in breaks:
                    why = last_restart.get(m.co_filename or "", "")
                    breaks[(site, via)] = GraphBreak(**_break_words(why, at.source if at else ""), site=site, via=via)
            if m.restart_reasons:
                last_restart[m.co_filename or ""] = sorted(m.restart_reasons)[0]
            if m.recompile_reason:
                reason = m.recompile_reason.strip().split("\n")[0]
                res.recompiles.append(Recompile(code, reason, where))
        res.breaks = list(breaks.values())

    def _break_that_failed(self, m: Any) -> GraphBreak | None:
        """The graph break that failed a frame's compile (``fullgraph=True`` raises dynamo's ``Unsupported`` where
        it would break the graph), at the line dynamo stopped at; None for any other failure."""
        if m.fail_type != "Unsupported" or not m.fail_user_frame_filename or not m.fail_user_frame_lineno:
            return None
        at = self._site(m.fail_user_frame_filename, m.fail_user_frame_lineno)
        user = self.locator is None or self.locator.is_user_file(m.fail_user_frame_filename)
        site, via = (at, None) if user else (self._triggers.get(str(m.compile_id)), at)  # broke inside a library
        return GraphBreak(**_break_words(m.fail_reason, at.source if at else ""), site=site, via=via)

    def _code_and_site(self, m: Any) -> tuple[str, Site | None]:
        """What was compiled and the user line to show: its own, or the line whose call compiled it."""
        trigger = self._triggers.get(str(m.compile_id))
        resumed = _RESUME.match(m.co_name or "")
        if m.co_filename and self.locator is not None and self.locator.is_user_file(m.co_filename):
            line = int(resumed["line"]) if resumed else m.co_firstlineno
            return m.co_name or "?", self._site(m.co_filename, line)
        return m.co_name or "?", trigger or self._site(m.co_filename, m.co_firstlineno)


def _break_words(text: str, source: str = "") -> dict[str, str]:
    reason, note, hint = explain_break(text, source)
    return {"reason": reason, "note": note, "hint": hint}


def _inner_restart(metrics: list) -> str:
    """The first reason a frame of the window restarted for that says what broke ("Unknown
    fail_and_restart_analysis" does not): what a ``step_unsupported`` break in a caller stands for."""
    reasons = [r for m in metrics for r in sorted(m.restart_reasons or ()) if not r.startswith("Unknown ")]
    return reasons[0] if reasons else ""


def _compiled_frame_name(frame: types.FrameType | None) -> str | None:
    """The function dynamo's ``_compile`` is converting, from its frame up the stack (None: none found), named as
    the call that was compiled: a graph break inside ``Net.__call__`` has dynamo compile ``forward`` and its
    resumption while that call runs, and the progress line should name ``Net`` throughout, not switch names."""
    converting = outermost = None
    while frame is not None:
        if converting is None:
            if frame.f_code.co_name in ("compile_inner", "_compile"):
                code = frame.f_locals.get("code")
                if isinstance(code, types.CodeType):
                    resumed = _RESUME.match(code.co_name)
                    converting = f"{resumed['fn']} (resumed after line {resumed['line']})" if resumed else code.co_name
        elif _entered_by_torch_compile(frame):
            outermost = frame.f_code.co_name
        frame = frame.f_back
    return outermost or converting


_DYNAMO_DIR = os.path.join("torch", "_dynamo", "")
_EVAL_FRAME = os.path.join("torch", "_dynamo", "eval_frame.py")


def _entered_by_torch_compile(frame: types.FrameType) -> bool:
    """Whether ``frame`` runs a function torch.compile wrapped, called by the wrapper (its compiled code keeps
    the function's name); dynamo's own frames that the wrapper calls are not."""
    caller = frame.f_back
    return (caller is not None and caller.f_code.co_filename.endswith(_EVAL_FRAME)
            and _DYNAMO_DIR not in frame.f_code.co_filename)

