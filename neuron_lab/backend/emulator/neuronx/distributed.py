"""``torch_neuronx.distributed`` on the emulator: importing it is what scripts do before
``init_process_group(backend="neuron")``; the emulated process group itself is not built yet."""

from __future__ import annotations

from neuron_lab.backend.emulator.not_emulated import not_emulated

ProcessGroupNeuron = not_emulated("torch_neuronx.distributed.ProcessGroupNeuron",
                                  "the emulated `neuron` process group is not built yet; use backend='gloo' on CPU "
                                  "tensors meanwhile")

__all__ = ["ProcessGroupNeuron"]
