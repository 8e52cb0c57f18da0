"""TorchNeuron's op tracking: two process-global sets of unique op names, no counts, no call sites.

Filled the way the real package fills them: a name enters the fallback set when an op reaches the
boxed PrivateUse1 CPU fallback (metadata/view ops excepted), and the executed set when an op runs
through a kernel the device registered. Nothing here knows about neuron_lab's recorder or profiles.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_fallback: set[str] = set()
_executed: set[str] = set()


def note_fallback(name: str) -> None:
    with _lock:
        _fallback.add(name)


def note_executed(name: str) -> None:
    with _lock:
        _executed.add(name)


def get_fallback_ops() -> set[str]:
    """Unique names (``"aten::atan2"``) of ops that ran through the CPU fallback since the last clear."""
    with _lock:
        return set(_fallback)


def get_executed_ops() -> set[str]:
    with _lock:
        return set(_executed)


def clear_op_tracking() -> None:
    with _lock:
        _fallback.clear()
        _executed.clear()
