"""``torch_neuronx.distributed`` on the emulator: importing it is what scripts do before
``init_process_group(backend="neuron")``; the emulator registered that backend when it installed."""

from __future__ import annotations

from neuron_lab.backend.emulator.distributed import ProcessGroupNeuron

__all__ = ["ProcessGroupNeuron"]
