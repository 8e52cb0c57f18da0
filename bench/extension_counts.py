"""The extension's cost per tracked cell counted in instructions under callgrind, as figures of their own.

bench/extension_overhead.py measures the same cells by CPU time and, with ``--instructions``, counts them too, one
after the other. The count does not depend on the machine's load, so ``make bench`` (bench/all.py) runs it here,
in its lane of counts, beside the timed scripts instead of before them: the minutes under valgrind no longer add to
the whole. The cells, the rounds and the ratios are extension_overhead's own (its ``instructions``).

    python bench/extension_counts.py [--rounds 2] [--steps 50] [--figures out/bench/extension_counts.json]
"""

from __future__ import annotations

import argparse
import sys

import figures
from extension_overhead import CONFIGS, PLAIN_AGAIN, TARGETS, instructions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="rounds of cells counted under valgrind")
    ap.add_argument("--steps", type=int, default=50, help="training steps per cell (extension_overhead's default)")
    ap.add_argument("--figures", help="write the figures here (bench/table.py)")
    args = ap.parse_args()
    counts = instructions(args.rounds, args.steps)
    if isinstance(counts, str):
        sys.exit(f"instructions not counted: {counts}")
    named = {f"{config}, per tracked cell (instructions)": config for config in CONFIGS if config in TARGETS}
    named["no extension, A/A control (instructions)"] = PLAIN_AGAIN
    figs = [figures.figure(name, counts[config], "x", TARGETS.get(config)) for name, config in named.items()]
    for f, config in zip(figs, named.values()):
        rounds = ", ".join(f"{x:.4f}x" for x in counts[config])
        print(f"{f['name']}: {f['value']:.4f}x (rounds: {rounds}; main thread alone "
              f"{min(counts[config + ' (main thread)']):.4f}x-{max(counts[config + ' (main thread)']):.4f}x)")
    figures.write(args.figures, figs)


if __name__ == "__main__":
    main()
