"""``torch_neuronx.profiling`` on the emulator: the names TorchNeuron documents (``NeuronConfig``,
``ProfileMode``, ``NeuronProfiler``) exist; device profiling of the emulated device is not built yet."""

from __future__ import annotations

from neuron_lab.backend.emulator.not_emulated import not_emulated

_WHY = "device profiling of the emulated device is not built yet; torch.profiler records the host side"
NeuronConfig = not_emulated("torch_neuronx.profiling.NeuronConfig", _WHY)
ProfileMode = not_emulated("torch_neuronx.profiling.ProfileMode", _WHY)
NeuronProfiler = not_emulated("torch_neuronx.profiling.NeuronProfiler", _WHY)

__all__ = ["NeuronConfig", "NeuronProfiler", "ProfileMode"]
