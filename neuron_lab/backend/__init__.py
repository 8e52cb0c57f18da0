"""`neuron` on any machine: the real TorchNeuron where installed, the bundled emulator elsewhere.

``activate()`` decides once per process (see :mod:`neuron_lab.backend.selection`) and installs
the emulator when that is the choice; ``active()`` gives the :class:`NeuronBackend` interface.
Nothing here imports IPython.
"""

from __future__ import annotations

import importlib
import threading
import warnings

import torch

from neuron_lab.backend.interface import LiveAllocation, NeuronBackend
from neuron_lab.backend.selection import EMULATOR, NONE, TORCHNEURON, Decision, decide

_lock = threading.RLock()  # re-entrant: importing torch_neuronx may import neuron_lab
_decision: Decision | None = None
_backend: NeuronBackend | None = None


class BackendUnavailable(RuntimeError):
    """No `neuron` backend is active in this process; the message says why."""


def activate() -> Decision:
    """Choose and set up the backend; idempotent. Never raises: a failure becomes the decision.

    The emulator is installed when chosen. For TorchNeuron, ``torch_neuronx`` is imported (a no-op
    when its own autoload ran first), so ``import neuron_lab`` provides `neuron` with autoload off.
    Every problem is also warned about, once: it may be a setting the user expects to take effect.
    """
    global _decision
    with _lock:
        if _decision is not None:
            return _decision
        d = decide()
        try:
            if d.kind == EMULATOR:
                from neuron_lab.backend import emulator

                emulator.install()
            elif d.kind == TORCHNEURON:
                importlib.import_module("torch_neuronx")
                if torch._C._get_privateuse1_backend_name() != "neuron":
                    raise RuntimeError("it imported but did not register the 'neuron' device")
        except Exception as e:
            what = ("the emulator failed to install" if d.kind == EMULATOR
                    else f"torch-neuronx {d.torchneuron_version} is installed, but loading it failed")
            why = f"{what}: {type(e).__name__}: {e}"
            d = Decision(NONE, why, d.torchneuron_version, [*d.problems, why])
        _decision = d
    for problem in d.problems:
        warnings.warn(f"neuron_lab: {problem} (run `neuron-lab doctor` for details)", RuntimeWarning, stacklevel=2)
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
