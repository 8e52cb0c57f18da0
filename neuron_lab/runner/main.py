"""``neuron-lab run PATH``: load the input, run it in a fresh kernel, print progress and a summary, gate, export.

With ``--nproc N`` the same steps run over N ranks, one kernel each (``runner.ranks``), shown across ranks
(``runner.ranks_view``).

The exit code says what happened (``options.MEANINGS``); every file asked for is written whatever
happened, except for bad usage (exit 2), so a CI job keeps the report of a run that failed.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from neuron_lab import settings
from neuron_lab.runner import (
    execute,
    export,
    gates,
    inputs,
    options,
    page,
    progress,
    ranks,
    ranks_view,
    summary,
    traces,
)
from neuron_lab.runner.records import FAILED, CellRecord
from neuron_lab.session import launch
from neuron_lab.session.ssh_engines import NEED_HOSTS, SSHOptions


def parser() -> argparse.ArgumentParser:
    """The parser of ``neuron-lab run`` on its own (``neuron_lab.cli`` adds the same arguments as a subcommand)."""
    p = argparse.ArgumentParser(prog="neuron-lab run", **options.PARSER)
    options.add_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args, extra = p.parse_known_args(argv)
    options.refuse_unknown(p, extra)
    return run(args)


def kernel_env(args: argparse.Namespace) -> dict[str, str]:
    """The runner's environment with ``--backend``, ``--coverage`` and ``--engines`` set; a coverage that cannot load
    is bad input."""
    from neuron_lab.backend import coverage

    env = dict(os.environ)
    if args.backend:
        env[settings.env("NEURON_LAB_BACKEND").name] = args.backend  # the kernel reads it
    if args.engines:
        env[settings.env("NEURON_LAB_RANKS_ENGINES").name] = args.engines  # its `%neuron ranks start N` does
    if (args.engines == "ssh") != bool(args.ssh_hosts):
        raise inputs.InputError(NEED_HOSTS if args.ssh_hosts is None else "--ssh-hosts goes with --engines ssh")
    if args.ssh_hosts:
        try:
            SSHOptions.parse(args.ssh_hosts)
        except ValueError as e:
            raise inputs.InputError(f"--ssh-hosts: {e}") from None
        env[settings.env("NEURON_LAB_RANKS_SSH_HOSTS").name] = args.ssh_hosts
    if args.coverage:
        try:
            coverage.load(args.coverage)
        except coverage.CoverageError as e:
            raise inputs.InputError(f"--coverage: {e}") from None
        # The kernel runs in the input's folder: a coverage file named relative to here must still be found.
        bundled = args.coverage in coverage.bundled()
        env[coverage.ENV_VAR] = args.coverage if bundled else str(Path(args.coverage).expanduser().resolve())
    return env


def run(args: argparse.Namespace) -> int:
    if args.allow_fallback and not args.fail_on_fallback:
        print(f"neuron-lab run: {options.ALLOW_ALONE}", file=sys.stderr)
    try:
        program = inputs.load(Path(args.path))
        env = kernel_env(args)
        trace_dir = traces.prepare(args.trace_dir) if args.trace_dir else None
    except inputs.InputError as e:
        print(f"neuron-lab run: {e}", file=sys.stderr)
        return options.EXIT_USAGE
    try:
        instances = launch.host_instances(args.instance, args.nnodes) if args.instance else []
    except ValueError as e:
        print(f"neuron-lab run: --instance: {e}", file=sys.stderr)
        return options.EXIT_USAGE
    if args.nproc is not None or args.nnodes > 1 or instances:
        return run_ranks(args, program, env, trace_dir, instances)
    total = len(program.code_cells)
    _say(progress.starting(program))
    outcome = execute.run(program, env, args.timeout,
                          on_cell=lambda rec: _say(*progress.cell(rec, total), *traces.missing(rec)),
                          on_ready=lambda info: _say(progress.ready(info)),
                          trace=None if trace_dir is None else
                          lambda rec: traces.fresh(trace_dir, rec.number, total),
                          on_progress=lambda rec, step: _say(progress.waiting(rec, total, step)))
    result = summary.summarize(outcome.cells, outcome.seconds)
    checked = gates.evaluate(summary.reports(outcome.cells), args)
    code = exit_code(outcome, checked)
    block = summary.render(result)  # the run's summary block: printed here, and the head of the --html page
    if trace_dir is not None:
        block += traces.said(trace_dir, [Path(c.trace) for c in outcome.cells if c.trace],
                             sum(c.no_trace is not None for c in outcome.cells))
    block += gates.said(checked)
    if outcome.kernel_error:
        block.append(f"kernel failed: {outcome.kernel_error}")
        if outcome.kernel_stderr:
            block += ["  the kernel's stderr ended with:",
                      *(f"    {line}" for line in outcome.kernel_stderr.splitlines())]
    _say(*block)
    wrote = _write(args, program.nb, code, checked,
                   lambda: page.head(f"neuron-lab run {program.path}", f"exit {code}: {_why(code, code, checked)}",
                                     block, checked),
                   lambda code: document(args, program, outcome, result, checked, code))
    _say(f"exit {wrote}: {_why(wrote, code, checked)}")
    return wrote


def run_ranks(args: argparse.Namespace, program: inputs.Program, env: dict[str, str], trace_dir: Path | None,
              instances: list[str]) -> int:
    """``--nproc N``: the program on N ranks at once (``runner.ranks``), shown across ranks (``runner.ranks_view``);
    with ``--trace`` each cell's ranks' traces are merged into one as soon as every rank is past the cell.
    ``--nnodes M``: N ranks on each of M hosts emulated on this machine, each host of its ``instances`` shape."""
    total = len(program.code_cells)
    store = launch.AgentStore()  # the ranks' rendezvous, for the run's length
    envs = launch.rank_envs(env, args.nproc or 1, store.port, args.nnodes, instances)
    world = len(envs)
    merged: list[Path] = []

    def on_cell(so_far: ranks.RanksOutcome, number: int) -> None:
        _say(*ranks_view.cell(so_far, number, total))
        if trace_dir is not None:
            for rank, rec in enumerate(so_far.cell(number)):
                if rec.no_trace is not None:
                    _say(*traces.missing(rec, rank))
            path, why = traces.merge_cell(trace_dir, number, total, world)
            if why is not None:
                print(f"neuron-lab run: --trace: {why}", file=sys.stderr)
            if path is not None:
                merged.append(path)

    def trace(rank: int) -> Callable[[CellRecord], str] | None:
        return None if trace_dir is None else lambda rec: traces.fresh(trace_dir, rec.number, total, rank)

    _say(ranks_view.starting(program, world, args.nnodes))
    outcome = ranks.run(program, envs, args.timeout, on_cell=on_cell,
                        on_ready=lambda rank, info: _say(ranks_view.ready(rank, info)),
                        traces=[trace(r) for r in range(world)], store=store)
    if outcome.hung is not None:
        print(*ranks_view.hang_said(outcome, total, args.timeout), sep="\n", file=sys.stderr, flush=True)
    checked = gates.evaluate(ranks_view.gate_reports(outcome), args)
    code = ranks_exit_code(outcome, checked)
    if outcome.preflight is not None:
        _say("the ranks differ, so none ran the program:", *outcome.preflight.splitlines())
    _say(*ranks_view.summary(program, outcome))
    if trace_dir is not None:
        without = sum(any(rec.no_trace is not None for rec in outcome.cell(k)) for k in range(1, total + 1))
        _say(*traces.said(trace_dir, merged, without, ranks=True))
    _say(*gates.said(checked))
    for rank, why in outcome.kernel_errors:
        _say(f"kernel failed on rank {rank}: {why}")
        if outcome.ranks[rank].kernel_stderr:
            _say("  the kernel's stderr ended with:",
                 *(f"    {line}" for line in outcome.ranks[rank].kernel_stderr.splitlines()))
    wrote = _write(args, outcome.notebook, code, checked,
                   lambda: ranks_view.head(f"neuron-lab run {ranks_view.layout(world, args.nnodes)} {program.path}",
                                           f"exit {code}: {_why(code, code, checked)}", program, outcome, checked),
                   lambda code: {**ranks_view.document(args, program, outcome, checked, code),
                                 "traces": [str(p) for p in merged]})
    _say(f"exit {wrote}: {_why(wrote, code, checked)}")
    return wrote


def ranks_exit_code(outcome: ranks.RanksOutcome, checked: list[gates.GateResult]) -> int:
    """As :func:`exit_code`, over every rank: Ctrl-C, then a rank's dead kernel, a hang (a cell past --timeout), a
    rank's failed cell, a gate."""
    if outcome.interrupted:
        return options.EXIT_INTERRUPTED
    if outcome.kernel_errors or outcome.preflight is not None:
        return options.EXIT_KERNEL
    if outcome.hung is not None:
        return options.EXIT_HUNG
    if any(c.status in FAILED for o in outcome.ranks for c in o.cells):
        return options.EXIT_CELL_ERROR
    if any(not g.passed for g in checked):
        return options.EXIT_GATE
    return options.EXIT_OK


