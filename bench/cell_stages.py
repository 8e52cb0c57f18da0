"""Where a tracked cell's fixed cost goes: instructions of each stage of the extension's work, counted under callgrind.

The training cell of bench/extension_overhead.py (``--steps``, default 1: the fixed cost stands out) runs ``--cells``
times with the extension loaded in a child under valgrind; the extension's stages (the cell hooks, the tracker's
open and close, its memory readings, each recorded call, the report's text and HTML, publishing) are wrapped so
that each entry and exit dumps the counters (bench/callgrind.py): every instruction of the main thread is counted
once, in the innermost stage running, and "the cell, not the extension" is the rest. A wrapper's own dumps cost a
few thousand instructions a call, counted in the stage that called it.

    python bench/cell_stages.py [--callsites off] [--cells 5] [--steps 1]
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import sys
from typing import Any

import callgrind  # bench/ is the script directory

REST = "the cell, not the extension"


def _stages() -> list[tuple[Any, str]]:
    """The functions whose instructions are counted apart: (their owner, their name)."""
    from neuron_lab import extension
    from neuron_lab.report.model import Report
    from neuron_lab.session.cells import CellLocator
    from neuron_lab.session.session import Session
    from neuron_lab.session.waits import CompileProgress
    from neuron_lab.trace.ops import OpTrace
    from neuron_lab.trace.sampler import MemorySampler
    from neuron_lab.trace.tracker import Tracker

    return [(Session, "pre_run_cell"), (Session, "post_run_cell"), (Session, "_keep"), (Tracker, "__init__"),
            (Tracker, "start"), (Tracker, "_open_memory"), (Tracker, "stop"), (OpTrace, "record"),
            (extension, "_display"), (Report, "__str__"), (Report, "_repr_html_"), (CompileProgress, "cell_started"),
            (MemorySampler, "start"), (MemorySampler, "stop"), (CellLocator, "newest_cell")]


def counted(cells: int, steps: int, callsites: bool) -> None:
    """The child under callgrind: warm up, then count ``cells`` cells stage by stage."""
    import extension_overhead as eo

    stack = [REST]
    counting = [False]

    def wrap(owner: Any, name: str) -> None:
        fn = getattr(owner, name)
        label = f"{getattr(owner, '__name__', owner)}.{name}"

        @functools.wraps(fn)
        def staged(*args, **kwargs):
            if not counting[0]:
                return fn(*args, **kwargs)
            callgrind.dump(stack[-1])
            stack.append(label)
            try:
                return fn(*args, **kwargs)
            finally:
                callgrind.dump(stack.pop())

        setattr(owner, name, staged)

    for owner, name in _stages():  # before the extension loads: the op subscriber is bound as it subscribes
        wrap(owner, name)
    shell = eo.make_shell()
    loop = eo.LOOP.format(steps=steps)
    eo.setup(shell, 64, 128)
    eo.configure(shell, eo.ON if callsites else eo.OFF)
    try:
        for _ in range(3):
            eo.run_loop(shell, loop)
        gc.collect()
        callgrind.zero()
        counting[0] = True
        for _ in range(cells):
            eo.run_loop(shell, loop, collect=False)
        callgrind.dump(REST)
        counting[0] = False
    finally:
        eo.configure(shell, eo.PLAIN)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", type=int, default=5, help="cells counted (after 3 uncounted)")
    ap.add_argument("--steps", type=int, default=1, help="training steps per cell")
    ap.add_argument("--callsites", choices=("on", "off"), default="on")
    ap.add_argument("--counted", action="store_true", help=argparse.SUPPRESS)  # the child under callgrind
    args = ap.parse_args()
    if args.counted:
        counted(args.cells, args.steps, args.callsites == "on")
        return
    why = callgrind.missing()
    if why:
        sys.exit(f"cannot count instructions here: {why}")
    counts, _ = callgrind.run([__file__, "--counted", "--cells", str(args.cells), "--steps", str(args.steps),
                               "--callsites", args.callsites], env={**os.environ, "OMP_NUM_THREADS": "1"})
    main_thread = {name: sum(c[0] for c in cs) / args.cells for name, cs in counts.items()}
    ours = sum(n for name, n in main_thread.items() if name != REST)
    print(f"{args.steps}-step training cell, call sites {args.callsites}: main-thread instructions a cell "
          f"(mean of {args.cells}), each stage's own (exclusive)\n")
    print(f"| {'stage':<34} | {'instructions':>12} |\n|{'-' * 36}|{'-' * 14}|")
    for name, n in sorted(main_thread.items(), key=lambda kv: -kv[1]):
        print(f"| {name:<34} | {n / 1e3:>10,.0f} k |")
    print(f"\nthe extension's stages: {ours / 1e6:.2f} M instructions a cell")


if __name__ == "__main__":
    main()
