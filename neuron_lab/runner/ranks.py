"""Run one program as N ranks at once (``neuron-lab run --nproc N``): one kernel per rank, in step.

Each rank is the single-rank executor (:class:`execute.Run`) in its own kernel with its own torchrun
environment (``session.launch``), so each gets the per-cell reports a 1-rank run gets. They run
concurrently, cell by cell: no rank starts cell k+1 before every rank has finished cell k, so cell k is
one window on every rank (one ``RanksReport``), and what the ranks printed in it is one output of rank 0's notebook,
collapsed across ranks as a ``%%neuron ranks`` cell shows it (``report.rank_lines``). Before the first cell (and
the program's ``init_process_group``) every rank takes the preflight (``session.preflight``): ranks that differ run
nothing, and the run shows the table.
When a rank fails (raises, times out, is interrupted, its kernel dies or never starts) the kernels of the ranks
still running a cell are ended: they may be waiting in a collective for the failed rank, which would wait forever;
no rank starts another cell. A cell past ``--timeout`` is a hang: before any rank is interrupted, every rank still in
the cell is asked where it is, out-of-band (``session.stuck``: the collective it waits in and its line, the hang view
``%neuron ranks`` shows), then each is interrupted.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import nbformat

from neuron_lab.agent import Script
from neuron_lab.report.rank_lines import collapse
from neuron_lab.report.ranks import Stuck
from neuron_lab.runner.execute import Outcome, Run, on_ctrl_c
from neuron_lab.runner.inputs import Program
from neuron_lab.runner.records import NOT_RUN, OK, STOPPED, CellRecord
from neuron_lab.session import launch, placement, preflight, stuck


@dataclass
class RanksOutcome:
    ranks: list[Outcome]  # each rank's, in rank order; rank r's cell k is ``ranks[r].cells[k - 1]``
    notebook: Any = None  # rank 0's executed notebook (what --output and --html write)
    failure: str | None = None  # the first failure, which stopped the other ranks: "rank 1 failed (error in t.py:5)"
    seconds: float = 0.0
    hosts: list[str] = field(default_factory=list)  # each rank's host, in rank order
    hung: int | None = None  # the cell that ran past --timeout, when one did: every rank in it was interrupted
    stuck: dict[int, Stuck] = field(default_factory=dict)  # where each rank in that cell was then, as it said

    @property
    def interrupted(self) -> bool:
        return any(o.interrupted for o in self.ranks)

    @property
    def preflight(self) -> str | None:
        """The preflight's table when the ranks differ (every rank has the same one), so that no cell ran."""
        return next((o.preflight for o in self.ranks if o.preflight is not None), None)

    @property
    def kernel_errors(self) -> list[tuple[int, str]]:
        """(rank, why) of each rank whose kernel died or could not start or load neuron_lab."""
        return [(r, o.kernel_error) for r, o in enumerate(self.ranks) if o.kernel_error]

    def cell(self, number: int) -> list[CellRecord]:
        """Cell ``number`` (1-based) as each rank ran it, in rank order."""
        return [o.cells[number - 1] for o in self.ranks]


def run(program: Program, envs: list[dict[str, str]], timeout: float | None,
        on_cell: Callable[[RanksOutcome, int], None], on_ready: Callable[[int, dict[str, Any]], None],
        traces: list[Callable[[CellRecord], str] | None] | None = None,
        store: launch.AgentStore | None = None) -> RanksOutcome:
    """Run ``program`` once per environment; ``on_cell`` gets the outcome so far and a cell's number once every
    rank is done with that cell, ``on_ready`` each rank's kernel-ready info; ``traces`` names each rank's trace
    files (``--trace``, as :class:`execute.Run` takes it); ``store``: the ranks' rendezvous, where a cell past
    ``--timeout`` asks them where they are."""
    return asyncio.run(_Ranks(program, envs, timeout, on_cell, on_ready, traces, store).main())


