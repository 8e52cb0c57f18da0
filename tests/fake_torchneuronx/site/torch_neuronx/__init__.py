"""Stand-in for the native TorchNeuron package (``torch-neuronx``), for neuron_lab's tests only.

Not AWS code and not a simulation of Trainium: it mirrors the facts of the real source that neuron_lab
depends on (see ``tests/fake_torchneuronx/README.md``, each with its tnx file:line). Like the real package,
importing it sets its environment defaults and registers the `neuron` PrivateUse1 device unconditionally,
and the Neuron runtime starts only at the first device use. A distribution without the ``torch.backends``
entry point stands for the legacy XLA library, which never touches PrivateUse1.
"""

from __future__ import annotations

import os
from importlib import metadata

from torch_neuronx import _build_config, _runtime, _tracking

__version__ = metadata.version("torch-neuronx")  # a DEV/source build is 0.1.0 (tnx torch_neuronx/__init__.py:1)

# Defaults set at import, the user's values kept (tnx torch_neuronx/__init__.py:44-65).
os.environ.setdefault("NEURON_LAUNCH_BLOCKING", _build_config.DEFAULT_SYNC_MODE)
os.environ.setdefault("TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS",
                      _build_config.DEFAULT_FALLBACK_ONLY_FOR_UNIMPLEMENTED)
os.environ.setdefault("TORCH_NEURONX_ENABLE_ASYNC_NRT", "1")
os.environ.setdefault("TORCH_NEURONX_ENABLE_STACK_TRACE", "0")


def _native() -> bool:
    """Native TorchNeuron declares ``torch_neuronx = torch_neuronx:_autoload`` (tnx pyproject.toml:14-15)."""
    eps = metadata.distribution("torch-neuronx").entry_points
    return any(ep.group == "torch.backends" and ep.value == "torch_neuronx:_autoload" for ep in eps)


registered = False  # fake-only: whether this import registered the `neuron` device

if _native():
    # No backing off: the real package registers whoever owns PrivateUse1, so its import fails when another
    # backend has it (tnx torch_neuronx/__init__.py:67-72 `_C._register_device()`, :119-128 rename and
    # `torch._register_device_module("neuron", ...)`, which raises when torch.neuron exists).
    from torch_neuronx import _device

    _device.register()
    import torch_neuronx._profiler  # noqa: F401  (registers its Kineto stand-in at import, as the real one does)
    registered = True
    from torch_neuronx import distributed

    distributed.register()


def is_neuron_runtime_initialized() -> bool:
    """False until the first device use (tnx torch_neuronx/__init__.py:182-183)."""
    return _runtime.is_initialized()


_lazy_init = _runtime.lazy_init  # tnx torch_neuronx/__init__.py:137-157

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
           "get_dynamo_metrics", "get_executed_ops", "get_fallback_ops", "is_neuron_runtime_initialized",
           "max_memory_allocated",
           "max_memory_reserved", "memory_allocated", "memory_reserved", "memory_stats", "memory_summary",
           "reset_dynamo_metrics", "reset_peak_memory_stats", "set_device", "synchronize"]


def _autoload() -> None:
    """The ``torch.backends`` entry point: as in the real package, importing the module is the work."""
