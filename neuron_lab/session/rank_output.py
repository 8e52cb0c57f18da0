"""What the ranks of a ``%%neuron ranks`` cell print, shown once for the ranks that printed the same thing.

stdout streams while the cell runs, collapsed as it comes (``report.rank_lines``): a line every rank printed alike is
shown once, as soon as the last running rank printed it or after ``NeuronLab.ranks_output_window_s``, with the ranks
that printed it (``[ranks 0-1] epoch 1``); a rank's own line with its rank, as ``%%px`` prefixes it (``[stdout:1]``).
stderr and each rank's traceback are held until the cell ends, then collapsed alike (torch's warnings once). A rank's
compile progress line is not shown: updated in place on its engine, it cannot be in the notebook.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Collection
from typing import Any

from neuron_lab.report.rank_lines import Collapser, collapse
from neuron_lab.session.waits import MIME as PROGRESS


class HeldOutput:
    """While a cell runs on the ranks: stdout collapsed as it streams, stderr and tracebacks kept; :meth:`show`
    prints what is left."""

    def __init__(self, running: dict[int, Any], window_s: float) -> None:
        self.running = running  # rank: the AsyncResult of its cell
        self.stdout = Collapser(running, window_s)
        self.stderr: dict[int, list[str]] = {rank: [] for rank in running}
        self.tracebacks: dict[int, list[str]] = {rank: [] for rank in running}
        self._partial = {name: dict.fromkeys(running, "") for name in ("stdout", "stderr")}  # lines not ended yet
        self._streams: list[Any] = []
        self._lock = threading.Lock()  # ipyparallel's thread adds lines, ours shows those that waited their window
        self._ended = threading.Event()
        self._ticker = threading.Thread(target=self._tick, args=(min(max(window_s, 0.02), 0.1),), daemon=True,
                                        name="neuron-lab-rank-output")

    def __enter__(self) -> HeldOutput:
        for rank, ar in self.running.items():
            # ipyparallel's own streaming, with stdout, stderr and errors handed to us (its per-result callback)
            ar._iopub_streaming_output_callback = self._hook(rank, ar._iopub_streaming_output_callback)
            self._streams.append(ar.stream_output())
            self._streams[-1].__enter__()
        self._ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ended.set()
        self._ticker.join()
        for s in reversed(self._streams):
            s.__exit__(None, None, None)

    def _tick(self, every_s: float) -> None:
        """Show the lines that waited their window; a rank whose cell ended (its output all in) waits for nothing."""
        while not self._ended.wait(every_s):
            with self._lock:
                for rank, ar in self.running.items():
                    if rank in self.stdout.running and ar.ready() and ar._output_ready:
                        self._print(self.stdout.leave(rank))
                self._print(self.stdout.due())

    def _lines(self, name: str, rank: int, text: str) -> list[str]:
        *lines, self._partial[name][rank] = (self._partial[name][rank] + text).split("\n")
        return lines

    def _hook(self, rank: int, stream: Any) -> Any:
        def callback(eid: int, msg_future: Any, msg: dict[str, Any]) -> None:
            kind, content = msg["header"]["msg_type"], msg.get("content", {})
            if kind == "stream" and content.get("name") == "stdout":
                with self._lock:
                    for line in self._lines("stdout", rank, content["text"]):
                        self._print(self.stdout.add(rank, line))
            elif kind == "stream" and content.get("name") == "stderr":
                self.stderr[rank] += self._lines("stderr", rank, content["text"])
            elif kind == "display_data" and PROGRESS in content.get("data", {}):
                pass  # a rank's compile progress line: ipyparallel's copy would be an "[output:N]" line and a line
                # never updated or emptied (the copy has no display_id)
            elif kind == "error":
                self.tracebacks[rank].append("\n".join(content.get("traceback") or
                                                       [f"{content.get('ename')}: {content.get('evalue')}"]))
            else:  # prefixed with the rank: an engine's id is its launcher's order, not its rank (srun's, mpiexec's)
                stream(rank, msg_future, msg)
        return callback

    @staticmethod
    def _print(lines: list[str], file: Any = None) -> None:
        if lines:
            print("\n".join(lines), file=file or sys.stdout, flush=True)

    def show(self, stopped: Collection[int] = ()) -> None:
        """The stdout lines still waiting, then the held stderr lines, then the tracebacks, each distinct one once
        (to stderr, as ``%%px`` shows them); not the KeyboardInterrupt of the ranks the notebook ``stopped`` after
        another failed (the report says where each was)."""
        with self._lock:
            for rank, rest in self._partial["stdout"].items():
                if rest:
                    self._print(self.stdout.add(rank, rest))
            self._print(self.stdout.end())
        for rank, rest in self._partial["stderr"].items():
            if rest:
                self.stderr[rank].append(rest)
        self._partial = {name: dict.fromkeys(self.running, "") for name in self._partial}
        for rank, ar in self.running.items():  # failed before its output was streamed: its traceback from the result
            if not self.tracebacks[rank] and ar.ready() and not ar.successful():
                self.tracebacks[rank] += [tb for tb in [getattr(ar.exception(), "traceback", None)] if tb]
        for rank in stopped:
            self.tracebacks[rank] = []
        self._print(collapse(self.stderr, ("[stderr:{ranks}] ", "[ranks {ranks}] "))
                    + collapse(self.tracebacks, ("[{ranks}:execute]\n", "[ranks {ranks}:execute]\n"), values=False),
                    sys.stderr)
