"""``neuron-lab``: ``doctor``, ``coverage`` and ``run`` (a notebook headless) from a shell."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from importlib import metadata

from neuron_lab import settings
from neuron_lab._version import __version__

# `neuron-lab --help` ends with these (tests parse each one with the real parser).
EXAMPLES = (
    ("neuron-lab doctor", "which backend serves `neuron` here, and why"),
    ("neuron-lab coverage show", "the ops the active coverage reports as CPU fallbacks"),
    ("neuron-lab coverage diff torchneuron-2.33 mine.json", "what changes between two coverage files"),
    ("neuron-lab run train.ipynb --html run.html", "a notebook headless (see `neuron-lab run --help`)"),
)


def _torch_neuronx_line() -> str:
    """What ``import torch_neuronx`` gives in this process: the real package, the emulation, or nothing."""
    import importlib.util

    from neuron_lab.backend.emulator import neuronx_finder

    if importlib.util.find_spec(neuronx_finder.NAME) is None:
        return "not importable"
    if neuronx_finder.serving():
        return "emulated by neuron_lab (no real torch-neuronx is installed; one on sys.path takes precedence)"
    return "the installed torch-neuronx"


def _autoload_line() -> str:
    eps = [ep for ep in metadata.entry_points(group="torch.backends") if ep.value.startswith("neuron_lab.")]
    if not eps:
        return "no torch.backends entry point for neuron_lab (is the package installed?)"
    if settings.env("TORCH_DEVICE_BACKEND_AUTOLOAD").raw() == "0":
        return "disabled by TORCH_DEVICE_BACKEND_AUTOLOAD=0; `import neuron_lab` installs the backend"
    from neuron_lab.backend import autoload

    return f"entry point {eps[0].name} = {eps[0].value}: " + ("ran" if autoload.ran else "did not run")


_HELD = "Failed to initialize Neuron Runtime"  # nrt_init's error (tnx csrc/core/NeuronBindings.cpp:271)


def _device_query(what: str, query: Callable[[], str]) -> str:
    """``query()``, or the line that says why it failed: doctor goes on whatever the device does."""
    try:
        return query()
    except Exception as e:
        if _HELD in str(e):
            return (f"unknown: the Neuron runtime did not start ({e}); another process holds the NeuronCores "
                    "(a notebook kernel or a training job): stop it, or give each process its own cores with "
                    "NEURON_RT_VISIBLE_CORES")
        return f"unknown: reading the {what} failed ({type(e).__name__}: {e})"


def _devices_line(b) -> str:
    from neuron_lab.units import format_capacity

    n = b.device_count()
    cap = b.capacity()
    return (f"{n} (neuron:0{'' if n == 1 else f'..neuron:{n - 1}'}); capacity {format_capacity(cap)}"
            + ("" if cap is None else " per device"))


def _neuron_ls() -> list[str]:
    """``neuron-ls`` output where it is on PATH: the Neuron tools' own view of the devices and who holds them."""
    import shutil
    import subprocess

    exe = shutil.which("neuron-ls")
    if exe is None:
        return ["not on PATH (the Neuron tools come with the Neuron SDK on Trn instances)"]
    try:
        out = subprocess.run([exe], capture_output=True, text=True, timeout=_NEURON_LS_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as e:
        return [f"{exe} failed: {type(e).__name__}: {e}"]
    lines = (out.stdout + out.stderr).rstrip().splitlines()
    return [f"{exe} (exit {out.returncode})", *lines]


_NEURON_LS_TIMEOUT_S = 10


def doctor(args: argparse.Namespace) -> int:
    import torch

    import neuron_lab
    from neuron_lab import backend, kinds

    d = backend.state()
    print(f"neuron_lab {neuron_lab.__version__} doctor")
    print(f"  torch        {torch.__version__}; PrivateUse1 is {torch._C._get_privateuse1_backend_name()!r}")
    print(f"  backend      {d.kind}: {d.reason}")
    status = 0
    try:
        b = backend.active()
    except backend.BackendUnavailable as e:
        print(f"  devices      none ({e})")
        b, status = None, 1
    if b is not None:
        print(f"  active       {_device_query('backend', lambda: b.description)}")
        if getattr(b, "core", None):
            print(f"  core         {b.core}: {b.core_reason}")
        print(f"  devices      {_device_query('devices', lambda: _devices_line(b))}")
        print(f"  build        {_device_query('build', lambda: b.build)}")
        p = b.coverage
        if p is not None:
            n_fb = sum(1 for r in p.ops.values() if r.kind == kinds.FALLBACK)
            n_host = sum(1 for r in p.ops.values() if r.kind == kinds.HOST)
            print(f"  coverage     {p.name} ({p.path}), dated {p.date}: {n_fb} ops CPU fallback, {n_host} host "
                  f"kernels, unknown ops {p.default}")
        else:
            print("  coverage     none: the real device reports its own fallbacks")
    print(f"  autoload     {_autoload_line()}")
    print(f"  torch_neuronx {_torch_neuronx_line()}")
    neuron_ls = _neuron_ls()
    print(f"  neuron-ls    {neuron_ls[0]}")
    for line in neuron_ls[1:]:
        print(f"    {line}")
    print("  environment")
    for var in settings.listed():
        if not var.torchneuron:
            _env_line(var)
    about = "" if b is None else f" ({_device_query('settings', lambda: b.torchneuron_settings)})"
    print(f"  TorchNeuron settings{about}")
    for var in settings.torchneuron():
        _env_line(var, "" if b is None else _device_query("settings", lambda v=var: b.torchneuron_setting(v.name)))
    problems = d.problems
    print("  problems     " + ("none" if not problems else ""))
    for p in problems:
        print(f"    - {p}")
    if getattr(args, "check", False):
        from neuron_lab import checkup

        print()
        status = max(status, checkup.run())
    return status


def _env_line(var: settings.EnvVar, note: str = "") -> None:
    value = var.raw()
    shown = "(unset)" if value is None else repr(value)
    print(f"    {var.name:<50} {shown:<12} {f'[{note}] ' if note else ''}{var.summary}")


def coverage_export(args: argparse.Namespace) -> int:
    import datetime

    import torch

    from neuron_lab import backend
    from neuron_lab.backend.coverage import Coverage, OpRule

    owner = torch._C._get_privateuse1_backend_name()
    if owner == "privateuseone":
        return _refuse("coverage export", "no PrivateUse1 backend is live in this process")
    regs = torch._C._dispatch_get_registrations_for_dispatch_key("PrivateUse1")
    names = sorted({r.split(".")[0] for r in regs if "::" in r})
    d = backend.state()
    coverage = Coverage(
        name=args.name or f"{owner}-{d.kind}-{datetime.date.today().isoformat()}",
        source=f"exported by neuron-lab coverage export from the live {owner!r} PrivateUse1 backend "
               f"({d.kind}: {d.reason}); an op is native when it has a PrivateUse1 kernel",
        date=datetime.date.today().isoformat(),
        default="fallback",
        default_reason=f"no PrivateUse1 kernel on the exporting backend ({d.kind})",
        ops={n: OpRule("native", "PrivateUse1 kernel registered") for n in names},
    )
    coverage.save(args.file)
    print(f"wrote {args.file}: {len(names)} native ops, everything else counts as CPU fallback")
    return 0


def coverage_show(args: argparse.Namespace) -> int:
    from neuron_lab.backend import coverage

    try:
        p = coverage.load(args.coverage)
    except coverage.CoverageError as e:
        return _refuse("coverage show", str(e))
    print(f"{p.name}  ({p.path})")
    print(f"  date     {p.date}")
    print(f"  source   {p.source}")
    if p.provenance:
        pv = p.provenance
        print(f"  derived  from {pv.get('repo', '?')} at {str(pv.get('commit', '?'))[:12]}: {pv.get('method', '')}")
    indent = "\n" + " " * 11  # a reason's source line, under its sentence
    print(f"  default  {p.default}: {p.default_reason.replace(chr(10), indent)}")
    print(f"  64-bit   {', '.join(sorted(p.downcast_dtypes))} are reported as downcasts")
    for dt, r in sorted(p.dtype_rules.items()):
        print(f"  dtype    {dt}: {r.kind} ({r.reason.replace(chr(10), indent)})")
    rows = sorted(p.ops.items(), key=lambda kv: (kv[1].kind, kv[0]))
    if not args.all:
        rows = [(n, r) for n, r in rows if r.kind != p.default]
    scope = "" if args.all else f" (those that are not {p.default}; --all for every op)"
    print(f"  ops      {len(rows)} listed{scope}")
    for name, r in rows:
        dts = f" [{', '.join(sorted(r.dtypes))}]" if r.dtypes else ""
        print(f"    {r.kind:<9} {name}{dts}")
    print(f"bundled coverage: {', '.join(coverage.bundled())}; choose with {coverage.ENV_VAR}=NAME|PATH")
    return 0


def coverage_diff(args: argparse.Namespace) -> int:
    """What changes between two coverage files: each op a backend can see that they classify differently."""
    from collections import defaultdict

    from neuron_lab.backend import coverage

    try:
        a, b = coverage.load(args.a), coverage.load(args.b)
    except coverage.CoverageError as e:
        return _refuse("coverage diff", str(e))
    for tag, p in (("A", a), ("B", b)):
        print(f"{tag}  {p.name}, dated {p.date}: {len(p.ops)} ops listed, unknown ops {p.default}")
    changes = coverage.diff(a, b)
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for name, ka, kb in changes:
        groups[(ka, kb)].append(name)
    print(f"{len(changes)} ops are classified differently (of {len(coverage.backend_ops())} ATen ops a backend "
          "can see, and every op either lists)")
    for (ka, kb), names in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        print(f"  {ka} in A, {kb} in B: {len(names)}")
        shown = names if args.all else names[:40]
        print("\n".join(f"    {n}" for n in shown))
        if len(names) > len(shown):
            print(f"    … {len(names) - len(shown)} more (--all lists them)")
    return 0


def run(args: argparse.Namespace) -> int:
    # nbformat's jsonschema builds some 35 Earley parsers at import when rfc3987-syntax (an extra of jupyter-events)
    # is installed, for the "iri" formats that no notebook schema uses: 1.7 s of CPU before every run starts. This
    # process runs no user code (cells run in kernels), so its jsonschema goes without that one format checker.
    sys.modules.setdefault("rfc3987_syntax", None)
    from neuron_lab.runner import main

    return main.run(args)


def _refuse(command: str, message: str) -> int:
    """Bad input to ``neuron-lab COMMAND``: one line on stderr, exit 2 (as ``neuron-lab run`` says it)."""
    print(f"neuron-lab {command}: {message}", file=sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    from neuron_lab.runner import options as run_options

    parser = argparse.ArgumentParser(prog="neuron-lab", description="neuron_lab command line",
                                     epilog="examples:\n" + run_options.examples(EXAMPLES),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    doc = sub.add_parser("doctor", help="which backend is active and why, devices, coverage, environment")
    doc.add_argument("--check", action="store_true",
                     help="also run a short self-test of what the workbench assumes about the device (a minute)")
    doc.set_defaults(func=doctor, parser=doc)
    cov = sub.add_parser("coverage", help="op coverage: which ops run natively, which fall back to the CPU")
    cov = cov.add_subparsers(dest="action", required=True)
    exp = cov.add_parser("export", help="write a coverage file from the live PrivateUse1 backend")
    exp.add_argument("file")
    exp.add_argument("--name", help="coverage name (default: derived from backend and date)")
    exp.set_defaults(func=coverage_export, parser=exp)
    show = cov.add_parser("show", help="list a coverage (default: the active one)")
    show.add_argument("coverage", nargs="?", default=None, help="bundled name or path")
    show.add_argument("--all", action="store_true", help="list every op, native ones included")
    show.set_defaults(func=coverage_show, parser=show)
    dif = cov.add_parser("diff", help="what changes between two coverage files")
    dif.add_argument("a", help="bundled name or path")
    dif.add_argument("b", help="bundled name or path")
    dif.add_argument("--all", action="store_true", help="list every changed op, not the first 40 of each kind")
    dif.set_defaults(func=coverage_diff, parser=dif)
    run_parser = sub.add_parser("run", help="run a notebook or script headless: reports, summary, CI gates, exports",
                                **run_options.PARSER)
    run_options.add_arguments(run_parser)
    run_parser.set_defaults(func=run, in_kernels=True, parser=run_parser)  # its cells run in kernels: no torch here
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; an unrecognized argument is refused by its command's own parser (runner.options)."""
    from neuron_lab.runner import options as run_options

    args, extra = build_parser().parse_known_args(argv)
    command = vars(args).pop("parser")  # the command's own parser, each command's default: not an option
    run_options.refuse_unknown(command, extra)
    return args


def main(argv: list[str] | None = None) -> int:
    return dispatch(parse(argv))


def main_parsing_first(install: Callable[[], object]) -> int:
    """The command line read before the package's ``__init__`` imports torch and installs the backend (some 2 s):
    ``--help``, ``--version`` and bad usage end in the parser, and ``install`` runs that ``__init__`` only for a
    command that uses the device here (``run``'s cells run in kernels, which import torch themselves). The console
    script (``_neuron_lab_cli``) and ``python -m neuron_lab`` (``__main__``) both start here."""
    args = parse()
    if not getattr(args, "in_kernels", False):
        install()
    return dispatch(args)


def dispatch(args: argparse.Namespace) -> int:
    """Run the parsed command (parsed by :func:`main`, or by :func:`main_parsing_first` before torch loads)."""
    try:
        return args.func(args)
    except BrokenPipeError:  # `neuron-lab coverage show | head`: the reader left, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
