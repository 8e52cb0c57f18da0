"""The grammar of ``%neuron`` and ``%%neuron``: one argparse parser with a subparser per command.

Built on IPython's ``MagicArgumentParser``, so every parse error is a ``UsageError``: one message
plus the usage of the command it concerns, no traceback.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import glob
import os
import textwrap
from collections.abc import Iterable
from contextvars import ContextVar

from IPython.core.error import UsageError
from IPython.core.magic_arguments import MagicArgumentParser

from neuron_lab.backend import coverage
from neuron_lab.checks import limits
from neuron_lab.session.launch import host_instances
from neuron_lab.session.ranks import DEFAULT_TIMEOUT_S, ENGINES, MAX_RANKS
from neuron_lab.session.session import Session
from neuron_lab.session.ssh_engines import NEED_HOSTS, SSHOptions
from neuron_lab.widgets.snapshot import VIEWS as WIDGET_VIEWS

VIEWS = ("dashboard", *WIDGET_VIEWS)  # `%neuron dashboard` and a command per view
LINE_ONLY = ("status", "mode", "report", "reset", "free", "coverage", *VIEWS)
CELL_ONLY = ("compile", "eager", "parity", "compare")
WIDTH = 100  # columns of the command list in ``%neuron?``
# What ``%neuron?`` leads with: the common tasks, one real command each (tests parse every one).
EXAMPLES = (
    ("%neuron device neuron", "switch the notebook device to neuron:0 (`%neuron device cpu` goes back)"),
    ("%%neuron compile", "first line of a cell: run its model calls compiled by torch.compile"),
    ("%neuron report --full", "the last cell's report: its CPU fallbacks, with the lines that caused them"),
    ("%%neuron parity --against cpu", "first line of a cell: run it on the device and on the CPU, compare"),
    ("%neuron dashboard", "live tabs: device memory, device tensors, CPU fallbacks, compiles"),
)
CELL_FORMS = ("cell forms: %%neuron compile [--fullgraph] [--backend NAME] [--device DEVICE] | "
              "%%neuron eager [--device DEVICE] | %%neuron device DEVICE | "
              "%%neuron parity [--against cpu|DEVICE] [--rtol R --atol A] [--vars NAME ...] [--seed S] | "
              "%%neuron compare [--warmup W] [--runs N] [--fullgraph] | "
              "%%neuron ranks [--timeout S] [--profile [--export PATH] [--row-limit N]] | "
              "%%neuron profile [--export PATH] [--row-limit N]")


_CELL_FORM: ContextVar[bool] = ContextVar("neuron_lab_cell_form", default=False)  # parse() of a cell's first line


class NeuronArgumentParser(MagicArgumentParser):
    """A parser whose parse errors are UsageErrors; the top one keeps its commands (argparse keeps them privately)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)
        self.subcommands: dict[str, tuple[NeuronArgumentParser, str]] = {}  # name -> (its parser, one-line help)

    def error(self, message: str):
        """argparse's own errors (``argument --export: expected one argument``) name the form the user wrote
        (:func:`written`); the parsers themselves are shared, and keep their names."""
        shown = copy.copy(self)
        shown.prog = written(self.prog, _CELL_FORM.get())
        raise UsageError(f"{shown.prog}: {message}\n{shown.format_usage().rstrip()}")

    def _check_value(self, action: argparse.Action, value: object) -> None:
        """argparse's own check, with a near miss named (as Python 3.14's ``suggest_on_error`` does)."""
        if action.choices is not None and value not in action.choices:
            choices = ", ".join(map(repr, action.choices))
            raise argparse.ArgumentError(action, f"invalid choice: {value!r}{did_you_mean(str(value), action.choices)}"
                                                 f" (choose from {choices})")


# Tab completion of an argument's values (``completion.py``): the ``completer`` its action names, argcomplete's
# convention, called with the session and the word being typed; an argument with ``choices`` completes those.
def _variables(session: Session, word: str) -> list[str]:
    return sorted(session.variable_names())


