"""Stand-in for the native TorchNeuron package (``torch-neuronx`` >= 2.13.3), for neuron_lab's tests only.

Not AWS code and not a simulation of Trainium: it implements the documented Python surface that
neuron_lab's adapter reads (see ``tests/fake_torchneuronx/README.md``). Like the real package,
importing it registers the `neuron` PrivateUse1 device, unless another backend already owns
PrivateUse1, in which case it leaves device registration to that backend. A version below 2.13.3
stands for the legacy XLA library, which never touches PrivateUse1.
"""

from __future__ import annotations

from importlib import metadata

import torch

from torch_neuronx import _tracking

__version__ = metadata.version("torch-neuronx")
NATIVE_MIN_VERSION = (2, 13, 3)


def _native(version: str) -> bool:
    parts = tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in version.split(".")[:3])
    return parts >= NATIVE_MIN_VERSION


registered = False  # fake-only: whether this import registered the `neuron` device
backed_off_for: str | None = None  # fake-only: the PrivateUse1 owner it deferred to

if _native(__version__):
    _owner = torch._C._get_privateuse1_backend_name()
    if _owner == "privateuseone":
        from torch_neuronx import _device

        _device.register()
        import torch_neuronx._profiler  # noqa: F401  (registers its Kineto stand-in at import, as the real one does)
        registered = True
    else:
        backed_off_for = _owner

get_fallback_ops = _tracking.get_fallback_ops
get_executed_ops = _tracking.get_executed_ops
clear_op_tracking = _tracking.clear_op_tracking

from torch_neuronx.neuron import (  # noqa: E402  (the top-level aliases the real package exports)
    current_device,
    device_count,
    empty_cache,
    get_device_properties,
    get_dynamo_metrics,
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_summary,
    reset_dynamo_metrics,
    reset_peak_memory_stats,
    set_device,
    synchronize,
)

__all__ = ["clear_op_tracking", "current_device", "device_count", "empty_cache", "get_device_properties",
           "get_dynamo_metrics", "get_executed_ops", "get_fallback_ops", "max_memory_allocated",
           "max_memory_reserved", "memory_allocated", "memory_reserved", "memory_stats", "memory_summary",
           "reset_dynamo_metrics", "reset_peak_memory_stats", "set_device", "synchronize"]


def _autoload() -> None:
    """The ``torch.backends`` entry point: as in the real package, importing the module is the work."""
