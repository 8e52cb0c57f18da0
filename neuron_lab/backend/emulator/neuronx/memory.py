"""``torch_neuronx.memory``: the module TorchNeuron's ``torch.neuron.memory`` is (``torch_neuronx/neuron.py:5``);
every name is that one's: ``memory_stats`` and the other memory functions, and the emulator's memory history."""

from __future__ import annotations

from typing import Any

import torch


def __getattr__(name: str) -> Any:
    return getattr(torch.neuron.memory, name)


def __dir__() -> list[str]:
    return dir(torch.neuron.memory)
