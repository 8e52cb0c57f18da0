"""A recorded CPU fallback taken apart: what a subscriber, a window's rows and its call sites each add to one
``atan2`` on `neuron` (compiled core unless ``NEURON_LAB_CORE`` says otherwise).

Four ways to run the same 2000 calls, interleaved round by round, single-threaded, by process CPU time: untracked;
with a no-op subscriber (the delivery to Python); in ``neuron_lab.track(callsites=False)`` (rows and counts); in
``neuron_lab.track()`` (call sites: the figure ``bench/cores.py`` reports). A window's own opening and closing is a
cell's cost, not a call's, and is taken off. With ``--instructions`` (valgrind installed) the same four run in a
child under callgrind (``bench/callgrind.py``), which counts the same work alike on a loaded machine.

    python bench/recorded_fallback.py --rounds 15 [--instructions]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import callgrind  # bench/ is the script directory

CALLS = 2000
PIECES = ("subscriber (no-op)", "rows, no call sites", "rows with call sites")


def _runs() -> dict:
    import torch

    import neuron_lab
    from neuron_lab import backend
    from neuron_lab.kinds import REPORTED

    torch.set_num_threads(1)
    x = torch.randn(8, device="neuron")

    def plain():
        for _ in range(CALLS):
            torch.atan2(x, x)

    def noop():
        unsubscribe = backend.active().subscribe(lambda e, a, k: None, REPORTED)
        plain()
        unsubscribe()

    def rows():
        with neuron_lab.track(callsites=False):
            plain()

    def sites():
        with neuron_lab.track():
            plain()

    def window():
        with neuron_lab.track():
            pass

    runs = {"plain": plain, "noop": noop, "rows": rows, "sites": sites, "window": window}
    for fn in runs.values():
        fn()  # warm up: every line's first calls, the kinds' classification
    return runs


def _added(t: dict[str, float]) -> dict[str, float]:
    """Per call, each way over the untracked loop (in the units of ``t``)."""
    noop = t["noop"] - t["plain"]
    rows = t["rows"] - t["plain"] - t["window"]
    sites = t["sites"] - t["plain"] - t["window"]
    return {PIECES[0]: noop / CALLS, PIECES[1]: rows / CALLS, PIECES[2]: sites / CALLS}


def cpu_time(rounds: int) -> dict[str, list[float]]:
    runs = _runs()
    out: dict[str, list[float]] = {p: [] for p in PIECES}
    for _ in range(rounds):
        t = {}
        for name, fn in runs.items():
            t0 = time.process_time()
            fn()
            t[name] = (time.process_time() - t0) * 1e6
        for piece, us in _added(t).items():
            out[piece].append(us)
    return out


def counted(rounds: int) -> None:
    """The child under callgrind: each run counted ``rounds`` times."""
    runs = _runs()
    for _ in range(rounds):
        for name, fn in runs.items():
            with callgrind.count(name):
                fn()


def instructions(rounds: int) -> dict[str, int] | str:
    why = callgrind.missing()
    if why:
        return why
    counts, _ = callgrind.run([__file__, "--counted", str(rounds)], env=os.environ.copy())
    least = {name: min(main for main, _ in c) for name, c in counts.items()}  # the main thread's, least noisy round
    return {piece: round(n) for piece, n in _added(least).items()} | {"untracked call": least["plain"] // CALLS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--instructions", action="store_true", help="also count instructions under callgrind")
    ap.add_argument("--counted", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.counted:
        counted(args.counted)
        return
    print(f"a recorded CPU fallback (atan2 on neuron, {CALLS} calls), added per call over the untracked call; "
          f"process CPU time, median (IQR) of {args.rounds} interleaved rounds")
    for piece, us in cpu_time(args.rounds).items():
        q = statistics.quantiles(us, n=4)
        print(f"  {piece}: +{statistics.median(us):.2f} us ({q[0]:.2f}-{q[2]:.2f})")
    if args.instructions:
        n = instructions(3)
        if isinstance(n, str):
            print(f"instructions not counted: {n}", file=sys.stderr)
        else:
            print("instructions per call (callgrind, main thread):", ", ".join(f"{k} {v}" for k, v in n.items()))


if __name__ == "__main__":
    main()
