"""``%neuron ranks``: N ranks of one process group on ipyparallel engines, and one notebook cell run on all of them.

Engine ``i`` is rank ``i``. Each engine gets torchrun's variables (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) before anything in it imports torch, so the emulator
installs with ``neuron:{rank}`` as its device; then it loads neuron_lab as a notebook does, imports
``torch_neuronx`` and joins ``init_process_group(backend="neuron")``. A cell runs on every engine through
``view.execute``, the machinery of ``%%px``, with what the ranks print shown once for the ranks that printed the same,
stdout as it comes, stderr and tracebacks at the end (``session.rank_output``); each engine's own session
makes the cell's :class:`Report`, and the ranks' reports become one :class:`RanksReport`. What runs on an engine
besides the cell is the in-kernel agent (``neuron_lab.agent``), called there by name: nothing of neuron_lab's code
is shipped to it. There a cell's own ``init_process_group``/``destroy_process_group`` meet the group the ranks are
in (``session.rank_group``).

``%%neuron ranks --profile`` runs the cell on each engine as a ``%%neuron profile`` cell, so each rank's own session
profiles it and puts the profile on its report, as in a one-rank notebook; the notebook merges the ranks' timelines
into one (:func:`~neuron_lab.trace.profile_timeline.merge_ranks`) and, with ``--export``, the Chrome traces the
engines wrote into a folder of its own into one file (:func:`~neuron_lab.trace.merge.merge`), a process per rank.

Nothing here waits on a process that is gone: engines are watched by pid while a cell runs, so a dead rank is
reported at once; a rank past the cell's deadline is reported and interrupted, and keeps its place until it is free
(one waiting in a collective is left there, until ``%neuron ranks interrupt`` interrupts every rank still busy).
Engines in a Slurm job are watched through the job's state (``session.slurm_job``) and the controller's heartbeats:
a job cancelled outside the notebook is said so on the next cell, and ``stop`` cancels the job (the launcher's
``scancel``). Engines started over ssh are watched by pid where their host is this machine, else by the controller's
heartbeats; ``stop`` kills them over ssh, one ssh per host (``session.ssh_engines.kill``).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import psutil
from traitlets.config import Config

from neuron_lab import settings
from neuron_lab.report.model import Report, Site
from neuron_lab.report.ranks import STOPPED, RankResult, RanksReport, Stuck, ranks_label, ranks_named
from neuron_lab.session import launch, placement, ranks_address, ssh_engines, stuck
from neuron_lab.session.preflight import PreflightMismatch
from neuron_lab.session.rank_output import HeldOutput
from neuron_lab.session.slurm_job import JobWatch, SlurmOptions
from neuron_lab.session.ssh_engines import HOST_INDEX, NEED_HOSTS, SSHOptions
from neuron_lab.trace import merge
from neuron_lab.trace.profile_timeline import merge_ranks
from neuron_lab.units import ShownAsText, count

ENGINES = ("local", "mpi", "slurm", "ssh")  # --engines: ipyparallel's launcher of that name (slurm: slurm_engines)
OUTPUT_WINDOW_S = settings.config("ranks_output_window_s").default  # NeuronLab.ranks_output_window_s
MAX_RANKS = 64  # more local engines than this is a typo, not a plan
DEFAULT_TIMEOUT_S = 300.0  # engines starting up; a rank waiting at a collective for the others
POLL_S = 0.2  # how often a waiting notebook checks that the engines it waits on are alive
FETCH_TIMEOUT_S = 30.0  # an engine that finished its cell hands its report over within this
SETTLE_TRIES = 50  # no-ops sent at most while a kernel still aborts requests after a failed cell
PEER_GRACE_S = 5.0  # ranks still in a cell this long after another rank failed in it are reported and interrupted
LEFT_WAITING = ("left waiting in its collective, not interrupted: the matching call on the other ranks frees it, "
                "at the latest the group's timeout ends it; `%neuron ranks interrupt` ends it now")
# what gloo raises once a collective outlived the group's timeout: the group's pairs are closed for good after it
_GROUP_TIMEOUT = re.compile(r"Timed out waiting \d+ms|Application timeout caused pair closure")
_CELL_FRAME = re.compile(r"^In\[(\d+)\] line (\d+)")  # a stack frame in a cell, as trace.sites writes it
STOP_WAIT_S = 5.0  # a process asked to terminate at stop gets this long before it is killed


class RanksError(RuntimeError):
    """The ranks could not start, or are not there to run on; the message says what to do."""


class RanksFailed(Exception):
    """A ``%%neuron ranks`` cell in which a rank failed, raised once the report is shown: "Run all" stops there, as
    it stops at any failing cell; the report is ``.report``, and ``broken`` what broke the group in it, if it broke
    (what to run is in it)."""

    def __init__(self, report: RanksReport, broken: str | None = None) -> None:
        self.report = report
        self.broken = broken
        super().__init__("; ".join(f"rank {r.rank}: {r.problem}" for r in report.failed))

    def _render_traceback_(self) -> list[str]:
        """IPython shows these lines instead of a traceback (each rank's own traceback was streamed already)."""
        alike: dict[str, list[int]] = {}  # a problem, and the ranks that had it: said once
        for r in self.report.failed:
            alike.setdefault(r.problem or "", []).append(r.rank)
        failed = [r for r in self.report.failed if not r.stopped]
        return [f"{type(self).__name__}: {count(len(failed), 'rank')} of {len(self.report.ranks)} failed in "
                f"{self.report.title}" + (f", {len(self.report.stopped)} {STOPPED}" if self.report.stopped else ""),
                *(f"  {'rank' if len(ranks) == 1 else 'ranks'} {ranks_label(ranks)}: {problem}"
                  for problem, ranks in alike.items()),
                *(f"  {line}" for line in self.report.hang()),
                *([f"  {self.broken}"] if self.broken else [])]


# -- on each engine -------------------------------------------------------------------------------------------------
def _set_env_code(env: dict[str, str]) -> str:
    """The first code an engine runs: the rank's variables, before anything imports torch (a string: importing
    neuron_lab would import torch), and whether torch came first (``neuron_lab.agent.TORCH_FIRST``)."""
    return (f"import os as _os, sys as _sys\n_nl_torch_first = 'torch' in _sys.modules\n"
            f"_os.environ.update({env!r})\ndel _os, _sys\n")


def _agent(call: str) -> Any:
    """The in-kernel agent's function ``call``, looked up on the engine by name: ``apply_async(_agent("cell_report"),
    3)`` runs ``neuron_lab.agent.cell_report(get_ipython(), 3)`` there with the engine's own shell."""
    from ipyparallel import Reference

    return Reference(f"lambda *args: __import__('neuron_lab.agent', fromlist=['agent']).{call}(get_ipython(), *args)")


# where an engine is: its host and the variables its launcher gave it (nothing imported that would import torch)
_WHERE = "lambda: (__import__('socket').gethostname(), dict(__import__('os').environ))"


# -- in the notebook ------------------------------------------------------------------------------------------------
@dataclass
class Engine:
    """One rank's engine as the notebook knows it."""

    rank: int
    pid: int
    device: str
    host: str = ""
    engine_id: int = -1  # ipyparallel's id for it, which its launcher chose (not its rank)
    died: bool = False
    job: JobWatch | None = None  # the Slurm job it runs in: its state, not its pid, says whether it can be up
    here: bool = True  # on this machine: its pid says whether it is up (elsewhere: the controller's heartbeats)
    busy: Any = None  # the AsyncResult of a cell it has not finished (past its deadline, or interrupted)
    busy_title: str = ""
    last: Any = None  # the AsyncResult of the last cell sent to it

    @property
    def where(self) -> str:
        return f"engine {self.rank} (pid {self.pid})"

    def alive(self) -> bool:
        up = self.job.up() if self.job is not None else _running(self.pid) if self.here else True
        self.died = self.died or not up
        return not self.died

    def free(self) -> bool:
        """Not running an earlier cell any more (it finished, or the engine is gone)."""
        if self.busy is not None and (self.busy.ready() or not self.alive()):
            self.busy = None
        return self.busy is None


class Ranks(ShownAsText):
    """A running ipyparallel cluster of N ranks in one ``neuron`` process group; ``str()`` is its status."""

    def __init__(self, cluster: Any, client: Any, engines: list[Engine], timeout_s: float, profile_dir: str,
                 store: launch.AgentStore, job: JobWatch | None = None, restart: str = "",
                 attached: str | None = None) -> None:
        self.cluster = cluster
        self.client = client
        self.engines = engines
        self.timeout_s = timeout_s
        self.store: launch.AgentStore | None = store  # the ranks' rendezvous, until they stop
        self._profile_dir = profile_dir
        self._stopped = False
        self.broken: str | None = None  # what broke the process group (a collective past its timeout), once it did
        self._line_offsets: dict[int, int] = {}  # a cell run on the ranks: its lines on an engine start this much later
        self._asked = 0  # questions asked of stuck ranks so far (``session.stuck``)
        self.job = job  # the Slurm job the engines run in, for slurm engines
        self.restart = restart  # the magic that starts these ranks afresh
        self.attached = attached  # where the cluster is whose engines these ranks are, when it is not ours to stop
        atexit.register(self.stop)  # the kernel exits: the engines go with it

    # -- start --------------------------------------------------------------------------------------------------
    @classmethod
    def start(cls, n: int, timeout_s: float = DEFAULT_TIMEOUT_S, progress: Callable[[str], None] = print,
              hosts: int = 1, engines: str = "local", slurm: SlurmOptions | None = None,
              instance: str | None = None, ssh: SSHOptions | None = None, address: str = "") -> Ranks:
        """Start ``n`` engines with ipyparallel's ``engines`` launcher and make them ranks 0..n-1 of one process
        group, each rank where its scheduler placed it (``hosts`` > 1: on that many hosts emulated on this machine,
        ``n // hosts`` ranks each, each host of its ``instance`` shape: ``launch.host_instances``); ``slurm``: the
        ``sbatch`` options of a Slurm job of engines; ``ssh``: the hosts of ssh engines, ``n // len(hosts)`` on
        each, ranked host by host in their order (``session.ssh_engines``); ``address``: where the engines reach the
        controller and the store (``NeuronLab.ranks_address``; empty: ``session.ranks_address``'s rule). On any
        failure every process (or job) started is stopped again and :class:`RanksError` says why."""
        if not 1 <= n <= MAX_RANKS:
            raise ValueError(f"N must be from 1 to {MAX_RANKS}, not {n}")
        try:
            import ipyparallel as ipp
        except ImportError:
            raise RanksError("ipyparallel is not installed (`pip install ipyparallel`)") from None

        if engines == "ssh" and ssh is None:
            raise RanksError(NEED_HOSTS)
        if engines == "ssh":
            try:
                ssh.check(n)
            except ValueError as e:
                raise RanksError(str(e)) from None
        address = ranks_address.choose(address, engines, [ssh.host_name(i) for i in range(len(ssh.hosts))]
                                       if engines == "ssh" else ())
        try:  # the controller listens there (on loopback, as ipyparallel's default), and its connection files name it
            here = ranks_address.is_loopback(address)
            address = ranks_address.LOOPBACK if here else address
            listen = {} if here else {"controller_ip": ranks_address.ip_of(address)}
        except OSError as e:
            raise RanksError(f"the ranks' address {address!r} does not resolve ({_one_line(e)}); "
                             "`%config NeuronLab.ranks_address = 'IP'` sets it") from None
        profile_dir = tempfile.mkdtemp(prefix="neuron-lab-ranks-")  # the user's own IPython profile stays untouched
        launcher: Any = engines
        config = Config()
        if engines == "slurm":
            from neuron_lab.session.slurm_engines import SlurmEngines

            launcher = SlurmEngines
            for name, value in (slurm or SlurmOptions()).traits().items():
                setattr(config.SlurmEngineSetLauncher, name, value)
        elif engines == "ssh":
            for name, value in ssh.traits(n, profile_dir).items():
                setattr(config.SSHEngineSetLauncher, name, value)
        cluster = ipp.Cluster(n=n, profile_dir=profile_dir, log_level=40, shutdown_atexit=True,
                              engine_launcher_class=launcher, config=config, **listen)
        restart = (f"%neuron ranks start {n}" + (f" --hosts {hosts}" if hosts > 1 else "")
                   + (f" --instance {instance}" if instance else "")
                   + (f" --engines {engines}" if engines != "local" else "") + (slurm.flags() if slurm else "")
                   + (ssh.flags() if ssh else "")
                   + " --restart")
        client = job = None
        started = time.monotonic()
        try:
            progress(f"neuron_lab: starting {count(n, 'ipyparallel engine')} (ranks 0..{n - 1})…")
            cluster.start_cluster_sync()
            if engines == "slurm":
                job = JobWatch(next(iter(cluster.engines.values())).job_id)
                progress(f"neuron_lab: Slurm job {job.job_id} submitted")
            client = cluster.connect_client_sync()
            _wait_engines(client, n, started + timeout_s, job, cluster)
            ends_with = () if job else (os.getpid(), cluster.controller.pid)  # a notebook killed without a stop
            engines_up, store = _join(client, n, hosts, timeout_s, started + timeout_s, progress, job, ends_with,
                                      instance, ssh if engines == "ssh" else None, address)
        except BaseException as e:
            _shutdown(cluster, client, profile_dir)
            if job is not None:
                job.gone()  # cancelled with the cluster: gone before the notebook says nothing is left
            raise _start_error(e, timeout_s) from None
        progress(f"neuron_lab: {count(n, 'rank')} ready in {time.monotonic() - started:.1f} s; run a cell on all "
                 "of them with `%%neuron ranks`, stop them with `%neuron ranks stop`")
        return cls(cluster, client, engines_up, timeout_s, profile_dir, store, job, restart)

    @classmethod
    def attach(cls, profile: str | None = None, cluster_file: str | None = None, sshserver: str | None = None,
               timeout_s: float = DEFAULT_TIMEOUT_S, progress: Callable[[str], None] = print,
               address: str = "") -> Ranks:
        """The engines of an ipyparallel cluster that runs already (a team's ``ipcluster start``), found by its
        IPython ``profile`` or its ``cluster_file``, through ``sshserver``'s tunnel if given, made ranks as started
        engines are, reaching the store at ``address`` (``NeuronLab.ranks_address``; empty: loopback). Nothing
        of that cluster is stopped, on a failure or at :meth:`stop`: the notebook detaches."""
        try:
            from ipyparallel import Client
        except ImportError:
            raise RanksError("ipyparallel is not installed (`pip install ipyparallel`)") from None
        where = f"cluster file {cluster_file}" if cluster_file else f"profile {profile or 'default'}"
        started = time.monotonic()
        try:
            kwargs = {"sshserver": sshserver} if sshserver else {}
            if cluster_file:  # ipcluster's file says where its profile and connection files are, and its engines
                with open(cluster_file) as f:
                    found = json.load(f)
                client = Client(profile_dir=found["cluster"]["profile_dir"],
                                cluster_id=found["cluster"].get("cluster_id", ""), timeout=timeout_s, **kwargs)
                sets = found.get("engines", {}).get("sets", {}).values()
                client.wait_for_engines(sum(s.get("n", 0) for s in sets), timeout=timeout_s, interactive=False)
            else:
                client = Client(profile=profile or "default", timeout=timeout_s, **kwargs)
        except Exception as e:  # noqa: BLE001 (no file, no controller, a tunnel refused: each said in its words)
            raise RanksError(f"no ipyparallel cluster to attach to at {where}: {_one_line(e)}") from None
        n = len(client.ids)
        try:
            if not 1 <= n <= MAX_RANKS:
                raise RanksError(f"the cluster at {where} has {count(n, 'engine')}; ranks need 1 to {MAX_RANKS}")
            progress(f"neuron_lab: attached to the {count(n, 'engine')} of the ipyparallel cluster at {where}")
            engines, store = _join(client, n, 1, timeout_s, started + timeout_s, progress, None, (),
                                   address=ranks_address.choose(address, "attach"))
        except BaseException as e:
            client.close()
            raise _start_error(e, timeout_s) from None
        progress(f"neuron_lab: {count(n, 'rank')} ready in {time.monotonic() - started:.1f} s; `%neuron ranks stop` "
                 "detaches, leaving the engines running")
        return cls(None, client, engines, timeout_s, "", store, attached=where)

    # -- run ----------------------------------------------------------------------------------------------------
    def run(self, body: str, title: str, *, cell: int | None = None, line_offset: int = 1,
            timeout_s: float | None = None, profile: bool = False, export: str | None = None,
            row_limit: int | None = None, output_window_s: float = OUTPUT_WINDOW_S) -> RanksReport:
        """Run ``body`` on every rank at once (their output streamed, collapsed across ranks: ``session.rank_output``)
        and merge their reports. ``cell``/``line_offset``: the notebook cell and where its body starts, so each report
        names the notebook's lines; ``timeout_s``: how long to wait for the ranks (None: as long as they run);
        ``output_window_s``: how long a printed line waits for the other ranks to print it too.

        ``profile``: each rank runs it under torch.profiler (``row_limit`` rows shown), and the report gets their
        timelines merged; ``export``: the ranks' Chrome traces merged into this file (a checked path)."""
        if self.broken is not None:
            raise RanksError(self.broken)
        if self.job is not None and not self.job.up(fresh=True):
            raise RanksError(self.job.ended_outside(self.restart))
        if not profile:
            return self._check_group(RanksReport(title, self._run(lambda rank: body, title, cell, line_offset,
                                                                  timeout_s, output_window_s)))
        folder = tempfile.mkdtemp(prefix="neuron-lab-ranks-traces-") if export else None
        try:
            # one line more on the engine: its reports' lines already count the `%%neuron profile` line
            results = self._run(lambda rank: _profiled_cell(body, folder, rank, row_limit), title, cell,
                                line_offset - 1, timeout_s, output_window_s)
            profiles = {r.rank: r.report.profiled for r in results
                        if r.report is not None and r.report.profiled is not None}
            for p in profiles.values():  # the notebook's copies, read back from the engines' data
                p.trace_path = None  # the engine's file, merged below and removed
            merged = None if folder is None else _merge_traces(folder, export, [e.rank for e in self.engines])
            return self._check_group(RanksReport(title, results, merge_ranks({rank: p.timeline
                                                                                for rank, p in profiles.items()}),
                                                 merged))
        finally:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)

    def _check_group(self, rr: RanksReport) -> RanksReport:
        """Once a rank's collective outlived the group's timeout, gloo has closed the group's connections: every later
        collective fails. Say so once, with what to run, instead of letting each next cell fail on its own."""
        timed_out = [(r.rank, m) for r in rr.failed if (m := _GROUP_TIMEOUT.search(r.problem or ""))]
        if timed_out:
            rank, m = timed_out[0]
            self._break(rr.title, f"rank {rank}'s collective outlived the group's timeout ({self.timeout_s:g} s; "
                                  f"gloo: {m.string[m.start():]})")
        return rr

    def _break(self, title: str, why: str) -> None:
        """The group can run no collective again: every next cell says so in one line, with what to run."""
        self.broken = (f"the process group broke in {title}: {why}, so no collective can run again; "
                       f"`{self._restart()}` starts the group afresh")

    def _run(self, code: Callable[[int], str], title: str, cell: int | None, line_offset: int,
             timeout_s: float | None, output_window_s: float) -> list[RankResult]:
        """:meth:`run`'s ranks, in rank order, with ``code(rank)`` the code each rank runs."""
        dead = [e for e in self.engines if not e.alive()]
        if dead:  # its peers' first collective would wait for it until the group's timeout
            raise RanksError(f"{_lost(self.engines, dead)}: the others would wait for it at their first collective; "
                             f"`{self._restart()}` starts the group afresh")
        results: dict[int, RankResult] = {}
        running: dict[int, Any] = {}
        stopped: dict[int, str] = {}  # a rank stopped because another failed: why
        for e in self.engines:
            if not e.free():  # run on the others: the matching call can free a rank waiting at a collective
                results[e.rank] = RankResult(e.rank, error=f"still running {e.busy_title}; not run here",
                                             where=e.where)
        for e in self.engines:
            if e.rank not in results:
                self._settle(e)
        for e in self.engines:  # sent back to back: the ranks start together
            if e.rank not in results:
                if cell is not None:  # the engine numbers the cell as the notebook does: tracebacks say In[cell]
                    self.client[e.engine_id].execute(f"get_ipython().execution_count = {cell}", silent=True,
                                                     block=False)
                running[e.rank] = e.last = self.client[e.engine_id].execute(code(e.rank), silent=False, block=False)
        if cell is not None:
            self._line_offsets[cell] = line_offset
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        output = HeldOutput(running, output_window_s).__enter__()
        try:
            self._wait(running, results, stopped, deadline, timeout_s, title)
        except KeyboardInterrupt:
            self._interrupt([r for r in running if r not in results and not running[r].ready()], running, title)
            raise
        finally:
            for rank, ar in running.items():
                if ar.ready() and not self.engines[rank].died:  # a dead engine's output is as complete as it gets
                    ar.wait_for_output(FETCH_TIMEOUT_S)
            output.__exit__()
            output.show(stopped)
        for rank in running:
            if rank in stopped and not running[rank].ready():
                results[rank] = RankResult(rank, error=stopped[rank], where=self.engines[rank].where, stopped=True)
            elif rank in stopped:  # its report, with why it stopped in place of the KeyboardInterrupt
                results[rank] = replace(self._fetch(self.engines[rank], title, cell, line_offset),
                                        error=stopped[rank], stopped=True)
            elif rank not in results:
                results[rank] = self._fetch(self.engines[rank], title, cell, line_offset)
        return [replace(results[e.rank], host=e.host) for e in self.engines]

    def _wait(self, running: dict[int, Any], results: dict[int, RankResult], stopped: dict[int, str],
              deadline: float | None, timeout_s: float | None, title: str) -> None:
        """Until every rank finished, died, or passed the deadline; ranks still running :data:`PEER_GRACE_S` after
        another rank failed are stopped (:meth:`_stop_peers`: why each, into ``stopped``), so the notebook is not held
        until the group's timeout."""
        waiting = dict(running)
        failed_at: tuple[int, float] | None = None  # the first rank that failed, and when the notebook saw it
        while waiting:
            for rank, ar in list(waiting.items()):
                e = self.engines[rank]
                if ar.ready() and _engine_died(ar):  # the controller noticed before the notebook did
                    e.died = True
                if ar.ready() and not e.died:
                    del waiting[rank]
                elif not e.alive():
                    del waiting[rank]
                    results[rank] = RankResult(rank, error=f"engine {rank} died (pid {e.pid})", where=e.where)
            if failed_at is None:  # a rank left out (busy) counts as failed: the others may wait for it
                failed = [r for r in results if r not in running] + [
                    r for r in running if r not in waiting and (r in results or not running[r].successful())]
                failed_at = (failed[0], time.monotonic()) if failed else None
            if waiting and failed_at is not None and time.monotonic() >= failed_at[1] + PEER_GRACE_S:
                self._stop_peers(list(waiting), running, stopped, failed_at[0], title)
                return
            if waiting and deadline is not None and time.monotonic() >= deadline:
                # a rank blocked in a collective is left there: a signal lands only once the collective returns (when
                # the matching call on the others frees it), and would then break its cell between two collectives
                stuck = self._where_stuck(list(waiting))
                left = [r for r in waiting if r in stuck and stuck[r].collective is not None]
                for rank in waiting:
                    results[rank] = RankResult(rank, error=f"no answer after {timeout_s:g} s; "
                                               + (LEFT_WAITING if rank in left else "interrupted"),
                                               where=self.engines[rank].where, stuck=stuck.get(rank))
                for rank in left:
                    self.engines[rank].busy, self.engines[rank].busy_title = running[rank], title
                self._interrupt([r for r in waiting if r not in left], running, title, stuck)
                return
            if waiting:
                next(iter(waiting.values())).wait(POLL_S)

    def _stop_peers(self, ranks: list[int], running: dict[int, Any], stopped: dict[int, str], failed: int,
                    title: str) -> None:
        """End ``ranks``, still in the cell :data:`PEER_GRACE_S` after rank ``failed`` failed in it, as torchrun ends
        a failed rank's peers: interrupted (a collective waits in slices: ``backend.emulator.interruptible``) and
        waited for, so what each printed is this cell's; why each stopped goes into ``stopped``. Left running, one
        waiting in a collective would meet the failed rank's next cell's collectives out of step (its all_reduce
        summing another cell's tensors); so one woken inside a collective, or maybe inside one (its backend does not
        say), or not ending, breaks the group: the next cell is refused until the ranks are started afresh."""
        where = self._where_stuck(ranks)
        self._interrupt(ranks, running, title, where)  # breaks the group for a rank inside a collective
        deadline = time.monotonic() + FETCH_TIMEOUT_S
        for rank in ranks:
            running[rank].wait(max(0.0, deadline - time.monotonic()))
        still = [r for r in ranks if not running[r].ready() and self.engines[r].alive()]
        unsaid = [r for r in ranks if r not in where or not where[r].told]
        if self.broken is None and (still or unsaid):
            self._break(title, f"{ranks_named(still or unsaid)} "
                               + ("still running after an interrupt" if still else
                                  "interrupted, maybe inside a collective (the backend does not say)")
                               + ", which the other ranks' next collectives could meet out of step")
        for rank in ranks:
            at = f", {where[rank].text}" if rank in where else ""
            stopped[rank] = f"{STOPPED}: interrupted {PEER_GRACE_S:g} s after rank {failed} failed{at}" + (
                f"; still running {FETCH_TIMEOUT_S:g} s later (blocked outside Python?); `%neuron ranks stop` ends it"
                if rank in still else "")

    def _where_stuck(self, ranks: list[int]) -> dict[int, Stuck]:
        """Where each of ``ranks`` is now, as it says out-of-band (``session.stuck``): the collective it waits in and
        its line, the engine's cell lines renamed to the notebook's."""
        if self.store is None:
            return {}
        self._asked += 1
        out = {}
        for rank, said in stuck.ask(self.store.tcp, self._asked, ranks).items():
            site = said["site"]
            if site is not None and site["cell"] is not None:
                c = site["cell"]
                site = {**site, "filename": f"In[{c}]", "line": site["line"] + self._line_offsets.get(c, 0)}
            out[rank] = Stuck.from_dict({**said, "site": site})
        return out

    def interrupt(self) -> str:
        """``%neuron ranks interrupt``: SIGINT to every rank still running a cell (one a deadline left waiting in its
        collective, too), then wait until each is free; which ranks were interrupted and where each was then."""
        busy = [e for e in self.engines if e.alive() and not e.free()]
        if not busy:
            return "neuron_lab ranks: no rank is running a cell; nothing to interrupt"
        titles = ", ".join(dict.fromkeys(e.busy_title for e in busy))
        view = self._interrupt([e.rank for e in busy], {e.rank: e.busy for e in busy}, titles, show=False)
        deadline = time.monotonic() + FETCH_TIMEOUT_S
        for e in busy:
            e.busy.wait(max(0.0, deadline - time.monotonic()))
        still = [e.rank for e in busy if not e.free()]
        lines = [f"neuron_lab ranks: interrupted {ranks_named([e.rank for e in busy])} running {titles}; "
                 "where each was:", *(f"  {line}" for line in view)]
        if still:
            lines.append(f"  {ranks_named(still)} still running {FETCH_TIMEOUT_S:g} s after the interrupt "
                         "(blocked outside Python?); `%neuron ranks stop` ends them")
        if self.broken is not None:
            lines.append(f"  {self.broken}")
        return "\n".join(lines)

    def _interrupt(self, ranks: list[int], running: dict[int, Any], title: str,
                   stuck: dict[int, Stuck] | None = None, show: bool = True) -> list[str]:
        """SIGINT to ranks still in the cell (``%%px`` does so on Ctrl-C); each stays busy until it is free. Where
        each was just before (``stuck``, else asked now: the hang view, printed when ``show``), its lines returned.
        A rank woken inside a collective leaves its peers' next collectives out of step with its own: the group
        breaks."""
        live = [r for r in ranks if self.engines[r].alive()]
        asked = stuck is None
        stuck = self._where_stuck(live) if stuck is None else stuck
        view = RanksReport(title, [RankResult(r, error="interrupted", stuck=stuck.get(r)) for r in live]).hang()
        for r in live:
            self.engines[r].busy, self.engines[r].busy_title = running[r], title
        if live:
            print(f"neuron_lab: sending SIGINT to {count(len(live), 'rank')} still running {title} "
                  f"({', '.join(map(str, live))})", file=sys.stderr)
            if asked and show and view:
                print("neuron_lab: where they were:", *(f"  {line}" for line in view), sep="\n", file=sys.stderr)
            # through each engine's nanny (ipyparallel's control channel): local, mpi, Slurm and attached engines alike
            self.client.send_signal(signal.SIGINT, targets=[self.engines[r].engine_id for r in live], block=False)
        inside = [r for r in live if r in stuck and stuck[r].collective is not None]
        if inside:
            ops = " and ".join(sorted({stuck[r].op for r in inside}))
            self._break(title, f"{ranks_named(inside)} interrupted inside {ops}, which the other ranks' next "
                               "collectives would meet out of step")
        return view

    def _settle(self, e: Engine) -> None:
        """After a cell that failed on ``e``, wait until its kernel takes requests again.

        A kernel aborts the requests that reach it while it is still aborting after an error (ipykernel's
        stop_on_error); a cell sent right after an interrupted one could be dropped unrun, so a no-op goes first,
        again until it is not aborted."""
        if e.last is None or not e.last.ready() or e.last.successful():
            return
        from ipyparallel.error import TaskAborted

        for _ in range(SETTLE_TRIES):
            try:
                self.client[e.engine_id].apply_async(_agent("ready")).get(timeout=FETCH_TIMEOUT_S)
                return
            except TaskAborted:
                continue
            except Exception:  # noqa: BLE001 (a dead or hung engine is reported by the cell that follows)
                return

    def _fetch(self, e: Engine, title: str, cell: int | None, line_offset: int) -> RankResult:
        """The engine's report of the cell, its lines renamed to the notebook cell's."""
        self._settle(e)
        try:
            data = self.client[e.engine_id].apply_async(_agent("cell_report"), cell).get(timeout=FETCH_TIMEOUT_S)
        except Exception as err:
            if not e.alive():
                return RankResult(e.rank, error=f"engine {e.rank} died (pid {e.pid})", where=e.where)
            return RankResult(e.rank, error=f"no report: {_one_line(err)}", where=e.where)
        if data is None:
            return RankResult(e.rank, error="no report: neuron_lab did not track the cell", where=e.where)
        report = Report.from_dict(json.loads(data))  # the notebook's copy, titled and named as the notebook's cell
        own = report.cell

        def notebook_line(c: int | None, line: int) -> tuple[int | None, int]:
            """An engine cell's line as the notebook's: this cell's, or an earlier ``%%neuron ranks`` cell's."""
            if c == own:
                return cell, line + line_offset
            return c, line + self._line_offsets.get(c, 0)

        def site(s: Site) -> Site:  # one name on every rank (not the engine's own file), so the ranks' rows merge
            if s.cell is None:
                return s
            c, line = notebook_line(s.cell, s.line)
            return replace(s, filename=title if s.cell == own else f"In[{c}]", cell=c, line=line)

        def frame(f: str) -> str:
            return _CELL_FRAME.sub(lambda m: "In[{}] line {}".format(*notebook_line(int(m[1]), int(m[2]))), f)

        report.map_sites(site, frame)
        return RankResult(e.rank, replace(report, title=title), where=e.where)

    # -- stop ---------------------------------------------------------------------------------------------------
    def stop(self) -> list[int]:
        """Leave the process group on each live rank, end the engines, stop the cluster and wait until every
        process of it is gone; the pids that were running. Harmless twice."""
        if self._stopped:
            return []
        self._stopped = True
        atexit.unregister(self.stop)
        live = [e for e in self.engines if e.alive() and e.free()]
        if live:
            try:
                self.client[[e.engine_id for e in live]].apply_async(_agent("leave_ranks")).get(timeout=FETCH_TIMEOUT_S)
            except Exception:
                pass  # the engines are stopped below all the same
        self.store = None
        if self.attached is not None:  # not ours: the engines stay, out of the group
            self.client.close()
            return []
        pids = [e.pid for e in self.engines if e.alive()]
        _shutdown(self.cluster, self.client, self._profile_dir)
        if self.job is not None and not self.job.gone():
            print(f"neuron_lab: the Slurm job {self.job.job_id} is still {self.job.state()} after scancel; "
                  f"`scancel {self.job.job_id}`", file=sys.stderr)
        return pids

    def _restart(self) -> str:
        """The magic that starts these ranks afresh, with the options they were started with."""
        return self.restart or f"%neuron ranks start {len(self.engines)} --restart"

    @property
    def stopped(self) -> bool:
        return self._stopped

    # -- status -------------------------------------------------------------------------------------------------
    def __str__(self) -> str:
        if self._stopped:
            return "neuron_lab ranks: stopped"
        up = [e for e in self.engines if e.alive()]
        on = "ipyparallel" if self.attached is None else f"the ipyparallel cluster at {self.attached} (attached)"
        lines = [f"neuron_lab ranks: {len(up)} of {count(len(self.engines), 'rank')} up on {on}, process "
                 f"group `neuron` (MASTER_ADDR={self.store.address} MASTER_PORT={self.store.port}, "
                 f"timeout {self.timeout_s:g} s)"]
        if self.job is not None:
            lines.append(f"  Slurm job {self.job.job_id}: {self.job.state() or 'unknown to squeue and sacct'}")
        for e in self.engines:
            state = "died" if not e.alive() else f"running {e.busy_title}" if not e.free() else "up"
            host = f"{e.host:<8} " if len({e.host for e in self.engines}) > 1 else ""
            lines.append(f"  rank {e.rank}  {host}pid {e.pid:<8} {e.device:<10} {state}")
        return "\n".join(lines)


