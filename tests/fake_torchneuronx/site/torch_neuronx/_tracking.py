"""TorchNeuron's op tracking: two process-global sets of unique op names, no counts, no call sites.

Filled the way the real package fills them: a name enters the fallback set when an op reaches the
boxed PrivateUse1 CPU fallback (metadata/view ops excepted), and the executed set when an op runs
through a kernel the device registered. Nothing here knows about neuron_lab's recorder or profiles.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

_lock = threading.Lock()
_fallback: set[str] = set()
_executed: set[str] = set()


def note_fallback(name: str) -> None:
    with _lock:
        _fallback.add(name)


def note_executed(name: str) -> None:
    with _lock:
        _executed.add(name)


def qualified(name: str, overload: str = "") -> str:
    """How TorchNeuron names an op in its sets: ``toString(operator_name())``, the overload included
    ("aten::atan2.out"; tnx:csrc/core/NeuronBindings.cpp:233), the registered ``aten_name`` for a Python op
    ("aten::add.Tensor"; tnx:python_ops/base.py:826, python_ops/auto_registration.py:91)."""
    return f"{name}.{overload}" if overload and overload != "default" else name


def _complex(args: tuple, kwargs: dict) -> bool:
    return any(isinstance(a, torch.Tensor) and a.is_complex() for a in (*args, *kwargs.values()))


# Registered Python ops whose implementations cannot handle some arguments: Operation.__call__ then runs them on the
# CPU and records the registered name in the fallback set (tnx:python_ops/base.py:732-829; RELEASE default
# TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS=0). Which ops and arguments is this fake's choice.
CPU_FOR: dict[str, Callable[[tuple, dict], bool]] = {
    "aten::add.Tensor": _complex,
    "aten::mul.Tensor": _complex,
}


def registered_kernel(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, a kernel registered at PrivateUse1 for ``name`` ("add.Tensor"), noting each call as TorchNeuron does:
    executed, or (for arguments :data:`CPU_FOR` says it cannot handle) run on the CPU and noted as a fallback."""
    op = "aten::" + name
    gate = CPU_FOR.get(op.removesuffix(".default"))

    def kernel(*args: Any, **kwargs: Any) -> Any:
        if gate is not None and gate(args, kwargs):
            note_fallback(op)  # the fake's device computes on host memory: the CPU run is the same computation
        else:
            note_executed(op.split(".")[0])
        return fn(*args, **kwargs)

    return kernel


def get_fallback_ops() -> set[str]:
    """Unique names (``"aten::atan2.out"``) of ops that ran on the CPU since the last clear."""
    with _lock:
        return set(_fallback)


def get_executed_ops() -> set[str]:
    with _lock:
        return set(_executed)


def clear_op_tracking() -> None:
    with _lock:
        _fallback.clear()
        _executed.clear()
