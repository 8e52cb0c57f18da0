"""``torch_neuronx`` as neuron_lab's emulator serves it, where the real torch-neuronx is not installed.

:mod:`neuron_lab.backend.emulator.neuronx_finder` hands this package out under the name ``torch_neuronx``
(no files on ``sys.path``, no package metadata: pip, backend selection and a later real install are
unaffected), so code written for Trainium (``import torch_neuronx``), and libraries that look for it
(transformers, accelerate), run on the emulated `neuron` device. Its names follow TorchNeuron's; what the
emulator cannot serve raises :class:`NotEmulatedError` saying why (``wrap_nki`` without AWS's ``nki``).
It says what it is:
``EMULATED`` is true, ``__version__`` ends in ``+neuronlab.emulator``, and the module's repr names the emulator.
"""

from __future__ import annotations

from neuron_lab import kinds as _kinds
from neuron_lab.backend.emulator import device_module as _dm
from neuron_lab.backend.emulator import lifecycle as _lifecycle
from neuron_lab.backend.emulator import streams as _streams
from neuron_lab.backend.emulator.nki import nki_op, wrap_nki
from neuron_lab.backend.emulator.not_emulated import NotEmulatedError

from . import distributed, memory, neuron, neuron_dynamo_backend, profiling  # noqa: F401  (as TorchNeuron's package has them)

__version__ = "2.13.3.0+neuronlab.emulator"  # the torch-neuronx release the bundled profile describes
EMULATED = True  # the real package has no such attribute: `getattr(torch_neuronx, "EMULATED", False)` tells them apart

# -- devices and streams, as torch.neuron has them --------------------------------------------
device_count = _dm.device_count
current_device = _dm.current_device
get_device_properties = _dm.get_device_properties
empty_cache = _dm.empty_cache
synchronize = _dm.synchronize
current_stream = _dm.current_stream
default_stream = _dm.default_stream
set_stream = _dm.set_stream
stream = _dm.stream
device = _dm.device
Stream = _streams.Stream  # the class (torch.neuron.Stream is the keyword-only factory, as on hardware)
Event = _dm.Event
StreamContext = _streams.StreamContext


def set_device(device: int) -> None:
    """Make ``neuron:device`` current. Like TorchNeuron's, it takes an index only (``torch.neuron.set_device``
    also takes a ``torch.device``)."""
    if isinstance(device, bool) or not isinstance(device, int) or not 0 <= device < device_count():
        raise ValueError(f"Invalid device id {device!r}: torch_neuronx.set_device takes an int in "
                         f"[0, {device_count()})")
    _dm.set_device(device)


def is_neuron_runtime_initialized() -> bool:
    """False until the user's first device use (a device tensor, ``torch.neuron.init()``, ``synchronize``, ...),
    as TorchNeuron's; ``init_process_group(backend="neuron")`` requires it False, as on hardware."""
    return _lifecycle.started()


_lazy_init = _lifecycle.ensure  # TorchNeuron's name; raises in a child forked after the runtime started


def __getattr__(name: str) -> object:
    if name == "_is_in_bad_fork":  # a module attribute on TorchNeuron, read when asked here
        return _lifecycle.in_bad_fork()
    raise AttributeError(f"module 'torch_neuronx' has no attribute {name!r}")


# -- memory -----------------------------------------------------------------------------------
memory_allocated = _dm.memory_allocated
max_memory_allocated = _dm.max_memory_allocated
memory_reserved = _dm.memory_reserved
max_memory_reserved = _dm.max_memory_reserved
memory_stats = _dm.memory_stats
memory_summary = _dm.memory_summary
reset_peak_memory_stats = _dm.reset_peak_memory_stats
reset_accumulated_memory_stats = _dm.reset_accumulated_memory_stats
mem_get_info = _dm.mem_get_info  # emulator only: TorchNeuron has none


# -- op tracking: unique names with their overloads, as TorchNeuron reports them ---------------
def _names(kind: str) -> list[str]:
    """``"aten::atan2.out"``, ``"aten::add.Tensor"``: TorchNeuron's binding names an op by its schema's
    operator name (``toString(operator_name())``), overload included."""
    from neuron_lab import backend

    return sorted({st.qualified_name for st in backend.active().recorder.stats(kind)})


def get_fallback_ops() -> list[str]:
    """Unique names of the ops that ran on the CPU since the last :func:`clear_op_tracking` (no counts:
    neuron_lab's reports have those, with the lines that issued them)."""
    return _names(_kinds.FALLBACK)


def get_executed_ops() -> list[str]:
    """Unique names of the ops that ran on the device since the last :func:`clear_op_tracking`."""
    return _names(_kinds.NATIVE)


def clear_op_tracking() -> None:
    from neuron_lab import backend

    backend.active().clear_op_tracking()


# -- torch.compile ------------------------------------------------------------------------------
get_dynamo_metrics = _dm.get_dynamo_metrics
reset_dynamo_metrics = _dm.reset_dynamo_metrics

# -- profiling: torch.profiler's trace with the device lanes, into NeuronConfig's directory ------
NeuronProfiler = profiling.NeuronProfiler

__all__ = ["EMULATED", "Event", "NeuronProfiler", "NotEmulatedError", "Stream", "StreamContext", "clear_op_tracking",
           "current_device", "current_stream", "default_stream", "device", "device_count", "empty_cache",
           "get_device_properties", "get_dynamo_metrics", "get_executed_ops", "get_fallback_ops",
           "is_neuron_runtime_initialized", "max_memory_allocated", "max_memory_reserved", "mem_get_info",
           "memory_allocated", "memory_reserved", "memory_stats", "memory_summary", "nki_op",
           "reset_accumulated_memory_stats", "reset_dynamo_metrics", "reset_peak_memory_stats", "set_device",
           "set_stream", "stream", "synchronize", "wrap_nki"]
