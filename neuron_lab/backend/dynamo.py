"""``torch.compile(backend="neuron")``, resolved lazily through the ``torch_dynamo_backends`` entry point.

Both neuron_lab and torch-neuronx declare an entry point named ``neuron``, and Dynamo loads
whichever it finds first. So this one serves the emulator when it is active and otherwise hands
the graph to the other package's ``neuron`` backend.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata
from typing import Any

from neuron_lab import backend
from neuron_lab.backend.selection import EMULATOR

_OURS = "neuron_lab.backend.dynamo:neuron_backend"
_graph_listeners: list[Callable[[Any], None]] = []


def on_graph(fn: Callable[[Any], None]) -> Callable[[], None]:
    """Call ``fn(gm)`` with each graph Dynamo hands to this backend (the trace layer reads its break reason);
    returns the unsubscribe function."""
    _graph_listeners.append(fn)
    return lambda: _graph_listeners.remove(fn) if fn in _graph_listeners else None


def _other_neuron_backend():
    for ep in metadata.entry_points(group="torch_dynamo_backends"):
        if ep.name == "neuron" and ep.value != _OURS:
            return ep.load()
    return None


def neuron_backend(gm, example_inputs, **kwargs):
    for fn in list(_graph_listeners):
        fn(gm)
    d = backend.state()
    if d.kind == EMULATOR:
        from neuron_lab.backend.emulator.lowering import compile_graph

        return compile_graph(gm, example_inputs, **kwargs)
    other = _other_neuron_backend()
    if other is None:
        raise RuntimeError(f"torch.compile(backend='neuron'): the emulator is not active ({d.kind}: {d.reason}) "
                           "and no other installed package provides a 'neuron' Dynamo backend")
    return other(gm, example_inputs, **kwargs)