def _movable(session: Session, word: str) -> list[str]:
    return sorted(session.movable_names())


def _reports(session: Session, word: str) -> list[str]:
    """``all`` and the cells whose reports are kept, newest first."""
    return ["all", *(str(n) for n in reversed(session.history))]


def _views(session: Session, word: str) -> tuple[str, ...]:
    return WIDGET_VIEWS


def _coverages(session: Session, word: str) -> list[str]:
    return coverage.bundled()


def _paths(session: Session, word: str) -> list[str]:
    """Files and folders (``/`` after a folder) whose path starts with ``word``."""
    return sorted(p + os.sep if os.path.isdir(p) else p for p in glob.glob(glob.escape(word) + "*"))


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """``; did you mean `x`?`` for the closest of ``known`` to a mistyped ``word`` (difflib's ratio), else ``""``."""
    close = difflib.get_close_matches(word, list(known), n=1)
    return f"; did you mean `{close[0]}`?" if close else ""


def options(sp: argparse.ArgumentParser) -> list[argparse.Action]:
    """A command's documented options, in the parser's order."""
    return [a for a in sp._actions if a.option_strings and a.help is not argparse.SUPPRESS]


def positionals(sp: argparse.ArgumentParser) -> list[argparse.Action]:
    """A command's documented positional arguments, in order."""
    return [a for a in sp._actions if not a.option_strings and a.help is not argparse.SUPPRESS]


def commands_for(p: NeuronArgumentParser, *, cell: bool) -> list[str]:
    """The commands ``%%neuron`` (``cell``) or ``%neuron`` accepts, in the parser's order."""
    refused = LINE_ONLY if cell else CELL_ONLY
    return [name for name in p.subcommands if name not in refused]


def _device_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", metavar="DEVICE", help="run the cell with this notebook device (cell magic only)")


def _compile_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fullgraph", action="store_true", help="fail on graph breaks instead of splitting the graph")
    p.add_argument("--backend", metavar="NAME", help="torch.compile backend (default: NeuronLab.compile_backend)")
    p.add_argument("--dynamic", action="store_true", default=None, help="compile with dynamic shapes")


