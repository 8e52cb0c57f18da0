"""``torch_neuronx.utils`` on the emulator: the helpers users call, answered for the emulated instance.

TorchNeuron's (tnx ``torch_neuronx/utils.py``) ask NRT for the platform and the logical-core setting; here they
come from the emulated topology (``NEURON_LAB_INSTANCE``, ``NEURON_LOGICAL_NC_CONFIG``). The environment
switches TorchNeuron reads (``TORCH_NEURONX_MLIR_ATEN_OPS``, ``NEURON_LAUNCH_BLOCKING``) change nothing on the
emulator, which runs every op synchronously through its own kernels: they answer as on hardware with TorchNeuron's
defaults.
"""

from __future__ import annotations

from typing import Any

import torch

from neuron_lab.backend.emulator import runtime as _rt


def get_platform_target() -> str:
    """``"trn1"``, ``"trn2"``, ...: the emulated instance's family."""
    return _rt.get().topology.instance.split(".", 1)[0]


def get_lnc_setting() -> str:
    return str(_rt.get().topology.lnc)


def get_logical_neuron_cores() -> str:
    """The Logical NeuronCore setting (``NEURON_LOGICAL_NC_CONFIG``, else the instance's default)."""
    return get_lnc_setting()


def get_worker_multiplier() -> int:
    return 2 if get_platform_target() == "trn2" and get_logical_neuron_cores() == "1" else 1


def is_float8_e4m3_supported() -> bool:
    return get_platform_target() == "trn2"


def is_float8_e4m3fn_supported() -> bool:
    return get_platform_target() != "trn2"


def is_mxocp_supported() -> bool:
    return get_platform_target() != "trn2"


def use_mlir_aten_ops() -> bool:
    """TorchNeuron's release default (on); the emulator has no MLIR lowering to switch."""
    return True


def is_sync_mode_enabled() -> bool:
    """Whether ops block until done: always, on the emulator (TorchNeuron: ``NEURON_LAUNCH_BLOCKING=1``)."""
    return True


def flatten_tensors(obj: Any) -> list[torch.Tensor]:
    """The tensors of a nested list/tuple structure, in order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in flatten_tensors(item)]
    return []


def get_device_from_tensors(tensors: Any) -> torch.device:
    """The first tensor's device, else the current `neuron` device."""
    flat = flatten_tensors(tensors)
    return flat[0].device if flat else torch.device("neuron", torch.neuron.current_device())


def move_pytree_to_cpu(obj: Any) -> Any:
    return _move(obj, "cpu")


def move_pytree_to_neuron(obj: Any) -> Any:
    return _move(obj, "neuron")


def _move(obj: Any, device: str) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_move(x, device) for x in obj)
    if isinstance(obj, dict):
        return {k: _move(v, device) for k, v in obj.items()}
    return obj
