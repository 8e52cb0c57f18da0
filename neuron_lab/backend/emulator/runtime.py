"""The emulator's one per-process state: allocator, executor, recorder and compile metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from neuron_lab.backend.emulator.memory import Allocator
    from neuron_lab.backend.emulator.ops import Executor
    from neuron_lab.backend.events import OpRecorder


@dataclass
class Runtime:
    allocator: Allocator
    recorder: OpRecorder
    executor: Executor
    libraries: list[Any] = field(default_factory=list)  # torch.library registrations, kept alive
    dynamo_metrics: list[dict[str, Any]] = field(default_factory=list)


_runtime: Runtime | None = None


def get() -> Runtime:
    if _runtime is None:
        raise RuntimeError("the neuron emulator is not installed in this process")
    return _runtime


def set_runtime(rt: Runtime) -> None:
    global _runtime
    _runtime = rt


def installed() -> bool:
    return _runtime is not None