def build() -> NeuronArgumentParser:
    p = NeuronArgumentParser(prog="%neuron", description=(
        "The neuron_lab workbench: device switching, eager/compile modes, per-cell reports of CPU "
        "fallbacks, memory and compiles. `%neuron` alone shows the status."))
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=NeuronArgumentParser)

    def command(name: str, help: str, **kwargs: str) -> NeuronArgumentParser:  # noqa: A002 (argparse's name)
        prog = f"%%neuron {name}" if name in CELL_ONLY else f"%neuron {name}"
        sp = sub.add_parser(name, prog=prog, help=help, **kwargs)
        p.subcommands[name] = (sp, help)
        return sp

    command("status", help="backend, device, mode, memory and session totals")

    d = command("device", help="show or switch the notebook's device",
                description="Show the notebook device, or switch it. As a cell magic (`%%neuron device cpu`), "
                            "for that cell only.")
    d.add_argument("device", nargs="?", metavar="DEVICE", help="neuron, neuron:N, cpu, cuda or cuda:N")
    d.add_argument("--default", action="store_true", help="also torch.set_default_device(DEVICE)")
    d.add_argument("--move", nargs="+", metavar="NAME", default=[],
                   help="move these objects to DEVICE").completer = _movable
    d.add_argument("--all", action="store_true",
                   help="move every module, tensor, optimizer and list/tuple/dict of tensors in the namespace")

    m = command("mode", help="show or set the default mode of the cells that follow",
                description="default: code runs as written; eager: compiled functions run eagerly (force_eager "
                            "stance); compile: outermost nn.Module calls are compiled.")
    m.add_argument("mode", nargs="?", choices=("default", "eager", "compile"), help="the mode")
    _compile_options(m)

    r = command("report", help="show reports from the history",
                description="Show a cell's report (`%neuron report 7`), every kept report "
                            "(`all`), or the last one (default).")
    r.add_argument("cell", nargs="?", metavar="CELL|all", help="a cell number, or all").completer = _reports
    r.add_argument("--last", action="store_true", help="the last report (the default)")
    g = r.add_mutually_exclusive_group()
    g.add_argument("--full", action="store_const", const="full", dest="detail", help="with call chains")
    g.add_argument("--summary", action="store_const", const="summary", dest="detail", help="one line")
    g.add_argument("--json", action="store_const", const="json", dest="detail", help="as JSON")

    command("reset", help="clear the session totals, the history and peak memory")
    command("free", help="drop IPython's own references to device tensors (Out, _, _N, the last traceback) "
                         "and report the bytes freed, each holder with the bytes only it held (not your variables)")

    v = command("dashboard", help="live views of memory, device tensors, CPU fallbacks and compiles, in tabs",
                description="A live panel that updates while cells run (a widget under a kernel; text elsewhere). "
                            "Each view also shows alone: `%neuron memory`, `%neuron tensors`, `%neuron fallbacks`, "
                            "`%neuron compiles`.")
    v.add_argument("views", nargs="*", metavar="VIEW",
                   help="only these views (memory, tensors, fallbacks, compiles)").completer = _views
    for name, what in (("memory", "device memory now, its timeline over the session and per-cell deltas, with a "
                                  "free button"),
                       ("tensors", "the device tensors, the names that refer to them and what holds them"),
                       ("fallbacks", "the CPU-fallback inspector: ops that did not run natively, with call sites"),
                       ("compiles", "graphs, graph breaks, recompiles and compile time per cell")):
        sv = command(name, help=f"view: {what}",
                     description=f"{what[0].upper()}{what[1:]}, as at the end of this cell.")
        sv.add_argument("--live", action="store_true", help="update after every cell and while cells run")
    cv = command("coverage", help="show or switch the op coverage: which ops run natively, which fall back",
                 description="The op coverage decides which ops the emulator runs natively and which it reports "
                             "as CPU fallbacks (`neuron-lab coverage show` lists one).")
    cv.add_argument("coverage", nargs="?", metavar="NAME|FILE",
                    help="a bundled coverage's name, or a JSON file").completer = _coverages
    pr = command("profile", help="cell magic: run the cell under torch.profiler: time per op and line",
                 description="`%%neuron profile` runs the cell once under torch.profiler; its report adds each "
                             "op's device and host time and the line that issued it.")
    pr.add_argument("coverage", nargs="?", help=argparse.SUPPRESS)  # `%neuron profile NAME`: `coverage`'s old name
    pr.add_argument("--export", metavar="PATH", help="cell form: write a Perfetto trace").completer = _paths
    pr.add_argument("--row-limit", type=int, metavar="N", help="cell form: rows shown (default 10)")
    c = command("compile", help="cell magic: run the cell with its outermost nn.Module calls compiled by "
                                "torch.compile")
    _compile_options(c)
    _device_option(c)
    e = command("eager", help="cell magic: run the cell eagerly, compiled functions included")
    _device_option(e)
    pa = command("parity", help="cell magic: run the cell on the notebook device, then on copies on a reference "
                                "device, and compare what it produced",
                 description="The device run is the real one; the reference run (eager, on deep copies of "
                             "what the cell reads) leaves nothing behind. Compared: new or changed tensors, "
                             "modules, optimizers, numbers and the last value, with torch.testing.assert_close"
                             "'s dtype tolerances unless --rtol/--atol are given.")
    pa.add_argument("--against", metavar="cpu|DEVICE", default="cpu", help="the reference device (default cpu)")
    pa.add_argument("--rtol", type=float, metavar="R", help="relative tolerance, a finite number >= 0 (with --atol)")
    pa.add_argument("--atol", type=float, metavar="A", help="absolute tolerance, a finite number >= 0 (with --rtol)")
    pa.add_argument("--vars", nargs="+", metavar="NAME", default=[],
                    help="compare only these variables").completer = _variables
    pa.add_argument("--seed", type=int, metavar="S", help="torch.manual_seed(S), S from 0 to 2**64-1, before the "
                    "device run; the reference starts from the same state (default: the generators as the cell "
                    "finds them)")
    ra = command("ranks", help="run cells on N ranks of one `neuron` process group, one ipyparallel engine each; "
                               "one report for all ranks",
                 description="`start N`: ranks 0..N-1 on ipyparallel engines (local, mpi, slurm or ssh; torchrun's "
                             "variables set, neuron:RANK each); `attach`: the engines of a cluster that runs already. "
                             "A `%%neuron ranks` cell runs on all of them and reports each rank's time, memory, "
                             "fallbacks, collectives and error, and the skew. `interrupt`: KeyboardInterrupt on every "
                             "rank still running a cell, and where each was. `stop` stops them (attached: detaches).")
    ra.add_argument("action", nargs="?", choices=("start", "attach", "interrupt", "stop"),
                    help="start N ranks; attach to an ipyparallel cluster that runs already; interrupt every rank "
                         "still running a cell; or stop them")
    ra.add_argument("n", nargs="?", type=int, metavar="N", help=f"how many ranks to start, 1 to {MAX_RANKS}")
    ra.add_argument("--timeout", type=float, metavar="S",
                    help="start: seconds to wait for the engines and, at a collective, for the other ranks "
                         f"(default {DEFAULT_TIMEOUT_S:g}); cell: for the ranks to finish (default: no limit)")
    ra.add_argument("--restart", action="store_true", help="start: stop the running ranks first")
    ra.add_argument("--engines", choices=tuple(ENGINES), default=None,
                    help="start: ipyparallel's launcher (default local; mpi: ranks as mpiexec numbers them; slurm: "
                         "one sbatch job, ranks as srun numbers them; ssh: host by host)")
    ra.add_argument("--hosts", type=int, metavar="M",
                    help="start: emulate M hosts here (local engines) or on the Slurm job's one node, N/M ranks each")
    ra.add_argument("--instance", metavar="NAME[,NAME...]",
                    help="start: each emulated host's instance shape (one for all, or one per host)")
    for flag, kind, meta, what in SLURM_FLAGS:
        ra.add_argument(flag, type=kind, metavar=meta, help=f"start, slurm engines: sbatch {flag} ({what})")
    ra.add_argument("--ssh-hosts", metavar="HOST[,HOST...]",
                    help="start, ssh engines: [user@]host[:port] each, N/hosts ranks each")
    ra.add_argument("--profile", nargs="?", const=True, default=False, metavar="NAME",
                    help="cell: run it under torch.profiler on every rank; one timeline, lanes per rank; attach: "
                         "the IPython profile whose cluster to attach to")
    ra.add_argument("--cluster-file", metavar="PATH", help="attach: the cluster file `ipcluster start` wrote")
    ra.add_argument("--sshserver", metavar="HOST", help="attach: reach the controller through an SSH tunnel to HOST")
    ra.add_argument("--export", metavar="PATH",
                    help="cell, with --profile: write the ranks' Perfetto traces merged into one, a process per "
                         "rank").completer = _paths
    ra.add_argument("--row-limit", type=int, metavar="N", help="cell, with --profile: rows shown (default 10)")
    co = command("compare", help="cell magic: time the cell eager and compiled, on copies, and compare their outputs",
                 description="Each mode runs once cold, W times to warm up, then N timed runs, each on fresh "
                             "copies of what the cell reads; then the cell runs once for real.")
    co.add_argument("--warmup", type=int, default=1, metavar="W",
                    help=f"untimed runs after the first, 0 to {limits.MAX_WARMUP:,} (default 1)")
    co.add_argument("--runs", type=int, default=5, metavar="N",
                    help=f"timed runs per mode, 1 to {limits.MAX_RUNS:,} (default 5)")
    co.add_argument("--fullgraph", action="store_true", help="compile with fullgraph=True (fail on graph breaks)")
    return p