def _why(code: int, before_writing: int, checked: list[gates.GateResult]) -> str:
    """The exit code's meaning, for this run: which gates failed, or that a file could not be written."""
    if code == options.EXIT_GATE:
        return "a gate failed: " + ", ".join(g.gate.split()[0] for g in checked if not g.passed)
    if code == options.EXIT_USAGE and before_writing != code:
        return "every cell ran and every gate passed, but an output file could not be written (see above)"
    return options.MEANINGS[code]


def exit_code(outcome: execute.Outcome, checked: list[gates.GateResult]) -> int:
    """A dead kernel outranks a failed cell, which outranks a failed gate: fix the first, then see the next.
    Ctrl-C says so whatever else happened: the user stopped the run."""
    if outcome.interrupted:
        return options.EXIT_INTERRUPTED
    if outcome.kernel_error:
        return options.EXIT_KERNEL
    if any(c.status in FAILED for c in outcome.cells):
        return options.EXIT_CELL_ERROR
    if any(not g.passed for g in checked):
        return options.EXIT_GATE
    return options.EXIT_OK


def document(args: argparse.Namespace, program: inputs.Program, outcome: execute.Outcome,
             result: summary.Summary, checked: list[gates.GateResult], code: int) -> dict[str, Any]:
    """The ``--json`` file: everything the run printed, as data (the cells' reports are ``Report.as_dict()``)."""
    return {"schema": export.SCHEMA, "input": str(program.path), "kind": program.kind, "backend": outcome.info,
            "options": {k: v for k, v in vars(args).items() if k not in ("path", "func", "command")},
            "cells": [c.as_dict() for c in outcome.cells], "summary": result.as_dict(),
            "traces": [c.trace for c in outcome.cells if c.trace],
            "gates": [g.as_dict() for g in checked], "exit_code": code, "kernel_error": outcome.kernel_error,
            "kernel_stderr": outcome.kernel_stderr if outcome.kernel_error else None}


