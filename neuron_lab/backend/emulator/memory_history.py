"""``torch.neuron.memory``: memory history and snapshots, as ``torch.cuda.memory`` records and exports them.

It also holds the memory functions (``memory_stats`` ...), as TorchNeuron's does; ``device_module`` puts them here.

A snapshot has the keys and values of ``torch.cuda.memory._snapshot()``, so PyTorch's own viewers read it:
``python -m torch.cuda._memory_viz trace_plot snap.pickle -o snap.html``, or drag the pickle onto
pytorch.org/memory_viz. On the compiled core the segments are those of the emulated caching allocator (one per
live block, its size class; freed segments stay cached, inactive, until ``empty_cache()``), at addresses in the
emulated device's own address space: a cached segment keeps its address when reused, and these are not the host
pointers ``data_ptr()`` returns. The pure-Python core has no cache: one segment per allocation, rounded to 512 B,
at the storage's ``data_ptr()``, released when the storage dies. Stacks are Python frames of the allocating code,
innermost first; the emulator's own frames are left out.
"""

from __future__ import annotations

import os
import pickle
import sys
from inspect import signature
from typing import Any

from neuron_lab.backend.emulator import runtime as _rt

_CONTEXTS = {None: 0, "state": 1, "alloc": 2, "all": 3}  # the cores' levels: stacks of nothing .. of frees too
_ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom"}
_SKIPPED: list[str] = []  # skip_actions of the recording: left out of the snapshot's history
_EMULATOR_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _record_memory_history(enabled: str | None = "all", *args: Any, **kwargs: Any) -> None:
    """Record allocator history for every emulated device, as :func:`torch.cuda.memory._record_memory_history`.

    Args:
        enabled: ``None`` stops recording and clears the history; ``"state"`` keeps stacks of live memory only;
            ``"all"`` also keeps a history of every alloc/free (the last ``max_entries``).
        context: ``None``, ``"state"`` (stacks of live blocks), ``"alloc"`` (and of allocations in the history)
            or ``"all"`` (and of frees).
        stacks: ``"python"`` or ``"all"``; both record Python frames (the emulated device has no device-side C++
            stack to show).
        max_entries: history entries kept per device; older ones are overwritten.
        device: accepted for compatibility; history is recorded for every device, as on CUDA.
        clear_history: empty the history when enabling.
        compile_context, global_record_annotations: accepted; the emulator has no compile or annotation context.
        skip_actions: actions left out of the history (``["free_requested", "free_completed"]``, say).

    A bool ``enabled`` takes CUDA's legacy arguments (``record_context``, ``trace_alloc_max_entries``,
    ``trace_alloc_record_context``, ...).
    """
    if isinstance(enabled, bool):
        _record_legacy(enabled, *args, **kwargs)
    else:
        _record(enabled, *args, **kwargs)


def _record(enabled: str | None = "all", context: str | None = "all", stacks: str = "all",
            max_entries: int = sys.maxsize, device: Any = None, clear_history: bool = False,
            compile_context: bool = False, global_record_annotations: bool = False,
            skip_actions: list[str] | None = None) -> None:
    # CUDA's checks and messages (torch/csrc/cuda/memory_snapshot.cpp), raised as RuntimeError the same way
    if enabled is not None and enabled not in ("state", "all"):
        raise RuntimeError("expected state to be 'state', 'all', or None")
    if context is not None and context not in _CONTEXTS:
        raise RuntimeError("expected context to be 'state', 'alloc', 'all', or None")
    if stacks not in ("python", "all"):
        raise RuntimeError("expected stacks to be 'python', or 'all'")
    unknown = sorted(set(skip_actions or ()) - _ACTIONS)
    if unknown:
        raise RuntimeError(f"skip_actions: unknown action {', '.join(map(repr, unknown))}; actions: "
                           f"{', '.join(sorted(_ACTIONS))}")
    _SKIPPED[:] = sorted(skip_actions or ()) if enabled is not None else []
    _rt.get().memory.record_history(enabled is not None, _CONTEXTS[context],
                                    max_entries if enabled == "all" else 1, clear_history)


def _record_legacy(enabled: bool, record_context: bool = True, trace_alloc_max_entries: int = 1,
                   trace_alloc_record_context: bool = False, device: Any = None, record_context_cpp: bool = False,
                   clear_history: bool = False) -> None:
    context = 2 if trace_alloc_record_context else 1 if record_context else 0
    _rt.get().memory.record_history(enabled, context, trace_alloc_max_entries, clear_history)


_record_memory_history.__signature__ = signature(_record)  # type: ignore[attr-defined]  (as CUDA's)


def _snapshot(device: Any = None, augment_with_fx_traces: bool = False) -> dict[str, Any]:
    """The allocator state of every emulated device and its recorded history, as ``torch.cuda.memory._snapshot()``.

    ``{"segments": [...], "device_traces": [[...] per device], ...}``; ``device`` is accepted for compatibility
    (every device is included, as on CUDA).
    """
    snap = _rt.get().memory.snapshot()
    for seg in snap["segments"]:
        seg["frames"] = _users(seg["frames"])
        for block in seg["blocks"]:
            block["frames"] = _users(block["frames"])
    snap["device_traces"] = [[{**e, "frames": _users(e["frames"])} for e in trace if e["action"] not in _SKIPPED]
                             for trace in snap["device_traces"]]
    if augment_with_fx_traces:
        from torch._utils import _augment_memory_snapshot_stack_traces

        snap = _augment_memory_snapshot_stack_traces(snap)
    return snap


def _dump_snapshot(filename: str = "dump_snapshot.pickle", augment_with_fx_traces: bool = False) -> None:
    """Pickle :func:`_snapshot` to ``filename``, for pytorch.org/memory_viz or ``python -m torch.cuda._memory_viz``."""
    snap = _snapshot(augment_with_fx_traces=augment_with_fx_traces)
    with open(filename, "wb") as f:
        pickle.dump(snap, f)


def _users(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The frames outside the emulator: where the user's code (or PyTorch's) allocated."""
    return [f for f in frames if not f["filename"].startswith(_EMULATOR_DIR)]
