"""What TorchNeuron's 64-bit rule for int64 costs hot int64 ops: per call, rule on against rule off, per core.

The rule (``neuron_lab/backend/emulator/int64_rule.py``) range-checks every int64 tensor of a device kernel's call
and wraps only values past int32, so an ordinary call pays the check alone. The setting is read once, at install, so
each (core, setting) pair runs in child processes of its own, off and on alternately (``--pairs`` times), each op's
best time per call over all their rounds taken: the machine may be shared, the least disturbed round counts. The
added cost is on minus off.

    python bench/int64_rule.py                       # the table for docs/benchmarks.md
    python bench/int64_rule.py --rounds 5 --pairs 1  # quicker, noisier
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CALLS = 200


def _ops():
    import torch
    from torch.nn import functional

    dev = "neuron"
    torch.manual_seed(0)
    weight = torch.randn(1000, 64, device=dev)
    idx = torch.randint(0, 1000, (32, 128)).to(dev)
    logp = torch.randn(256, 1000, device=dev).log_softmax(1)
    target = torch.randint(0, 1000, (256,)).to(dev)
    ints = torch.arange(4096).to(dev)
    return {
        "embedding (32x128 int64 indices)": lambda: functional.embedding(idx, weight),
        "nll_loss (256 int64 targets)": lambda: functional.nll_loss(logp, target),
        "arange(4096) int64": lambda: torch.arange(4096, device=dev),
        "int64 add (4096) + 1": lambda: ints + 1,
        "int64 sum (4096)": lambda: ints.sum(),
    }


def _child(rounds: int) -> None:
    import torch

    torch.set_num_threads(1)
    import neuron_lab  # noqa: F401  (installs the backend)

    best = {}
    for name, fn in _ops().items():
        for _ in range(20):
            fn()
        best[name] = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter_ns()
            for _ in range(CALLS):
                fn()
            best[name] = min(best[name], (time.perf_counter_ns() - t0) / CALLS / 1000)
    print(json.dumps(best))


def _run(core: str, rule: str, rounds: int) -> dict[str, float]:
    env = dict(os.environ, NEURON_LAB_CORE=core, NEURON_LAB_EMULATE_DOWNCAST=rule)
    r = subprocess.run([sys.executable, __file__, "--child", "--rounds", str(rounds)], env=env, capture_output=True,
                       text=True, timeout=600)
    if r.returncode:
        raise SystemExit(f"{core} core, NEURON_LAB_EMULATE_DOWNCAST={rule}: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _best(core: str, rounds: int, pairs: int) -> dict[str, tuple[float, float]]:
    runs = [(_run(core, "0", rounds), _run(core, "1", rounds)) for _ in range(pairs)]
    return {name: (min(off[name] for off, _ in runs), min(on[name] for _, on in runs)) for name in runs[0][0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.rounds)
        return
    print("| op | core | rule off, us/call | rule on, us/call | added, us |")
    print("|---|---|---|---|---|")
    for core in ("compiled", "python"):
        for name, (off, on) in _best(core, args.rounds, args.pairs).items():
            print(f"| {name} | {core} | {off:.1f} | {on:.1f} | {on - off:+.1f} |")

if __name__ == "__main__":
    main()
