"""What starting a 4-rank notebook cluster costs: ``%neuron ranks start 4`` against the floor any such cluster pays.

The floor is a bare ipyparallel cluster of 4 local engines, each importing torch (what ``%%px`` users start
by hand before their first distributed cell). ``%neuron ranks start 4`` adds, per engine, the rank's variables,
loading neuron_lab, ``import torch_neuronx`` and ``init_process_group(backend="neuron")``. The two alternate,
round by round, in one IPython shell; the figure is the median of the per-round ratios (absolute seconds differ
between machines; ratios measured in one run do not), with the median seconds for scale.

    .venv/bin/python bench/ranks_start.py [--rounds 3] [--ranks 4]
"""

from __future__ import annotations

import argparse
import statistics
import time

import ipyparallel
from IPython.testing.globalipapp import start_ipython


def bare(n: int) -> float:
    """Seconds to a cluster of ``n`` engines that have imported torch; the cluster is stopped afterwards."""
    start = time.perf_counter()
    cluster = ipyparallel.Cluster(n=n, log_level=40)
    client = cluster.start_and_connect_sync(activate=False)
    try:
        client.wait_for_engines(n, timeout=300)
        client[:].execute("import torch", block=True)
        return time.perf_counter() - start
    finally:
        client.close()
        cluster.stop_cluster_sync()


def ranks(shell, n: int) -> float:  # noqa: ANN001  (IPython's shell)
    """Seconds for ``%neuron ranks start n``; the ranks are stopped afterwards."""
    start = time.perf_counter()
    shell.run_line_magic("neuron", f"ranks start {n}")
    took = time.perf_counter() - start
    shell.run_line_magic("neuron", "ranks stop")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=4)
    args = ap.parse_args()
    shell = start_ipython()
    shell.run_line_magic("load_ext", "neuron_lab")
    ours, floor = [], []
    for _ in range(args.rounds):
        floor.append(bare(args.ranks))
        ours.append(ranks(shell, args.ranks))
    ratio = statistics.median(o / f for o, f in zip(ours, floor, strict=True))
    print(f"starting {args.ranks} ranks, median of {args.rounds} rounds")
    print("| start | seconds | ratio to the floor |\n|---|---|---|")
    print(f"| bare ipyparallel, {args.ranks} engines importing torch | {statistics.median(floor):.1f} s | 1.00x |")
    print(f"| `%neuron ranks start {args.ranks}` | {statistics.median(ours):.1f} s | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
