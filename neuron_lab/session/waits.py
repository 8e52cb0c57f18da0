"""The progress line of a long compile, in the cell that compiles: a first compile takes seconds, and a cell that
says nothing for that long looks hung.

One daemon thread for the session, idle between cells. While a cell runs it reads the cell's compile in progress
(``Tracker.compiling()``: plain reads) four times a second; only a compile that has run
``NeuronLab.compile_progress_s`` (0.7 s) shows a line, so cached and quick compiles show nothing. Under a kernel
the line is one display output updated in place (``display_id``) and emptied as the cell ends, before its report;
elsewhere (a terminal, a captured shell) each new step is one printed line, never a carriage return.
"""

from __future__ import annotations

import sys
import threading
import uuid
from typing import Any

from neuron_lab.report.waits import compiling_line, compiling_step, settled

TICK_S = 0.25
MIME = "application/vnd.neuron-lab.progress+json"  # the line's data: ``neuron-lab run`` prints each step once


def bundle(text: str = "", step: str = "") -> dict[str, Any]:
    """The line as display data: its text, and its step for readers that print a step once."""
    return {"text/plain": text, MIME: {"text": text, "step": step}}


class CompileProgress:
    """Shows the running cell's compile in progress; :meth:`cell_started` and :meth:`cell_ended` bracket a cell."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.in_place = getattr(shell, "kernel", None) is not None  # a kernel's frontend updates a display
        self.error: BaseException | None = None  # the thread's last failure (a thread must not print it)
        self._wake = threading.Condition()
        self._tracker: Any = None  # the running cell's, while one runs
        self._after_s = 0.0  # how long a compile runs before its line shows
        self._parent: Any = None  # the running cell's request (a kernel's outputs go to the cell that made them)
        self._generation = 0
        self._shown: str | None = None  # the display_id of the cell's line, once shown
        self._thread: threading.Thread | None = None
        self._closed = False

    def cell_started(self, tracker: Any, after_s: float) -> None:
        with self._wake:
            self._tracker, self._shown, self._after_s = tracker, None, after_s
            self._parent = getattr(self.shell, "parent_header", None)
            self._generation += 1
            self._wake.notify()
            if self._thread is None:  # one for the session, started by its first cell
                self._thread = threading.Thread(target=self._run, name="neuron_lab-progress", daemon=True)
                self._thread.start()

    def cell_ended(self) -> None:
        """The cell is over: no more updates, and its line (under a kernel) is emptied for the report."""
        with self._wake:
            self._tracker = None
            self._generation += 1
            shown, self._shown = self._shown, None
        if shown is not None:
            self._publish(bundle(), shown, update=True)

    def close(self) -> None:
        """The session ends: the thread returns at its next wake (a daemon: nothing waits for it)."""
        self.cell_ended()
        with self._wake:
            self._closed = True
            self._wake.notify()

    def _publish(self, data: dict[str, Any], display_id: str, update: bool) -> None:
        """What ``display(..., display_id=...)`` and its handle's ``update`` send, through the shell's publisher."""
        self.shell.display_pub.publish(data=data, metadata={}, transient={"display_id": display_id}, update=update)

    def _run(self) -> None:
        generation, said, loading = -1, "", False
        while True:
            with self._wake:
                while self._tracker is None and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                tracker, gen, parent, after_s = self._tracker, self._generation, self._parent, self._after_s
            if gen != generation:
                generation, said, loading = gen, "", False
                self._adopt(parent)
            try:
                c = tracker.compiling()
                if c is not None and (said or c["elapsed_s"] >= after_s):  # once shown, every step shows
                    loading = c["phase"] == "loading"
                    said = self._say(compiling_line(c), compiling_step(c), said, gen)
                elif c is None and said and self.in_place:  # no stale step while the cell goes on
                    said = self._say(settled(loading), settled(loading), said, gen)
            except Exception as e:  # noqa: BLE001  (kept for inspection; the cell and its report go on)
                self.error = e
            tracker = None  # not kept while waiting: between cells (and after the session closes) it would hold the
            # last cell's tracker, its rows and its locator
            with self._wake:
                if self._generation == gen and not self._closed:
                    self._wake.wait(TICK_S)

    def _adopt(self, parent: Any) -> None:
        """This thread's outputs go to the running cell (ipykernel routes a thread's by the parent it is given)."""
        pub = getattr(self.shell, "display_pub", None)
        if parent and hasattr(pub, "set_thread_parent"):
            pub.set_thread_parent(parent)

    def _say(self, text: str, step: str, said: str, gen: int) -> str:
        """Show the line (in place), or print its step when it is a new one (lines); what was said."""
        wanted = text if self.in_place else step
        if wanted == said:
            return said
        with self._wake:
            if self._generation != gen:  # the cell ended meanwhile: its report is coming, say nothing
                return said
            if not self.in_place:
                print(f"neuron_lab: {step}…", file=sys.stdout, flush=True)
            elif self._shown is None:
                self._shown = uuid.uuid4().hex
                self._publish(bundle(text, step), self._shown, update=False)
            else:
                self._publish(bundle(text, step), self._shown, update=True)
        return wanted