class _Ranks:
    """The ranks' runs and where each is: the cells it finished, whether it is in a cell, whether it ended."""

    def __init__(self, program: Program, envs: list[dict[str, str]], timeout: float | None,
                 on_cell: Callable[[RanksOutcome, int], None], on_ready: Callable[[int, dict[str, Any]], None],
                 traces: list[Callable[[CellRecord], str] | None] | None = None,
                 store: launch.AgentStore | None = None) -> None:
        self.on_cell, n = on_cell, len(envs)
        self.store = store
        self.runs = [Run(dataclasses.replace(program, nb=copy.deepcopy(program.nb)), env, timeout,
                         on_cell=functools.partial(self._finished, r), on_ready=functools.partial(on_ready, r),
                         pace=functools.partial(self._pace, r), on_start=self._catch_ctrl_c,
                         trace=None if traces is None else traces[r],
                         preflight_s=preflight.TIMEOUT_S if timeout is None else max(timeout, preflight.TIMEOUT_S),
                         on_timeout=self._timed_out)
                     for r, env in enumerate(envs)]
        self.cells = len(program.code_cells)
        self.outcome = RanksOutcome([run.outcome for run in self.runs], self.runs[0].program.nb,
                                    hosts=[placement.host_name(env) for env in envs])
        self.finished, self.running, self.ended = [0] * n, [False] * n, [False] * n
        self.done = [asyncio.Event() for _ in range(self.cells + 1)]  # done[k]: every rank is past cell k
        self.done[0].set()
        self.shown = 0  # cells handed to on_cell
        self.stops: list[asyncio.Future[None]] = []
        self.asked: asyncio.Future[None] | None = None  # the hang view, asked once, when a cell first timed out
        self.interrupted: set[int] = set()

    async def main(self) -> RanksOutcome:
        start = time.monotonic()
        self._catch_ctrl_c()
        await asyncio.gather(*(self._rank(r) for r in range(len(self.runs))))
        await asyncio.gather(*self.stops, return_exceptions=True)
        self.outcome.seconds = time.monotonic() - start
        return self.outcome

    async def _rank(self, r: int) -> None:
        try:
            await self.runs[r].main()
        finally:
            self.ended[r], self.running[r] = True, False
            if not all(self.ended):  # nbclient took its Ctrl-C handler away as this rank's kernel ended
                self._catch_ctrl_c()
            error = self.runs[r].outcome.kernel_error
            if error:
                self._fail(r, error)
            elif self.runs[r].outcome.preflight is not None:
                self._fail(r, "the ranks differ: preflight")
            self._advance()

    def _catch_ctrl_c(self) -> None:
        """Ctrl-C interrupts every rank's kernel (a rank that then fails stops the others)."""
        on_ctrl_c([(run.client, run.outcome) for run in self.runs])

    async def _pace(self, r: int, rec: CellRecord) -> bool:
        """Before cell k on rank ``r``: wait until every rank is past cell k - 1; go on unless a rank failed."""
        await self.done[rec.number - 1].wait()
        if self.outcome.failure is not None or self.runs[r].outcome.interrupted:
            return False
        self.running[r] = True
        return True

    async def _timed_out(self, rec: CellRecord) -> None:
        """A cell past ``--timeout`` on some rank: first (once) where every rank still in it is, then an interrupt to
        each, so that none is left waiting in a collective for the others (the emulated one wakes on it)."""
        if self.asked is None:
            self.asked = asyncio.ensure_future(self._ask_where(rec.number))
        await self.asked
        for q, run in enumerate(self.runs):
            if run.executing and q not in self.interrupted:  # not one handing its report over
                self.interrupted.add(q)
                await run.interrupt()

    async def _ask_where(self, number: int) -> None:
        self.outcome.hung = number
        in_cell = [q for q, run in enumerate(self.runs) if run.executing]
        if self.store is None or not in_cell:
            return
        said = await asyncio.get_running_loop().run_in_executor(None, stuck.ask, self.store.tcp, 1, in_cell)
        script = self.runs[0].script
        for q, where in said.items():
            at = Stuck.from_dict(where)
            if at.site is not None and script is not None:
                at = dataclasses.replace(at, site=Script(**script).line(at.site))
            self.outcome.stuck[q] = at

    def _finished(self, r: int, rec: CellRecord) -> None:
        self.running[r], self.finished[r] = False, rec.number
        if rec.status not in (OK, STOPPED):
            self._fail(r, f"{rec.status} in {rec.label}")
        self._advance()

    def _fail(self, r: int, why: str) -> None:
        """The first failure ends the kernels of the other ranks still in a cell (not those a hang interrupted: they
        are ending, and hand their reports over)."""
        if self.outcome.failure is not None:
            return
        self.outcome.failure = f"rank {r} failed ({why})"
        for q, run in enumerate(self.runs):
            if q != r and self.running[q] and q not in self.interrupted:
                self.stops.append(asyncio.ensure_future(
                    run.stop(f"{self.outcome.failure}; a collective here would wait for it forever")))

    def _advance(self) -> None:
        """Hand over each cell every rank is past, in order, and let the ranks start the next."""
        while self.shown < self.cells:
            k = self.shown + 1
            if not all(self.ended[q] or self.finished[q] >= k for q in range(len(self.runs))):
                return
            self.shown = k
            if any(rec.status != NOT_RUN for rec in self.outcome.cell(k)):
                self._collapse_stdout(k)
                self.on_cell(self.outcome, k)
            self.done[k].set()

    def _collapse_stdout(self, k: int) -> None:
        """Cell ``k``'s stdout on every rank, collapsed across ranks, in place of rank 0's own in its notebook."""
        cells = [run.program.nb.cells[rec.index] for run, rec in zip(self.runs, self.outcome.cell(k), strict=True)]
        said = {r: stdout(c) for r, c in enumerate(cells)}
        if len(cells) < 2 or not any(said.values()):
            return
        outputs = cells[0].get("outputs", [])
        at = next((i for i, o in enumerate(outputs) if _is_stdout(o)), len(outputs))
        kept = [o for o in outputs if not _is_stdout(o)]
        kept.insert(at, nbformat.v4.new_output("stream", name="stdout", text="\n".join(collapse(said)) + "\n"))
        cells[0].outputs = kept


def _is_stdout(output: dict[str, Any]) -> bool:
    return output.get("output_type") == "stream" and output.get("name") == "stdout"


def stdout(cell: Any) -> list[str]:
    """The lines a notebook cell printed to stdout, the last one also when it did not end."""
    lines = "".join(o["text"] for o in cell.get("outputs", []) if _is_stdout(o)).split("\n")
    return lines[:-1] if lines[-1] == "" else lines
