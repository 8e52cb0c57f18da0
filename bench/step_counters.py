"""What a training step's gap to CPU eager is made of: per-step counters of CPU eager (its default AdamW, the
single-tensor loop), CPU eager running the `_foreach_` AdamW that `neuron` runs, and `neuron`, in one process.

Hardware counters are not available in this VM (``perf stat`` reports cycles, instructions and cache misses as
not supported), so there are two sources:

- by default, interleaved rounds of process CPU time and minor page faults (getrusage) a step;
- ``--callgrind``: the same steps under callgrind's cache and branch simulation (``--cache-sim=yes
  --branch-sim=yes``, the last level modelled on this machine's 512 KiB L2, since a tiny model fits its L3): a
  step's instructions, L1 data misses, L2 misses and mispredicted branches. Each configuration's stretch is counted
  after one counted warm-up stretch of its own, so the simulated caches are warm.

    python bench/step_counters.py [--models gpt2,llama,bert,mlp] [--rounds 9] [--callgrind]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time

import callgrind
import model_zoo
import real_models
import torch

CONFIGS = {"cpu": ("cpu", None), "cpu foreach": ("cpu", True), "neuron": ("neuron", None)}
CACHES = ("--cache-sim=yes", "--branch-sim=yes", "--D1=32768,8,64", "--LL=524288,8,64")
COUNTED_STEPS = 3


def _built(name: str):
    torch.manual_seed(0)
    return real_models.mlp() if name == "mlp" else model_zoo.ZOO[name][1]()


def _steps(name: str) -> dict:
    built = _built(name)
    runs = {label: real_models.stepper(*built, dev, foreach) for label, (dev, foreach) in CONFIGS.items()}
    for step in runs.values():
        for _ in range(3):
            step()  # first-call plans, caches, optimizer state
    return runs


def _round(step, number: int) -> tuple[float, float]:
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time()
    for _ in range(number):
        step()
    t1, r1 = time.process_time(), resource.getrusage(resource.RUSAGE_SELF)
    return (t1 - t0) / number * 1e3, (r1.ru_minflt - r0.ru_minflt) / number


def timed(models: list[str], rounds: int) -> None:
    print("| model | configuration | CPU ms a step (median, IQR) | ratio to CPU eager | minor faults a step |")
    print("|---|---|---|---|---|")
    for name in models:
        runs = _steps(name)
        samples: dict[str, list[tuple[float, float]]] = {label: [] for label in runs}
        for _ in range(rounds):
            for label, step in runs.items():
                samples[label].append(_round(step, 4))
        base = [ms for ms, _ in samples["cpu"]]
        for label, xs in samples.items():
            ms = [m for m, _ in xs]
            q = statistics.quantiles(ms, n=4)
            ratio = statistics.median(m / b for m, b in zip(ms, base))
            print(f"| {name} | {label} | {statistics.median(ms):.2f} ({q[0]:.2f}-{q[2]:.2f}) | {ratio:.2f}x | "
                  f"{statistics.median(f for _, f in xs):.1f} |")


def counted(models: list[str]) -> None:
    for name in models:
        runs = _steps(name)
        for label, step in runs.items():
            for stretch in ("warm", "counted"):
                with callgrind.count(f"{name}|{label}|{stretch}"):
                    for _ in range(COUNTED_STEPS):
                        step()


def simulated(models: list[str]) -> None:
    dumps, _ = callgrind.run_events([__file__, "--counted", "--models", ",".join(models)], options=CACHES)
    print("| model | configuration | instructions | L1d misses | L2 misses | mispredicted branches |")
    print("|---|---|---|---|---|---|")
    for key, stretches in dumps.items():
        name, label, stretch = key.split("|")
        if stretch != "counted":
            continue
        ev: dict[str, int] = {}
        for threads in stretches:
            for counts in threads.values():
                for k, v in counts.items():
                    ev[k] = ev.get(k, 0) + v

        def per_step(*keys: str, ev: dict[str, int] = ev) -> str:
            return f"{sum(ev.get(k, 0) for k in keys) / COUNTED_STEPS / 1e3:,.0f} k"

        print(f"| {name} | {label} | {per_step('Ir')} | {per_step('D1mr', 'D1mw')} | {per_step('DLmr', 'DLmw')} | "
              f"{per_step('Bcm', 'Bim')} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt2,llama,bert,mlp")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--callgrind", action="store_true", help="count under callgrind's cache and branch simulation")
    ap.add_argument("--counted", action="store_true", help=argparse.SUPPRESS)  # the run under callgrind
    args = ap.parse_args()
    torch.set_num_threads(1)
    models = args.models.split(",")
    if args.counted:
        counted(models)
    elif args.callgrind:
        if why := callgrind.missing():
            sys.exit(why)
        simulated(models)
    else:
        timed(models, args.rounds)


if __name__ == "__main__":
    main()