def commands(p: NeuronArgumentParser) -> list[tuple[str, NeuronArgumentParser, str]]:
    """(name, parser, one-line help) of every command, in the parser's order (``%neuron?``, ``docs/notebook.md``)."""
    return [(name, sp, help) for name, (sp, help) in p.subcommands.items()]


def _overview(p: NeuronArgumentParser) -> list[str]:
    """What it is, the common tasks as examples, the commands in one line each."""
    width = max(len(line) for line, _ in EXAMPLES) + 2
    examples = "\n".join(f"  {line:<{width}}# {comment}" for line, comment in EXAMPLES)
    listed = commands(p)
    name_width = max(len(name) for name, _, _ in listed) + 2
    summary = "\n".join(textwrap.fill(help, WIDTH, initial_indent=f"  {name:<{name_width}}",
                                       subsequent_indent=" " * (name_width + 2)) for name, _, help in listed)
    return [f"%neuron COMMAND [options]     a line magic\n%%neuron COMMAND [options]    the first line of a cell"
            f"\n\n{textwrap.fill(p.description or '', WIDTH)}", f"Examples:\n{examples}", f"Commands:\n{summary}"]


def help_text(p: NeuronArgumentParser) -> str:
    """The whole help (``%neuron?``): the overview, then every command's usage and options, as IPython's own magics
    lead with usage before the reference."""
    parts = [*_overview(p), "Reference: each command's usage and options"]
    parts += [f"--- {name} ---\n{sp.format_help().rstrip()}" for name, sp, _ in commands(p)]
    return "\n\n".join(parts)


