"""The backend interface over the bundled emulator."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from neuron_lab.backend import coverage
from neuron_lab.backend.emulator import oom_watch
from neuron_lab.backend.emulator import runtime as _rt
from neuron_lab.backend.emulator.device_index import index_of
from neuron_lab.backend.interface import DeviceSpec, LiveAllocation, NeuronBackend, device_index
from neuron_lab.backend.memory_reading import FLAT_KEYS, MemoryReading
from neuron_lab.units import parse_size


class EmulatorBackend(NeuronBackend):
    kind = "emulator"
    lowering_metric = "torch_neuronx_lower_us"  # emulator/lowering.py records lowering as TorchNeuron spells it

    def __init__(self, rt: _rt.Runtime) -> None:
        super().__init__(rt.recorder)
        self._rt = rt

    @property
    def version(self) -> str:
        from neuron_lab._version import __version__

        return f"neuron_lab {__version__}"

    @property
    def computes_64bit_in_32bit(self) -> bool:
        """By default, as TorchNeuron does; NEURON_LAB_EMULATE_DOWNCAST=0 (read once, at install) keeps 64-bit exact."""
        return self._rt.emulate_downcast

    @property
    def differs_from_trainium(self) -> str:
        numerics = ("" if self._rt.emulate_downcast
                    else ", exact 64-bit numerics (TorchNeuron computes them in 32 bits; NEURON_LAB_EMULATE_DOWNCAST=0 "
                         "is set)")
        return ("synchronous execution (on Trainium an error or a slow op shows at a later sync), no Adaptive Eager "
                f"fusion{numerics}")

    tells_collectives = True

    def collective_waiting(self) -> dict[str, Any] | None:
        from neuron_lab.backend.emulator import distributed

        return distributed.waiting_in()

    @property
    def timing_note(self) -> str:
        """Every op runs on this machine's CPU, so a time says nothing of a NeuronCore's speed."""
        return "emulator: host CPU timings"

    @property
    def device_clock(self) -> str:
        """The emulator's kernels run on the host CPU: its device lanes are host time."""
        return "host"

    @property
    def device_timing(self) -> bool:
        """The compiled core adds device lanes through PyTorch's PrivateUse1 profiler hooks, which are C++ only
        (``csrc/profiler/profiler.cpp``): the pure-Python core has none to add, its ops are host work."""
        return self._rt.core == _rt.COMPILED

    @property
    def device_lanes(self) -> str:
        if not self.device_timing:
            return ("no device time: the pure-Python core adds no device lanes to torch.profiler (its ops are host "
                    "work; the compiled core adds them)")
        return ("device lanes: the emulator's own, its kernels run and timed on the host CPU; on a Trn instance the "
                "device profile is in Neuron Explorer")

    def oom_asked(self, error: BaseException) -> int | None:
        """The emulator's allocators (both cores) say "tried to allocate 96.00 MiB": the size to two decimals."""
        m = re.search(r"out of memory \(emulated\): tried to allocate ([\d.]+ \w+);", str(error))
        return parse_size(m[1]) if m else None

    def watch_ooms(self, watcher: Callable[[BaseException], None]) -> Callable[[], None]:
        """Both cores' allocators raise one ``torch.OutOfMemoryError``: every one is heard (:mod:`oom_watch`)."""
        return oom_watch.subscribe(watcher)

    @property
    def core(self) -> str:
        """Which core runs the device: "compiled" or "python"."""
        return self._rt.core

    @property
    def core_reason(self) -> str:
        return self._rt.core_reason

    @property
    def detail(self) -> str:
        return "compiled core" if self._rt.core == "compiled" else f"pure-Python core ({self._rt.core_reason})"

    @property
    def description(self) -> str:
        core = "compiled core" if self._rt.core == "compiled" else "pure-Python core"
        return f"emulator (neuron_lab, {core}; {self._rt.topology.summary}; coverage {self.coverage.name})"

    def device_count(self) -> int:
        return self._rt.devices.device_count()

    def synchronize(self, device: DeviceSpec = None) -> None:
        """Nothing is queued on the emulator; and neuron_lab's own sync is not the user's first device use. Counted
        as TorchNeuron's would be."""
        self.synchronizes += 1

    def capacity(self) -> int:
        return self._rt.memory.capacity_of(self._rt.devices.current_device())

    def memory_reading(self, device: DeviceSpec = None, synchronize: bool = True) -> MemoryReading:
        """The reading's counters alone (:data:`FLAT_KEYS`), not the whole ``memory_stats()``: two a tracked cell,
        and the memory sampler's."""
        index = device_index(device)
        if synchronize:
            self.synchronize(index)
        return MemoryReading(*self._rt.memory.values(index_of(index), FLAT_KEYS))

    peak_note = None  # the emulator's peak windows leave the user's counter alone

    def open_peak_window(self, device: DeviceSpec = None) -> object:
        index = device_index(device)
        return self._rt.memory.open_window(self._rt.devices.current_device() if index is None else index)

    def close_peak_window(self, window: object) -> int:
        return self._rt.memory.close_window(window)

    def live_allocations(self) -> list[LiveAllocation]:
        now = time.monotonic_ns()
        return [LiveAllocation(a.nbytes, str(a.dtype).removeprefix("torch.") if a.dtype else None, a.shape,
                               max(now - a.created_ns, 0) / 1e9, a.site, a.ptr) for a in self._rt.memory.live()]

    def record_allocation_sites(self, enabled: bool) -> None:
        self._rt.memory.set_record_sites(enabled)

    @property
    def coverage(self) -> coverage.Coverage:
        return self._rt.coverage

    def set_coverage(self, name_or_path: str) -> coverage.Coverage:
        c = coverage.load(name_or_path)
        self._rt.set_coverage(c)
        return c

    def summary(self) -> dict:
        return {**super().summary(), "core": self._rt.core, "core_reason": self._rt.core_reason,
                "topology": self._rt.topology.summary}

    def attention_dropout_mask(self, philox_seed: Any, shape: tuple[int, ...], p: float) -> Any:
        from neuron_lab.backend.emulator import attention

        return attention.dropout_mask(philox_seed.cpu(), shape, p)

    @property
    def compile_lowerings(self) -> tuple[str, ...]:
        from neuron_lab.backend.emulator import lowering

        return lowering.LOWERINGS

    def set_compile_lowering(self, name: str | None) -> None:
        from neuron_lab.backend.emulator import lowering

        lowering.set_lowering(name)

    def dynamo_metrics(self) -> list[dict]:
        return [dict(m) for m in self._rt.dynamo_metrics]
