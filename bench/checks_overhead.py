"""What `%%neuron parity` and `%%neuron compare` cost beyond the runs they must make, as ratios from one run.

One in-process IPython shell with the extension loaded (auto-report off) trains bench/workload.py's
lowered MLP for a few AdamW steps per cell. Every round, after a ``gc.collect()``, runs the plain cell, the
same cell under ``%%neuron parity`` and under ``%%neuron compare --warmup 0 --runs 2``, in an order
that rotates per round. The ratios, medians over rounds:

- parity cell / plain cell: what a user waits, against a plain device run. The floor is about
  1 + (CPU reference run / device run), since the reference run is a second run.
- parity bookkeeping: the share of the parity cell that is neither of its two runs (copies,
  RNG replay, the comparison, the result). Both runs are timed inside the check.
- compare bookkeeping: the same share for compare: its wall time minus its timed runs (cold,
  timed, each mode) and the final real run, over its wall time.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import statistics
import time

import torch
from extension_overhead import make_shell  # bench/ is the script directory
from workload import LOWERED

import neuron_lab  # noqa: F401  (activates the emulator when autoload is off)

torch.set_num_threads(1)

SETUP = "import torch\nimport torch.nn.functional as F\n\n" + LOWERED  # compare compiles it
STEPS = """\
for _ in range({steps}):
    opt.zero_grad(set_to_none=True)
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
"""
PLAIN, PARITY, COMPARE = "plain", "parity", "compare"
HEADS = {PLAIN: "", PARITY: "%%neuron parity\n", COMPARE: "%%neuron compare --warmup 0 --runs 2\n"}


def run(shell, source: str) -> tuple[float, object]:
    gc.collect()
    with contextlib.redirect_stdout(io.StringIO()):
        t = time.perf_counter()
        r = shell.run_cell(source, store_history=True)
        wall = time.perf_counter() - t
    r.raise_error()
    return wall, r.result


def measure(repeat: int = 7, steps: int = 10, batch: int = 64, width: int = 128) -> dict:
    shell = make_shell()
    with contextlib.redirect_stdout(io.StringIO()):
        shell.extension_manager.load_extension("neuron_lab")
    shell.run_line_magic("config", "NeuronLab.auto_report = False")
    shell.run_cell(SETUP.format(batch=batch, width=width), store_history=True).raise_error()
    cell = STEPS.format(steps=steps)
    for kind in HEADS:  # warm-up, untimed: the first compile happens here
        run(shell, HEADS[kind] + cell)
    out: dict[str, list[float]] = {"parity_ratio": [], "parity_bookkeeping": [], "compare_bookkeeping": []}
    kinds = list(HEADS)
    try:
        for r in range(repeat):
            walls: dict[str, tuple[float, object]] = {}
            for i in range(len(kinds)):
                kind = kinds[(r + i) % len(kinds)]
                walls[kind] = run(shell, HEADS[kind] + cell)
            plain_s = walls[PLAIN][0]
            parity_s, p = walls[PARITY]
            compare_s, c = walls[COMPARE]
            assert p.passed and c.passed, (str(p), str(c))
            out["parity_ratio"].append(parity_s / plain_s)
            out["parity_bookkeeping"].append((parity_s - p.device_s - p.reference_s) / parity_s)
            runs_s = sum(t.first_s + sum(t.runs_s) for t in (c.eager, c.compiled))
            out["compare_bookkeeping"].append((compare_s - runs_s - plain_s) / compare_s)
    finally:
        with contextlib.redirect_stdout(io.StringIO()):
            shell.extension_manager.unload_extension("neuron_lab")
    return {k: statistics.median(v) for k, v in out.items()} | {"rounds": out, "steps": steps, "repeat": repeat}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    m = measure(args.repeat, args.steps)
    print(f"checks overhead: {args.steps} AdamW steps per cell, medians of {args.repeat} rotated rounds")
    print(f"  parity cell / plain cell             {m['parity_ratio']:.2f}x")
    print(f"  parity: share outside its two runs   {m['parity_bookkeeping']:.1%}")
    print(f"  compare: share outside its runs      {m['compare_bookkeeping']:.1%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(m, f, indent=1)


if __name__ == "__main__":
    main()
