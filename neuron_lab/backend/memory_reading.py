"""One device's allocator counters, read from ``torch.neuron.memory_stats()`` in the shape TorchNeuron gives it.

TorchNeuron nests its statistics (``torch_neuronx/memory.py:28-54``, built in
``csrc/core/NeuronBindings.cpp:1239-1260``): ``allocated_bytes``, ``reserved_bytes`` and ``active_bytes`` each
hold ``current``, ``peak``, ``allocated`` and ``freed``; ``num_alloc_retries``, ``num_ooms``, ``num_tensor_frees``
and ``allocation_requests`` are plain counts. The emulated ``torch.neuron`` gives the same shape, so this is the
one place that reads it. A core that counts in CUDA's flat keys (the emulator's) is read by :data:`FLAT_KEYS`: the
numbers a reading holds, in its fields' order, and nothing else of its ``memory_stats``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MemoryReading:
    """What the workbench shows of one device's memory: bytes, and the allocator's trouble counters."""

    allocated: int  # bytes held by tensors now
    peak: int  # the highest ``allocated`` since the allocator's peak was last reset
    reserved: int  # bytes the caching allocator holds (TorchNeuron's April build: always 0)
    active: int  # bytes in active use by tensors
    alloc_retries: int  # allocations that succeeded only after the cache was released
    ooms: int  # allocations that failed for good

    @classmethod
    def parse(cls, stats: Mapping[str, Any]) -> MemoryReading:
        """Read TorchNeuron's nested ``memory_stats()``; a missing key reads as 0 (an allocator that never counted)."""

        def current_and_peak(key: str) -> tuple[int, int]:
            group = stats.get(key) or {}
            return int(group.get("current", 0)), int(group.get("peak", 0))

        allocated, peak = current_and_peak("allocated_bytes")
        return cls(allocated, peak, current_and_peak("reserved_bytes")[0], current_and_peak("active_bytes")[0],
                   int(stats.get("num_alloc_retries", 0)), int(stats.get("num_ooms", 0)))


# The flat counters (CUDA's ``memory_stats`` keys, pool ``all``) that are a reading's fields, in their order.
FLAT_KEYS = ("allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current",
             "active_bytes.all.current", "num_alloc_retries", "num_ooms")
