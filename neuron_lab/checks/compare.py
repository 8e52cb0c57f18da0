"""``%%neuron compare`` / ``neuron_lab.compare``: the code in eager mode against compile mode, timed.

Every timed run works on fresh copies of what the code reads (made outside the timed window), with the
random generators where the real run will find them, so each run does the same work and a training step is
never applied twice. Each mode
runs once cold (the compiled one compiles there), then ``warmup`` times untimed, then ``runs`` times
timed, with the device synchronized before each clock read. Compile mode is the workbench's own
(:mod:`neuron_lab.modes`), so the cell compiles exactly as under ``%%neuron compile``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from neuron_lab import backend as _backend
from neuron_lab import interrupts, modes
from neuron_lab.checks import agreement, copies, diff, limits, parity, runs
from neuron_lab.report.checks import CompareResult, Timing
from neuron_lab.trace.compiles import CompileTrace
from neuron_lab.trace.sites import Locator


@dataclass(frozen=True)
class CompareOptions:
    """A compare check's options, checked as they are made: a :class:`limits.OptionError` (a ``ValueError``)
    names the first one out of bounds."""

    warmup: int = 1
    runs: int = 5
    fullgraph: bool = False
    backend: str = "neuron"

    def __post_init__(self) -> None:
        limits.count("warmup", self.warmup, 0, limits.MAX_WARMUP)
        limits.count("runs", self.runs, 1, limits.MAX_RUNS)
        limits.compile_backend(self.backend)


def _series(subject: runs.Subject, fresh: Callable[[], dict[str, Any]], device: torch.device, mode: str,
            opts: modes.CompileOptions | None, options: CompareOptions, start: runs.RngState,
            locator: Locator, exclude: Callable[[], Any]) -> tuple[runs.Run, Timing | None]:
    def once(locator: Locator | None = None) -> runs.Run:
        return runs.run(subject, rng=start.restore, ns=fresh(), device=device, source=device, mode=mode,
                        options=opts, locator=locator, exclude=exclude, timed=True)

    first = once(locator)  # the run whose outputs and training steps are compared
    if first.error is not None:
        return first, None
    for _ in range(options.warmup):
        if once().error is not None:
            return first, None
    timing = Timing(first.seconds)
    for _ in range(options.runs):
        r = once()
        if r.error is not None:
            return first, None
        timing.runs_s.append(r.seconds)
    return first, timing


def _timing_note(device: torch.device) -> str | None:
    """What the backend says its times measure, when the check timed its device (a CPU run times the CPU)."""
    if not _backend.is_active() or device.type != _backend.active().device_type:
        return None
    return _backend.active().timing_note


@interrupts.guard
def check(subject: runs.Subject, device: torch.device, options: CompareOptions, *, locator: Locator,
          exclude: Callable[[], Any] = contextlib.nullcontext,
          keep: Callable[[CompareResult], None] | None = None, then_run: bool = False) -> CompareResult:
    """Time and compare ``subject`` eager and compiled on copies; ``then_run``: then run it for real, as a plain
    run would (its errors propagate), after ``keep`` got the result."""
    __tracebackhide__ = True  # noqa: F841
    live = dict(subject.namespace)
    names = subject.names()
    shared: list[str] = []

    def fresh() -> dict[str, Any]:
        c = copies.copy_state(live, names, device, device)
        shared[:] = c.shared
        return {**subject.namespace, **c.values}  # now: with the globals earlier compiled runs installed

    with exclude():  # every run here is on copies, and the comparison is the check's: not the cell's report
        downcasts = parity.Downcasts()
        opts = modes.CompileOptions(options.backend, options.fullgraph)
        with runs.rng_preserved({device.type}) as start:  # every run draws what the real run will draw
            with downcasts.watching():
                eager, eager_t = _series(subject, fresh, device, modes.EAGER, None, options, start, locator, exclude)
            trace = CompileTrace(locator, _backend.active().lowering_us if _backend.is_active() else None)
            try:
                trace.start()  # inside: a Ctrl-C that lands in it still closes the window
                with subject.compiled(opts):
                    compiled, compiled_t = _series(subject, fresh, device, modes.COMPILE, opts, options, start, locator,
                                                           exclude)
            finally:
                compiles = trace.stop()
        a = agreement.build(subject, live, compiled, eager, ("compiled", "eager"))
        a.shared = shared
        diff.mark_unchanged(a.items, live, eager.namespace)
        result = CompareResult(str(device), options.backend, options.fullgraph, options.warmup, options.runs, a,
                               eager_t, compiled_t, compiles.compile_s, compiles.frames, compiles.graphs,
                               list(compiles.breaks), list(compiles.recompiles), list(compiles.failures),
                               parity.downcast_emulated(), downcasts.calls, list(downcasts.ops), parity.coverage_name(),
                               timing_note=_timing_note(device))
        if compiled_t is not None and compiles.frames == 0:
            a.notes.append("nothing compiled in this check: the code calls no nn.Module, or dynamo's cache already "
                           "held it, so the first compiled run shows no compile cost")
    if keep is not None:
        keep(result)
    if then_run:
        interrupts.user_code(subject.execute)
    return result
