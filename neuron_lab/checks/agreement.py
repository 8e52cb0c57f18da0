"""What two runs of the same code produced, compared: the items, the training steps, where they parted."""

from __future__ import annotations

from typing import Any

from neuron_lab.checks import diff
from neuron_lab.checks.runs import Loss, Run, Subject, error_text
from neuron_lab.report.checks import Agreement, Divergence, Item, Step

LAST = "last value"


def outputs(subject: Subject, before: dict[str, Any], runs: tuple[Run, Run]) -> list[str]:
    """Names to compare: those the code mentions or creates, holding tensors, modules, optimizers or numbers."""
    order = [*subject.names(), *(n for r in runs for n in r.namespace if n not in before)]
    return [n for n in dict.fromkeys(order) if subject.visible(n)
            and any(n in r.namespace and diff.comparable(r.namespace[n]) for r in runs)]


def _items(var: str, actual: Any, expected: Any, labels: tuple[str, str], rtol: float | None,
           atol: float | None, name: str | None = None) -> list[Item]:
    name = name or var
    la, le = dict(diff.leaves(name, actual)), dict(diff.leaves(name, expected))
    if not la and not le:  # named with --vars, holding something else: compare by ==
        try:
            same = bool(actual == expected)
        except Exception:
            same = False
        return [Item(name, var, same, None if same else "values differ", actual_value=repr(actual)[:60],
                     expected_value=repr(expected)[:60])]
    out = []
    for path in dict.fromkeys([*la, *le]):
        if path not in le:
            out.append(diff.missing(path, var, labels[1]))
        elif path not in la:
            out.append(diff.missing(path, var, labels[0]))
        else:
            out.append(diff.compare(path, var, la[path], le[path], rtol, atol))
    return out


def _first_step(actual: list[Loss], expected: list[Loss], rtol: float | None,
                atol: float | None) -> tuple[int, Step | None]:
    n = min(len(actual), len(expected))
    for i in range(n):
        a, e = actual[i], expected[i]
        r, t = (rtol, atol) if rtol is not None and atol is not None else diff.default_tolerances(a.dtype, e.dtype)
        if not abs(a.value - e.value) <= t + r * abs(e.value):  # NaN fails
            return n, Step(i + 1, a.value, e.value, False, a.site)
    return n, None


def build(subject: Subject, before: dict[str, Any], actual: Run, expected: Run, labels: tuple[str, str], *,
          names: tuple[str, ...] = (), rtol: float | None = None, atol: float | None = None) -> Agreement:
    """Compare ``actual`` against ``expected``: ``names`` only when given, else what :func:`outputs` finds."""
    a = Agreement(*labels, actual_error=error_text(actual.error), expected_error=error_text(expected.error),
                  step_counts=(len(actual.losses), len(expected.losses)))
    if actual.error is not None or expected.error is not None:
        return a
    for n in names or outputs(subject, before, (actual, expected)):
        here, there = n in actual.namespace, n in expected.namespace
        if not here and not there:
            a.items.append(Item(n, n, False, "not defined after either run"))
        elif not there:
            a.items.append(diff.missing(n, n, labels[1]))
        elif not here:
            a.items.append(diff.missing(n, n, labels[0]))
        else:
            a.items += _items(n, actual.namespace[n], expected.namespace[n], labels, rtol, atol)
    if not names and not subject.last_is_name() and (actual.value is not None or expected.value is not None):
        a.items += [i for i in _items("", actual.value, expected.value, labels, rtol, atol, LAST)
                    if diff.comparable(actual.value) or diff.comparable(expected.value)]
    a.steps, step = _first_step(actual.losses, expected.losses, rtol, atol)
    bad = next((i for i in a.items if not i.passed), None)
    if bad is not None or step is not None:
        var = (bad.var or LAST) if bad is not None else None
        a.divergence = Divergence(var, bad.name if bad else None, subject.line_of(bad.var) if bad else None, step)
    return a