_HELP_FLAGS = ("-h", "--help")


def asked_for_help(p: NeuronArgumentParser, line: str, *, cell: bool) -> str | None:
    """The help a line asks for, as a command-line tool answers ``-h``: ``%neuron -h`` (``--help``, ``help``) the
    overview, ``%neuron COMMAND -h`` (``help COMMAND``) that command's usage and options; None for any other line.
    ``%neuron?`` (IPython's own) stays the whole reference."""
    words = line.split()
    words = words[:words.index("--")] if "--" in words else words  # after `--`: another program's arguments
    if not words or not (words[0] == "help" or any(w in _HELP_FLAGS for w in words)):
        return None
    named = [w for w in words if w != "help" and w not in _HELP_FLAGS]
    if named and named[0] in p.subcommands:
        sp = copy.copy(p.subcommands[named[0]][0])
        sp.prog = written(sp.prog, cell)
        return sp.format_help().rstrip()
    return "\n\n".join([*_overview(p), "`%neuron COMMAND -h` shows one command's usage and options, `%neuron?` every "
                                       "command's."])


def written(prog: str, cell: bool) -> str:
    """A parser's name in the form the user wrote: ``%%neuron profile`` on a cell's first line (a cell magic's own
    parser says ``%%neuron`` already)."""
    return f"%{prog}" if cell and not prog.startswith("%%") else prog


def usage(p: NeuronArgumentParser, command: str, *, cell: bool = False) -> str:
    """The usage line of one command (``usage: %neuron device [-h] ...``), to follow an error message; ``cell``: in
    the form the user wrote (:func:`written`)."""
    sp = copy.copy(p.subcommands[command][0])
    sp.prog = written(sp.prog, cell)
    return sp.format_usage().rstrip()


