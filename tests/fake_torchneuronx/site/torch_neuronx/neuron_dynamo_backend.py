"""``torch.compile(backend="neuron")`` as the fake provides it: record a metrics entry, run the graph eagerly.

The real backend lowers the FX graph to StableHLO and compiles a NEFF; the fake keeps only what
neuron_lab reads, as the real one produces it:
- one ``NeuronCompilationMetrics`` record per graph (tnx:neuron_dynamo_backend/metrics.py:153-177), appended at
  compile time with the lowering time taken from dynamo's ``torch_neuronx_lower`` timing (:194-195,
  tnx:neuron_dynamo_backend/fx/fx_transform.py:185) and ``counters["neuron"]["compiled_graphs"]`` bumped (:199);
- ``torch_neuronx_compile_us`` (neuronx-cc) left 0 until ``get_dynamo_metrics()`` synchronizes, then taken from the
  NEFF cache entry (:204-227): a graph found in the cache reports its entry's original compile time again;
- the NEFF cache's counters (tnx:csrc/core/compilation/CompilationCache.cpp:149-215,566), kept while metrics are on;
- a graph whose execution fails runs ``gm.forward`` eagerly, logged in the real words, unless
  ``TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION`` is on (tnx:neuron_dynamo_backend/backend.py:232-242).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

from torch._dynamo.utils import compilation_time_metrics, counters

from torch_neuronx import _device, metrics

LOWER_US = 1000  # the fake lowers nothing; it records 1 ms of lowering per graph, so readers of the metric see some
NEFF_US = 250_000  # and 250 ms of neuronx-cc per NEFF it "compiles"
FAIL_EXECUTION = False  # fake-only: set True and every compiled graph's execution fails (the eager fallback)
logger = logging.getLogger("torch_neuronx.neuron_dynamo_backend.backend")
_cache: dict[str, int] = {}  # graph code -> its NEFF's compile time in ms (the cache entry)


@dataclass
class NeuronCompilationMetrics:
    graph_id: str
    graph_name: str
    model_name: str
    has_collectives: bool
    graph_node_count: int
    timestamp: str
    torch_neuronx_fx_passes_us: int
    torch_neuronx_lower_us: int
    torch_neuronx_compile_us: int = 0  # populated at get_dynamo_metrics(), after its synchronize


def compile_time_ms(graph_id: str) -> int:
    return next((ms for i, ms in enumerate(_cache.values()) if f"fake-{i}" == graph_id), 0)


def _neff(key: str) -> None:
    if key in _cache:
        metrics.count("CompilationCache.InMemoryHits")
        return
    metrics.count("CompilationCache.InMemoryMisses")
    metrics.count("CompilationCache.TotalCompilations")
    _cache[key] = NEFF_US // 1000


def neuron_backend(gm, example_inputs, **kwargs):
    st = _device.state()
    n = len(st.dynamo_metrics)
    model = (kwargs.get("options") or {}).get("model_name", "model")
    compilation_time_metrics.setdefault("torch_neuronx_lower", []).append(LOWER_US / 1e6)  # as dynamo_timed does
    _neff(gm.code)
    st.dynamo_metrics.append(NeuronCompilationMetrics(  # graph_id is the NEFF cache key (backend.py:206-211)
        graph_id=f"fake-{list(_cache).index(gm.code)}", graph_name=f"{model}_0_inference_{n}", model_name=model,
        has_collectives=False,
        graph_node_count=len(gm.graph.nodes), timestamp=str(time.time_ns()),
        torch_neuronx_fx_passes_us=0, torch_neuronx_lower_us=LOWER_US))
    counters["neuron"]["compiled_graphs"] += 1

    def execution_wrapper(*inputs):
        try:
            if FAIL_EXECUTION:
                raise RuntimeError("NEFF execution failed (fake)")
            return gm.forward(*inputs)
        except Exception as e:
            if os.environ.get("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "0").lower() in ("1", "true"):
                raise
            logger.error(f"Execution failed: {e}")
            logger.warning("Falling back to original GraphModule execution")
            return gm.forward(*inputs)

    return execution_wrapper
