"""What profiling costs a training step (issue 19's bound: a profiled step at most 2× an unprofiled one).

The workload is the overhead benches' MLP (bench/workload.py: three Linear layers, two ``torch.atan2`` CPU
fallbacks, AdamW) on ``neuron``. Three ways to run one step, interleaved so that drift hits all alike:
plain; under bare ``torch.profiler`` (CPU + PrivateUse1 activities, record_shapes) for reference; and under
``neuron_lab.profile()`` (the profiler plus the call-site join and the report data). Every round runs each
once, in an order that rotates per round, after a ``gc.collect()``; a profiled step's ratio is its time over
the round's plain step. The figures are medians over rounds. ``--steps`` steps run inside each timed window,
so the profiler's fixed start/stop cost is spread as it is when a user profiles a few steps of a cell.

    .venv/bin/python bench/profile_overhead.py [--rounds 15] [--steps 5] [--width 256] [--batch 64] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F  # noqa: N812 (the workload's spelling)
from torch.profiler import ProfilerActivity
from workload import MODEL  # bench/ is the script directory

import neuron_lab

PLAIN, TORCH, OURS = "plain", "torch.profiler", "neuron_lab.profile()"
TARGET = 2.0
MEASURES = {"steps": "the steps alone (inside the profiled window)",
            "window": "the whole window (profiler start, stop and reading the profile included)"}


def workload(width: int, batch: int) -> dict:
    ns: dict = {"torch": torch}
    exec(MODEL.format(width=width, batch=batch), ns)
    return ns


def stepper(ns: dict, steps: int) -> Callable[[], None]:
    model, opt, x, y = ns["model"], ns["opt"], ns["x"], ns["y"]

    def run() -> None:
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
        loss.item()

    return run


def timed(how: str, run: Callable[[], None]) -> tuple[float, float]:
    """(seconds the steps took, seconds of the whole window: the profiler's start, stop and reading included)."""
    t0 = time.perf_counter()
    if how == PLAIN:
        run()
        t = time.perf_counter() - t0
        return t, t
    if how == TORCH:
        with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                                    record_shapes=True) as prof:
            t1 = time.perf_counter()
            run()
            t2 = time.perf_counter()
        prof.events()  # the profiler's own tables read it so
    else:
        with neuron_lab.profile():
            t1 = time.perf_counter()
            run()
            t2 = time.perf_counter()
    return t2 - t1, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    a = ap.parse_args()
    torch.set_num_threads(1)
    run = stepper(workload(a.width, a.batch), a.steps)
    for how in (PLAIN, TORCH, OURS):  # warm: the first call of each op classifies it, the profiler loads
        timed(how, run)
    order = [PLAIN, TORCH, OURS]
    times: dict[str, dict[str, list[float]]] = {m: {h: [] for h in order} for m in MEASURES}
    ratios: dict[str, dict[str, list[float]]] = {m: {TORCH: [], OURS: []} for m in MEASURES}
    for r in range(a.rounds):
        got = {}
        for how in order[r % 3:] + order[:r % 3]:
            gc.collect()
            got[how] = dict(zip(MEASURES, timed(how, run)))
            for m in MEASURES:
                times[m][how].append(got[how][m])
        for m in MEASURES:
            for how in ratios[m]:
                ratios[m][how].append(got[how][m] / got[PLAIN][m])
    with neuron_lab.profile() as report:  # one more, to show what the join attributed
        run()
    p = report.profiled
    calls = sum(r.calls for r in p.rows)
    unattributed = sum(r.unattributed for r in p.rows)
    figures = {"rounds": a.rounds, "steps": a.steps, "width": a.width, "batch": a.batch,
               "median_s": {m: {h: statistics.median(t) for h, t in times[m].items()} for m in MEASURES},
               "median_ratio": {m: {h: statistics.median(x) for h, x in ratios[m].items()} for m in MEASURES},
               "calls": calls, "unattributed_calls": unattributed, "target": TARGET}
    if a.json:
        print(json.dumps(figures))
        return
    print(f"{a.steps} training steps per window, MLP width {a.width}, batch {a.batch}, {a.rounds} rounds, "
          f"{neuron_lab.backend.active().description}")
    for m, what in MEASURES.items():
        print(f"{what}:")
        for how in order:
            ratio = "" if how == PLAIN else f"  ratio {figures['median_ratio'][m][how]:.2f}×"
            print(f"  {how:<22} median {figures['median_s'][m][how] * 1e3:8.1f} ms{ratio}")
    step = figures["median_ratio"]["steps"][OURS]
    print(f"profiled steps / plain steps: {step:.2f}× ({'within' if step <= TARGET else 'OVER'} the {TARGET:g}× "
          f"target); the whole window, report included: {figures['median_ratio']['window'][OURS]:.2f}×")
    print(f"profiled op calls: {calls:,}, without a user line: {unattributed:,}")

if __name__ == "__main__":
    main()
