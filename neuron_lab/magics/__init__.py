"""``%neuron`` and ``%%neuron``: parse, validate, then call the session; never branch on the backend.

Every bad input is a ``UsageError`` raised before anything changes.
"""

from __future__ import annotations

import ast
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class, output_can_be_silenced

from neuron_lab import checks, modes, settings
from neuron_lab.checks import CompareOptions, ParityOptions, limits
from neuron_lab.deprecation import renamed
from neuron_lab.magics import parser as _parser
from neuron_lab.magics.completion import NeuronCompleter
from neuron_lab.magics.parser import CELL_ONLY
from neuron_lab.report.model import Report
from neuron_lab.report.ranks import RanksReport
from neuron_lab.report.rows import summary_line
from neuron_lab.session import devices
from neuron_lab.session.ranks import DEFAULT_TIMEOUT_S, Ranks, RanksError, RanksFailed
from neuron_lab.session.session import Session
from neuron_lab.session.slurm_job import SlurmOptions
from neuron_lab.session.ssh_engines import SSHOptions
from neuron_lab.trace import profile as profiling
from neuron_lab.units import ShownAsText, count

_PARSER = _parser.build()
_RANKS_ENGINES = settings.env("NEURON_LAB_RANKS_ENGINES")
_RANKS_SSH_HOSTS = settings.env("NEURON_LAB_RANKS_SSH_HOSTS")
_BACKEND_SETTING = f"NeuronLab.{settings.config('compile_backend').name}"  # compile mode's backend when no --backend


class ReportList(ShownAsText):
    """Several reports, one summary line each (``%neuron report all``)."""

    def __init__(self, reports: list[Report]) -> None:
        self.reports = reports

    def __str__(self) -> str:
        if not self.reports:
            return "no reports yet: run a cell that uses the device"
        return "\n".join(summary_line(r) for r in self.reports)

    def _repr_html_(self) -> str:
        from html import escape

        rows = "".join(f"<div style='font-family:monospace;font-size:12px'>{escape(summary_line(r))}</div>"
                       for r in self.reports)
        return rows or escape(str(self))


class _Text(ShownAsText, str):
    """A message shown as plain text without quotes."""


