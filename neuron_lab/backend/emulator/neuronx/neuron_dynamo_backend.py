"""``torch_neuronx.neuron_dynamo_backend`` on the emulator: TorchNeuron's helper API for ``torch.compile``.

The names of tnx ``neuron_dynamo_backend/__init__.py`` users call: ``set_model_name`` / ``get_model_name`` /
``get_rank``, the metrics, the backend itself and its exceptions. The MLIR and FX artefact writers need
TorchNeuron's torch-mlir lowering, which the emulator does not have: they raise :class:`NotEmulatedError`.
TorchNeuron reads its settings (``TORCH_NEURONX_DEBUG_DIR``, ``NEURON_CC_FLAGS``, ...) from the environment;
the emulator compiles no NEFF and ignores them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from neuron_lab.backend.emulator import device_module as _dm
from neuron_lab.backend.emulator.not_emulated import NotEmulatedError

get_dynamo_metrics = _dm.get_dynamo_metrics
reset_dynamo_metrics = _dm.reset_dynamo_metrics


class NEFFCompilationError(Exception):
    """Raised on hardware when neuronx-cc fails; the emulator compiles no NEFF, so never raises it."""


class NEFFExecutionError(Exception):
    """Raised on hardware when a NEFF fails to run; never raised by the emulator."""


def set_model_name(name: str) -> None:
    """Name the graphs compiled from now on: their ``get_dynamo_metrics()`` ``graph_name`` starts with it."""
    from neuron_lab.backend.emulator import lowering

    lowering.set_model_name(name)


def get_model_name() -> str:
    from neuron_lab.backend.emulator import lowering

    return lowering.get_model_name()


def get_rank() -> int:
    """The distributed rank when a process group is up, else the current `neuron` device, as TorchNeuron's."""
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else _dm.current_device()


def neuron_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable[..., Any]:
    """``torch.compile(backend=neuron_backend)``: the same backend as ``backend="neuron"``."""
    from torch._dynamo import lookup_backend

    return lookup_backend("neuron")(gm, example_inputs, **kwargs)


def create_neuron_backend() -> Callable[..., Any]:
    return neuron_backend


def _not_emulated(name: str) -> Callable[..., Any]:
    def writer(*_args: Any, **_kwargs: Any) -> Any:
        raise NotEmulatedError(f"neuron_dynamo_backend.{name} writes TorchNeuron's torch-mlir/StableHLO "
                               "artefacts; the emulator does not lower to MLIR (only a Trn instance has them)")

    writer.__name__ = name
    return writer


fx_to_mlir_string = _not_emulated("fx_to_mlir_string")
load_mlir = _not_emulated("load_mlir")
save_fx_as_mlir = _not_emulated("save_fx_as_mlir")
save_fx_graph_all_formats = _not_emulated("save_fx_graph_all_formats")
save_fx_graph_txt = _not_emulated("save_fx_graph_txt")
save_mlir = _not_emulated("save_mlir")

__all__ = ["NEFFCompilationError", "NEFFExecutionError", "create_neuron_backend", "fx_to_mlir_string",
           "get_dynamo_metrics", "get_model_name", "get_rank", "load_mlir", "neuron_backend", "reset_dynamo_metrics",
           "save_fx_as_mlir", "save_fx_graph_all_formats", "save_fx_graph_txt", "save_mlir", "set_model_name"]
