"""The notes a session says once, each under the first report shown that calls for it (the int64 note).

The extension shows them under the report (``extension.load``); ``neuron-lab run``'s agent asks which were said
under a report, so the terminal shows the text Jupyter showed under the cell.
"""

from __future__ import annotations

from collections.abc import Callable

from neuron_lab.report.model import Report
from neuron_lab.report.rows import INT64_NOTE, expected_downcast

# each note, and whether a report calls for it
NOTES: tuple[tuple[str, Callable[[Report], bool]], ...] = (
    (INT64_NOTE, lambda report: any(expected_downcast(row) for row in report.downcasts)),
)


class OnceNotes:
    """Which of :data:`NOTES` this session has said, and under which report it said the last ones."""

    def __init__(self) -> None:
        self._said: set[str] = set()
        self._last: tuple[Report | None, list[str]] = (None, [])

    def say(self, report: Report) -> list[str]:
        """The notes due under ``report``, shown now: none of them is due again this session."""
        due = [note for note, calls_for in NOTES if note not in self._said and calls_for(report)]
        self._said.update(due)
        self._last = (report, due)
        return due

    def said_under(self, report: Report) -> list[str]:
        """The notes :meth:`say` gave for ``report``, when it was the last report shown; else none."""
        return self._last[1] if self._last[0] is report else []
