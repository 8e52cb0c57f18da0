"""The backend interface over the bundled emulator."""

from __future__ import annotations

import time

from neuron_lab.backend import profiles
from neuron_lab.backend.emulator import runtime as _rt
from neuron_lab.backend.interface import LiveAllocation, NeuronBackend


class EmulatorBackend(NeuronBackend):
    kind = "emulator"

    def __init__(self, rt: _rt.Runtime) -> None:
        super().__init__(rt.recorder)
        self._rt = rt

    @property
    def version(self) -> str:
        from neuron_lab import __version__

        return f"neuron_lab {__version__}"

    @property
    def description(self) -> str:
        return f"emulator (neuron_lab, pure-Python PrivateUse1; profile {self.profile.name})"

    def device_count(self) -> int:
        return 1

    def capacity(self) -> int:
        return self._rt.allocator.capacity

    def memory_sample(self) -> tuple[int, int]:
        a = self._rt.allocator  # two int reads: no lock, no stats dict
        return a.allocated, a.peak

    def open_peak_window(self) -> object:
        return self._rt.allocator.open_window()

    def close_peak_window(self, window: object) -> int:
        return self._rt.allocator.close_window(window)

    def live_allocations(self) -> list[LiveAllocation]:
        now = time.monotonic_ns()
        return [LiveAllocation(a.nbytes, str(a.dtype).removeprefix("torch.") if a.dtype else None, a.shape,
                               (now - a.created_ns) / 1e9, a.site, a.ptr) for a in self._rt.allocator.live()]

    def record_allocation_sites(self, enabled: bool) -> None:
        self._rt.allocator.record_sites = enabled

    @property
    def profile(self) -> profiles.Profile:
        return self._rt.executor.profile

    def set_profile(self, name_or_path: str) -> profiles.Profile:
        p = profiles.load(name_or_path)
        self._rt.executor.set_profile(p)
        return p

    def dynamo_metrics(self) -> list[dict]:
        return [dict(m) for m in self._rt.dynamo_metrics]
