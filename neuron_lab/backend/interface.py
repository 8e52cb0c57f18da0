"""The one interface the workbench sees, whichever `neuron` backend runs underneath.

Magics and widgets call these methods and never ask which implementation they got. What only
one implementation can know (live allocations on the emulator) comes back empty elsewhere,
never as an error.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from neuron_lab.backend.coverage import Coverage
from neuron_lab.backend.events import OpEvent, OpRecorder, OpStats, Roles, WindowAccount
from neuron_lab.backend.memory_reading import MemoryReading
from neuron_lab.deprecation import renamed
from neuron_lab.kinds import FALLBACK, NATIVE

DeviceSpec = Any  # int | str | torch.device | None: which device a memory read is about


def device_index(device: DeviceSpec) -> int | None:
    """The `neuron` device index ``device`` names; None (the current device) for None, an index-less ``neuron``,
    or a device of another type (a notebook on the CPU still has a current `neuron` device)."""
    if device is None or isinstance(device, int):
        return device
    import torch

    d = torch.device(device)
    return d.index if d.type == torch._C._get_privateuse1_backend_name() else None


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

    @property
    def build(self) -> str:
        """Doctor's line on what build of the device's software runs (TorchNeuron: its BUILD_TYPE)."""
        return f"{self.kind} (no TorchNeuron build)"

    @property
    def torchneuron_settings(self) -> str:
        """What TorchNeuron's own variables (``settings.torchneuron()``) are to this backend, for doctor."""
        return f"not read by the {self.kind}"

    def torchneuron_setting(self, name: str) -> str:
        """What doctor says beside TorchNeuron's variable ``name`` (who set it), "" when nothing."""
        return ""

    # -- device and memory ---------------------------------------------------------------------
    @abstractmethod
    def device_count(self) -> int: ...

    @abstractmethod
    def capacity(self) -> int | None:
        """Bytes of device memory on device 0; None when it cannot be known without starting the device's runtime
        (TorchNeuron before the user's first device use: reading it would take every NeuronCore)."""

    synchronizes = 0  # the workbench's own synchronize calls (each a sync on TorchNeuron): held to one a cell

    def synchronize(self, device: DeviceSpec = None) -> None:
        import torch

        self.synchronizes += 1
        torch.neuron.synchronize(device_index(device))

    def memory_stats(self, synchronize: bool = True, device: DeviceSpec = None) -> dict[str, Any]:
        """``torch.neuron.memory_stats(device)`` in TorchNeuron's nested shape, read after a synchronize unless told
        not to (TorchNeuron's allocator is asynchronous). ``device``: an index, ``"neuron:1"``, a ``torch.device``;
        None, or a device of another type, is the current one."""
        import torch

        index = device_index(device)
        if synchronize:
            self.synchronize(index)
        return dict(torch.neuron.memory_stats(index))

    def memory_reading(self, device: DeviceSpec = None, synchronize: bool = True) -> MemoryReading:
        """The one way the workbench reads device memory: ``device``'s counters (see :meth:`memory_stats`)."""
        return MemoryReading.parse(self.memory_stats(synchronize, device))

    def oom_asked(self, error: BaseException) -> int | None:
        """Bytes the allocation that raised ``error`` asked for, as the device's error says it; None where it does not.
        TorchNeuron's allocator says "NRT allocation failed for size N (OOM)" (csrc/core/allocator/
        NeuronCachingAllocator.cpp:82-88)."""
        m = re.search(r"NRT allocation failed for size (\d+) \(OOM\)", str(error))
        return int(m[1]) if m else None

    def watch_ooms(self, watcher: Callable[[BaseException], None]) -> Callable[[], None]:
        """Call ``watcher`` with each out-of-memory error the device raises, as it happens, caught or not (a retry
        loop's too); returns the call that stops it. The default hears none: TorchNeuron's allocator raises a plain
        ``RuntimeError`` (csrc/core/allocator/NeuronCachingAllocator.cpp:82-88) that nothing can watch, so there
        only its ``num_ooms`` count, where its stats keep one, tells of a handled one."""
        return lambda: None

    def memory_allocated(self, device: DeviceSpec = None) -> int:
        return self.memory_reading(device).allocated

    def max_memory_allocated(self, device: DeviceSpec = None) -> int:
        return self.memory_reading(device).peak

    def allocated_everywhere(self, synchronize: bool = True) -> int:
        """Bytes allocated on all devices together, after one synchronize (``synchronize=False``: the caller knows
        nothing was queued since the last): what a scan of every device tensor (``%neuron tensors``, ``%neuron
        free``, the OOM report) adds up to."""
        if synchronize:
            self.synchronize()
        return sum(self.memory_reading(i, synchronize=False).allocated for i in range(self.device_count()))

    def memory_sample(self, device: DeviceSpec = None) -> tuple[int, int]:
        """(allocated, peak) bytes as the allocator knows them now: no synchronize, safe from any thread.

        Live views call it several times a second while a cell runs, from their refresh thread.
        """
        r = self.memory_reading(device, synchronize=False)
        return r.allocated, r.peak

    def reset_peak_memory_stats(self, device: DeviceSpec = None) -> None:
        import torch

        torch.neuron.reset_peak_memory_stats(device_index(device))

    # TorchNeuron's allocator keeps one peak counter per device and offers no window of its own, so a cell's peak
    # is measured by resetting it; None where the backend keeps windows of its own (the emulator).
    peak_note: str | None = ("each cell resets the device's peak counter (TorchNeuron's allocator keeps only one), "
                             "so torch.neuron.max_memory_allocated() counts from the start of the current cell")

    def open_peak_window(self, device: DeviceSpec = None) -> object:
        """Start measuring ``device``'s peak allocated bytes over a window (a cell's), for :meth:`close_peak_window`.

        Here the device's peak counter is reset (:attr:`peak_note` says so to the user); the emulator keeps windows
        of its own and leaves the user's peak alone.
        """
        index = device_index(device)
        self.reset_peak_memory_stats(index)
        return index

    def close_peak_window(self, window: object) -> int:
        return self.memory_reading(window, synchronize=False).peak  # type: ignore[arg-type]

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

    def begin_window(self) -> frozenset[str]:
        """A tracked window (a cell) starts; the op kinds, beyond the reported ones, its tracker should collect rows
        of, for :meth:`end_window`'s account to be placed on (TorchNeuron: native calls, which its own account may
        say ran on the CPU). The emulator's observer is its whole account: nothing to start, nothing more to watch."""
        return frozenset()

    def end_window(self) -> WindowAccount:
        """What the backend itself says about the window since :meth:`begin_window`, read after the window's
        closing synchronize (TorchNeuron: its op-tracking sets, neuronx-cc time, NEFF cache counters)."""
        return WindowAccount()

    def op_stats(self, kind: str | None = None) -> list[OpStats]:
        return self.recorder.stats(kind)

    def subscribe(self, fn: Callable[[OpEvent, tuple, dict], Any], kinds: frozenset[str] | set[str] | None = None,
                  roles: Roles | None = None) -> Callable[[], None]:
        """Op events of ``kinds`` (default: all) from now on; returns the unsubscribe function. ``roles``: a
        subscriber that takes calls by line (:meth:`OpRecorder.subscribe`).

        On TorchNeuron, ops are only observed while somebody subscribes.
        """
        return self.recorder.subscribe(fn, kinds, roles)

    def flush_ops(self, keep: bool = True) -> None:
        """Calls counted by line, handed to their subscribers before one reads its counts (:meth:`OpRecorder.flush`)."""
        self.recorder.flush(keep)

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

    @property
    def differs_from_trainium(self) -> str | None:
        """What this backend knowingly does differently from TorchNeuron on a Trn instance (``%neuron status``
        says it); None where it is TorchNeuron itself."""
        return None

    tells_collectives = False  # whether collective_waiting() knows (the emulator's group does; TorchNeuron's not)

    def collective_waiting(self) -> dict[str, Any] | None:
        """The collective this process's main thread is blocked in (op, group, size, shapes, dtypes), safe to ask from
        another thread while it is; None when it is in none, or where the backend cannot tell."""
        return None

    @property
    def timing_note(self) -> str | None:
        """What a wall-clock time of work on this device measures, where that is not the device itself: compare says
        it beside its figures; None where the times are the device's own."""
        return None

    # -- compile -------------------------------------------------------------------------------
    lowering_metric: str | None = None  # the key of a dynamo_metrics() record that times its lowering, in µs

    def attention_dropout_mask(self, philox_seed: Any, shape: tuple[int, ...], p: float) -> Any:
        """The keep mask (bool, on the CPU) a fused attention call with dropout ``p`` drew
        (``_scaled_dot_product_fused_attention_overrideable``, from its ``philox_seed`` output), so a parity check can
        hand it to the reference's math kernel; None where the backend cannot say."""
        return None

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

    @property
    def device_clock(self) -> str:
        """Whose clock times the work on this backend's device lanes, in one word: "device", or "host" where the
        device's kernels run on the host CPU (the emulator). A profile's device times carry the word."""
        return "device"

    @property
    def device_lanes(self) -> str | None:
        """What this backend's device lanes in torch.profiler are, or, where :attr:`device_timing` is False, why a
        profile has no device time: a line a profile shows under its head; None where there is nothing to say."""
        return None

    def profiler_config(self, output_dir: str) -> str | None:
        """The ``custom_profiler_config`` string to pass torch.profiler (through ``experimental_config``) so that
        the device writes its own profile files into ``output_dir``; None where it writes none (no folder is made)."""
        return None
