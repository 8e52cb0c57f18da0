"""Trust checks: does the code give the same numbers on the device as on the CPU (``parity``), and
what does compiling buy (``compare``)? For a notebook cell (``%%neuron parity``, ``%%neuron compare``)
or a function (:mod:`neuron_lab.checks.api`). No IPython here: a cell comes in as a :class:`CellSubject`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from neuron_lab.checks import compare, parity
from neuron_lab.checks.compare import CompareOptions
from neuron_lab.checks.parity import ParityOptions
from neuron_lab.checks.runs import CellSubject, Subject
from neuron_lab.report.checks import CompareResult, ParityResult
from neuron_lab.trace.sites import Locator

__all__ = ["CellSubject", "CompareOptions", "ParityOptions", "run_check"]


def run_check(kind: str, subject: Subject, device: torch.device, options: ParityOptions | CompareOptions, *,
              locator: Locator, exclude: Callable[[], Any] = contextlib.nullcontext,
              keep: Callable[[Any], None] | None = None) -> ParityResult | CompareResult:
    """A cell's check: ``parity`` (the cell's own run is the device run) or ``compare`` (copies, then the cell)."""
    __tracebackhide__ = True  # noqa: F841
    if kind == "parity":
        return parity.check(subject, device, options, locator=locator, exclude=exclude, keep=keep)
    if kind == "compare":
        return compare.check(subject, device, options, locator=locator, exclude=exclude, keep=keep, then_run=True)
    raise ValueError(f"unknown check {kind!r}; expected parity or compare")