def _lost(engines: list[Engine], dead: list[Engine]) -> str:
    """The dead ranks in words: a host whose every rank died is named as lost, with its ranks; other ranks by engine."""
    several = len({e.host for e in engines}) > 1
    hosts = [h for h in dict.fromkeys(e.host for e in engines)
             if several and all(e in dead for e in engines if e.host == h)]
    said = []
    for h in hosts:
        ranks = [e for e in dead if e.host == h]
        said.append(f"host {h} is lost, with its {'rank' if len(ranks) == 1 else 'ranks'} "
                    f"{ranks_label(e.rank for e in ranks)} (pid{'s' if len(ranks) > 1 else ''} "
                    f"{', '.join(str(e.pid) for e in ranks)})")
    rest = [e for e in dead if e.host not in hosts]
    if rest:
        said.append(f"{count(len(rest), 'rank')} of the group died ({', '.join(e.where for e in rest)})")
    return "; ".join(said)


def _profiled_cell(body: str, folder: str | None, rank: int, row_limit: int | None) -> str:
    """The cell a rank runs for ``%%neuron ranks --profile``: ``body`` as a ``%%neuron profile`` cell, its trace
    exported into ``folder`` when one is given."""
    options = [] if folder is None else ["--export", shlex.quote(_trace_file(folder, rank))]
    options += [] if row_limit is None else ["--row-limit", str(row_limit)]
    return " ".join(["%%neuron profile", *options]) + "\n" + body