@magics_class
class NeuronMagics(Magics):
    """The extension's per-shell state lives here (its session and ``%config NeuronLab``), as IPython's own
    extensions keep theirs on their Magics: ``shell.magics_manager.registry["NeuronMagics"]`` finds it."""

    def __init__(self, shell: Any, session: Session, settings: Any) -> None:
        super().__init__(shell)
        self.session = session
        self.settings = settings  # the NeuronLab configurable (``Magics.config`` is traitlets' own)
        self.completer = NeuronCompleter(_PARSER, session)  # Tab after `%neuron`, from the same parser

    @output_can_be_silenced
    @line_cell_magic
    def neuron(self, line: str = "", cell: str | None = None):
        __tracebackhide__ = True  # noqa: F841
        if (shown := _parser.asked_for_help(_PARSER, line, cell=cell is not None)) is not None:
            print(shown)  # and nothing runs, the cell's body neither: as `-h` on a command line
            return None
        args = _parser.parse(_PARSER, line, cell=cell is not None)
        if cell is not None:
            return self._cell(args, line, cell)
        return getattr(self, f"cmd_{args.command or 'status'}")(args)

    # -- cell forms -----------------------------------------------------------------------------
    def _cell(self, args, line: str, cell: str):
        __tracebackhide__ = True  # noqa: F841
        if args.command == "ranks":
            return self._run_on_ranks(args, cell)
        if args.command in ("parity", "compare"):
            options = self._check_options(args, cell)
            return checks.run_check(self.session.cell_to_check(cell, f"%%neuron {line}\n{cell}"), options)
        if args.command == "profile":
            return self._run_profiled(args, line, cell)
        mode = options = None
        device_text = args.device
        if args.command == "compile":
            mode = modes.COMPILE
            options = self._compile_options(args)
        elif args.command == "eager":
            mode = modes.EAGER
        device = self._parse_device(device_text, args.command) if device_text else None
        return self.session.run_cell_body(cell, f"%%neuron {line}\n{cell}", mode=mode, options=options,
                                          device=device)

    def _run_profiled(self, args, line: str, cell: str) -> profiling.ProfileResult:
        """``%%neuron profile``: the cell runs once under torch.profiler; the profile joins the cell's report, and the
        cell's value is the profile, to export or tabulate afterwards (``_.export_chrome_trace(path)``)."""
        __tracebackhide__ = True  # noqa: F841
        try:
            path = profiling.check_export_path(args.export) if args.export else None
            limit = profiling.check_row_limit(args.row_limit if args.row_limit is not None
                                              else profiling.DEFAULT_ROW_LIMIT)
            p = profiling.OpProfile(self.session.locator, with_stack=path is not None, export=path,
                                    label="cell").start()  # its number is known only at its end (IPython 8)
        except ValueError as e:  # the cell form's errors say `%%neuron`; the command is a line magic too
            raise UsageError(f"%%neuron profile: {e}\n{_parser.usage(_PARSER, 'profile', cell=True)}") from None
        tracker = self.session.running
        try:
            self.session.run_cell_body(cell, f"%%neuron {line}\n{cell}")
        finally:
            profiled = p.result(export=path, row_limit=limit)
            if tracker is not None:
                tracker.attach_profile(profiled)
            kept = p.keep(tracker.report if tracker is not None else None)  # a failed cell's too: last_profile()
        return kept

    def _check_options(self, args, cell: str) -> ParityOptions | CompareOptions:
        """Options of `%%neuron parity` / `compare`, checked before the cell runs: their bounds by the option
        objects themselves, then what only the shell knows (the names in --vars, the notebook device)."""
        cmd = args.command
        with _refused(cmd):
            if cmd == "compare":
                backend = self.session.config.compile_backend
                limits.compile_backend(backend, _BACKEND_SETTING)  # compare takes no --backend: the setting's
                return CompareOptions(args.warmup, args.runs, args.fullgraph, backend)
            options = ParityOptions(args.against, args.rtol, args.atol, tuple(dict.fromkeys(args.vars)), args.seed)
        assigned = self._assigned(cell)
        unknown = [] if assigned is None else [n for n in options.vars
                                               if n not in self.shell.user_ns and n not in assigned]
        if unknown:
            raise _usage_error(cmd, f"--vars {' '.join(unknown)}: no such variable, and the cell does not assign "
                                    f"{'it' if len(unknown) == 1 else 'them'}")
        if options.against == self.session.device:
            raise _usage_error(cmd, f"the reference device is the notebook device ({options.against}); compare "
                                    "against another one, e.g. --against cpu, or switch the notebook device with "
                                    "`%neuron device`")
        return options

    def _assigned(self, cell: str) -> set[str] | None:
        """Names the cell binds (assignments, defs, imports, loop targets); None when it does not parse."""
        try:
            tree = ast.parse(self.shell.transform_cell(cell))
        except SyntaxError:
            return None
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.alias):
                names.add((node.asname or node.name).split(".")[0])
        return names

    # -- line forms -----------------------------------------------------------------------------
    def cmd_status(self, args):
        return self.session.status()

    def _parse_device(self, text: str, command: str = "device") -> torch.device:
        with _refused(command):
            return devices.parse_device(text)

    def cmd_device(self, args):
        s = self.session
        if not args.device:
            here = devices.stayed_elsewhere(s.shell.user_ns, s.device, skip=s._hidden_names())
            lines = [f"notebook device: {s.device} (variable `{s.config.device_variable}`)"]
            if here:
                lines.append("objects on other devices:")
                lines += [f"  {x.name:<20} {x.kind:<16} on {x.where}" for x in here]
            print("\n".join(lines))
            return None
        dev = self._parse_device(args.device)
        names = s.movable_names() if args.all else list(dict.fromkeys(args.move))
        missing = [n for n in names if n not in s.shell.user_ns]
        if missing:
            raise _usage_error("device", f"no variable named {', '.join(missing)}; nothing was moved")
        bad = [n for n in names if not devices.movable(s.shell.user_ns[n])]
        if bad:
            kinds = ", ".join(f"{n} ({type(s.shell.user_ns[n]).__name__})" for n in bad)
            raise _usage_error("device", f"cannot move {kinds}: only tensors, nn.Modules, optimizers and "
                                         "lists/tuples/dicts of tensors move; nothing was moved")
        report = failure = None
        if names:
            try:
                report = s.move(names, dev)
            except Exception as e:  # out of memory, or an object that cannot be rebuilt on the device
                failure = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}".rstrip(": ")
        if failure is not None:  # raised here, not in the handler: no __context__ keeps the failed move's frames
            raise UsageError(f"%neuron device: moving to {dev} failed, and everything was put back where it "
                             f"was: {failure}")
        s.set_device(dev, default=args.default)
        head = f"notebook device: {dev}" + (" (also torch's default device)" if args.default else "")
        print(head + ("\n" + str(report) if report is not None else ""))

    def cmd_mode(self, args):
        s = self.session
        if args.mode is None and (args.fullgraph or args.backend or args.dynamic):
            raise _usage_error("mode", "--fullgraph, --backend and --dynamic go with `compile`: "
                                       "`%neuron mode compile --fullgraph`")
        if args.mode is not None:  # alone, it shows the mode, as `%neuron device` alone shows the device
            options = self._compile_options(args) if args.mode == modes.COMPILE else None
            if args.mode != modes.COMPILE and (args.fullgraph or args.backend or args.dynamic):
                raise _usage_error("mode", "--fullgraph, --backend and --dynamic go with `compile`, "
                                           f"not `{args.mode}`")
            s.set_mode(args.mode, options)
        print(f"mode for the cells that follow: {args.mode or modes.described(s.mode, s.compile_options)}")

    def _compile_options(self, args) -> modes.CompileOptions:
        with _refused(args.command):
            if args.backend:
                return limits.compile_options(args.backend, args.fullgraph, args.dynamic)
            return limits.compile_options(self.session.config.compile_backend, args.fullgraph, args.dynamic,
                                          _BACKEND_SETTING)

    def cmd_report(self, args):
        s = self.session
        detail = args.detail
        if args.cell == "all":
            reports = list(s.history.values())
            if detail == "json":
                return _Text(json.dumps([r.as_dict() for r in reports], indent=1))
            return ReportList(reports)
        if args.cell is None or args.last:
            if not s.history:
                return _Text("no reports yet: run a cell that uses the device")
            report = next(reversed(s.history.values()))
        else:
            try:
                n = int(args.cell)
            except ValueError:
                raise _usage_error("report", f"CELL must be a cell number or `all`, not {args.cell!r}") from None
            if n not in s.history:
                kept = ", ".join(str(k) for k in s.history) or "none"
                raise UsageError(f"%neuron report: no report for cell {n} (reports kept for cells: {kept})")
            report = s.history[n]
        if detail == "json":
            return _Text(json.dumps(report.as_dict(), indent=1))
        if detail:
            from dataclasses import replace

            report = replace(report, detail=detail)  # a copy shown otherwise: the kept report is final
        return report

    def cmd_reset(self, args):
        self.session.reset()
        print("neuron_lab: session totals, report history and peak memory cleared")

    def cmd_free(self, args):
        return self.session.free()

    # -- ranks ----------------------------------------------------------------------------------------
    def cmd_ranks(self, args):
        s = self.session
        running = s.ranks is not None and not s.ranks.stopped
        if args.action == "start":
            if running and not args.restart:
                raise _usage_error("ranks", f"{count(len(s.ranks.engines), 'rank')} already running (pids "
                                            f"{', '.join(str(e.pid) for e in s.ranks.engines)}); `%neuron ranks "
                                            "stop` first, or add --restart")
            if running:
                self._stop_ranks()
            try:
                slurm = SlurmOptions(args.partition, args.nodes, args.ntasks_per_node, args.account, args.time)
                engines, problem = _RANKS_ENGINES.choice()  # `neuron-lab run --engines KIND`'s default
                if problem and not args.engines:
                    print(f"neuron_lab: {problem}", file=sys.stderr)
                engines = args.engines or engines
                hosts = args.ssh_hosts or (_RANKS_SSH_HOSTS.text() if engines == "ssh" else "")  # or the runner's
                try:
                    ssh = SSHOptions.parse(hosts) if hosts else None
                except ValueError as e:
                    raise RanksError(f"--ssh-hosts: {e}") from None
                s.ranks = Ranks.start(args.n, args.timeout or DEFAULT_TIMEOUT_S, hosts=args.hosts or 1,
                                      engines=engines, slurm=slurm, instance=args.instance, ssh=ssh,
                                      address=s.config.ranks_address)
            except RanksError as e:
                first, _, table = str(e).partition("\n")  # a preflight's table follows its first line
                raise UsageError(f"%neuron ranks start: {first}; nothing is left running"
                                 + (f"\n{table}" if table else "")) from None
            return None
        if args.action == "attach":
            if running:
                raise _usage_error("ranks", f"{count(len(s.ranks.engines), 'rank')} already running; `%neuron ranks "
                                            "stop` first")
            try:
                s.ranks = Ranks.attach(args.profile or None, args.cluster_file, args.sshserver,
                                       args.timeout or DEFAULT_TIMEOUT_S, address=s.config.ranks_address)
            except RanksError as e:
                first, _, table = str(e).partition("\n")
                raise UsageError(f"%neuron ranks attach: {first}" + (f"\n{table}" if table else "")) from None
            return None
        if args.action in ("interrupt", "stop") and not running:
            return _Text("neuron_lab ranks: none running")
        if args.action == "interrupt":
            return _Text(s.ranks.interrupt())
        if args.action == "stop":
            return self._stop_ranks()
        return s.ranks if running else _Text("neuron_lab ranks: none running; start them with "
                                             "`%neuron ranks start N`")

    def _stop_ranks(self) -> _Text:
        ranks, self.session.ranks = self.session.ranks, None
        pids = ranks.stop()
        if ranks.attached is not None:
            return _Text(f"neuron_lab ranks: detached from {count(len(ranks.engines), 'rank')}; their engines keep "
                         f"running (the cluster at {ranks.attached} was not started here)")
        return _Text(f"neuron_lab ranks: stopped {count(len(ranks.engines), 'rank')}" +
                     (f" (pids {', '.join(map(str, pids))})" if pids else ""))

    def _run_on_ranks(self, args, cell: str) -> RanksReport:
        try:  # before anything runs: a path that cannot be written
            export = profiling.check_export_path(args.export) if args.export else None
            limit = None if args.row_limit is None else profiling.check_row_limit(args.row_limit)
        except ValueError as e:
            raise UsageError(f"%%neuron ranks: {e}\n{_parser.usage(_PARSER, 'ranks', cell=True)}") from None
        ranks = self.session.ranks
        if ranks is None or ranks.stopped:
            raise UsageError("%%neuron ranks: no ranks are running; start them first with `%neuron ranks start N` "
                             "on a line of its own (e.g. `%neuron ranks start 2`)")
        number = self.session.locator.current_cell()
        number = self.shell.execution_count if number is None else number
        try:
            report = ranks.run(cell, f"In[{number}]", cell=number, line_offset=1, timeout_s=args.timeout,
                               profile=args.profile, export=export, row_limit=limit,
                               output_window_s=self.session.config.ranks_output_window_s)
        except RanksError as e:
            raise UsageError(f"%%neuron ranks: {e}") from None
        self.session.ranks_ran(report)
        if report.failed:
            from IPython.display import display

            display(report)
            raise RanksFailed(report, ranks.broken)
        return report

    # -- live views -------------------------------------------------------------------------------
    def _show(self, views: list[str], live: bool = True):
        from neuron_lab import widgets

        return widgets.show(self.session, views, live=live)

    def cmd_dashboard(self, args):
        from neuron_lab.widgets import VIEWS

        unknown = [v for v in args.views if v not in VIEWS]
        if unknown:
            raise _usage_error("dashboard", f"unknown view {', '.join(unknown)}; views: {', '.join(VIEWS)}")
        return self._show(list(dict.fromkeys(args.views)) or list(VIEWS))

    def cmd_memory(self, args):
        return self._show(["memory"], live=args.live)

    def cmd_tensors(self, args):
        return self._show(["tensors"], live=args.live)

    def cmd_fallbacks(self, args):
        return self._show(["fallbacks"], live=args.live)

    def cmd_compiles(self, args):
        return self._show(["compiles"], live=args.live)

    def cmd_coverage(self, args):
        from neuron_lab import backend
        from neuron_lab.backend import coverage

        if not backend.is_active():
            raise UsageError(f"%neuron coverage: no neuron backend ({backend.state().reason})")
        b = backend.active()
        if args.coverage:
            try:
                with _refused("coverage"):  # a coverage that does not load (coverage.CoverageError)
                    b.set_coverage(args.coverage)
            except NotImplementedError as e:
                raise UsageError(f"%neuron coverage: {e}") from None
        c = b.coverage
        if c is None:
            return _Text(f"{b.name} reports which ops ran natively; it has no op coverage to switch")
        return _Text(f"op coverage: {c.name}, dated {c.date}: {c.source}\n"  # a source is sentences, its own stop
                     f"bundled: {', '.join(coverage.bundled())}; switch with `%neuron coverage NAME|FILE`")

    def cmd_profile(self, args):
        """``%neuron profile [NAME]`` on a line: the old spelling of ``%neuron coverage [NAME]``."""
        renamed("`%neuron profile NAME`", "`%neuron coverage NAME` (`%%neuron profile` is torch.profiler's)")
        return self.cmd_coverage(args)


def _usage_error(command: str, why: str, usage: bool = True) -> UsageError:
    """``%neuron COMMAND: why`` (``%%`` for a cell magic), then the command's usage unless told not to."""
    where = _parser.written(f"{_PARSER.prog} {command}", command in CELL_ONLY)
    return UsageError(f"{where}: {why}" + (f"\n{_parser.usage(_PARSER, command)}" if usage else ""))


@contextmanager
def _refused(command: str) -> Iterator[None]:
    """The one place a ``ValueError`` becomes a UsageError: an option object refusing a value
    (:class:`limits.OptionError`, spelled with the flags' names), a device or a coverage that does not parse."""
    try:
        yield
    except limits.SettingError as e:  # not an option of the command: its usage would not help
        raise _usage_error(command, str(e), usage=False) from None
    except limits.OptionError as e:
        raise _usage_error(command, e.spelled(lambda name: f"--{name}")) from None
    except ValueError as e:
        raise _usage_error(command, str(e)) from None


NeuronMagics.neuron.__doc__ = _parser.help_text(_PARSER)
