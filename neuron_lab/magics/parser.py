"""The grammar of ``%neuron`` and ``%%neuron``: one argparse parser with a subparser per command.

Built on IPython's ``MagicArgumentParser``, so every parse error is a ``UsageError``: one message
plus the usage of the command it concerns, no traceback.
"""

from __future__ import annotations

import argparse

from IPython.core.error import UsageError
from IPython.core.magic_arguments import MagicArgumentParser

LINE_ONLY = ("status", "mode", "report", "reset", "free")
CELL_ONLY = ("compile", "eager")


class NeuronArgumentParser(MagicArgumentParser):
    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message}\n{self.format_usage().rstrip()}")


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

    sub.add_parser("status", prog="%neuron status", help="backend, device, mode, memory and session totals")

    d = sub.add_parser("device", prog="%neuron device", help="show or switch the notebook's device",
                       description="Show the notebook device, or switch it. As a cell magic "
                                   "(`%%neuron device cpu`), for that cell only.")
    d.add_argument("device", nargs="?", metavar="DEVICE", help="neuron, neuron:N, cpu, cuda or cuda:N")
    d.add_argument("--default", action="store_true", help="also torch.set_default_device(DEVICE)")
    d.add_argument("--move", nargs="+", metavar="NAME", default=[], help="move these objects to DEVICE")
    d.add_argument("--all", action="store_true",
                   help="move every module, tensor, optimizer and list/tuple/dict of tensors in the namespace")

    m = sub.add_parser("mode", prog="%neuron mode", help="the default mode of the cells that follow",
                       description="default: code runs as written; eager: compiled functions run eagerly "
                                   "(force_eager stance); compile: outermost nn.Module calls are compiled.")
    m.add_argument("mode", choices=("default", "eager", "compile"), help="the mode")
    _compile_options(m)

    r = sub.add_parser("report", prog="%neuron report", help="show reports from the history",
                       description="Show a cell's report (`%neuron report 7`), every kept report "
                                   "(`all`), or the last one (default).")
    r.add_argument("cell", nargs="?", metavar="CELL|all", help="a cell number, or all")
    r.add_argument("--last", action="store_true", help="the last report (the default)")
    g = r.add_mutually_exclusive_group()
    g.add_argument("--full", action="store_const", const="full", dest="detail", help="with stacks")
    g.add_argument("--summary", action="store_const", const="summary", dest="detail", help="one line")
    g.add_argument("--json", action="store_const", const="json", dest="detail", help="as JSON")

    sub.add_parser("reset", prog="%neuron reset", help="clear the session totals, the history and peak memory")
    sub.add_parser("free", prog="%neuron free",
                   help="drop IPython's own references to device tensors (Out, _, _N, the last traceback) "
                        "and report the bytes freed")

    c = sub.add_parser("compile", prog="%%neuron compile", help="cell magic: run the cell with its outermost "
                       "nn.Module calls compiled by torch.compile")
    _compile_options(c)
    _device_option(c)
    e = sub.add_parser("eager", prog="%%neuron eager",
                       help="cell magic: run the cell eagerly, compiled functions included")
    _device_option(e)
    return p


def help_text(p: NeuronArgumentParser) -> str:
    """The whole help: the overview, then every command's usage and options (``%neuron?``)."""
    parts = [p.format_help().rstrip()]
    for action in p._subparsers._group_actions:
        for name, sp in action.choices.items():
            parts.append(f"--- {name} ---\n{sp.format_help().rstrip()}")
    return "\n\n".join(parts)


def usage(p: NeuronArgumentParser, command: str) -> str:
    return p._subparsers._group_actions[0].choices[command].format_usage().rstrip()


def parse(p: NeuronArgumentParser, line: str, *, cell: bool) -> argparse.Namespace:
    try:
        args, extra = p.parse_argstring(line, partial=True)
    except ValueError as e:  # shlex: an unclosed quote
        raise UsageError(f"%neuron: {e} in {line!r}\n{p.format_usage().rstrip()}") from None
    cmd = args.command
    if extra:
        where = f"%neuron {cmd}" if cmd else "%neuron"
        raise UsageError(f"{where}: unrecognized arguments: {' '.join(extra)}\n"
                         f"{usage(p, cmd) if cmd else p.format_usage().rstrip()}")
    if cell and cmd in LINE_ONLY:
        raise UsageError(f"%%neuron {cmd}: is a line magic; use `%neuron {cmd}` on a line of its own.\n"
                         "cell forms: %%neuron compile [--fullgraph] [--backend NAME] [--device DEVICE] | "
                         "%%neuron eager [--device DEVICE] | %%neuron device DEVICE")
    if cell and cmd is None:
        raise UsageError("%%neuron: name what the cell runs with.\n"
                         "cell forms: %%neuron compile [--fullgraph] [--backend NAME] [--device DEVICE] | "
                         "%%neuron eager [--device DEVICE] | %%neuron device DEVICE")
    if not cell and cmd in CELL_ONLY:
        raise UsageError(f"%neuron {cmd}: is a cell magic (`%%neuron {cmd}` on a cell's first line); "
                         f"for the cells that follow use `%neuron mode {cmd}`.")
    if cell and cmd == "device":
        if not args.device:
            raise UsageError("%%neuron device: needs a DEVICE, e.g. `%%neuron device cpu`")
        if args.move or args.all or args.default:
            raise UsageError("%%neuron device: --move, --all and --default are line-magic options; "
                             "use `%neuron device DEVICE --move NAME` on a line of its own.")
    if not cell and cmd == "device" and (args.move or args.all) and not args.device:
        raise UsageError(f"%neuron device: --move and --all need a DEVICE to move to\n{usage(p, 'device')}")
    if not cell and cmd == "device" and args.move and args.all:
        raise UsageError(f"%neuron device: give either --move NAME ... or --all, not both\n{usage(p, 'device')}")
    return args
