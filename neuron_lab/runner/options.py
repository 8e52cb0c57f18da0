"""``neuron-lab run`` options, the exit codes it documents, and the spellings its gates accept."""

from __future__ import annotations

import argparse
import difflib
import math
from typing import Any

from neuron_lab.deprecation import renamed
from neuron_lab.units import parse_size

EXIT_OK = 0  # every cell ran, every gate passed
EXIT_CELL_ERROR = 1  # a cell raised (or ran past --timeout); the run stops there
EXIT_USAGE = 2  # bad usage or bad input: unknown option, bad size, missing or unreadable file
EXIT_GATE = 3  # every cell ran, but a gate failed (--fail-on-fallback, --max-peak-memory, ...)
EXIT_KERNEL = 4  # the kernel died, or could not start or load neuron_lab
EXIT_HUNG = 5  # --nproc: a cell ran past --timeout (a hang); every rank was interrupted, the hang view says where
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT), as shells report it

DESCRIPTION = """\
Run a notebook or a `# %%` script headless in a fresh kernel with neuron_lab loaded: print each
cell's report and a summary, apply the CI gates, write the executed notebook, its HTML and JSON, and
with --trace a Chrome/Perfetto trace per cell."""

MEANINGS = {
    EXIT_OK: "every cell ran and every gate passed",
    EXIT_CELL_ERROR: "a cell raised or timed out (the run stops at that cell)",
    EXIT_USAGE: "bad usage or bad input (unknown option, bad size, missing file, not a notebook or script, a "
                "coverage that does not load, a --trace folder that cannot be written into), or an output file "
                "that cannot be written",
    EXIT_GATE: "a gate failed: --fail-on-fallback, --max-peak-memory, --fail-on-graph-break, --fail-on-unsupported, "
               "--fail-on-abort",
    EXIT_KERNEL: "the kernel died, or could not start or load neuron_lab (--nproc: or the ranks' preflight found "
                 "them differing)",
    EXIT_HUNG: "--nproc: a cell ran past --timeout; every rank still in it was interrupted, and stderr and --json "
               "say where each rank was (the collective it waited in and its line)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C): the running cell was stopped, the cells that ran are reported",
}

ALLOW_ALONE = "--allow-fallback has no effect without --fail-on-fallback"  # said on stderr; the run goes on

# `neuron-lab run --help` ends with these (tests parse each one with the real parser).
EXAMPLES = (
    ("neuron-lab run nb.ipynb", "each cell's report, then the summary"),
    ("neuron-lab run nb.ipynb --html run.html --json run.json", "HTML led by summary and gates"),
    ("neuron-lab run nb.ipynb --fail-on-fallback --allow-fallback normal", "CI: no CPU fallback but normal"),
    ("neuron-lab run nb.ipynb --max-peak-memory 2GiB", "CI: no cell over 2 GiB on the device"),
    ("neuron-lab run train.py --timeout 600", "a `# %%` script, 10 minutes per cell"),
    ("neuron-lab run train.py --nproc 4 --fail-on-unsupported", "4 ranks, as torchrun starts them"),
    ("neuron-lab run train.py --trace traces/", "CI: a Perfetto trace per cell"),
)


def refuse_unknown(p: argparse.ArgumentParser, extra: list[str]) -> None:
    """Unrecognized arguments refused by their command's parser ``p`` (its usage; argparse's own refusal of a
    subcommand's prints the top parser's), with the option meant when one is close (``--fail-on-fallbak``)."""
    if not extra:
        return
    known = [s for a in p._actions for s in a.option_strings]
    close = next((m for word in extra if word.startswith("-")
                  for m in difflib.get_close_matches(word.split("=")[0], known, n=1, cutoff=0.8)), None)
    p.error(f"unrecognized arguments: {' '.join(extra)}" + (f" (did you mean {close}?)" if close else ""))


def examples(rows: tuple[tuple[str, str], ...]) -> str:
    """Example commands, one a line with its comment after ``#``, aligned, as an argparse epilog shows them."""
    width = max(len(command) for command, _ in rows) + 2
    return "".join(f"  {command:<{width}}# {comment}\n" for command, comment in rows)


