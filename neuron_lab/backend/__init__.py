"""`neuron` on any machine: the real TorchNeuron where installed, the bundled emulator elsewhere.

``activate()`` decides once per process (see :mod:`neuron_lab.backend.selection`) and installs
the emulator when that is the choice; ``active()`` gives the :class:`NeuronBackend` interface.
Nothing here imports IPython.
"""

from __future__ import annotations

import threading

from neuron_lab.backend.interface import LiveAllocation, NeuronBackend
from neuron_lab.backend.selection import EMULATOR, NONE, TORCHNEURON, Decision, decide

_lock = threading.Lock()
_decision: Decision | None = None
_backend: NeuronBackend | None = None


class BackendUnavailable(RuntimeError):
    """No `neuron` backend is active in this process; the message says why."""


def activate() -> Decision:
    """Choose and set up the backend; idempotent. Raises only on an emulator install failure."""
    global _decision
    with _lock:
        if _decision is not None:
            return _decision
        d = decide()
        if d.kind == EMULATOR:
            from neuron_lab.backend import emulator

            try:
                emulator.install()
            except Exception as e:
                d = Decision(NONE, f"the emulator failed to install: {type(e).__name__}: {e}",
                             d.torchneuron_version, [*d.problems, f"emulator install failed: {e}"])
                _decision = d
                raise
        _decision = d
        return d


def note_problem(problem: str) -> None:
    """Keep an autoload or setup problem for `doctor` to show."""
    global _decision
    if _decision is None:
        _decision = Decision(NONE, "activation failed", None, [problem])
    else:
        _decision.problems.append(problem)


def state() -> Decision:
    """The decision made for this process (activating if nothing decided yet)."""
    return _decision if _decision is not None else activate()


def active() -> NeuronBackend:
    """The interface to the active backend."""
    global _backend
    if _backend is not None:
        return _backend
    d = state()
    if d.kind == EMULATOR:
        from neuron_lab.backend.emulated import EmulatorBackend
        from neuron_lab.backend.emulator import runtime

        _backend = EmulatorBackend(runtime.get())
    elif d.kind == TORCHNEURON:
        from neuron_lab.backend.torchneuron import TorchNeuronBackend

        try:
            _backend = TorchNeuronBackend()
        except Exception as e:
            raise BackendUnavailable(f"{d.reason}, but it failed to load: {type(e).__name__}: {e}") from e
    else:
        raise BackendUnavailable(f"no neuron backend is active: {d.reason}")
    return _backend


def is_active() -> bool:
    return state().kind != NONE


__all__ = ["BackendUnavailable", "Decision", "LiveAllocation", "NeuronBackend", "activate", "active", "is_active",
           "note_problem", "state"]
