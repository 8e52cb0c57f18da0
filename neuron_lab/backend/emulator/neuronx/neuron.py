"""``torch_neuronx.neuron``: the device module TorchNeuron registers as ``torch.neuron``; every name is that one's."""

from __future__ import annotations

from typing import Any

import torch


def __getattr__(name: str) -> Any:
    return getattr(torch.neuron, name)


def __dir__() -> list[str]:
    return dir(torch.neuron)
