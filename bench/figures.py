"""One format for every bench figure, so bench/table.py can gather them into one table and compare two runs.

A figure is a dict: ``name``, ``value`` (a float), ``unit`` (``"x"`` for a ratio to a baseline, ``"us"``, ``"%"``,
``"s"``), ``target`` (the bound it must stay at or under, or None), ``spread`` (the interquartile range of the
rounds, when there were rounds) and ``holds``. A bench script writes ``{"figures": [...]}`` with ``--figures``.
"""

from __future__ import annotations

import json
import statistics


def figure(name: str, samples: list[float], unit: str, target: float | None) -> dict:
    """The median of `samples` against `target` (at most), with the rounds' interquartile range."""
    value = statistics.median(samples)
    q = statistics.quantiles(samples, n=4) if len(samples) > 1 else [value, value, value]
    return {"name": name, "value": value, "unit": unit, "target": target, "spread": [q[0], q[2]],
            "holds": None if target is None else value <= target}


def write(path: str | None, figures: list[dict]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump({"figures": figures}, f, indent=1)
