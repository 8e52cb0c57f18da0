"""``torch_neuronx.metrics`` as far as the fake keeps it: named counters, collected while metrics are enabled
(``TORCH_NEURONX_METRICS_ENABLED`` "1"/"true"/"yes" at import, or ``set_enabled``): tnx:torch_neuronx/metrics.py:26-79.
"""

from __future__ import annotations

import os

_enabled = os.environ.get("TORCH_NEURONX_METRICS_ENABLED", "").lower() in ("1", "true", "yes")
_counters: dict[str, int] = {}


def is_enabled() -> bool:
    return _enabled


def set_enabled(enabled: bool) -> None:
    global _enabled
    _enabled = bool(enabled)


def count(name: str, n: int = 1) -> None:
    """Fake-only: what the C++ TORCH_NEURONX_COUNTER macro does."""
    if _enabled:
        _counters[name] = _counters.get(name, 0) + n


def get_counter_names() -> list[str]:
    return sorted(_counters)


def get_counter_value(name: str) -> int | None:
    return _counters.get(name)


def clear_counters() -> None:
    _counters.clear()