EPILOG = "exit codes:\n" + "".join(f"  {code}  {meaning}\n" for code, meaning in MEANINGS.items()) + f"""\
A cell error or timeout (1) outranks a failed gate (3); a hang (5) and a kernel failure (4) outrank both, the
kernel failure the hang; Ctrl-C (130) all.
--json, --html and --output are written in every case but {EXIT_USAGE}, with the cells that ran.
--trace DIR is checked (created if missing) before any cell runs: one that cannot be written into is {EXIT_USAGE};
an earlier run's DIR/cell-*.json are removed then (no other file). Each cell that ran writes DIR/cell-001.json,
cell-002.json, ... (cell k of the [k/n] progress lines), the cell that raised too; the cell reports show its op
table, the summary where the traces are. A cell that runs its own profiler (%%neuron profile, neuron_lab.profile(),
torch.profiler.profile()) runs as it does without --trace and writes no trace; a line after it says so, and why
when a trace could not be written.

A script (.py) runs as one cell per `# %%` chunk (a script without markers is one cell);
its call sites are reported as FILE:LINE.

--nproc N runs N ranks at once, one kernel each, with the variables torchrun sets (RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT: a rendezvous store the runner hosts,
as torchrun's agent does): rank R owns neuron:R. The
ranks go cell by cell in step (no rank starts a cell before every rank finished the one before), so
each cell is reported across ranks; the gates judge every rank's reports and name the rank. When a
rank fails, the ranks still running are stopped (a collective would wait for it forever). --output
and --html hold rank 0's executed notebook; --json every rank's. With --trace each rank writes
DIR/cell-001.rankR.json, merged into DIR/cell-001.json with a process per rank ("rank R") and its
device lane ("rank R neuron:R") on one time axis.

""" + "examples:\n" + examples(EXAMPLES)

# How the run command's parser presents itself in its usage and --help, as a subcommand and on its own alike.
PARSER: dict[str, Any] = {"description": DESCRIPTION, "epilog": EPILOG,
                          "formatter_class": argparse.RawDescriptionHelpFormatter}


def size(text: str) -> int:
    """argparse type: ``"512MiB"`` -> bytes (KB/MB/GB mean KiB/MiB/GiB, as NEURON_LAB_DEVICE_MEMORY reads them)."""
    try:
        n = parse_size(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"cannot read {text!r} as a size (examples: 512MiB, 2GiB, 1048576)")
    return n


MAX_TIMEOUT_S = 1e6  # about 11 days: nbclient and ZeroMQ take the timeout as whole seconds and milliseconds


def seconds(text: str) -> float:
    """argparse type of ``--timeout``: a number of seconds in (0, MAX_TIMEOUT_S]; nan and inf are refused."""
    try:
        s = float(text)
    except ValueError:
        s = math.nan
    if not 0 < s <= MAX_TIMEOUT_S:  # also false for nan
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds (at most {MAX_TIMEOUT_S:g})")
    return s


