"""Trust checks: does the code give the same numbers on the device as on the CPU (``parity``), and
what does compiling buy (``compare``)? For a notebook cell (``%%neuron parity``, ``%%neuron compare``:
:func:`run_check`) or a function (:mod:`neuron_lab.checks.api`). No IPython here: a cell comes in as the
session describes it (:class:`~neuron_lab.session.session.CellToCheck`).
"""

from __future__ import annotations

from neuron_lab.checks import compare, parity
from neuron_lab.checks.compare import CompareOptions
from neuron_lab.checks.parity import ParityOptions
from neuron_lab.checks.runs import CellSubject
from neuron_lab.report.checks import CompareResult, ParityResult
from neuron_lab.session.session import CellToCheck

__all__ = ["CompareOptions", "ParityOptions", "run_check"]


def run_check(cell: CellToCheck, options: ParityOptions | CompareOptions) -> ParityResult | CompareResult:
    """A cell's check, by its options: parity (the cell's own run is the device run, its errors propagate) or
    compare (copies first, then the cell runs for real)."""
    __tracebackhide__ = True  # noqa: F841
    subject = CellSubject(cell)
    if isinstance(options, ParityOptions):
        return parity.check(subject, cell.device, options, locator=cell.locator, exclude=cell.exclude,
                            keep=cell.keep)
    return compare.check(subject, cell.device, options, locator=cell.locator, exclude=cell.exclude, keep=cell.keep,
                         then_run=True)
