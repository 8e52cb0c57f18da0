"""``torch.neuron`` as the fake registers it: the documented device, RNG, memory and compile-metrics calls.

The real allocator is asynchronous ("always call torch.neuron.synchronize() before you read any
memory statistic"). The fake makes that rule observable: every memory statistic is the snapshot
published by the last ``synchronize()``, so a reader that skips the synchronize sees stale numbers.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from torch_neuronx import _device, _runtime


def _index(device: Any = None) -> int:
    if device is None:
        return 0
    idx = device if isinstance(device, int) else (torch.device(device).index or 0)
    if idx != 0:
        raise ValueError(f"Invalid device id {idx}")
    return idx


# -- device --------------------------------------------------------------------------------
def is_available() -> bool:
    return _device.STATE is not None


def is_initialized() -> bool:
    return _device.STATE is not None


def init() -> None:
    _device.state()


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return 1 if _device.STATE is not None else 0


def current_device() -> int:
    return 0


def set_device(device: Any) -> None:
    _index(device)


class device:  # noqa: N801  (spelled like torch.cuda.device)
    def __init__(self, device: Any) -> None:
        self.idx = _index(device)

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def get_device_name(device: Any = None) -> str:
    return f"neuron:{_index(device)}"


@dataclass(frozen=True)
class DeviceProperties:
    name: str
    total_memory: int


def get_device_properties(device: Any = None) -> DeviceProperties:
    _index(device)
    _runtime.lazy_init()  # the real call starts the Neuron runtime (tnx torch_neuronx/__init__.py:235-236)
    return DeviceProperties("neuron (torch-neuronx fake)", _device.state().allocator.capacity)


def synchronize(device: Any = None) -> None:
    """Wait for queued work; here, publish the allocator's statistics."""
    _index(device)
    st = _device.state()
    st.synchronize_calls += 1
    st.published_stats = st.allocator.nested_stats()


def is_bf16_supported() -> bool:
    return True


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.float32, torch.float16, torch.bfloat16]


# -- RNG -----------------------------------------------------------------------------------
def _gen() -> torch.Generator:
    return _device.state().executor.generator


def manual_seed(seed: int) -> None:
    _gen().manual_seed(int(seed))


manual_seed_all = manual_seed


def seed() -> None:
    _gen().seed()


seed_all = seed


def initial_seed() -> int:
    return _gen().initial_seed()


def get_rng_state(device: Any = "neuron") -> torch.Tensor:
    return _gen().get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "neuron") -> None:
    _gen().set_state(new_state)


# -- memory: as of the last synchronize, nested as the real _C._get_memory_stats builds it -------------
def memory_stats(device: Any = None) -> dict[str, Any]:
    """TorchNeuron's shape (torch_neuronx/memory.py:28-54, csrc/core/NeuronBindings.cpp:1239-1260)."""
    _index(device)
    return copy.deepcopy(_device.state().published_stats)


def memory_allocated(device: Any = None) -> int:
    return memory_stats(device)["allocated_bytes"]["current"]  # memory.py:57-71


def max_memory_allocated(device: Any = None) -> int:
    return memory_stats(device)["allocated_bytes"]["peak"]  # memory.py:74-85


def memory_reserved(device: Any = None) -> int:
    return memory_stats(device)["reserved_bytes"]["current"]  # memory.py:88-101


def max_memory_reserved(device: Any = None) -> int:
    return memory_stats(device)["reserved_bytes"]["peak"]  # memory.py:104-117


def reset_peak_memory_stats(device: Any = None) -> None:
    _index(device)
    _device.state().allocator.reset_peak()


def reset_accumulated_memory_stats(device: Any = None) -> None:
    _index(device)
    _device.state().allocator.reset_accumulated()


def empty_cache() -> None:
    """Nothing is cached: freed blocks go back at once."""


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    s = memory_stats(device)
    return (f"neuron:{_index(device)} (torch-neuronx fake): allocated {s['allocated_bytes']['current']} B, "
            f"peak {s['allocated_bytes']['peak']} B, reserved {s['reserved_bytes']['current']} B, "
            f"OOMs {s['num_ooms']}")


# -- torch.compile metrics -------------------------------------------------------------------
def get_dynamo_metrics() -> list[Any]:
    """One record per compiled graph; synchronizes first, as the real call does."""
    synchronize()
    from torch_neuronx.neuron_dynamo_backend import compile_time_ms

    records = _device.state().dynamo_metrics
    for m in records:  # tnx:neuron_dynamo_backend/metrics.py:222-227: neuronx-cc time, known once synchronized
        if m.torch_neuronx_compile_us == 0:
            m.torch_neuronx_compile_us = compile_time_ms(m.graph_id) * 1000
    return list(records)


def reset_dynamo_metrics() -> None:
    from torch._dynamo.utils import counters

    _device.state().dynamo_metrics.clear()
    counters["neuron"].clear()
