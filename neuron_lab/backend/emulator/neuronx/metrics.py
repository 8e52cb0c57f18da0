"""``torch_neuronx.metrics`` on the emulator: TorchNeuron's counters-and-metrics API, with nothing to count.

TorchNeuron's counters are its NEFF compilation cache's (``CompilationCache.InMemoryHits``, ``.PersistentHits``,
``.TotalCompilations``, ...; tnx ``torch_neuronx/metrics.py``). The emulator compiles no NEFF and has no such
cache, so it has no counter or metric it could give honestly: the names are empty and a value is None, as
TorchNeuron's are before a counter's first increment. Code that reads them runs unchanged. Collection is off
until :func:`set_enabled` (TorchNeuron also reads ``TORCH_NEURONX_METRICS_ENABLED`` at start-up; with nothing
to collect, the emulator does not).
"""

from __future__ import annotations

from typing import Any

_enabled = False


def is_enabled() -> bool:
    return _enabled


def set_enabled(enabled: bool) -> None:
    global _enabled
    _enabled = bool(enabled)


def get_counter_names() -> list[str]:
    return []


def get_counter_value(name: str) -> int | None:
    return None


def get_metric_names() -> list[str]:
    return []


def get_metric_data(name: str) -> dict[str, Any] | None:
    return None


def report() -> str:
    return ("No Neuron metrics: the emulator compiles no NEFF, so it has none of TorchNeuron's compilation-cache "
            "counters (see torch.neuron.get_dynamo_metrics() for its per-graph records).")


def report_filtered(counter_names: list[str] | None = None, metric_names: list[str] | None = None) -> str:
    return report()


def clear_counters() -> None:
    """Nothing to clear."""


def clear_metrics() -> None:
    """Nothing to clear."""


def clear_all() -> None:
    """Nothing to clear."""


def get_compilation_metrics() -> dict[str, Any]:
    return {}