def parse(p: NeuronArgumentParser, line: str, *, cell: bool) -> argparse.Namespace:
    form = _CELL_FORM.set(cell)
    try:
        args, extra = p.parse_argstring(line, partial=True)
    except ValueError as e:  # shlex: an unclosed quote
        raise UsageError(f"{written(p.prog, cell)}: {e} in {line!r}\n{p.format_usage().rstrip()}") from None
    finally:
        _CELL_FORM.reset(form)
    cmd = args.command
    if extra:
        where = written(f"{p.prog} {cmd}" if cmd else p.prog, cell)
        flags = [s for a in options(p.subcommands[cmd][0] if cmd else p) for s in a.option_strings]
        hint = next((h for word in extra if word.startswith("-") and (h := did_you_mean(word, flags))), "")
        raise UsageError(f"{where}: unrecognized arguments: {' '.join(extra)}{hint}\n"
                         f"{usage(p, cmd, cell=cell) if cmd else p.format_usage().rstrip()}")
    if cell and cmd in LINE_ONLY:
        raise UsageError(f"%%neuron {cmd}: is a line magic; use `%neuron {cmd}` on a line of its own.\n"
                         + CELL_FORMS)
    if cell and cmd is None:
        raise UsageError("%%neuron: name what the cell runs with.\n"
                         + CELL_FORMS)
    if not cell and cmd in CELL_ONLY:
        then = f"; for the cells that follow use `%neuron mode {cmd}`" if cmd in ("compile", "eager") else \
            " (it checks that one cell)"
        raise UsageError(f"%neuron {cmd}: is a cell magic (`%%neuron {cmd}` on a cell's first line){then}.")
    if cell and cmd == "device":
        if not args.device:
            raise UsageError("%%neuron device: needs a DEVICE, e.g. `%%neuron device cpu`")
        if args.move or args.all or args.default:
            raise UsageError("%%neuron device: --move, --all and --default are line-magic options; "
                             "use `%neuron device DEVICE --move NAME` on a line of its own.")
    if cmd == "ranks":
        _check_ranks(p, args, cell)
    if cmd == "profile" and cell and args.coverage:
        raise UsageError(f"%%neuron profile: the cell form takes only --export PATH and --row-limit N; switch the "
                         f"op coverage with `%neuron coverage {args.coverage}` on a line of its own\n"
                         f"{usage(p, 'profile', cell=True)}")
    if cmd == "profile" and not cell and (args.export or args.row_limit is not None):
        raise UsageError("%neuron profile: --export and --row-limit go with the cell form: put `%%neuron profile "
                         f"--export PATH` on the first line of the cell to profile\n{usage(p, 'profile')}")
    if not cell and cmd == "device" and (args.move or args.all) and not args.device:
        raise UsageError("%neuron device: --move and --all need a DEVICE to move to; put it first, "
                         f"as in `%neuron device cpu --move x`\n{usage(p, 'device')}")
    if not cell and cmd == "device" and args.move and args.all:
        raise UsageError(f"%neuron device: give either --move NAME ... or --all, not both\n{usage(p, 'device')}")
    return args


SLURM_FLAGS = (("--partition", str, "NAME", "the launcher's queue"), ("--nodes", int, "M", "the launcher's options"),
               ("--ntasks-per-node", int, "K", "the launcher's options"), ("--account", str, "NAME", "its account"),
               ("--time", str, "LIMIT", "its timelimit"))


def slurm_given(args: argparse.Namespace) -> list[str]:
    """The Slurm options given on the line."""
    return [flag for flag, *_ in SLURM_FLAGS if getattr(args, flag[2:].replace("-", "_")) is not None]


def ssh_given(args: argparse.Namespace) -> list[str]:
    """The ssh engines' options given on the line."""
    return ["--ssh-hosts"] if args.ssh_hosts else []


