"""Run a :class:`~neuron_lab.runner.inputs.Program` in a fresh ipykernel through nbclient, cell by cell.

Before the first cell a silent execution loads the extension (``kernel.install``); after each cell
another fetches that cell's report from the in-kernel agent (``agent.after_cell``), so the records of the cells
before a kernel death are already here when it happens. Silent executions store no history, fire no cell events
and add no output, so the executed notebook is what the user would have seen.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from queue import Empty
from typing import IO, Any

import nbclient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

from neuron_lab import agent
from neuron_lab.compat import nbclient as compat
from neuron_lab.runner.inputs import Program
from neuron_lab.runner.records import DIED, ERROR, INTERRUPTED, OK, STOPPED, TIMEOUT, CellRecord
from neuron_lab.session.waits import MIME as PROGRESS

STARTUP_TIMEOUT = 120  # seconds: a cold start imports torch
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_HOOK = "__import__('neuron_lab.runner.kernel', fromlist=['kernel'])"  # the runner's own calls: load, --trace
_AGENT = "__import__('neuron_lab.agent', fromlist=['agent'])"  # the in-kernel agent %neuron ranks calls too
_LOADS_ITSELF = re.compile(r"^\s*%(re)?load_ext\s+neuron_lab\b", re.M)
_RETRIES = 50  # times a silent request the kernel aborted is sent again (0.1 s apart)
_STDERR_TAIL = 20  # lines of the kernel process's own stderr kept for a kernel failure
_TCP_WARNING = "[IPKernelApp] WARNING | Kernel is running over TCP"  # every local kernel says it; not news
_QUIET = logging.getLogger("neuron_lab.runner.nbclient")  # nbclient's log lines repeat what the runner says
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


class KernelFailed(RuntimeError):
    """The kernel could not start, could not load neuron_lab, or died."""


@dataclass
class Outcome:
    cells: list[CellRecord]
    info: dict[str, Any] = field(default_factory=dict)  # what kernel.install returned: banner, backend, profile
    kernel_error: str | None = None  # why the kernel failed, when it did
    preflight: str | None = None  # a rank whose ranks differ: the preflight's table (no cell ran)
    kernel_stderr: str = ""  # the last lines the kernel process wrote to its stderr (shown when it failed)
    interrupted: bool = False  # Ctrl-C (SIGINT): the running cell was interrupted and the run stopped there
    pid: int | None = None  # the kernel process, once started (a local kernel's)
    seconds: float = 0.0


def run(program: Program, env: dict[str, str], timeout: float | None,
        on_cell: Callable[[CellRecord], None], on_ready: Callable[[dict[str, Any]], None],
        trace: Callable[[CellRecord], str] | None = None,
        on_progress: Callable[[CellRecord, str], None] | None = None) -> Outcome:
    return asyncio.run(Run(program, env, timeout, on_cell, on_ready, trace=trace, on_progress=on_progress).main())


class Run:
    """One run of a program in one kernel; each step below has one job.

    Several ranks (``runner.ranks``) pass ``pace``, awaited before each cell (False stops the run there), and
    ``on_start``, called once the kernel started, when nbclient has just put its own Ctrl-C handler in place:
    by default this kernel's :func:`on_ctrl_c` replaces it, the ranks' replaces it with one for every rank.
    ``trace`` (``--trace``) names the file each cell's Chrome trace goes to; the kernel is told just before the cell.
    ``on_timeout`` (several ranks) is awaited when a cell passes ``--timeout``, and interrupts this kernel itself.
    ``on_progress`` gets each new step of a long compile's progress line while its cell runs (the line itself, a
    display the kernel empties as the cell ends, is left out of the executed notebook).
    """

    def __init__(self, program: Program, env: dict[str, str], timeout: float | None,
                 on_cell: Callable[[CellRecord], None], on_ready: Callable[[dict[str, Any]], None],
                 pace: Callable[[CellRecord], Awaitable[bool]] | None = None,
                 on_start: Callable[[], None] | None = None,
                 trace: Callable[[CellRecord], str] | None = None,
                 on_progress: Callable[[CellRecord, str], None] | None = None,
                 preflight_s: float | None = None,
                 on_timeout: Callable[[CellRecord], Awaitable[None]] | None = None) -> None:
        self.program, self.env, self.timeout, self.trace = program, env, timeout, trace
        self.preflight_s = preflight_s  # a rank of several: its preflight, waiting this long for the others
        self.on_cell, self.on_ready, self.pace, self.on_timeout = on_cell, on_ready, pace, on_timeout
        self.on_start = on_start or (lambda: on_ctrl_c([(self.client, self.outcome)]))
        self.stopped: str | None = None  # why the caller ended this kernel (another rank failed)
        self.executing = False  # a cell of the program runs in the kernel now (not the runner's own requests)
        self.outcome = Outcome([CellRecord(index, k) for k, index in enumerate(program.code_cells, 1)])
        self.script: dict[str, Any] | None = None  # what the kernel needs to name a script's lines (agent.Script)
        if program.kind == "script":
            self.script = {"path": str(program.path), "file": str(program.path.resolve()),
                           "first_lines": program.first_lines}
            for rec, line in zip(self.outcome.cells, program.first_lines):
                rec.where = f"{program.path}:{line}"
        self.client = nbclient.NotebookClient(
            program.nb, kernel_name="python3", startup_timeout=STARTUP_TIMEOUT,
            timeout=None if timeout is None else math.ceil(timeout), log=_QUIET,
            resources={"metadata": {"path": str(program.path.parent.resolve())}}, on_cell_error=self._heard_error)
        self.raised: dict[str, Any] | None = None  # the running cell's error, as its execute reply names it
        if on_progress is not None:
            self._tell_progress(on_progress)

    def _tell_progress(self, on_progress: Callable[[CellRecord, str], None]) -> None:
        """Each new step of a cell's progress line to ``on_progress``, as the kernel sends it."""
        records = {rec.index: rec for rec in self.outcome.cells}
        said: dict[int, str] = {}
        process_message = self.client.process_message

        def telling(msg: dict[str, Any], cell: Any, cell_index: int) -> Any:
            line = msg.get("content", {}).get("data", {}).get(PROGRESS)
            if line and line.get("step") and said.get(cell_index) != line["step"] and cell_index in records:
                said[cell_index] = line["step"]
                on_progress(records[cell_index], line["step"])
            return process_message(msg, cell, cell_index)

        self.client.process_message = telling

    async def main(self) -> Outcome:
        start = time.monotonic()
        # The kernel's own stderr (its launcher's log, a crash's last words) goes to a file, not between our lines.
        with tempfile.TemporaryFile() as kernel_stderr:
            await self._in_kernel(kernel_stderr)
            self.outcome.kernel_stderr = _tail(kernel_stderr)
        self.outcome.seconds = time.monotonic() - start
        return self.outcome

    async def _in_kernel(self, kernel_stderr: IO[bytes]) -> None:
        """Start the kernel, run the program in it, shut it down; a kernel failure becomes ``kernel_error``."""
        started = False
        try:
            async with self.client.async_setup_kernel(env=self.env, stderr=kernel_stderr):
                started = True
                self.outcome.pid = getattr(self.client.km.provisioner, "pid", None)
                self.on_start()
                await self._language_info()
                if self.preflight_s is not None:
                    self.outcome.preflight = (await _ask(self.client, f"{_AGENT}.preflight_rank(get_ipython(), "
                                                                      f"{self.preflight_s!r})"))["table"]
                    if self.outcome.preflight is not None:
                        return  # the ranks differ: none runs the program (it would hang or fail far from the cause)
                    await _ask(self.client, f"{_AGENT}.answer_where(get_ipython())")  # a cell past --timeout asks
                await self._load()
                await self._cells()
                self.client.set_widgets_metadata()  # the widgets' last state, saved as Jupyter saves it
        except KernelFailed as e:
            self.outcome.kernel_error = str(e)
        except DeadKernelError:
            self.outcome.kernel_error = "the kernel died while loading neuron_lab"
        except Exception as e:  # the kernel did not start: jupyter_client raises RuntimeError, TimeoutError...
            if started:
                raise
            # nbclient already cleaned up, but left its exit hook behind, which would fail on the cleaned client.
            compat.forget_exit_hook(self.client)
            self.outcome.kernel_error = f"the kernel did not start: {type(e).__name__}: {e}"

    async def _language_info(self) -> None:
        """The executed notebook names the kernel's language, as one run by Jupyter does."""
        reply = await _reply(self.client, await nbclient.util.ensure_async(self.client.kc.kernel_info()))
        if "language_info" in reply["content"]:
            self.program.nb.metadata["language_info"] = reply["content"]["language_info"]

    async def _load(self) -> None:
        """Load neuron_lab before the first cell, unless the notebook loads it itself."""
        if loads_itself(self.program):
            self.on_ready({"loads_itself": True})
            return
        self.outcome.info = await _ask(self.client, f"{_HOOK}.install(get_ipython(), {self.script!r})")
        self.on_ready(self.outcome.info)

    async def _cells(self) -> None:
        """Run the cells in order, reporting each; the run stops at the first that does not end OK, or at Ctrl-C."""
        for rec in self.outcome.cells:
            if self.pace is not None and not await self.pace(rec):
                break
            loaded = await self._cell(rec)
            self.on_cell(rec)
            if loaded:
                self.outcome.info = {**loaded, "by_notebook": True}
                self.on_ready(self.outcome.info)
            if rec.status != OK or self.outcome.interrupted:
                self.outcome.kernel_error = self._death(rec)
                break

    def _death(self, rec: CellRecord) -> str | None:
        """Why the kernel is gone after ``rec`` ran, if it is (not when the caller stopped it)."""
        if rec.status != DIED:
            return None
        if self.outcome.interrupted:
            return "interrupted twice: the kernel was shut down"
        return f"the kernel died while running cell [{rec.number}/{len(self.outcome.cells)}]"

    async def _cell(self, rec: CellRecord) -> dict[str, Any] | None:
        """Run one cell and fetch its report; what the kernel said about neuron_lab when this cell loaded it."""
        cell = self.program.nb.cells[rec.index]
        trace = await self._arm_trace(rec)
        t0 = time.monotonic()
        await self._execute(cell, rec)
        rec.seconds = time.monotonic() - t0
        cell.outputs = [o for o in cell.get("outputs", []) if PROGRESS not in o.get("data", {})]
        rec.execution_count = cell.get("execution_count")
        if trace is not None and os.path.isfile(trace):  # written as the cell ended, even when it raised
            rec.trace = trace
        if rec.status in (DIED, STOPPED):
            return None
        if trace is not None and rec.trace is None:
            rec.no_trace = await self._why_no_trace()
        return await self._fetch(rec)

    async def _why_no_trace(self) -> str | None:
        """``--trace``, a cell that wrote no trace: why, as the kernel's tracer saw it."""
        try:
            return await asyncio.wait_for(_ask(self.client, f"{_HOOK}.trace_missing(get_ipython())"), 60)
        except (KernelFailed, DeadKernelError, asyncio.TimeoutError):
            return None

    async def _arm_trace(self, rec: CellRecord) -> str | None:
        """``--trace``: tell the kernel where the cell's trace goes; None when it will not write one (the notebook
        has not loaded neuron_lab yet)."""
        if self.trace is None:
            return None
        path = self.trace(rec)
        arm = (f"{_HOOK}.arm_trace(get_ipython(), {path!r}) "
               "if 'neuron_lab.extension' in __import__('sys').modules else False")
        return path if await _ask(self.client, arm) else None

    async def _execute(self, cell: Any, rec: CellRecord) -> None:
        """Run one cell; how it ended goes into ``rec`` (status and error)."""
        self.executing, self.raised = True, None
        try:
            await self.client.async_execute_cell(cell, rec.index, execution_count=self.client.code_cells_executed + 1)
            rec.status = OK
            raised = self.raised
            if raised is not None:  # a cell tagged raises-exception: it may raise, and the run goes on; say that it did
                rec.error = _error_of(cell, raised.get("ename", "?"), raised.get("evalue", ""))
        except CellExecutionError as e:
            interrupted = self.outcome.interrupted and e.ename == "KeyboardInterrupt"
            rec.status, rec.error = INTERRUPTED if interrupted else ERROR, _error_of(cell, e.ename, e.evalue)
        except CellTimeoutError:
            rec.status = TIMEOUT
            rec.error = {"ename": "CellTimeoutError", "evalue": f"the cell ran past --timeout {self.timeout:g} s",
                         "traceback": ""}
            if self.on_timeout is not None:  # several ranks: where each is, then every rank interrupted
                await self.on_timeout(rec)
            else:
                await self.interrupt()  # the kernel finishes the report
        except DeadKernelError:
            rec.status = STOPPED if self.stopped else DIED
            why = self.stopped or "the kernel process ended while the cell ran"
            rec.error = {"ename": rec.status, "evalue": why, "traceback": ""}
        finally:
            self.executing = False

    def _heard_error(self, cell: Any, cell_index: int, execute_reply: dict[str, Any]) -> None:
        """nbclient's hook for a cell that raised: its reply names the error, also where the cell shows no error
        output (IPython prints a magic's UsageError on stderr instead of a traceback)."""
        self.raised = execute_reply.get("content", {})

    async def interrupt(self) -> None:
        """SIGINT to the kernel, as Jupyter's stop button sends it: its running cell raises KeyboardInterrupt."""
        await nbclient.util.ensure_async(self.client.km.interrupt_kernel())

    async def stop(self, why: str) -> None:
        """End this kernel now, because of ``why``: the running cell ends as ``stopped``, the rest are not run.

        A kill, not an interrupt: a rank waiting in a collective for a rank that failed waits in C++, where
        an interrupt does not reach it.
        """
        km = self.client.km
        if km is not None and await nbclient.util.ensure_async(km.is_alive()):  # one that died is reported so
            self.stopped = why
            await nbclient.util.ensure_async(km.shutdown_kernel(now=True))

    async def _fetch(self, rec: CellRecord) -> dict[str, Any] | None:
        """The cell's report into ``rec``; what the kernel said about neuron_lab when this cell loaded it."""
        # Until the notebook has loaded the extension the kernel imports nothing (None comes back).
        after_cell = (f"{_AGENT}.after_cell(get_ipython(), {self.script!r}) "
                      "if 'neuron_lab.extension' in __import__('sys').modules else None")
        try:
            after = await asyncio.wait_for(_ask(self.client, after_cell), 60)
        except (KernelFailed, DeadKernelError, asyncio.TimeoutError):
            return None
        if after is None:  # neuron_lab is not loaded yet
            return None
        if after["reports"]:  # one per cell; a nested run_cell belongs to its outer cell
            last = after["reports"][-1]
            rec.report, rec.text, rec.touched_device = last["report"], last["text"], last["touched_device"]
            rec.ranks = last.get("ranks", [])
            rec.execution_count = rec.report.get("cell") or rec.execution_count
        return after["loaded"]


