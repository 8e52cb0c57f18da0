"""The one interface the workbench sees, whichever `neuron` backend runs underneath.

Magics and widgets call these methods and never ask which implementation they got. What only
one implementation can know (live allocations on the emulator) comes back empty elsewhere,
never as an error.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from neuron_lab.backend.coverage import Coverage
from neuron_lab.backend.events import OpEvent, OpRecorder, OpStats
from neuron_lab.deprecation import renamed
from neuron_lab.kinds import FALLBACK, NATIVE


@dataclass(frozen=True)
class LiveAllocation:
    """One live device storage, as the memory views show it."""

    nbytes: int
    dtype: str | None
    shape: tuple[int, ...] | None
    age_s: float
    site: tuple[str, ...] | None  # creation stack, when site recording is on
    ptr: int  # the storage's data pointer, as ``t.untyped_storage().data_ptr()`` gives it


class NeuronBackend(ABC):
    kind: str  # "emulator" | "torchneuron"
    device_type = "neuron"

    def __init__(self, recorder: OpRecorder) -> None:
        self.recorder = recorder

    # -- identity ----------------------------------------------------------------------------
    @property
    @abstractmethod
    def version(self) -> str: ...

    @property
    def name(self) -> str:
        """The short name status lines show ("emulator", "TorchNeuron 2.14.3.0")."""
        return self.kind

    @property
    def description(self) -> str:
        return f"{self.kind} {self.version}"

    @property
    def detail(self) -> str:
        """What else a status line should say about this backend (the emulator: which core runs)."""
        return ""

    # -- device and memory ---------------------------------------------------------------------
    @abstractmethod
    def device_count(self) -> int: ...

    @abstractmethod
    def capacity(self) -> int:
        """Bytes of device memory on device 0."""

    def synchronize(self) -> None:
        import torch

        torch.neuron.synchronize()

    def memory_stats(self, synchronize: bool = True) -> dict[str, int]:
        """``torch.cuda.memory_stats``-style flat keys, read after a synchronize unless told not to."""
        import torch

        if synchronize:
            self.synchronize()
        return dict(torch.neuron.memory_stats())

    def memory_allocated(self) -> int:
        return self.memory_stats().get("allocated_bytes.all.current", 0)

    def max_memory_allocated(self) -> int:
        return self.memory_stats().get("allocated_bytes.all.peak", 0)

    def memory_sample(self) -> tuple[int, int]:
        """(allocated, peak) bytes as the allocator knows them now: no synchronize, safe from any thread.

        Live views call it several times a second while a cell runs, from their refresh thread.
        """
        st = self.memory_stats(synchronize=False)
        return st.get("allocated_bytes.all.current", 0), st.get("allocated_bytes.all.peak", 0)

    def reset_peak_memory_stats(self) -> None:
        import torch

        torch.neuron.reset_peak_memory_stats()

    def open_peak_window(self) -> object:
        """Start measuring a window's peak allocated bytes (a cell's), for :meth:`close_peak_window`.

        TorchNeuron's allocator keeps one peak counter, so here it is reset: on the real device
        ``torch.neuron.max_memory_allocated()`` counts from the start of the current cell. The emulator
        keeps windows of its own and leaves the user's peak alone.
        """
        self.reset_peak_memory_stats()
        return None

    def close_peak_window(self, window: object) -> int:
        return self.memory_stats(synchronize=False).get("allocated_bytes.all.peak", 0)

    def live_allocations(self) -> list[LiveAllocation]:
        return []

    def record_allocation_sites(self, enabled: bool) -> None:
        """Capture a creation stack for each new allocation (costly; off by default)."""

    # -- ops -----------------------------------------------------------------------------------
    @property
    def coverage(self) -> Coverage | None:
        """The op coverage the emulator reports through; None on a real device (it reports what it does)."""
        return None

    def set_coverage(self, name_or_path: str) -> Coverage:
        raise NotImplementedError(f"the {self.kind} backend reports what the device does; it takes no coverage")

    @property
    def profile(self) -> Coverage | None:
        """Deprecated spelling of :attr:`coverage`."""
        renamed("Backend.profile", "Backend.coverage")
        return self.coverage

    def set_profile(self, name_or_path: str) -> Coverage:
        """Deprecated spelling of :meth:`set_coverage`."""
        renamed("Backend.set_profile()", "Backend.set_coverage()")
        return self.set_coverage(name_or_path)

    def get_fallback_ops(self) -> set[str]:
        """TorchNeuron's API: unique names of ops that ran on the CPU since the last clear."""
        return self.recorder.names(FALLBACK)

    def get_executed_ops(self) -> set[str]:
        return self.recorder.names(NATIVE)

    def clear_op_tracking(self) -> None:
        self.recorder.clear()

    def op_stats(self, kind: str | None = None) -> list[OpStats]:
        return self.recorder.stats(kind)

    def subscribe(self, fn: Callable[[OpEvent, tuple, dict], None],
                  kinds: frozenset[str] | set[str] | None = None) -> Callable[[], None]:
        """Op events of ``kinds`` (default: all) from now on; returns the unsubscribe function.

        On TorchNeuron, ops are only observed while somebody subscribes.
        """
        return self.recorder.subscribe(fn, kinds)

    def op_calls(self) -> int:
        """Ops observed since the process started; never cleared, so windows can diff it."""
        return self.recorder.calls

    def transfer_bytes(self) -> tuple[int, int]:
        """(host-to-device, device-to-host) bytes copied since the last clear."""
        return self.recorder.h2d_bytes, self.recorder.d2h_bytes

    def transfer_totals(self) -> tuple[int, int]:
        """The same since the process started: :meth:`clear_op_tracking` leaves it, so windows can diff it."""
        return self.recorder.transfers_total

    # -- numerics ------------------------------------------------------------------------------
    @property
    def computes_64bit_in_32bit(self) -> bool:
        """Whether float64/int64 ops compute in 32 bits here, as on Trainium (parity checks say so)."""
        return True

    # -- compile -------------------------------------------------------------------------------
    lowering_metric: str | None = None  # the key of a dynamo_metrics() record that times its lowering, in µs

    @property
    def compile_lowerings(self) -> tuple[str, ...]:
        """How this backend can run compiled graphs, default first; () where its compiler offers no choice."""
        return ()

    def set_compile_lowering(self, name: str | None) -> None:
        """Run graphs compiled from now on with lowering ``name`` (None: the backend's default)."""
        raise NotImplementedError(f"the {self.kind} backend compiles graphs with its own compiler; "
                                  "it has no lowering to choose (NeuronLab.compile_lowering applies to the emulator)")

    def dynamo_metrics(self) -> list[dict[str, Any]]:
        import torch

        return list(torch.neuron.get_dynamo_metrics())

    def lowering_us(self) -> int:
        """Microseconds the backend has spent lowering compiled graphs so far, as its own metrics report it.

        A backend may lower a graph at its first call, after Dynamo's compile window closed (the emulator's
        host Inductor does): that is compile time too, which only the backend can tell. 0 where it reports none.
        """
        if self.lowering_metric is None:
            return 0
        return sum(int(m.get(self.lowering_metric) or 0) for m in self.dynamo_metrics())

    def summary(self) -> dict[str, Any]:
        """What `doctor` and the status views print."""
        return {
            "kind": self.kind,
            "version": self.version,
            "devices": self.device_count(),
            "capacity": self.capacity(),
            "coverage": self.coverage.name if self.coverage else None,
        }

    # -- profiling -----------------------------------------------------------------------------
    @property
    def device_timing(self) -> bool:
        """Whether the device's work reaches torch.profiler as device events (lanes, per-op device time)."""
        return True

    def profiler_config(self, output_dir: str) -> str | None:
        """The ``custom_profiler_config`` string to pass torch.profiler (through ``experimental_config``) so that
        the device writes its own profile files into ``output_dir``; None where it writes none (no folder is made)."""
        return None