def _trace_file(folder: str, rank: int) -> str:
    return os.path.join(folder, f"rank{rank}.json")


def _merge_traces(folder: str, export: str, ranks: list[int]) -> str | None:
    """The ranks' traces in ``folder`` merged into ``export``, one process per rank (a rank that wrote none, as one
    that died, is left out); its path, or None (why, on stderr) when there was none or it could not be written."""
    traces = {}
    try:
        for rank in ranks:
            if os.path.isfile(_trace_file(folder, rank)):
                with open(_trace_file(folder, rank)) as f:
                    traces[rank] = json.load(f)
        if not traces:
            print("neuron_lab: no rank wrote a trace; nothing exported", file=sys.stderr)
            return None
        with open(export, "w") as f:
            json.dump(merge.merge(traces), f)
    except (OSError, ValueError) as e:
        print(f"neuron_lab: the ranks' traces were not exported to {export}: {_one_line(e)}", file=sys.stderr)
        return None
    return export


def _join(client: Any, n: int, hosts: int, timeout_s: float, deadline: float, progress: Callable[[str], None],
          job: JobWatch | None, ends_with: tuple[int, ...], instance: str | None = None,
          ssh: SSHOptions | None = None, address: str = launch.MASTER_ADDR) -> tuple[list[Engine], launch.AgentStore]:
    """The registered engines made ranks 0..n-1 of one process group that meets at a store hosted here: each rank
    where its scheduler placed it (``hosts`` > 1 or an ``instance``: on that many hosts emulated, ``n // hosts`` ranks
    each, each host of its instance shape; ``ssh``: host by host in the order of its hosts); an engine on this
    machine ends when the processes ``ends_with`` are gone (none: engines this notebook did not start); ``address``:
    their ``MASTER_ADDR``."""
    from ipyparallel import Reference

    store = launch.AgentStore(address)  # the ranks' rendezvous, hosted here as torchrun's agent hosts it
    port = store.port
    ids = sorted(client.ids)[:n]
    seen = [placement.Seen(host, env)
            for host, env in client[ids].apply_async(Reference(_WHERE)).get(timeout=timeout_s)]
    # torchrun's variables; OMP_NUM_THREADS=1 for several ranks unless the user chose it
    base = {k: v for k, v in os.environ.items() if k == "OMP_NUM_THREADS"}
    names: list[str] | None = None  # each rank's host, where its launcher names it
    if hosts > 1 or instance:
        envs = launch.rank_envs(base, n // hosts, port, hosts,
                                launch.host_instances(instance, hosts) if instance else (), address)
    elif ssh is not None:  # host by host in --ssh-hosts order; several hosts that are one machine are emulated
        index = [int(s.env.get(HOST_INDEX, "-1")) for s in seen]
        order = sorted(range(n), key=lambda i: (index[i], ids[i]))
        ids, seen, index = [ids[i] for i in order], [seen[i] for i in order], [index[i] for i in order]
        emulated = len({s.host for s in seen}) < len(set(index))
        envs = launch.place_envs(base, placement.place([placement.Seen(ssh.hosts[i], {}) for i in index]), port,
                                 emulated, master_addr=address)
        names = None if emulated else [ssh.host_name(i) for i in index]
    else:  # each engine's rank from its scheduler's variables (mpiexec's, srun's), or host by host
        places = placement.place(seen)
        by_rank = sorted(range(n), key=lambda i: places[i].rank)
        envs = launch.place_envs(base, [places[i] for i in by_rank], port, master_addr=address)
        ids, seen = [ids[i] for i in by_rank], [seen[i] for i in by_rank]
    here = [s.host == socket.gethostname() for s in seen]  # its pid can be watched
    progress(f"neuron_lab: {count(n, 'engine')} up; loading neuron_lab and joining the process group "
             f"(MASTER_ADDR={address} MASTER_PORT={port})…")
    pids = client[ids].apply_async(os.getpid).get(timeout=timeout_s)
    for i in range(n):
        client[ids[i]].execute(_set_env_code(envs[i]), silent=True, block=False)
    pending = {i: client[ids[i]].apply_async(_agent("join_ranks"), timeout_s, *(ends_with if here[i] else ()))
               for i in range(n)}
    engines: list[Engine] = []
    for i, ar in pending.items():
        info = _wait_setup(ar, Engine(i, pids[i], "", job=job, here=here[i]), deadline)
        if info["torch_first"]:
            raise RanksError(f"rank {i}: torch was imported before the rank's variables were set (an IPython "
                             f"startup file, or earlier work on an attached engine?), so its device is not neuron:{i}")
        host = placement.host_name(envs[i]) if names is None else names[i]
        engines.append(Engine(i, info["pid"], info["device"], host, ids[i], job=job, here=here[i]))
        on = f" on {host}" if hosts > 1 or instance or ssh else ""
        progress(f"neuron_lab: rank {i} ready: pid {info['pid']}, {info['device']}{on}")
    return engines, store


