"""``torch.compile(backend="neuron")``, resolved lazily through the ``torch_dynamo_backends`` entry point.

Both neuron_lab and torch-neuronx declare an entry point named ``neuron``, and Dynamo loads
whichever it finds first. So this one serves the emulator when it is active and otherwise hands
the graph to the other package's ``neuron`` backend.
"""

from __future__ import annotations

from importlib import metadata

from neuron_lab import backend
from neuron_lab.backend.selection import EMULATOR

_OURS = "neuron_lab.backend.dynamo:neuron_backend"


def _other_neuron_backend():
    for ep in metadata.entry_points(group="torch_dynamo_backends"):
        if ep.name == "neuron" and ep.value != _OURS:
            return ep.load()
    return None


def neuron_backend(gm, example_inputs, **kwargs):
    d = backend.state()
    if d.kind == EMULATOR:
        from neuron_lab.backend.emulator.compile import compile_graph

        return compile_graph(gm, example_inputs, **kwargs)
    other = _other_neuron_backend()
    if other is None:
        raise RuntimeError(f"torch.compile(backend='neuron'): the emulator is not active ({d.kind}: {d.reason}) "
                           "and no other installed package provides a 'neuron' Dynamo backend")
    return other(gm, example_inputs, **kwargs)
