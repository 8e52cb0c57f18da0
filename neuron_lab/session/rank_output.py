"""What the ranks of a ``%%neuron ranks`` cell print, shown once for the ranks that printed the same thing.

stdout streams as it comes, prefixed by rank as ``%%px`` streams it (``[stdout:1]``): a training loop's progress is
the user's own. stderr and each rank's traceback are held until the cell ends; then a line (or a traceback) every
rank printed alike is shown once with the ranks that printed it (``[ranks 0-1] UserWarning: ...``), one rank's own
as ``%%px`` shows it (``[stderr:1] ...``, ``[1:execute]``). Lines that differ between ranks only where each rank
writes its own process (IPython's per-process cell files, c10d's timestamp and thread, gloo's "Rank N is connected")
count as alike, so torch's warnings are shown once.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from neuron_lab.report.ranks import ranks_label

_OWN_PROCESS = [  # (what differs between ranks in a line that says the same thing on each, what it becomes)
    (re.compile(r"ipykernel_\d+"), "ipykernel_*"),  # ipykernel names a cell's file after the process
    (re.compile(r"^\[([WIEF])\d{4} \d\d:\d\d:\d\d\.\d+ \d+ "), r"[\1 "),  # c10's log prefix: date, time, thread
    (re.compile(r"\[Gloo\] Rank \d+ is connected to"), "[Gloo] Rank * is connected to"),
]


def collapse(texts: dict[int, list[str]], one: str, many: str) -> list[str]:
    """Each distinct text of ``texts`` (rank: its texts, in order) once, in the order first printed, prefixed by
    ``one`` or ``many`` formatted with ``ranks`` (the ranks that printed it)."""
    seen: dict[str, tuple[str, set[int]]] = {}
    for rank in sorted(texts):
        for text in texts[rank]:
            seen.setdefault(_alike(text), (text, set()))[1].add(rank)
    return [(many if len(ranks) > 1 else one).format(ranks=ranks_label(ranks)) + text
            for text, ranks in seen.values()]


def _alike(text: str) -> str:
    for pattern, same in _OWN_PROCESS:
        text = pattern.sub(same, text)
    return text


class HeldOutput:
    """While a cell runs on the ranks: stdout streamed, stderr and tracebacks kept; :meth:`show` prints those."""

    def __init__(self, running: dict[int, Any]) -> None:
        self.running = running  # rank: the AsyncResult of its cell
        self.stderr: dict[int, list[str]] = {rank: [] for rank in running}
        self.tracebacks: dict[int, list[str]] = {rank: [] for rank in running}
        self._partial: dict[int, str] = dict.fromkeys(running, "")  # a line not ended yet
        self._streams: list[Any] = []

    def __enter__(self) -> HeldOutput:
        for rank, ar in self.running.items():
            # ipyparallel's own streaming, with stderr and errors handed to us (its per-result callback)
            ar._iopub_streaming_output_callback = self._hook(rank, ar._iopub_streaming_output_callback)
            self._streams.append(ar.stream_output())
            self._streams[-1].__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        for s in reversed(self._streams):
            s.__exit__(None, None, None)

    def _hook(self, rank: int, stream: Any) -> Any:
        def callback(eid: int, msg_future: Any, msg: dict[str, Any]) -> None:
            kind, content = msg["header"]["msg_type"], msg.get("content", {})
            if kind == "stream" and content.get("name") == "stderr":
                *lines, self._partial[rank] = (self._partial[rank] + content["text"]).split("\n")
                self.stderr[rank] += lines
            elif kind == "error":
                self.tracebacks[rank].append("\n".join(content.get("traceback") or
                                                       [f"{content.get('ename')}: {content.get('evalue')}"]))
            else:  # prefixed with the rank: an engine's id is its launcher's order, not its rank (srun's, mpiexec's)
                stream(rank, msg_future, msg)
        return callback

    def show(self) -> None:
        """The held stderr lines, then the tracebacks, each distinct one once (to stderr, as ``%%px`` shows them)."""
        for rank, rest in self._partial.items():
            if rest:
                self.stderr[rank].append(rest)
        self._partial = dict.fromkeys(self._partial, "")
        for rank, ar in self.running.items():  # failed before its output was streamed: its traceback from the result
            if not self.tracebacks[rank] and ar.ready() and not ar.successful():
                self.tracebacks[rank] += [tb for tb in [getattr(ar.exception(), "traceback", None)] if tb]
        lines = collapse(self.stderr, "[stderr:{ranks}] ", "[ranks {ranks}] ")
        lines += collapse(self.tracebacks, "[{ranks}:execute]\n", "[ranks {ranks}:execute]\n")
        if lines:
            print("\n".join(lines), file=sys.stderr)