def ranks(text: str) -> int:
    """argparse type of ``--nproc``: a whole number of ranks, at least 1."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of ranks (a whole number, at least 1)")
    return n


class Renamed(argparse.Action):
    """An option's old spelling: stores as the new one does, and warns that it was renamed."""

    def __init__(self, *args: Any, new: str, **kwargs: Any) -> None:
        self.new = new
        super().__init__(*args, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        renamed(f"{parser.prog} {option_string}", f"{parser.prog} {self.new}", stacklevel=2)
        setattr(namespace, self.dest, values)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="a notebook (.ipynb) or a Python script (.py)")
    p.add_argument("--backend", choices=("auto", "emulator"), default=None,
                   help="NEURON_LAB_BACKEND in the kernel (default: the environment's, else auto)")
    p.add_argument("--coverage", metavar="NAME|FILE", default=None,
                   help="NEURON_LAB_COVERAGE in the kernel: a bundled coverage's name or a coverage file")
    p.add_argument("--profile", dest="coverage", action=Renamed, new="--coverage", help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=seconds, metavar="S", default=None,
                   help=f"seconds each cell may run (more than 0, at most {MAX_TIMEOUT_S:g}); --nproc: past it, where "
                        f"each rank is, then every rank interrupted (exit {EXIT_HUNG})")
    p.add_argument("--nproc", "--nproc-per-node", type=ranks, metavar="N", default=None,
                   help="run N ranks as torchrun --nproc-per-node N does, one kernel each, and merge their reports")
    p.add_argument("--nnodes", type=ranks, metavar="M", default=1,
                   help="emulate M hosts on this machine, each with --nproc-per-node ranks (torchrun's multi-node "
                        "ranks; each rank is told its host)")
    p.add_argument("--instance", metavar="NAME[,NAME...]", default=None,
                   help="each emulated host's instance shape (trn2.48xlarge: every host; trn2.48xlarge,trn1.32xlarge: "
                        "one per host), so each rank gets its host's devices, cores and memory")
    p.add_argument("--engines", choices=("local", "mpi", "slurm", "ssh"), default=None,
                   help="the ipyparallel engines a notebook's `%%neuron ranks start N` starts "
                        "(NEURON_LAB_RANKS_ENGINES in the kernel; default: the environment's, else local)")
    p.add_argument("--ssh-hosts", metavar="HOST[,HOST...]", default=None,
                   help="--engines ssh: the hosts, [user@]host[:port] each (NEURON_LAB_RANKS_SSH_HOSTS in the kernel)")
    p.add_argument("--json", metavar="FILE", dest="json_file", help="write the session report as JSON")
    p.add_argument("--html", metavar="FILE", dest="html_file", help="write the executed notebook as HTML")
    p.add_argument("--output", metavar="FILE", dest="output_file", help="write the executed notebook (.ipynb)")
    p.add_argument("--trace", metavar="DIR", dest="trace_dir",
                   help="run each cell under torch.profiler (as %%%%neuron profile does) and write its Chrome trace to "
                        "DIR/cell-001.json, ... (one lane per rank with --nproc)")
    g = p.add_argument_group("gates (exit code 3 when one fails)")
    g.add_argument("--fail-on-fallback", action="store_true", help="fail on any CPU fallback")
    g.add_argument("--allow-fallback", metavar="OP", action="append", default=[],
                   help="exempt an op from --fail-on-fallback: normal (every overload, in-place normal_ too), "
                        "normal_ (in-place only) or aten::normal.out (that overload); repeatable; without "
                        "--fail-on-fallback it has no effect, and the run says so")
    g.add_argument("--max-peak-memory", type=size, metavar="SIZE", default=None,
                   help="fail when a cell's peak device memory exceeds SIZE (512MiB, 2GiB)")
    g.add_argument("--fail-on-graph-break", action="store_true", help="fail on any torch.compile graph break")
    g.add_argument("--fail-on-unsupported", action="store_true",
                   help="fail on any call TorchNeuron does not support (collectives it lacks or restricts: send/recv, "
                        "a subgroup barrier, uneven all_to_all, complex all_reduce, float64 broadcast, fp8 all_gather)")
    g.add_argument("--fail-on-abort", action="store_true",
                   help="fail on any call a public report saw abort the process on TorchNeuron (an op of the "
                        "coverage's aborts on a parameter; NEURON_LAB_ABORTS=warn, the default, reports them)")


def op_matches(spec: str, op: str) -> bool:
    """Whether ``--allow-fallback spec`` covers ``op``, as ATen names its variants.

    A base name (``normal``, ``aten::normal``) covers the op, its in-place form and all their overloads
    (``aten::normal.Tensor_float``, ``aten::normal_``, ``aten::normal.out``); an in-place name (``normal_``)
    covers only the in-place forms; a name with an overload (``aten::normal.out``, ``atan2.default``) only
    that overload, where ``aten::atan2`` and ``aten::atan2.default`` are the same one.
    """
    def split(name: str) -> tuple[str, str, str]:
        ns, _, rest = name.strip().rpartition("::")
        base, _, overload = rest.partition(".")
        return ns or "aten", base, overload

    s_ns, s_base, s_overload = split(spec)
    o_ns, o_base, o_overload = split(op)
    if s_ns != o_ns:
        return False
    if "." in spec:
        return (s_base, s_overload or "default") == (o_base, o_overload or "default")
    return o_base in (s_base, f"{s_base}_")
