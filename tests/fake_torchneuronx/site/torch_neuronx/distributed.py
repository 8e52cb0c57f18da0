"""The fake's `neuron` c10d backend: TorchNeuron's check that the runtime is not started yet, then gloo underneath.

The real ``ProcessGroupNeuron`` runs ``_neuron_runtime_setup`` for the first group, which asserts the runtime is
not initialized and then starts it (tnx torch_neuronx/distributed/backend.py:292-308, :437-440); the package
registers the backend at import (tnx torch_neuronx/__init__.py:93, distributed/backend.py:57-67). Collectives here
are gloo's on the host: only the check and the runtime start are mirrored.
"""

from __future__ import annotations

import torch.distributed as dist

import torch_neuronx
from torch_neuronx import _runtime

_started = False


def _neuron_runtime_setup() -> None:
    assert not torch_neuronx.is_neuron_runtime_initialized(), \
        "Neuron runtime should not be initialized before the init_process_group."
    _runtime.lazy_init()


def _create(store, rank: int, size: int, timeout):
    global _started
    if not _started:  # the first process group, as the real backend's _WORLD_SIZE guard
        _started = True
        _neuron_runtime_setup()
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def register() -> None:
    if dist.is_available() and "neuron" not in dist.Backend.backend_list:
        dist.Backend.register_backend("neuron", _create, devices=["neuron", "cpu"])
