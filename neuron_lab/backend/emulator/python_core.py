"""The pure-Python core: one `neuron` device set up from Python alone, the fallback when the compiled
core is not built or does not load.

It registers what a C++ backend registers at load time, as far as Python may: the hooks, a device
guard, and one boxed fallback that runs every op on zero-copy host aliases (``ops.Executor``).
What only C++ can register (a second device, device generators, pinned memory, in-place storage
resize) is missing here, and asking for it is a clear error that names the compiled core.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from neuron_lab.backend.emulator.ops import Classify


class Hooks(torch._C._acc.PrivateUse1Hooks):
    """PrivateUse1HooksInterface as far as Python may override it: one always-available device."""

    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class Guard(torch._C._acc.DeviceGuard):
    """The Python device guard: one device, so only its type matters."""

    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


class PythonDevices:
    """One device, ``neuron:0``; its generator is the executor's."""

    def __init__(self, generator: torch.Generator, why_not_compiled: str, compiled_devices: int) -> None:
        self._generator = generator
        self._why = why_not_compiled
        self._compiled_devices = compiled_devices

    def device_count(self) -> int:
        return 1

    def current_device(self) -> int:
        return 0

    def set_device(self, index: int) -> None:
        self.check(index)

    def check(self, index: int) -> int:
        if index != 0:
            raise ValueError(self.one_device(index))
        return 0

    def one_device(self, index: int) -> str:
        return (f"Invalid device id {index}: the neuron emulator's pure-Python core has one device (neuron:0); "
                f"the compiled core would give {self._compiled_devices}, but {self._why}")

    def generator(self, index: int) -> torch.Generator:
        self.check(index)
        return self._generator


_keep: list[object] = []  # the hook and guard objects must outlive registration


def install(capacity: int, classify: Classify, why_not_compiled: str,
            compiled_devices: int, emulate_downcast: bool) -> dict[str, object]:
    """Register the pure-Python core; returns the pieces the runtime holds."""
    from neuron_lab.backend.emulator import native
    from neuron_lab.backend.emulator.memory import Allocator
    from neuron_lab.backend.emulator.ops import Executor
    from neuron_lab.backend.events import OpRecorder

    _keep.extend([Hooks(), Guard()])
    torch._C._acc.register_python_privateuseone_hook(_keep[-2])
    torch._C._acc.register_python_privateuseone_device_guard(_keep[-1])
    allocator, recorder = Allocator(capacity), OpRecorder()
    executor = Executor(allocator, recorder, classify, emulate_downcast)
    fallback_lib = torch.library.Library("_", "IMPL")
    fallback_lib.fallback(executor.fallback, "PrivateUse1")
    aten_lib = torch.library.Library("aten", "IMPL")
    native.install_native(executor, aten_lib)
    devices = PythonDevices(executor.generator, why_not_compiled, compiled_devices)
    return dict(memory=allocator, recorder=recorder, devices=devices, bridge=executor.bridge,
                on_coverage=lambda coverage: executor.set_coverage(coverage.abort_ops()),
                libraries=[fallback_lib, aten_lib])