def _wait_engines(client: Any, n: int, deadline: float, job: JobWatch | None, cluster: Any) -> None:
    """Until ``n`` engines registered; a Slurm job that ends first is a :class:`RanksError` with its output's last
    line, one that is still pending at the deadline says so."""
    from ipyparallel.error import TimeoutError as EnginesLate

    while True:
        try:
            client.wait_for_engines(n, timeout=max(0.1, min(POLL_S * 10, deadline - time.monotonic())),
                                    interactive=False)
            return
        except EnginesLate:
            if job is not None and not job.up():
                out = next(iter(cluster.engines.values())).get_output(remove=False).strip().splitlines()
                raise RanksError(f"the Slurm job {job.job_id} ended before its engines started (state "
                                 f"{job.state()})" + (f": {out[-1]}" if out else "")) from None
            if time.monotonic() >= deadline:
                if job is not None and job.state() == "PENDING":
                    raise RanksError(f"the Slurm job {job.job_id} is still pending (`squeue -j {job.job_id}` says "
                                     "why); --timeout S waits longer") from None
                raise


def _wait_setup(ar: Any, e: Engine, deadline: float) -> dict[str, Any]:
    """One engine's setup result; a rank that raises, dies or passes the deadline is a :class:`RanksError`."""
    rank = e.rank
    while not ar.ready():
        if not e.alive():
            raise RanksError(f"engine {rank} died while starting (pid {e.pid})")
        if time.monotonic() >= deadline:
            raise RanksError(f"rank {rank} did not join the process group in time (pid {e.pid}); --timeout S "
                             "waits longer")
        ar.wait(POLL_S)
    try:
        return ar.get()
    except Exception as e:
        if getattr(e, "ename", "") == PreflightMismatch.__name__:  # the table, whole: it is the message
            raise RanksError(f"the ranks differ, so none joined the process group\n{e.evalue}") from None
        raise RanksError(f"rank {rank} failed to start: {_one_line(e)}") from None


