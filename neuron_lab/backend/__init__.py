"""`neuron` on any machine: the real TorchNeuron where installed, the bundled emulator elsewhere.

``activate()`` decides once per process (see :mod:`neuron_lab.backend.selection`), then installs
the emulator or imports ``torch_neuronx``, whichever was chosen; it never raises (a failure is a
problem that ``neuron-lab doctor`` lists). ``active()`` gives the :class:`NeuronBackend` interface.
Nothing here imports IPython.
"""

from __future__ import annotations

import threading
import warnings
from typing import TYPE_CHECKING

from neuron_lab.backend import foreign, torchneuron_env
from neuron_lab.backend.selection import EMULATOR, NONE, TORCHNEURON, Decision, decide

if TYPE_CHECKING:  # the interface brings in torch, which nothing here needs before activate()
    from neuron_lab.backend.interface import NeuronBackend

_lock = threading.RLock()  # re-entrant: importing torch_neuronx may import neuron_lab
_decision: Decision | None = None
_backend: NeuronBackend | None = None


class BackendUnavailable(RuntimeError):
    """No `neuron` backend is active in this process; the message says why."""


def activate() -> Decision:
    """Choose and set up the backend; idempotent. Never raises: a failure becomes the decision (only a
    Ctrl-C the user presses meanwhile interrupts, as it should).

    The emulator is installed when chosen. For TorchNeuron, ``torch_neuronx`` is imported (a no-op
    when its own autoload ran first), so ``import neuron_lab`` provides `neuron` with autoload off.
    Every problem is also warned about, once: it may be a setting the user expects to take effect.
    """
    global _decision
    with _lock:
        import torch  # first: its autoload may call this on the same thread, which the re-entrant lock lets through

        if _decision is not None:
            return _decision
        try:
            d = decide()
        except Exception as e:  # an unreadable install, or a bug: no backend, and the reason for `doctor`
            why = f"choosing the neuron backend failed: {type(e).__name__}: {e}"
            d = Decision(NONE, why, None, [why])
        try:
            if d.kind == EMULATOR:
                from neuron_lab.backend import emulator

                d.problems.extend(emulator.install().problems)
            elif d.kind == TORCHNEURON:
                torchneuron_env.record_before_import()  # doctor then knows which settings torch_neuronx set
                foreign.import_module("torch_neuronx")  # its sys.exit() or own KeyboardInterrupt: an error
                if torch._C._get_privateuse1_backend_name() != "neuron":
                    raise RuntimeError("it imported but did not register the 'neuron' device")
        except Exception as e:
            what = ("the emulator failed to install" if d.kind == EMULATOR
                    else f"torch-neuronx {d.torchneuron_version} is installed, but loading it failed")
            detail = str(e) if isinstance(e, foreign.ForeignImportError) else f"{type(e).__name__}: {e}"
            why = f"{what}: {detail}"
            d = Decision(NONE, why, d.torchneuron_version, [*d.problems, why])
        _decision = d
    for problem in d.problems:
        try:
            warnings.warn(f"neuron_lab: {problem} (run `neuron-lab doctor` for details)", RuntimeWarning,
                          stacklevel=2)
        except Exception:  # `-W error`: the warning would end `import torch`; `doctor` still lists the problem
            pass
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
        from neuron_lab.backend.emulator import runtime
        from neuron_lab.backend.emulator_backend import EmulatorBackend

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


__all__ = ["BackendUnavailable", "Decision", "activate", "active", "is_active",
           "note_problem", "state"]
