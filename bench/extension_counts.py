"""The extension's cost per tracked cell counted in instructions under callgrind, as figures of their own.

bench/extension_overhead.py measures the same cells by CPU time and, with ``--instructions``, counts them too, one
after the other. The count does not depend on the machine's load, so ``make bench`` (bench/all.py) runs it here,
in its lane of counts, beside the timed scripts instead of before them: the minutes under valgrind no longer add to
the whole. The cells, the rounds and the ratios are extension_overhead's own (its ``instructions``). Each cell length
of ``--steps`` is counted: 50 steps (~100 ms, extension_overhead's cell) and 20 (~40 ms), where the cell's fixed
cost weighs more than twice as much, so the 3% holds for cells from about 40 ms and not only for long ones.

    python bench/extension_counts.py [--rounds 2] [--steps 50 20] [--figures out/bench/extension_counts.json]
"""

from __future__ import annotations

import argparse
import sys

import figures
from extension_overhead import CONFIGS, PLAIN_AGAIN, STEPS, TARGETS, instructions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="rounds of cells counted under valgrind")
    ap.add_argument("--steps", type=int, nargs="+", default=[STEPS, 20], help="training steps per cell, each counted")
    ap.add_argument("--figures", help="write the figures here (bench/table.py)")
    args = ap.parse_args()
    figs = []
    for steps in args.steps:
        counts = instructions(args.rounds, steps)
        if isinstance(counts, str):
            sys.exit(f"instructions not counted: {counts}")
        cell = "" if steps == STEPS else f", {steps} steps"  # extension_overhead's cell keeps its figures' names
        named = {f"{config}, per tracked cell (instructions{cell})": config for config in CONFIGS if config in TARGETS}
        named[f"no extension, A/A control (instructions{cell})"] = PLAIN_AGAIN
        for name, config in named.items():
            figs.append(f := figures.figure(name, counts[config], "x", TARGETS.get(config)))
            rounds = ", ".join(f"{x:.4f}x" for x in counts[config])
            print(f"{f['name']}: {f['value']:.4f}x (rounds: {rounds}; main thread alone "
                  f"{min(counts[config + ' (main thread)']):.4f}x-{max(counts[config + ' (main thread)']):.4f}x)")
    figures.write(args.figures, figs)


if __name__ == "__main__":
    main()
