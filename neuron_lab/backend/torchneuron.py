"""The backend interface over the real TorchNeuron (``torch-neuronx`` >= 2.13.3).

TorchNeuron's own tracking gives sets of op names. While somebody subscribes, a dispatch-mode
observer adds what the sets lack: per-call counts, shapes and dtypes, host time, and the caller's
frame. Fallback is judged the way TorchNeuron's boxed CPU fallback is reached: the op has no
PrivateUse1 kernel. Verified here only against a fake ``torch_neuronx`` that implements the
documented surface; there is no Trainium in CI.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from importlib import metadata

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from neuron_lab.backend.events import DOWNCAST, FALLBACK, NATIVE, OpEvent, OpRecorder
from neuron_lab.backend.interface import NeuronBackend

_WIDE = {torch.float64: "float64", torch.int64: "int64"}


class _Observer(TorchDispatchMode):
    """Sees every op before the backend does; records those that touch a `neuron` tensor."""

    def __init__(self, recorder: OpRecorder) -> None:
        super().__init__()
        self.recorder = recorder
        self._native: dict[str, bool] = {}

    def _has_kernel(self, name: str) -> bool:
        hit = self._native.get(name)
        if hit is None:
            hit = self._native[name] = torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1")
        return hit

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        t0 = time.perf_counter_ns()
        out = func(*args, **kwargs)
        dtypes = [a.dtype for a in _tensors(args, kwargs) if a.device.type == "neuron"]
        if dtypes:
            name = func._schema.name
            overload = func._schema.overload_name
            native = self._has_kernel(func.name())
            host_ns = time.perf_counter_ns() - t0 if not native else 0
            self.recorder.record(name, overload, NATIVE if native else FALLBACK,
                                 "" if native else "no PrivateUse1 kernel: TorchNeuron's boxed CPU fallback runs it",
                                 args, kwargs, host_ns)
            wide = sorted({_WIDE[d] for d in dtypes if d in _WIDE})
            if wide:
                self.recorder.record(name, overload, DOWNCAST, f"{'/'.join(wide)} computed in 32-bit by TorchNeuron",
                                     args, kwargs, 0)
        return out


def _tensors(args, kwargs):
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (b for b in a if isinstance(b, torch.Tensor))


class TorchNeuronBackend(NeuronBackend):
    kind = "torchneuron"

    def __init__(self) -> None:
        import torch_neuronx  # loaded already by TorchNeuron's own autoload

        super().__init__(OpRecorder())
        self._tnx = torch_neuronx
        self._observer: _Observer | None = None
        self._subscribers = 0

    @property
    def version(self) -> str:
        return metadata.version("torch-neuronx")

    @property
    def description(self) -> str:
        return f"TorchNeuron (torch-neuronx {self.version})"

    def device_count(self) -> int:
        return torch.neuron.device_count()

    def capacity(self) -> int:
        return int(torch.neuron.get_device_properties(0).total_memory)

    def get_fallback_ops(self) -> set[str]:
        self.synchronize()
        return set(self._tnx.get_fallback_ops()) | self.recorder.names(FALLBACK)

    def get_executed_ops(self) -> set[str]:
        self.synchronize()
        return set(self._tnx.get_executed_ops()) | self.recorder.names(NATIVE)

    def clear_op_tracking(self) -> None:
        self._tnx.clear_op_tracking()
        self.recorder.clear()

    def subscribe(self, fn: Callable[[OpEvent, tuple, dict], None]) -> Callable[[], None]:
        unsubscribe_recorder = self.recorder.subscribe(fn)
        self._subscribers += 1
        if self._observer is None:
            self._observer = _Observer(self.recorder)
            torch.utils._python_dispatch._push_mode(self._observer)

        def unsubscribe() -> None:
            unsubscribe_recorder()
            self._subscribers -= 1
            if self._subscribers == 0 and self._observer is not None:
                torch.utils._python_dispatch._pop_mode()
                self._observer = None

        return unsubscribe

    def dynamo_metrics(self) -> list[dict]:
        return [dict(m) if isinstance(m, dict) else vars(m) for m in self._tnx.get_dynamo_metrics()]