def _start_error(e: BaseException, timeout_s: float) -> BaseException:
    """What a start that failed with ``e`` raises: a :class:`RanksError` that says why (an interrupt stays one)."""
    from ipyparallel.error import TimeoutError as EnginesLate

    if isinstance(e, (RanksError, KeyboardInterrupt)):
        return e
    if isinstance(e, placement.PlacementError):
        return RanksError(f"the engines do not make one world: {e}")
    if isinstance(e, (TimeoutError, EnginesLate)):
        return RanksError(f"the engines did not start within {timeout_s:g} s (--timeout S waits longer)")
    return RanksError(f"the ranks did not start: {_one_line(e)}")


def _shutdown(cluster: Any, client: Any, profile_dir: str) -> None:
    """End the engines, stop the cluster and make sure its controller is gone (killed if it does not go), then drop
    its files.

    The engines are killed, not asked: they ran every cell to its end (or are being given up), their ranks left the
    group, and their namespaces go with them either way; an asked engine takes ipykernel's own shutdown (2-5 s, then
    ipyparallel kills it), and its nanny waits 3 s more to tell a controller that is gone already."""
    from ipyparallel.cluster.launcher import SSHLauncher

    for said in ssh_engines.kill(cluster.engines.values(), FETCH_TIMEOUT_S):  # on their hosts, one ssh per host
        print(f"neuron_lab: ssh engines at {said}", file=sys.stderr)
    # a local engine set's launcher per engine; mpiexec's one launcher, whose process tree holds the engines (an ssh
    # launcher's pid is the engine's on its host, killed there above)
    launchers = [proc for es in cluster.engines.values()
                 for proc in (getattr(es, "launchers", None) or {0: es}).values()]
    ended = _tree([proc.pid for proc in launchers if (getattr(proc, "pid", None) or -1) > 0
                   and not isinstance(proc, SSHLauncher)])  # each engine and its nanny
    _signal(ended, psutil.Process.kill)
    psutil.wait_procs(ended, timeout=FETCH_TIMEOUT_S)
    controller = [getattr(cluster.controller, "pid", -1)] if cluster.controller is not None else []
    procs = _tree([pid for pid in controller if pid > 0])  # the controller's schedulers too
    if client is not None:
        client.close()
    try:
        cluster.stop_cluster_sync()
    except Exception:
        pass  # an engine already gone; its pid is checked below
    for signal_them, wait_s in ((psutil.Process.terminate, STOP_WAIT_S), (psutil.Process.kill, FETCH_TIMEOUT_S)):
        _signal(procs, signal_them)  # what the cluster's stop left
        _gone, procs = psutil.wait_procs(procs, timeout=wait_s)
    shutil.rmtree(profile_dir, ignore_errors=True)