def _check_ranks(p: NeuronArgumentParser, args: argparse.Namespace, cell: bool) -> None:
    """``start N [--timeout S] [--restart]`` / ``interrupt`` / ``stop`` / nothing (status) on a line;
    ``[--timeout S]`` on a cell."""
    def refuse(why: str) -> UsageError:
        return UsageError(f"%{'%' if cell else ''}neuron ranks: {why}\n{usage(p, 'ranks', cell=cell)}")

    attaching = [o for o, given in (("--cluster-file", args.cluster_file), ("--sshserver", args.sshserver)) if given]
    if args.action == "attach" and not cell:
        if args.n is not None or args.restart or args.engines or args.hosts or slurm_given(args) or ssh_given(args):
            raise refuse("attach takes the cluster that runs: `%neuron ranks attach --profile NAME` or "
                         "`--cluster-file PATH`, and --sshserver HOST, --timeout S")
        if (args.profile is True) or (args.profile and args.cluster_file):
            raise refuse("attach: --profile NAME or --cluster-file PATH, one of them")
        return
    if isinstance(args.profile, str) or attaching:
        raise refuse(f"{', '.join(attaching or ['--profile NAME'])} go{'es' if len(attaching) < 2 else ''} with "
                     "attach: `%neuron ranks attach --profile NAME`")
    if cell and (args.action or args.n is not None or args.restart):
        raise refuse("the cell form runs the cell on the ranks and takes only --timeout S, --profile, --export PATH "
                     "and --row-limit N; start and stop them with `%neuron ranks start N` / `%neuron ranks stop` on "
                     "a line of their own")
    if args.timeout is not None and not (args.timeout > 0 and args.timeout != float("inf")):
        raise refuse(f"--timeout must be a number of seconds > 0, not {args.timeout:g}")
    profiling = [o for o, given in (("--profile", args.profile), ("--export", args.export),
                                    ("--row-limit", args.row_limit is not None)) if given]
    if not cell and profiling:
        raise refuse(f"{', '.join(profiling)} go{'es' if len(profiling) == 1 else ''} with the cell form: put "
                     "`%%neuron ranks --profile` on the first line of the cell to profile on every rank")
    if cell and not args.profile and profiling:
        raise refuse(f"{' and '.join(profiling)} go{'es' if len(profiling) == 1 else ''} with --profile "
                     "(`%%neuron ranks --profile --export PATH`)")
    if cell:
        return
    if args.action == "start":
        if args.n is None:
            raise refuse("start needs N, how many ranks: `%neuron ranks start 2`")
        if not 1 <= args.n <= MAX_RANKS:
            raise refuse(f"N must be from 1 to {MAX_RANKS}, not {args.n}")
        if args.hosts is not None and args.engines not in (None, "local", "slurm"):
            raise refuse(f"--hosts emulates hosts with local engines; {args.engines} engines are where it puts them")
        if ssh_given(args) and args.engines != "ssh":
            given = ssh_given(args)
            raise refuse(f"{', '.join(given)} go{'es' if len(given) == 1 else ''} with --engines ssh")
        if args.engines == "ssh":
            if not args.ssh_hosts:
                raise refuse(NEED_HOSTS)
            try:
                ssh = SSHOptions.parse(args.ssh_hosts)
            except ValueError as e:
                raise refuse(f"--ssh-hosts: {e}") from None
            try:
                ssh.check(args.n)
            except ValueError as e:
                raise refuse(str(e)) from None
        if args.hosts is not None and args.nodes is not None:
            raise refuse("--hosts emulates hosts on the Slurm job's one node; --nodes asks Slurm for real ones")
        if slurm_given(args) and args.engines != "slurm":
            given = slurm_given(args)
            raise refuse(f"{', '.join(given)} go{'es' if len(given) == 1 else ''} with --engines slurm")
        if args.hosts is not None and not (1 <= args.hosts <= args.n and args.n % args.hosts == 0):
            raise refuse(f"--hosts {args.hosts} must divide the {args.n} ranks evenly (as many ranks on each host)")
        if args.instance is not None and args.engines not in (None, "local"):
            raise refuse(f"--instance shapes emulated hosts; {args.engines} engines run on real ones")
        if args.instance is not None:
            try:
                host_instances(args.instance, args.hosts or 1)
            except ValueError as e:
                raise refuse(f"--instance: {e}") from None
        return
    if args.n is not None:
        raise refuse(f"N goes with start: `%neuron ranks start {args.n}`")
    if (args.hosts is not None or args.engines is not None or args.instance is not None or slurm_given(args)
            or ssh_given(args)):
        raise refuse("--hosts, --instance and --engines go with start: `%neuron ranks start 4 --hosts 2`")
    if args.timeout is not None or args.restart:
        raise refuse("--timeout and --restart go with start (`%neuron ranks start N --timeout S`); a cell's "
                     "deadline is `%%neuron ranks --timeout S`")
