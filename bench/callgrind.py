"""Instruction counts of stretches of a Python process under valgrind's callgrind: a measure of the same work that
stays within a fraction of a percent when the machine is shared (hardware counters are not available in a VM).

A process runs itself under ``valgrind --tool=callgrind --instr-atstart=no`` (imports run uninstrumented) and marks
the stretches to count with :func:`count`: a tiny C helper, built here once with the system's compiler against
valgrind's ``callgrind.h``, issues the client requests (start instrumentation, zero the counters, dump them under
a name). Outside valgrind the requests are no-ops. Counts come per thread and for all of them; time-driven work (a
thread that wakes every 20 ms) runs about 50× more often per counted stretch than natively, so a count that
includes it is an upper bound.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

HEADER = Path("/usr/include/valgrind/callgrind.h")
SOURCE = """#include <valgrind/callgrind.h>
void nl_start(void) { CALLGRIND_START_INSTRUMENTATION; }
void nl_zero(void) { CALLGRIND_ZERO_STATS; }
void nl_dump(const char* name) { CALLGRIND_DUMP_STATS_AT(name); }
"""
_lib: ctypes.CDLL | None = None


def missing() -> str | None:
    """Why instruction counts cannot be taken here (None: they can)."""
    if shutil.which("valgrind") is None:
        return "valgrind is not installed (apt-get install valgrind)"
    if not HEADER.exists():
        return f"{HEADER} is missing (valgrind's development headers)"
    if shutil.which("cc") is None:
        return "no C compiler (cc) to build the client-request helper"
    return None


def _helper() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        out = Path(tempfile.gettempdir()) / f"neuron_lab_callgrind_{os.getuid()}.so"
        if not out.exists():
            src = out.with_suffix(".c")
            src.write_text(SOURCE)
            subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
        _lib = ctypes.CDLL(str(out))
        _lib.nl_dump.argtypes = [ctypes.c_char_p]
        _lib.nl_start()
    return _lib


@contextlib.contextmanager
def count(name: str) -> Iterator[None]:
    """Count the instructions the block runs (every thread's), dumped under ``name``."""
    lib = _helper()
    lib.nl_zero()
    try:
        yield
    finally:
        lib.nl_dump(name.encode())


def dump(name: str) -> None:
    """Dump the instructions run since the last dump (or zeroing) under ``name``: consecutive dumps split a stretch
    into parts, each counted once (bench/cell_stages.py)."""
    _helper().nl_dump(name.encode())


def zero() -> None:
    """Start counting afresh (what ran before is dropped)."""
    _helper().nl_zero()


def run(argv: list[str], env: dict[str, str] | None = None,
        timeout: float = 3000) -> tuple[dict[str, list[tuple[int, int]]], str]:
    """Run ``python argv`` under callgrind; the instructions of each :func:`count` stretch by name, in order, as
    (the main thread's, every thread's), and the process's standard output."""
    dumps, out = run_events(argv, ("--separate-threads=yes",), env=env, timeout=timeout)
    counts = {name: [(threads.get(1, {}).get("Ir", 0), sum(t.get("Ir", 0) for t in threads.values()))
                     for threads in stretches] for name, stretches in dumps.items()}
    return counts, out


def run_events(argv: list[str], options: tuple[str, ...] = (), env: dict[str, str] | None = None,
               timeout: float = 3000) -> tuple[dict[str, list[dict[int, dict[str, int]]]], str]:
    """Run ``python argv`` under callgrind with extra ``options`` (``--cache-sim=yes``, ``--branch-sim=yes``); each
    :func:`count` stretch by name, in order, as {thread: {event: count}} (``Ir``, and ``D1mr``, ``DLmw``, ``Bcm``...
    as the options simulate them), and the process's standard output. With ``--separate-threads=yes`` a stretch's
    dump holds the counting thread's events only (callgrind dumps the current thread's); without it, thread 0 holds
    every thread's together (a `neuron` backward runs on the autograd engine's device thread)."""
    with tempfile.TemporaryDirectory() as d:
        p = subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", *options,
                            f"--callgrind-out-file={d}/cg", sys.executable, *argv], env=env, capture_output=True,
                           text=True, timeout=timeout)
        if p.returncode:
            raise RuntimeError(f"the run under callgrind failed:\n{p.stderr[-3000:]}")
        dumps: dict[int, tuple[str, dict[int, dict[str, int]]]] = {}  # dump number: (its name, events by thread)
        for f in Path(d).glob("cg.*"):
            dump, thread = (int(n or 0) for n in re.fullmatch(r"cg\.(\d+)(?:-(\d+))?", f.name).groups())
            text = f.read_text(errors="replace")
            trigger = re.search(r"^desc: Trigger: Client Request: (.+)$", text, re.M)
            events = re.search(r"^events: (.+)$", text, re.M)
            total = re.search(r"^(?:summary|totals): (.+)$", text, re.M)
            if trigger and events and total:
                counts = dict(zip(events.group(1).split(), (int(n) for n in total.group(1).split())))
                dumps.setdefault(dump, (trigger.group(1).strip(), {}))[1][thread] = counts
        out: dict[str, list[dict[int, dict[str, int]]]] = {}
        for _, (name, threads) in sorted(dumps.items()):
            out.setdefault(name, []).append(threads)
        return out, p.stdout