def _write(args: argparse.Namespace, nb: Any, code: int, checked: list[gates.GateResult], head: Callable[[], str],
           doc: Callable[[int], dict[str, Any]]) -> int:
    """Write the files asked for (``nb`` the executed notebook, ``head`` the HTML's, ``doc`` the JSON for the final
    exit code); one that cannot be written is reported, and turns a success into exit 2."""
    def attempt(what: str, path: str, write: Any) -> bool:
        try:
            write()
        except Exception as e:  # OSError, or nbconvert failing on an output: the other files still get written
            print(f"neuron-lab run: cannot write {what} {path}: {type(e).__name__}: {e}", file=sys.stderr)
            return False
        _say(f"wrote {path}")
        return True

    ok = True
    if args.output_file:
        ok &= attempt("--output", args.output_file, lambda: export.write_notebook(nb, args.output_file))
    if args.html_file:
        ok &= attempt("--html", args.html_file, lambda: export.write_html(nb, args.html_file, head()))
    if not ok and code == options.EXIT_OK:
        code = options.EXIT_USAGE
    if args.json_file:
        data = doc(code)
        if not attempt("--json", args.json_file, lambda: export.write_json(data, args.json_file)) \
                and code == options.EXIT_OK:
            code = options.EXIT_USAGE
    return code


def _say(*lines: str) -> None:
    if not lines:  # nothing to say (no gates enabled): not an empty line
        return
    try:
        print(*lines, sep="\n", flush=True)
    except BrokenPipeError:  # `neuron-lab run ... | head`: the reader left; the run goes on and still writes its files
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
