"""Execution modes (process-wide torch state, nothing per shell), built on PyTorch's own primitives.

- ``compile``: the outermost ``nn.Module`` calls made while the mode is on run through
  ``torch.compile(backend=..., fullgraph=...)``. Calls made inside a compiled region, modules
  that are already compiled (``torch.compile(model)``, ``model.compile()``) and explicitly compiled
  functions are left alone. Dynamo's code cache keeps the compiled code per module and options,
  so re-running a cell does not recompile.
- ``eager``: ``torch.compiler.set_stance("force_eager")``, once dynamo is loaded; explicitly compiled functions run
  eagerly.
- ``default``: code runs as written.

Modes nest (a ``%%neuron eager`` cell inside ``%neuron mode compile``) and always restore the
previous one, also on exceptions and KeyboardInterrupt.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch

from neuron_lab.trace import compile_errors, compiler_loading
from neuron_lab.trace.compiles import observed

DEFAULT, EAGER, COMPILE = "default", "eager", "compile"
MODES = (DEFAULT, EAGER, COMPILE)


@dataclass(frozen=True)
class CompileOptions:
    backend: str = "neuron"
    fullgraph: bool = False
    dynamic: bool | None = None


def described(name: str, options: CompileOptions) -> str:
    """A mode in words, with the compile options that apply to it (``compile (backend=neuron, fullgraph)``)."""
    if name != COMPILE:
        return name
    return f"{name} (backend={options.backend}{', fullgraph' if options.fullgraph else ''})"


_stack: list[CompileOptions | None] = []  # the innermost mode's compile options; None: not compiling
_compiled: dict[tuple[CompileOptions, type], object] = {}
_tls = threading.local()
_original_call = None


def _module_call(self: torch.nn.Module, *args, **kwargs):
    return _original_call(self, *args, **kwargs)


def _compiled_call(opts: CompileOptions, cls: type) -> object:
    """``torch.compile`` of a copy of :func:`_module_call` made for ``cls``, named ``cls.__name__``.

    Dynamo keeps compiled code, and counts recompiles against its limit, per code object: a copy per
    module class gives each class its own cache, and reports say ``PolarNet.__call__`` recompiled.
    (``Module._call_impl`` itself cannot be the compiled frame: dynamo skips torch.nn's frames at top
    level and would compile the leaf modules one by one instead of the outermost call.)
    """
    fn = _compiled.get((opts, cls))
    if fn is None:
        code = _module_call.__code__.replace(co_name=f"{cls.__name__}.__call__")
        copy = types.FunctionType(code, _module_call.__globals__, code.co_name)
        fn = _compiled[(opts, cls)] = torch.compile(copy, backend=observed(opts.backend), fullgraph=opts.fullgraph,
                                                    dynamic=opts.dynamic)
    return fn


def _compiling_call(self: torch.nn.Module, *args, **kwargs):
    __tracebackhide__ = True  # noqa: F841
    opts = _stack[-1] if _stack else None
    if (opts is None or torch.compiler.is_compiling() or getattr(_tls, "depth", 0)
            or isinstance(self, torch._dynamo.eval_frame.OptimizedModule)
            or getattr(self, "_compiled_call_impl", None) is not None):
        return _original_call(self, *args, **kwargs)
    fn = _compiled_call(opts, type(self))
    _tls.depth = 1
    try:
        return fn(self, *args, **kwargs)
    except Exception as e:
        if compile_errors.is_graph_break_error(e):  # fullgraph: the break
            compile_errors.keep_user_frames(e)
        raise
    finally:
        _tls.depth = 0


def _push(opts: CompileOptions | None) -> None:
    global _original_call
    if _original_call is None:
        _original_call = torch.nn.Module.__call__
        torch.nn.Module.__call__ = _compiling_call
    _stack.append(opts)


def forget_compiled() -> None:
    """Drop the compiled module calls kept for reuse (unloading: a reload compiles afresh, counted afresh)."""
    _compiled.clear()


def _pop() -> None:
    global _original_call
    _stack.pop()
    if not _stack and _original_call is not None:
        torch.nn.Module.__call__ = _original_call
        _original_call = None


@contextmanager
def mode(name: str, options: CompileOptions | None = None) -> Iterator[None]:
    """Run the block in ``name`` mode; the previous mode comes back afterwards, whatever happens."""
    if name not in MODES:
        raise ValueError(f"unknown mode {name!r}; expected one of {', '.join(MODES)}")
    if name == COMPILE:
        _push(options or CompileOptions())
        try:
            with torch.compiler.set_stance("default"):
                yield
        finally:
            _pop()
    elif name == EAGER:
        _push(None)
        try:
            with _forced_eager():
                yield
        finally:
            _pop()
    else:
        yield


@contextmanager
def _forced_eager() -> Iterator[None]:
    """``set_stance("force_eager")`` from the moment dynamo is loaded: at once when it is, else when the block's code
    loads it (a ``torch.compile`` call does, before it compiles anything). Setting a stance loads dynamo (seconds),
    which a block that compiles nothing, such as a parity check's reference run, must not pay."""
    with ExitStack() as stack:
        cancel = compiler_loading.when_loaded(lambda: stack.enter_context(torch.compiler.set_stance("force_eager")))
        try:
            yield
        finally:
            cancel()


def patched() -> bool:
    """Whether ``nn.Module.__call__`` is currently wrapped (for tests and unload checks)."""
    return _original_call is not None
