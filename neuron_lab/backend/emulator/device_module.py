"""``torch.neuron`` for the emulated devices: the surface TorchNeuron's device module offers.

The emulator runs every op synchronously on one in-order queue, so streams and events are
exact rather than approximate: work recorded before an event is complete when it is recorded.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

from neuron_lab.backend.emulator import memory_history as memory  # torch.neuron.memory, as torch.cuda.memory
from neuron_lab.backend.emulator import runtime as _rt
from neuron_lab.backend.emulator.memory import torchneuron_stats
from neuron_lab.units import format_size

sys.modules.setdefault("torch.neuron.memory", memory)  # `from torch.neuron.memory import _snapshot` works too


def _index(device: Any = None) -> int:
    """A device index from an int, a string or a torch.device; None is the current device."""
    devices = _rt.get().devices
    if device is None:
        return devices.current_device()
    if isinstance(device, int):
        idx = device
    else:
        d = torch.device(device)
        if d.type != "neuron":
            raise ValueError(f"Expected a neuron device, got {d}")
        idx = devices.current_device() if d.index is None else d.index
    return devices.check(idx)


# -- device --------------------------------------------------------------------------------
def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def init() -> None:
    """The emulated runtime needs no initialisation."""


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return _rt.get().devices.device_count()


def current_device() -> int:
    return _rt.get().devices.current_device()


def set_device(device: Any) -> None:
    _rt.get().devices.set_device(_index(device))


class device:  # noqa: N801  (spelled like torch.cuda.device)
    """Context manager that makes ``device`` current and restores the previous one."""

    def __init__(self, device: Any) -> None:
        self.idx = _index(device)
        self.prev = -1

    def __enter__(self) -> None:
        self.prev = current_device()
        _rt.get().devices.set_device(self.idx)

    def __exit__(self, *exc: object) -> None:
        _rt.get().devices.set_device(self.prev)


def get_device_name(device: Any = None) -> str:
    return f"neuron:{_index(device)}"


@dataclass(frozen=True)
class DeviceProperties:
    name: str
    total_memory: int


def get_device_properties(device: Any = None) -> DeviceProperties:
    rt = _rt.get()
    return DeviceProperties(f"neuron (emulated {rt.topology.instance} logical NeuronCore, LNC={rt.topology.lnc})",
                            rt.memory.capacity_of(_index(device)))


def synchronize(device: Any = None) -> None:
    """Every emulated op completes before it returns: nothing is queued."""
    _index(device)


# -- RNG: a default generator per device ------------------------------------------------------
def _gen(device: Any = None) -> torch.Generator:
    return _rt.get().devices.generator(_index(device))


def manual_seed(seed: int) -> None:
    _gen().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for i in range(device_count()):
        _gen(i).manual_seed(int(seed))


def seed() -> None:
    _gen().seed()


def seed_all() -> None:
    s = _gen(0).seed()
    for i in range(1, device_count()):
        _gen(i).manual_seed(s)


def initial_seed() -> int:
    return _gen().initial_seed()


def get_rng_state(device: Any = "neuron") -> torch.Tensor:
    return _gen(device).get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "neuron") -> None:
    _gen(device).set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


# -- AMP -----------------------------------------------------------------------------------
def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.float32, torch.float16, torch.bfloat16]


def is_bf16_supported() -> bool:
    return True


# -- memory --------------------------------------------------------------------------------
def _mem():
    return _rt.get().memory


def memory_stats(device: Any = None) -> dict[str, Any]:
    """The allocator's statistics in TorchNeuron's nested shape (``torch_neuronx/memory.py:28-54``):
    ``allocated_bytes``/``reserved_bytes``/``active_bytes`` → ``current``/``peak``/``allocated``/``freed``, and
    ``num_alloc_retries``, ``num_ooms``, ``num_tensor_frees``, ``allocation_requests``."""
    return torchneuron_stats(_mem().stats(_index(device)))


def memory_allocated(device: Any = None) -> int:
    return _mem().allocated_of(_index(device))


def max_memory_allocated(device: Any = None) -> int:
    return memory_stats(device)["allocated_bytes"]["peak"]


def memory_reserved(device: Any = None) -> int:
    return memory_stats(device)["reserved_bytes"]["current"]


def max_memory_reserved(device: Any = None) -> int:
    return memory_stats(device)["reserved_bytes"]["peak"]


def reset_peak_memory_stats(device: Any = None) -> None:
    _mem().reset_peak(_index(device))


def reset_accumulated_memory_stats(device: Any = None) -> None:
    _mem().reset_accumulated(_index(device))


def empty_cache() -> None:
    """Release the cached segments of every device (the emulator's cache holds no host memory)."""
    for i in range(device_count()):
        _mem().empty_cache(i)


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes, as ``torch.cuda.mem_get_info``. Emulator only: TorchNeuron has no ``mem_get_info``;
    ``torch.accelerator.get_memory_info`` reads it here."""
    return _mem().mem_get_info(_index(device))


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    idx = _index(device)
    s = _mem().stats(idx)  # the core's flat counters: the allocation counts too
    rows = [("Allocated memory", "allocated_bytes"), ("Active memory", "active_bytes"),
            ("Reserved memory", "reserved_bytes")]
    if not abbreviated:
        rows.append(("Allocations", "allocation"))
    row = "| {:<22}|" + " {:>11} |" * 4  # 81 characters wide, like every other line of the table
    lines = ["|" + "=" * 79 + "|", "|{:^79}|".format(f"neuron (emulated) memory summary, device {idx}"),
             "|" + "-" * 79 + "|", row.format("Metric", "Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed"),
             "|" + "-" * 79 + "|"]
    for label, key in rows:
        vals = [s[f"{key}.all.{m}"] for m in ("current", "peak", "allocated", "freed")]
        cells = [str(v) for v in vals] if key == "allocation" else [format_size(v) for v in vals]
        lines.append(row.format(label, *cells))
    lines += ["|" + "-" * 79 + "|",
              f"| OOMs: {s['num_ooms']:<8} capacity: {format_size(_mem().capacity_of(idx)):<53}|",
              "|" + "=" * 79 + "|"]
    return "\n".join(lines)


# torch.neuron.memory holds the memory functions too, as TorchNeuron's does (torch_neuronx/neuron.py:5, memory.py)
for _f in (memory_stats, memory_allocated, max_memory_allocated, memory_reserved, max_memory_reserved,
           reset_peak_memory_stats, reset_accumulated_memory_stats, memory_summary):
    setattr(memory, _f.__name__, _f)


# -- streams and events: one in-order queue --------------------------------------------------
class Event:
    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self._recorded_ns: int | None = None

    def record(self, stream: Stream | None = None) -> None:
        self._recorded_ns = time.perf_counter_ns()

    def query(self) -> bool:
        return True

    def wait(self, stream: Stream | None = None) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end_event: Event) -> float:
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self._recorded_ns is None or end_event._recorded_ns is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._recorded_ns - self._recorded_ns) / 1e6


class Stream:
    def __init__(self, device: Any = None, priority: int = 0) -> None:
        self.device = torch.device("neuron", _index(device))
        self.priority = priority

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def wait_event(self, event: Event) -> None:
        return None

    def wait_stream(self, stream: Stream) -> None:
        return None

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream)

    def __hash__(self) -> int:
        return 0


_DEFAULT_STREAM = Stream()


def current_stream(device: Any = None) -> Stream:
    _index(device)
    return _DEFAULT_STREAM


default_stream = current_stream


def set_stream(stream: Stream) -> None:
    return None


@contextlib.contextmanager
def stream(s: Stream | None):
    yield


# -- torch.compile metrics, as TorchNeuron spells them ---------------------------------------
def get_dynamo_metrics() -> list[dict[str, Any]]:
    synchronize()
    return [dict(m) for m in _rt.get().dynamo_metrics]


def reset_dynamo_metrics() -> None:
    _rt.get().dynamo_metrics.clear()
