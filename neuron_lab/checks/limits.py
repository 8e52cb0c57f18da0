"""The bounds of the checks' options, enforced once, where the option objects are made.

``ParityOptions`` and ``CompareOptions`` call these from ``__post_init__``, so ``%%neuron parity``,
``%%neuron compare``, ``neuron_lab.parity()`` and ``neuron_lab.compare()`` refuse the same values with
the same words. The bounds keep a check meaningful and finite: a NaN tolerance passes everything, an
astronomical ``--runs`` never ends, and a seed outside what ``torch.manual_seed`` keeps fails half way.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

MAX_RUNS = 10_000
MAX_WARMUP = 10_000
MAX_SEED = 2**64 - 1  # torch.manual_seed keeps seeds in [0, 2**64 - 1] (it remaps negative ones into that range)


class OptionError(ValueError):
    """An option outside its bounds. The message names options as ``{rtol}`` so each caller spells them its own
    way: ``rtol`` for ``neuron_lab.parity(...)`` (``str(e)``), ``--rtol`` for ``%%neuron parity``."""

    def __init__(self, template: str) -> None:
        self.template = template
        super().__init__(self.spelled(lambda name: name))

    def spelled(self, spell: Callable[[str], str]) -> str:
        return re.sub(r"\{(\w+)\}", lambda m: spell(m.group(1)), self.template)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def count(name: str, value: Any, low: int, high: int) -> None:
    if not _is_int(value) or not low <= value <= high:
        raise OptionError(f"{{{name}}} must be a whole number from {low} to {high:,} (got {value!r})")


def tolerances(rtol: Any, atol: Any) -> None:
    if (rtol is None) != (atol is None):
        raise OptionError("give both {rtol} and {atol}, or neither (as torch.testing.assert_close)")
    for name, value in (("rtol", rtol), ("atol", atol)):
        ok = value is None or ((_is_int(value) or isinstance(value, float)) and math.isfinite(value) and value >= 0)
        if not ok:
            raise OptionError(f"{{{name}}} must be a finite number >= 0 (got {value!r})")


def seed(value: Any) -> None:
    if value is not None and (not _is_int(value) or not 0 <= value <= MAX_SEED):
        raise OptionError(f"{{seed}} must be a whole number from 0 to 2**64-1 = {MAX_SEED} (got {value!r}), "
                          "as torch.manual_seed keeps it")
