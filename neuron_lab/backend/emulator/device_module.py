"""``torch.neuron`` for the emulated devices: the surface TorchNeuron's device module offers.

The emulator runs every op synchronously on one in-order queue, so streams and events are
exact rather than approximate: work recorded before an event is complete when it is recorded.
The runtime starts as TorchNeuron's does, at the user's first device use (``lifecycle``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import Any

import torch

from neuron_lab.backend.emulator import lifecycle
from neuron_lab.backend.emulator import memory_history as memory  # torch.neuron.memory, as torch.cuda.memory
from neuron_lab.backend.emulator import runtime as _rt
from neuron_lab.backend.emulator.compile_metrics import NeuronCompilationMetrics
from neuron_lab.backend.emulator.device_index import index_of as _index
from neuron_lab.backend.emulator.memory import torchneuron_stats
from neuron_lab.backend.emulator.streams import Event, StreamContext, current_stream, default_stream, set_stream  # noqa: F401  (torch.neuron's names)
from neuron_lab.backend.emulator.streams import Stream as _Stream
from neuron_lab.units import format_size

sys.modules.setdefault("torch.neuron.memory", memory)  # `from torch.neuron.memory import _snapshot` works too


# -- device --------------------------------------------------------------------------------
def is_available() -> bool:
    return True


def is_initialized() -> bool:
    """False until the user's first device use, as TorchNeuron's (neuron_lab's own reads do not count)."""
    return lifecycle.started()


def init() -> None:
    """Start the runtime (TorchNeuron's ``_lazy_init``); in a child forked after it started, refuse."""
    lifecycle.ensure()


def _is_in_bad_fork() -> bool:
    return lifecycle.in_bad_fork()


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
    """Starts the runtime, as TorchNeuron's does (it reads HBM from NRT)."""
    idx = _index(device)
    lifecycle.ensure()
    rt = _rt.get()
    return DeviceProperties(f"neuron (emulated {rt.topology.instance} logical NeuronCore, LNC={rt.topology.lnc})",
                            rt.memory.capacity_of(idx))


def synchronize(device: Any = None) -> None:
    """Every emulated op completes before it returns: nothing is queued. A device use, as on hardware."""
    _index(device)
    lifecycle.ensure()


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
    """Release the cached segments of every device, and the host bytes the compiled core keeps for reuse."""
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


# -- streams and events: one in-order queue (``streams``) ---------------------------------------
def Stream(*args: Any, **kwargs: Any) -> _Stream:  # noqa: N802  (spelled as TorchNeuron's factory)
    """A stream; keyword arguments only, as ``torch.neuron.Stream(**kwargs)`` takes them on hardware."""
    if args:
        raise TypeError("torch.neuron.Stream() takes keyword arguments only, as TorchNeuron's does: "
                        "pass the device as torch.neuron.Stream(device=...)")
    lifecycle.ensure()
    return _Stream(**kwargs)


def stream(s: _Stream | None) -> StreamContext:
    """Context manager that makes ``s`` the current stream."""
    return StreamContext(s)


def wait_stream(stream: _Stream) -> None:
    """Make the current stream wait for ``stream``."""
    current_stream().wait_stream(stream)


def wait_event(event: Event) -> None:
    current_stream().wait_event(event)


def record_event(event: Event | None = None) -> Event:
    return current_stream().record_event(event)


def query() -> bool:
    """Whether all work on the current stream is done: always, on the emulator."""
    return current_stream().query()


def _sleep(cycles: int) -> None:
    """A no-op, as TorchNeuron's."""


# -- torch.compile metrics, as TorchNeuron spells them ---------------------------------------
def get_dynamo_metrics() -> list[NeuronCompilationMetrics]:
    """One record per compiled graph, TorchNeuron's dataclass (attribute access; item access works too)."""
    synchronize()
    return [replace(m) for m in _rt.get().dynamo_metrics]


def reset_dynamo_metrics() -> None:
    _rt.get().dynamo_metrics.clear()