def _tail(kernel_stderr: IO[bytes]) -> str:
    """The last lines the kernel process wrote to its stderr, but the warning every local kernel gives."""
    kernel_stderr.seek(0)
    lines = kernel_stderr.read().decode("utf-8", "replace").splitlines()
    return "\n".join([x for x in lines if not x.startswith(_TCP_WARNING)][-_STDERR_TAIL:])


def on_ctrl_c(kernels: list[tuple[nbclient.NotebookClient, Outcome]]) -> None:
    """Ctrl-C interrupts the running cell of every kernel, as Jupyter's stop button does, so its report and the
    files still come; a second Ctrl-C shuts the kernels down (nbclient's own handler, which this one replaces)."""
    def interrupt() -> None:
        if any(outcome.interrupted for _, outcome in kernels):
            for client, _ in kernels:
                if client.km is not None:
                    asyncio.ensure_future(compat.shut_down(client))
            return
        s = "s" if len(kernels) > 1 else ""
        print(f"interrupted: stopping at the running cell (Ctrl-C again shuts the kernel{s} down)", flush=True)
        for client, outcome in kernels:
            outcome.interrupted = True
            if client.km is not None:
                asyncio.ensure_future(nbclient.util.ensure_async(client.km.interrupt_kernel()))

    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, interrupt)
    except (RuntimeError, NotImplementedError):  # not the main thread, or Windows: nbclient's handling stays
        pass


