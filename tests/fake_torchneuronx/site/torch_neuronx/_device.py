"""The fake's `neuron` device, built from neuron_lab's emulator parts used as a library.

What the real package does in C++ (allocator, copies, views, a set of device kernels, one boxed
CPU fallback) is assembled here from neuron_lab's Allocator, HostBridge and Executor. The fake
registers its *own* device module (``torch_neuronx.neuron``), hooks and op tracking, and never
calls ``neuron_lab.backend.emulator.install()``, so neuron_lab sees a foreign `neuron` backend,
exactly as it would see the real one.

Which ops count as executed and which as fallback follows from the registrations alone: every
kernel registered at PrivateUse1 (neuron_lab's DIRECT_OPS and copies) notes its op as executed;
every other op reaches the boxed fallback and is noted as a fallback. Device plumbing (empty,
set_, resize_, views, ``.item()``) gets real PrivateUse1 kernels too and is not tracked, as in the
real package, whose tracker skips metadata ops.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch

from torch_neuronx import _host_kernels, _runtime, _tracking

CAPACITY = 24 * 1024**3  # one Trn2 logical NeuronCore's HBM


@dataclass
class State:
    allocator: Any
    executor: Any
    libraries: list[Any] = field(default_factory=list)
    hooks: list[Any] = field(default_factory=list)
    published_stats: dict[str, Any] = field(default_factory=dict)  # memory stats as of the last synchronize
    synchronize_calls: int = 0
    dynamo_metrics: list[Any] = field(default_factory=list)


STATE: State | None = None


def state() -> State:
    if STATE is None:
        raise RuntimeError("torch_neuronx (fake): the neuron device is not registered in this process "
                           "(another PrivateUse1 backend was imported first)")
    return STATE


class _TrackedLibrary:
    """A ``torch.library.Library`` whose PrivateUse1 kernels note their op as executed."""

    def __init__(self, lib: torch.library.Library) -> None:
        self.lib = lib

    def impl(self, name: str, fn, key: str) -> None:
        self.lib.impl(name, functools.wraps(fn)(_tracking.registered_kernel(name, fn)), key)


def _register_plumbing(executor, lib: torch.library.Library) -> None:
    """Give the device plumbing neuron_lab reaches through its fallback real PrivateUse1 kernels."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for full in torch._C._dispatch_get_all_op_names():
        base = full.split(".")[0]
        fn = executor.native.get(base)
        if fn is None or has(full, "PrivateUse1") or has(full, "CompositeImplicitAutograd"):
            continue
        qual = full.removeprefix("aten::")
        packet, _, overload = qual.partition(".")
        op = getattr(getattr(torch.ops.aten, packet), overload or "default")
        lib.impl(qual, functools.partial(fn, op), "PrivateUse1")


def register() -> None:
    """Claim PrivateUse1 as `neuron` and set the device up; the caller checked nobody owns it."""
    global STATE
    torch.utils.rename_privateuse1_backend("neuron")
    # Imported after the rename: these modules build torch.device("neuron") at import.
    from neuron_lab.backend.emulator import autocast, native
    from neuron_lab.backend.emulator.memory import Allocator
    from neuron_lab.backend.emulator.ops import Executor
    from neuron_lab.backend.emulator.python_core import Guard, Hooks
    from neuron_lab.backend.events import OpRecorder
    from torch_neuronx import neuron

    class TrackingExecutor(Executor):
        def fallback(self, op, *args, **kwargs):  # the boxed PrivateUse1 CPU fallback
            if op._schema.name not in self.native:
                _tracking.note_fallback(_tracking.qualified(op._schema.name, op._schema.overload_name))
            return super().fallback(op, *args, **kwargs)

    class NrtAllocator(Allocator):
        """The real allocator's counters and OOM (csrc/core/allocator/NeuronCachingAllocator.cpp:39-88, the OOM at
        :82-88; csrc/core/metrics/NeuronMetrics.cpp RecordNewAllocation/RecordDeallocation): a tensor's bytes count as
        allocated and active, nothing as reserved (April's reserved_bytes is "currently unused"); past ``capacity``
        (set it in a test: ``_device.state().allocator.capacity = n``) it raises the real RuntimeError."""

        def _register(self, *args, **kwargs):  # a device allocation starts the runtime (tnx
            _runtime.lazy_init()  # csrc/aten/NeuronNativeFunctions.cpp:252, maybe_lazy_init)
            return super()._register(*args, **kwargs)

        def _check_capacity(self, nbytes: int) -> None:
            self.settle()
            if self.allocated + nbytes > self.capacity:
                self.num_ooms += 1
                raise RuntimeError(f"NRT allocation failed for size {nbytes} (OOM)")

        def nested_stats(self) -> dict[str, Any]:
            """The dict _C._get_memory_stats returns (NeuronBindings.cpp:1239-1260)."""
            self.settle()
            tensor_bytes = {"current": self.allocated, "peak": self.peak, "allocated": self.total_allocated,
                            "freed": self.total_freed}
            return {"allocated_bytes": dict(tensor_bytes), "reserved_bytes": dict.fromkeys(tensor_bytes, 0),
                    "active_bytes": dict(tensor_bytes), "num_alloc_retries": 0, "num_ooms": self.num_ooms,
                    "num_tensor_frees": self.n_free, "allocation_requests": self.n_alloc}

    allocator = NrtAllocator(capacity=CAPACITY)
    # The executor's own recorder and classification are private to the fake; nothing reads them.
    executor = TrackingExecutor(allocator, OpRecorder(), lambda name, dtypes: ("native", "", ()))
    STATE = State(allocator, executor, hooks=[Hooks(), Guard()])

    torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=False)
    torch._register_device_module("neuron", neuron)
    torch._C._acc.register_python_privateuseone_hook(STATE.hooks[0])
    torch._C._acc.register_python_privateuseone_device_guard(STATE.hooks[1])

    fallback_lib = torch.library.Library("_", "IMPL")
    fallback_lib.fallback(executor.fallback, "PrivateUse1")
    aten_lib = torch.library.Library("aten", "IMPL")
    native.install_native(executor, _TrackedLibrary(aten_lib))
    _register_plumbing(executor, aten_lib)
    autocast.install(aten_lib, fallback_lib)
    _host_kernels.register(aten_lib)
    STATE.libraries += [fallback_lib, aten_lib]
    STATE.published_stats = allocator.nested_stats()
