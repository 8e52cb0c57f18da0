"""``torch.compile(backend="neuron")`` as the fake provides it: record a metrics entry, run the graph eagerly.

The real backend lowers the FX graph to StableHLO and compiles a NEFF; the fake keeps only what
neuron_lab reads: one ``NeuronCompilationMetrics``-shaped record per graph, and outputs on `neuron`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from torch_neuronx import _device

LOWER_US = 1000  # the fake lowers nothing; it records 1 ms of lowering per graph, so readers of the metric see some


@dataclass
class NeuronCompilationMetrics:
    graph_id: str
    graph_name: str
    model_name: str
    has_collectives: bool
    graph_node_count: int
    timestamp: float
    torch_neuronx_fx_passes_us: int
    torch_neuronx_lower_us: int
    torch_neuronx_compile_us: int


def neuron_backend(gm, example_inputs, **kwargs):
    st = _device.state()
    t0 = time.perf_counter_ns()
    n = len(st.dynamo_metrics)
    model = (kwargs.get("options") or {}).get("model_name", "model")
    fx_us = (time.perf_counter_ns() - t0) // 1000
    st.dynamo_metrics.append(NeuronCompilationMetrics(
        graph_id=f"fake-{n}", graph_name=f"{model}_0_inference_{n}", model_name=model, has_collectives=False,
        graph_node_count=len(gm.graph.nodes), timestamp=time.time(),
        torch_neuronx_fx_passes_us=fx_us, torch_neuronx_lower_us=LOWER_US,
        torch_neuronx_compile_us=fx_us + LOWER_US))
    return gm.forward
