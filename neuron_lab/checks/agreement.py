"""Two runs of the same code, judged: what each raised, what they produced (:mod:`neuron_lab.checks.diff`
compares it), and where they first parted."""

from __future__ import annotations

from typing import Any

from neuron_lab.checks import diff
from neuron_lab.checks.runs import Run, Subject, error_text
from neuron_lab.report.checks import Agreement, Divergence, Item, Step


def build(subject: Subject, before: dict[str, Any], actual: Run, expected: Run, labels: tuple[str, str], *,
          names: tuple[str, ...] = (), rtol: float | None = None, atol: float | None = None) -> Agreement:
    """``actual`` against ``expected``: ``names`` only when given, else what :func:`diff.outputs` finds."""
    a = Agreement(*labels, actual_error=error_text(actual.error), expected_error=error_text(expected.error),
                  step_counts=(len(actual.losses), len(expected.losses)))
    if actual.error is not None or expected.error is not None:
        return a
    a.items, steps = diff.compared(subject, before, actual, expected, labels, names=names, rtol=rtol, atol=atol)
    a.steps = len(steps)
    a.divergence = _divergence(subject, a.items, steps)
    return a


def _divergence(subject: Subject, items: list[Item], steps: list[Step]) -> Divergence | None:
    """The first item over tolerance (in the code's order) and the first training step whose loss was."""
    bad = next((i for i in items if not i.passed), None)
    step = next((s for s in steps if not s.passed), None)
    if bad is None:
        return None if step is None else Divergence(step=step)
    return Divergence(bad.var or diff.LAST, bad.name, subject.line_of(bad.var), step)
