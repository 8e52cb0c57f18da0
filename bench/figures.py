"""One format for every bench figure, so bench/table.py can gather them into one table and compare two runs.

A figure is a dict: ``name``, ``value`` (a float), ``unit`` (``"x"`` for a ratio to a baseline, ``"us"``, ``"%"``,
``"s"``, ``"syncs"``), ``target`` (the bound it must stay at or under, or None), ``spread`` (the interquartile range
of the rounds, when there were rounds), ``ci`` (a 95% confidence interval of the median, from the rounds' order
statistics: whether the rounds resolve the target) and ``holds``. A bench script writes ``{"figures": [...]}``
with ``--figures``.
"""

from __future__ import annotations

import json
import math
import statistics


def figure(name: str, samples: list[float], unit: str, target: float | None) -> dict:
    """The median of `samples` against `target` (at most), with the rounds' interquartile range."""
    value = statistics.median(samples)
    q = statistics.quantiles(samples, n=4) if len(samples) > 1 else [value, value, value]
    return {"name": name, "value": value, "unit": unit, "target": target, "spread": [q[0], q[2]],
            "ci": median_ci(samples), "holds": None if target is None else value <= target}


def median_ci(samples: list[float], level: float = 0.95) -> list[float]:
    """A distribution-free confidence interval of the median: the order statistics whose binomial tails hold
    ``1 - level`` between them (with few rounds, the widest there is: the smallest and largest)."""
    xs, n = sorted(samples), len(samples)
    k, below = 0, 1 / 2 ** n  # leaving k rounds out at each end misses the median with 2 * P(Binomial(n, 1/2) <= k)
    while k + 1 <= (n - 1) // 2:
        below += math.comb(n, k + 1) / 2 ** n
        if 2 * below > 1 - level:
            break
        k += 1
    return [xs[k], xs[n - 1 - k]]


def write(path: str | None, figures: list[dict]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump({"figures": figures}, f, indent=1)
