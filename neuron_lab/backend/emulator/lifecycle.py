"""When the emulated Neuron runtime counts as started, as TorchNeuron's does: lazily, at the user's first device use.

TorchNeuron starts NRT at the first device use (a device allocation, ``torch.neuron.init()``,
``get_device_properties``, ...), and its ``neuron`` process group refuses to start after that
(tnx ``torch_neuronx/__init__.py:130-183``, ``distributed/backend.py:292-295``), so code that touches the
device before ``init_process_group`` fails on hardware: here it fails the same way. neuron_lab's own reads
(capacity, memory samples, its per-cell sync) go to the emulator's runtime, not through here, so loading
the extension starts nothing.

A device use is seen without a hook on the op path: ``torch.neuron`` entry points mark it (:func:`ensure`);
tensors are seen when asked (:func:`started`): an op was recorded, bytes were transferred, or memory was
allocated since the emulator installed (a peak window opened then).

Forking after the start: TorchNeuron marks the child "in a bad fork" and its ``_lazy_init`` raises. The
emulator raises at the child's first ``torch.neuron`` entry point *and* at its first op on a device
tensor; TorchNeuron checks only in ``_lazy_init`` (its ops reach NRT, whose state a forked child does not
own), and its April build's hook, ``_after_fork(arg)`` under ``os.register_at_fork`` (which passes no
argument), does not run at all. Stricter here is the safe side: code that works on the emulator does not
rely on a forked child using the device.
"""

from __future__ import annotations

import os
import threading

from neuron_lab.backend.emulator import runtime as _rt

# TorchNeuron's words (torch_neuronx/__init__.py:_lazy_init), so code that matches them matches here too
BAD_FORK = ("Cannot re-initialize Neuron runtime in forked subprocess. "
            "To use Neuron with multiprocessing, use the 'spawn' start method")
BEFORE_PROCESS_GROUP = "Neuron runtime should not be initialized before the init_process_group."

_lock = threading.RLock()
_started = False
_pid = 0
_bad_fork = False
_windows: list[int] | None = None  # a peak window per device of the emulator's memory, opened at install


def watch() -> None:
    """Called once, when the emulator installs: from now on, memory allocated means the device was used."""
    global _windows
    _windows = _open_windows(_rt.get())
    os.register_at_fork(before=_settle, after_in_child=_after_fork_in_child)


def _used() -> bool:
    """Whether user code touched a device tensor since :func:`watch` (reading the counters starts nothing)."""
    global _windows
    rt = _rt.get()
    rec = rt.recorder
    if rec.calls or any(rec.transfers_total):
        return True
    if _windows is None:
        return False
    peak = max(rt.memory.close_window(w) for w in _windows)
    _windows = None if peak else _open_windows(rt)
    return peak > 0


def _open_windows(rt: _rt.Runtime) -> list[int]:
    """A peak window on every device: an allocation on any of them is a device use."""
    return [rt.memory.open_window(d) for d in range(rt.devices.device_count())]


def started() -> bool:
    """``torch_neuronx.is_neuron_runtime_initialized()``: False until the user's first device use."""
    global _started, _pid
    if _started or _bad_fork or not _rt.installed():
        return _started
    with _lock:
        if not _started and _used():
            _started, _pid = True, os.getpid()
    return _started


def ensure() -> None:
    """TorchNeuron's ``_lazy_init``: start the runtime; in a child forked after it started, refuse."""
    global _started, _pid
    if _bad_fork:
        raise RuntimeError(BAD_FORK)
    with _lock:
        _started, _pid = True, os.getpid()


def in_bad_fork() -> bool:
    return _bad_fork


def check_before_process_group() -> None:
    """What TorchNeuron's first ``neuron`` process group asserts, then it starts the runtime."""
    assert not started(), BEFORE_PROCESS_GROUP
    ensure()


def _settle() -> None:
    """Before a fork, in the parent: decide whether the runtime started, so the child need only read a flag."""
    started()


def _after_fork_in_child() -> None:
    global _started, _bad_fork
    if _started and _pid != os.getpid():
        _started, _bad_fork = False, True
        _rt.get().recorder.subscribe(_refuse)  # any op on a device tensor in this child now raises


def _refuse(*_event: object) -> None:
    raise RuntimeError(BAD_FORK)
