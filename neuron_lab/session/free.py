"""``%neuron free``: drop the references IPython itself keeps to device tensors.

A tensor that was a cell's value stays alive after ``del x`` through ``Out[N]``, ``_N``, ``_``
(also in ``user_ns_hidden``) and the display hook; a tensor local to a function that raised stays
alive through the last traceback's frames (``sys.last_*``, ``InteractiveTB.tb``,
``last_execution_result``). Only holders of device tensors are touched; other outputs stay. A holder is named with
the bytes only it held: what your variables also hold stays allocated, so dropping IPython's reference to it frees
nothing.
"""

from __future__ import annotations

import gc
import inspect
import sys
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import torch

from neuron_lab import backend as _backend
from neuron_lab.session.devices import tensors_in
from neuron_lab.session.tensors import ipython_own
from neuron_lab.units import ShownAsText, format_size


@dataclass
class FreeReport(ShownAsText):
    dropped: list[tuple[str, int]] = field(default_factory=list)  # (holder, bytes of the storages only it held)
    freed: int = 0  # device bytes released
    allocated: int = 0  # device bytes still allocated
    shared: bool = False  # a dropped holder held only storages your variables hold too

    def __str__(self) -> str:
        lines = [f"freed {format_size(self.freed)} of device memory; {format_size(self.allocated)} still allocated"]
        if self.dropped:
            lines.append("dropped IPython's references:")
            lines += [f"  {holder:<34} {format_size(n):>12}" for holder, n in self.dropped]
        elif self.shared:
            lines.append("IPython held only device tensors your variables hold too")
        else:
            lines.append("IPython held no device tensors")
        if self.allocated:
            lines.append("what remains is held by your variables (`%neuron tensors` lists them) or by objects "
                         "they reference")
        return "\n".join(lines)


def _storages(objs: list[Any], device_type: str) -> dict[int, int]:
    """Data pointer -> bytes of the ``device_type`` storages behind the tensors in ``objs``.

    A view keeps its whole storage alive, so freeing it releases the storage's bytes, not the view's.
    """
    sizes: dict[int, int] = {}
    for obj in objs:
        try:
            for t in tensors_in(obj):
                if t.device.type == device_type:
                    st = t.untyped_storage()
                    sizes[st.data_ptr()] = st.nbytes()
        except ReferenceError:  # a dead weakproxy somewhere in a container
            pass
    return sizes


def _variables_storages(shell: Any, device_type: str) -> set[int]:
    """Data pointers of the device storages your variables hold: dropping IPython's references leaves them."""
    ns, hidden = shell.user_ns, shell.user_ns_hidden
    return set(_storages([v for k, v in list(ns.items()) if not ipython_own(ns, hidden, k)], device_type))


def _dropped(report: FreeReport, holder: str, storages: dict[int, int], kept: Collection[int]) -> None:
    """Name ``holder`` with the bytes of the storages only it held; one that held only what ``kept`` holds is not
    named (dropping it freed nothing), but said."""
    own = sum(n for ptr, n in storages.items() if ptr not in kept)
    if own:
        report.dropped.append((holder, own))
    elif storages:
        report.shared = True


def _function_frames(tb: Any) -> list[Any]:
    """The traceback's function frames; a cell's module-level frame has the user namespace as locals."""
    frames = []
    while tb is not None:
        if tb.tb_frame.f_code.co_flags & inspect.CO_OPTIMIZED:
            frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


def _frames_storages(frames: list[Any], device_type: str) -> dict[int, int]:
    """The distinct device storages the frames hold (one tensor is often in several frames)."""
    values: list[Any] = []
    for f in frames:
        try:
            values += f.f_locals.values()
        except Exception:
            pass
    return _storages(values, device_type)


def release(shell: Any) -> FreeReport:
    """Drop IPython's own references to device tensors, collect, and say how much device memory that freed."""
    b = _backend.active()
    device_type = b.device_type
    before = b.allocated_everywhere()
    report = FreeReport()
    kept = _variables_storages(shell, device_type)
    _drop_output_cache(shell, device_type, report, kept)
    _drop_last_values(shell, device_type, report, kept)
    clear_traceback_frames(shell, device_type, report, kept)
    gc.collect()
    b.synchronize()
    empty = getattr(getattr(torch, device_type, None), "empty_cache", None)
    if empty is not None:
        empty()
    report.allocated = b.allocated_everywhere()
    report.freed = max(before - report.allocated, 0)
    return report


def _drop_output_cache(shell: Any, device_type: str, report: FreeReport, kept: Collection[int]) -> None:
    """``Out[N]`` and ``_N`` of the outputs that hold device tensors."""
    ns, hidden = shell.user_ns, shell.user_ns_hidden
    out = ns.get("Out", {})
    for k, held in [(k, _storages([v], device_type)) for k, v in out.items()]:
        if not held:
            continue
        _dropped(report, f"Out[{k}]", held, kept)
        del out[k]
        for space in (ns, hidden):
            space.pop(f"_{k}", None)


def _drop_last_values(shell: Any, device_type: str, report: FreeReport, kept: Collection[int]) -> None:
    """``_``, ``__`` and ``___``: in the namespace, its hidden copy and the display hook's own."""
    ns, hidden, dh = shell.user_ns, shell.user_ns_hidden, shell.displayhook
    for name in ("_", "__", "___"):
        in_spaces = [space for space in (ns, hidden) if _storages([space.get(name)], device_type)]
        in_hook = _storages([getattr(dh, name, None)], device_type)
        held = _storages([getattr(dh, name, None), *(space[name] for space in in_spaces)], device_type)
        if not held:
            continue
        _dropped(report, name, held, kept)
        for space in in_spaces:
            space[name] = ""
        if in_hook:
            setattr(dh, name, "")


def _last_tracebacks(shell: Any) -> list[tuple[str, Any]]:
    """(holder, traceback) of every distinct last traceback IPython and ``sys`` keep."""
    result = getattr(shell, "last_execution_result", None)
    candidates = (("sys.last_traceback", getattr(sys, "last_traceback", None)),
                  ("sys.last_exc", getattr(getattr(sys, "last_exc", None), "__traceback__", None)),
                  ("InteractiveTB.tb", getattr(shell.InteractiveTB, "tb", None)),
                  ("last_execution_result", getattr(getattr(result, "error_in_exec", None), "__traceback__", None)))
    tbs: list[tuple[str, Any]] = []
    for holder, tb in candidates:
        if tb is not None and all(tb is not t for _, t in tbs):
            tbs.append((holder, tb))
    return tbs


def clear_traceback_frames(shell: Any, device_type: str, report: FreeReport, kept: Collection[int] = ()) -> None:
    """The locals of the last tracebacks' function frames that hold device tensors, each frame once; ``kept``: the
    storages your variables hold (a frame of neuron_lab's often holds the namespace itself)."""
    cleared: set[int] = set()
    for holder, tb in _last_tracebacks(shell):
        frames = [f for f in _function_frames(tb) if id(f) not in cleared]
        held = _frames_storages(frames, device_type)
        if not held:
            continue
        _dropped(report, f"{holder} frames", held, kept)
        for f in frames:
            cleared.add(id(f))
            _clear_frame(f)


def _clear_frame(f: Any) -> None:
    try:
        f.clear()
        f.f_locals  # noqa: B018  (re-syncs the locals snapshot our scan created, dropping its refs)
    except RuntimeError:  # a frame still running
        pass