def loads_itself(program: Program) -> bool:
    """A notebook with its own ``%load_ext neuron_lab``: the runner loads nothing before that cell runs."""
    return program.kind == "notebook" and any(_LOADS_ITSELF.search(program.nb.cells[i].source)
                                              for i in program.code_cells)


def _error_of(cell: Any, ename: str, evalue: str) -> dict[str, Any]:
    tb = next((o.get("traceback", []) for o in cell.get("outputs", []) if o.get("output_type") == "error"), [])
    return {"ename": ename, "evalue": evalue, "traceback": _ANSI.sub("", "\n".join(tb))}


async def _ask(client: nbclient.NotebookClient, expression: str) -> Any:
    """Evaluate ``expression`` in the kernel silently; its :class:`agent.Payload`'s data.

    A request that reached the kernel while a cell was failing (the one sent after a ``--timeout``
    interrupt) is aborted with the cell, as ipykernel aborts every queued request after an error: ask again.
    """
    for _ in range(_RETRIES):
        msg_id = await nbclient.util.ensure_async(
            client.kc.execute("", silent=True, store_history=False, user_expressions={"value": expression}))
        reply = await _reply(client, msg_id)
        if reply["content"].get("status") != "aborted":
            break
        await asyncio.sleep(0.1)
    value = reply["content"].get("user_expressions", {}).get("value", {})
    if value.get("status") != "ok":
        raise KernelFailed(f"the kernel could not run neuron_lab's runner hook: {value.get('ename', 'error')}: "
                           f"{value.get('evalue', reply['content'].get('evalue', ''))}")
    data = value.get("data", {})
    return json.loads(data[agent.MIME]) if agent.MIME in data else None


async def _reply(client: nbclient.NotebookClient, msg_id: str) -> dict[str, Any]:
    """The shell reply to ``msg_id``, however long it takes, unless the kernel dies.

    Not ``client.async_wait_for_reply``: that applies the cells' ``--timeout`` to the runner's own requests
    (loading the extension imports torch) and, without a cell, fails on an assertion instead of timing out.
    """
    while True:
        try:
            msg = await nbclient.util.ensure_async(client.kc.shell_channel.get_msg(timeout=1))
        except Empty:
            if not await nbclient.util.ensure_async(client.km.is_alive()):
                raise DeadKernelError("Kernel died") from None
            continue
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg
