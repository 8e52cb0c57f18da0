"""Running the same code more than once: on the user's objects, or on copies that vanish afterwards.

A :class:`Subject` is what a check runs: a notebook cell (its namespace is the shell's) or a function
with its arguments (its namespace is the bound arguments). A run on copies swaps the copies in for the
duration of the run, so the notebook's own functions, which read the shell's globals, see them too,
and puts every name back afterwards, whatever happens. The user's code runs through
:func:`neuron_lab.interrupts.user_code`, the only place inside a check where Ctrl-C lands at once: the
checks are :func:`neuron_lab.interrupts.guard`-ed, so no Ctrl-C can cut a restore short.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from neuron_lab import interrupts, modes
from neuron_lab.checks import copies
from neuron_lab.report.model import Site
from neuron_lab.session import devices
from neuron_lab.session.cells import Compiled, compile_body, run_compiled
from neuron_lab.session.session import CellToCheck
from neuron_lab.trace.sites import Locator


class Subject:
    """What a check runs. ``namespace`` holds the named objects the code reads and leaves behind."""

    namespace: dict[str, Any]
    device_variable: str | None = None  # the variable naming the notebook device, if the code reads one

    def names(self) -> list[str]:
        """Names the code reads or writes, in the order it first mentions them."""
        raise NotImplementedError

    def line_of(self, name: str) -> int | None:
        return None

    def visible(self, name: str) -> bool:
        """Whether ``name`` is the user's (not IPython's or ours)."""
        return not name.startswith("_")

    def last_is_name(self) -> bool:
        return False

    def execute(self) -> Any:
        """Run once on whatever ``namespace`` holds now; the last expression's value."""
        raise NotImplementedError

    @contextlib.contextmanager
    def swapped(self, ns: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Run with ``ns`` as the namespace; yields the dict that holds what the run leaves."""
        raise NotImplementedError

    def quiet(self) -> contextlib.AbstractContextManager:
        """Swallow what a copy run prints: the user sees the output of the real run only."""
        return _redirected()

    def compiled(self, options: modes.CompileOptions) -> contextlib.AbstractContextManager:
        """What compile mode needs besides :func:`modes.mode` (a cell: nothing; its module calls compile)."""
        return contextlib.nullcontext()


@contextlib.contextmanager
def _redirected() -> Iterator[None]:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


class CellSubject(Subject):
    """A ``%%neuron`` cell body, as the session describes it, run like IPython runs a cell."""

    def __init__(self, cell: CellToCheck) -> None:
        self.shell, self.body, self.raw, self.number = cell.shell, cell.body, cell.raw_cell, cell.number
        self.namespace = cell.shell.user_ns
        self.hidden = cell.hidden | {cell.device_variable}
        self.device_variable = cell.device_variable
        try:
            code = cell.shell.transform_cell(cell.body)
        except Exception:
            code = cell.body
        offset = max(len(cell.raw_cell.splitlines()) - len(cell.body.splitlines()), 0)
        self._mentioned = [(n, line + offset) for n, line in copies.mentioned(code)]
        self._last_is_name = _last_is_name(code)
        self._compiled: Compiled | None = None  # the body, compiled at the first run: timed runs time the body alone

    def names(self) -> list[str]:
        direct = [n for n, _ in self._mentioned if n not in self.hidden or n == self.device_variable]
        return [n for n in copies.read_through(direct, self.namespace)
                if n not in self.hidden or n == self.device_variable]

    def line_of(self, name: str) -> int | None:
        return dict(self._mentioned).get(name)

    def visible(self, name: str) -> bool:
        return not name.startswith("_") and name not in self.hidden

    def last_is_name(self) -> bool:
        return self._last_is_name

    def execute(self) -> Any:
        __tracebackhide__ = True  # noqa: F841
        if self._compiled is None:
            self._compiled = compile_body(self.shell, self.body, self.raw, self.number)
        return run_compiled(self.shell, self._compiled)

    @contextlib.contextmanager
    def swapped(self, ns: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The shell's namespace holds ``ns`` for the run, and what it held afterwards. Dunder names the run
        added stay: dynamo installs the globals its compiled code calls (``__compiled_fn_…``, ``__resume_at_…``)
        into the cell's globals, and the code cache outlives the run."""
        live = self.namespace
        saved = dict(live)  # the restore plan, made before anything changes
        try:
            live.clear()
            live.update(ns)
            yield live
        finally:
            compiled = {k: v for k, v in live.items() if k.startswith("__") and k not in saved}
            live.clear()
            live.update(saved)
            live.update(compiled)

    def quiet(self) -> contextlib.AbstractContextManager:
        from IPython.utils.capture import capture_output

        return capture_output()


def _last_is_name(code: str) -> bool:
    import ast

    try:
        body = ast.parse(code).body
    except SyntaxError:
        return False
    return bool(body) and isinstance(body[-1], ast.Expr) and isinstance(body[-1].value, ast.Name)


class FunctionSubject(Subject):
    """``fn(*args, **kwargs)``; an ``nn.Module`` given as ``fn`` is part of the state, as ``module``."""

    def __init__(self, fn: Callable, args: tuple, kwargs: dict) -> None:
        self.fn = fn
        self.call: Callable | None = None  # what runs instead of fn (its compiled wrapper), same arguments
        try:
            self.signature: inspect.Signature | None = inspect.signature(fn)
            bound = self.signature.bind(*args, **kwargs)
            ns = dict(bound.arguments)
        except (TypeError, ValueError):
            self.signature = None
            ns = {f"args[{i}]": a for i, a in enumerate(args)} | dict(kwargs)
        self._positional = len(args)
        self.namespace = ({"module": fn} if isinstance(fn, torch.nn.Module) else {}) | ns

    def names(self) -> list[str]:
        return list(self.namespace)

    def execute(self) -> Any:
        __tracebackhide__ = True  # noqa: F841
        ns = self.namespace
        fn = self.call or ns.get("module", self.fn)
        if self.signature is not None:
            ba = inspect.BoundArguments(self.signature, {k: v for k, v in ns.items() if k != "module"})
            return fn(*ba.args, **ba.kwargs)
        args = [ns[f"args[{i}]"] for i in range(self._positional)]
        return fn(*args, **{k: v for k, v in ns.items() if not k.startswith("args[") and k != "module"})

    @contextlib.contextmanager
    def compiled(self, options: modes.CompileOptions) -> Iterator[None]:
        """A plain function is compiled itself (its module calls are then part of its graph)."""
        if isinstance(self.fn, torch.nn.Module):
            yield
            return
        from neuron_lab.trace.compiles import observed

        self.call = torch.compile(self.fn, backend=observed(options.backend), fullgraph=options.fullgraph,
                                  dynamic=options.dynamic)
        try:
            yield
        finally:
            self.call = None

    @contextlib.contextmanager
    def swapped(self, ns: dict[str, Any]) -> Iterator[dict[str, Any]]:
        saved, self.namespace = self.namespace, dict(ns)
        try:
            yield self.namespace
        finally:
            self.namespace = saved


# -- RNG --------------------------------------------------------------------------------------
@dataclass
class RngState:
    """Every generator a run may draw from: torch's CPU one and the devices', Python's, NumPy's."""

    cpu: torch.Tensor
    devices: dict[str, torch.Tensor]
    python: Any
    numpy: Any = None

    @classmethod
    def now(cls, device_types: set[str]) -> RngState:
        devs = {}
        for t in device_types - {"cpu"}:
            mod = getattr(torch, t, None)
            if mod is not None and hasattr(mod, "get_rng_state"):
                devs[t] = mod.get_rng_state()
        np = sys.modules.get("numpy")
        return cls(torch.get_rng_state(), devs, random.getstate(), np.random.get_state() if np is not None else None)

    def restore(self, cpu: torch.Tensor | None = None) -> None:
        """Put every generator back; ``cpu``, when given, is the CPU generator's state instead."""
        torch.set_rng_state(self.cpu if cpu is None else cpu)
        for t, state in self.devices.items():
            getattr(torch, t).set_rng_state(state)
        random.setstate(self.python)
        np = sys.modules.get("numpy")
        if np is not None and self.numpy is not None:
            np.random.set_state(self.numpy)

    def drawn(self, later: RngState) -> tuple[bool, set[str]]:
        """(the CPU generator, the device types whose generators) moved between this state and ``later``."""
        return (not torch.equal(self.cpu, later.cpu),
                {t for t, s in self.devices.items() if t in later.devices and not torch.equal(s, later.devices[t])})


@contextlib.contextmanager
def rng_preserved(device_types: set[str]) -> Iterator[RngState]:
    """Every generator comes back as it was, whatever the block draws."""
    state = RngState.now(device_types)
    try:
        yield state
    finally:
        state.restore()


def synchronize(device: torch.device) -> None:
    if device.type != "cpu":
        getattr(torch, device.type).synchronize()


# -- one run ----------------------------------------------------------------------------------
@dataclass
class Loss:
    value: float
    dtype: torch.dtype
    site: Site | None


@dataclass
class Run:
    """What one run left: its namespace, the last expression's value, its error, its losses, its time."""

    namespace: dict[str, Any] = field(default_factory=dict)
    value: Any = None
    error: BaseException | None = None
    losses: list[Loss] = field(default_factory=list)
    seconds: float = 0.0


@contextlib.contextmanager
def recording_losses(out: list[Loss], locator: Locator, exclude: Callable[[], Any]) -> Iterator[None]:
    """Note the scalar each ``backward()`` is called on: one per training step, to find the first that diverged."""
    original = torch.Tensor.backward
    inside = [0]  # a torch function mode (a default device) calls Tensor.backward again, from inside

    def backward(self, *args, **kwargs):
        if not inside[0] and not torch.compiler.is_compiling() and self.numel() == 1 and not self.is_complex():
            with exclude():
                value = float(self.detach().reshape(()).to("cpu", torch.float64))
            out.append(Loss(value, self.dtype, locator.locate(sys._getframe(1))))
        inside[0] += 1
        try:
            return original(self, *args, **kwargs)
        finally:
            inside[0] -= 1

    torch.Tensor.backward = backward
    try:
        yield
    finally:
        torch.Tensor.backward = original


@contextlib.contextmanager
def on_device(subject: Subject, ns: dict[str, Any], source: torch.device, target: torch.device) -> Iterator[None]:
    """The run's device is ``target``: the device variable and torch's default device, when they named ``source``."""
    var = subject.device_variable
    if var is not None and isinstance(ns.get(var), torch.device) and ns[var] == source:
        ns[var] = target
    default = devices.default_device()
    moved = torch.get_default_device().type == source.type and source != target
    if moved:
        torch.set_default_device(target)
    try:
        yield
    finally:
        if moved:
            torch.set_default_device(default)


def run(subject: Subject, *, rng: Callable[[], None] | None = None, ns: dict[str, Any] | None = None,
        device: torch.device | None = None, source: torch.device | None = None, mode: str | None = None,
        options: modes.CompileOptions | None = None, locator: Locator | None = None,
        exclude: Callable[[], Any] = contextlib.nullcontext, timed: bool = False) -> Run:
    """Run ``subject`` once: on its own namespace (``ns`` None; errors propagate), or on ``ns`` (errors are kept).

    ``rng`` sets the generators at the start; ``source``/``device`` moves the run to ``device``;
    ``locator`` turns on loss recording; ``timed`` synchronizes ``device`` around the clock reads.
    """
    __tracebackhide__ = True  # noqa: F841
    out = Run()
    with contextlib.ExitStack() as stack:
        if ns is not None:
            out.namespace = stack.enter_context(subject.swapped(ns))
            stack.enter_context(exclude())
            stack.enter_context(subject.quiet())
            if device is not None and source is not None:
                stack.enter_context(on_device(subject, out.namespace, source, device))
        else:
            out.namespace = subject.namespace
        if mode is not None:
            stack.enter_context(modes.mode(mode, options))
        if locator is not None:
            stack.enter_context(recording_losses(out.losses, locator, exclude))
        if rng is not None:
            rng()
        if timed and device is not None:
            synchronize(device)
        t0 = time.perf_counter()
        try:
            out.value = interrupts.user_code(subject.execute)
            if timed and device is not None:
                synchronize(device)
        except Exception as e:
            if ns is None:
                raise
            out.error = e
        out.seconds = time.perf_counter() - t0
        out.namespace = dict(out.namespace)  # what the run left, before the swap puts the user's back
    return out


def error_text(e: BaseException | None) -> str | None:
    if e is None:
        return None
    text = str(e).strip().split("\n")[0]
    text = text if len(text) <= 200 else text[:199] + "…"
    return f"{type(e).__name__}: {text}".rstrip(": ")