def _signal(procs: list[psutil.Process], signal_them: Callable[[psutil.Process], None]) -> None:
    for p in procs:
        try:
            signal_them(p)
        except psutil.NoSuchProcess:
            pass


def _running(pid: int) -> bool:
    """The process is there and has not exited (an exited child stays a zombie until it is reaped)."""
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


def _tree(pids: list[int]) -> list[psutil.Process]:
    """These processes and all their descendants that are still there."""
    procs: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            p = psutil.Process(pid)
            procs.update({q.pid: q for q in [p, *p.children(recursive=True)]})
        except psutil.NoSuchProcess:
            pass
    return list(procs.values())


def _engine_died(ar: Any) -> bool:
    """Whether a finished AsyncResult is ipyparallel's word that its engine died (or was stopped) while running it."""
    try:
        ar.get(0)
    except Exception as e:
        names = [getattr(e, "ename", None) or type(e).__name__, *(x[0] for x in getattr(e, "elist", []))]
        return "EngineError" in names
    return False


def _one_line(e: BaseException) -> str:
    """An exception as its traceback's last line; an engine's RemoteError as the engine's own exception."""
    name, value = getattr(e, "ename", None) or type(e).__name__, getattr(e, "evalue", None)
    text = str(e) if value is None else value
    return f"{name}: {(text.strip().splitlines() or [''])[-1]}".rstrip(": ")
