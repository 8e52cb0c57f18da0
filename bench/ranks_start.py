"""What starting and stopping a notebook cluster of ranks costs, per engine kind: ``%neuron ranks start N --engines
KIND`` / ``stop`` against a bare ipyparallel cluster of N engines of the same kind
(``Cluster(n=N, engines=KIND).start_and_connect_sync()`` / ``stop_cluster_sync()``).

The floor is a bare ipyparallel cluster of N local engines, each importing torch (what ``%%px`` users start by hand
before their first distributed cell). ``%neuron ranks start N`` adds, per engine, the rank's variables, loading
neuron_lab, ``import torch_neuronx`` and ``init_process_group(backend="neuron")``. The two alternate, round by
round, in one IPython shell; the figures are the median of the per-round ratios (absolute seconds differ between
machines; ratios measured in one run do not), with the median seconds for scale.

ssh engines go to ``--ssh-hosts`` (default: two ssh hosts that are this machine, as ``tools/ssh_local.sh`` serves
them), half of the engines on each; the bare cluster gets each host a profile folder of its own, as the workbench
does (one machine's two hosts would otherwise copy the connection files onto themselves).

    .venv/bin/python bench/ranks_start.py [--rounds 3] [--ranks 2] [--engines local mpi slurm ssh]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import ipyparallel
from IPython.testing.globalipapp import start_ipython
from traitlets.config import Config

SSH_HOSTS = "localhost:2222,127.0.0.1:2222"


def bare(n: int, engines: str, ssh_hosts: str) -> tuple[float, float]:
    """Seconds to start a cluster of ``n`` engines of kind ``engines`` that have imported torch, and to stop it."""
    config, profile_dir = Config(), tempfile.mkdtemp(prefix="bench-ranks-")
    if engines == "ssh":
        hosts = ssh_hosts.split(",")
        config.SSHEngineSetLauncher.engines = {
            h: {"n": n // len(hosts), "remote_profile_dir": os.path.join(profile_dir, f"ssh{i}")}
            for i, h in enumerate(hosts)}
        config.SSHEngineSetLauncher.remote_python = sys.executable
    start = time.perf_counter()
    cluster = ipyparallel.Cluster(n=n, log_level=40, engine_launcher_class=engines, profile_dir=profile_dir,
                                  config=config)
    client = cluster.start_and_connect_sync(activate=False)
    try:
        client.wait_for_engines(n, timeout=300)
        client[:].execute("import torch", block=True)
        started = time.perf_counter() - start
    finally:
        stopping = time.perf_counter()
        client.close()
        cluster.stop_cluster_sync()
        stopped = time.perf_counter() - stopping
        shutil.rmtree(profile_dir, ignore_errors=True)
    return started, stopped


def ranks(shell, n: int, engines: str, ssh_hosts: str) -> tuple[float, float]:  # noqa: ANN001  (IPython's shell)
    """Seconds for ``%neuron ranks start n --engines engines`` and for ``%neuron ranks stop``."""
    hosts = f" --ssh-hosts {ssh_hosts}" if engines == "ssh" else ""
    start = time.perf_counter()
    shell.run_line_magic("neuron", f"ranks start {n} --engines {engines}{hosts}")
    started = time.perf_counter() - start
    stopping = time.perf_counter()
    shell.run_line_magic("neuron", "ranks stop")
    return started, time.perf_counter() - stopping


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--engines", nargs="+", default=["local"], choices=("local", "mpi", "slurm", "ssh"))
    ap.add_argument("--ssh-hosts", default=SSH_HOSTS, help=f"ssh engines' hosts (default {SSH_HOSTS})")
    args = ap.parse_args()
    shell = start_ipython()
    shell.run_line_magic("load_ext", "neuron_lab")
    print(f"{args.ranks} ranks, median of {args.rounds} interleaved rounds")
    print("| engines | | start | ratio | stop | ratio |\n|---|---|---|---|---|---|")
    for kind in args.engines:
        ours, floor = [], []
        for _ in range(args.rounds):
            floor.append(bare(args.ranks, kind, args.ssh_hosts))
            ours.append(ranks(shell, args.ranks, kind, args.ssh_hosts))
        print(f"| {kind} | bare ipyparallel, {args.ranks} engines importing torch | "
              f"{statistics.median(f[0] for f in floor):.1f} s | 1.00x | "
              f"{statistics.median(f[1] for f in floor):.1f} s | 1.00x |")
        ratios = [statistics.median(o[i] / f[i] for o, f in zip(ours, floor, strict=True)) for i in (0, 1)]
        print(f"| {kind} | `%neuron ranks start {args.ranks} --engines {kind}` / `stop` | "
              f"{statistics.median(o[0] for o in ours):.1f} s | {ratios[0]:.2f}x | "
              f"{statistics.median(o[1] for o in ours):.1f} s | {ratios[1]:.2f}x |")

if __name__ == "__main__":
    main()
