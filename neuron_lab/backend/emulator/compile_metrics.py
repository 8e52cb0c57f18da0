"""The per-graph record ``get_dynamo_metrics()`` returns, shaped as TorchNeuron's ``NeuronCompilationMetrics``.

TorchNeuron's is a dataclass (tnx ``neuron_dynamo_backend/metrics.py``): code reads ``m.graph_name``, and on
hardware ``m["graph_name"]`` is a TypeError. The emulator's record has the same fields, then what the emulator
adds (how the graph was lowered, and why; the nodes TorchNeuron would not lower). Item access is kept too, for code
written against the dict records earlier versions returned.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class NeuronCompilationMetrics:
    graph_id: str
    graph_name: str = ""
    model_name: str = ""
    has_collectives: bool = False
    graph_node_count: int = 0
    timestamp: float = 0.0  # time.time() of the compile (TorchNeuron's is a segment-id string)
    torch_neuronx_fx_passes_us: int = 0
    torch_neuronx_lower_us: int = 0
    torch_neuronx_compile_us: int = 0
    # the emulator's own
    graph_type: str = ""
    lowering: str = ""
    lowering_reason: str | None = None
    unlowered: list[Any] = field(default_factory=list)  # nodes TorchNeuron would not lower: the graph fails
    fallback_execution: bool = False  # it failed, and ran eagerly (TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0)

    def keys(self) -> list[str]:
        """The field names, so ``dict(record)`` works."""
        return [f.name for f in fields(self)]

    def __iter__(self) -> Iterator[str]:  # `set(record)`, `for key in record`, as over the dict it was
        return iter(self.keys())

    def __getitem__(self, key: str) -> Any:
        if key not in self.keys():
            raise KeyError(key)
        return getattr(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in self.keys():
            raise KeyError(key)
        setattr(self, key, value)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in self.keys() else default
