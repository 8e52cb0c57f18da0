"""What TorchNeuron's 64-bit rule for int64 costs hot int64 ops: per call, rule on against rule off, per core.

The rule (``neuron_lab/backend/emulator/int64_rule.py``) range-checks every int64 tensor of a device kernel's call
and wraps only values past int32, so an ordinary call pays the check alone. The setting is read once, at install, so
each (core, setting) pair runs in a child process of its own; inside it each op's best time per call over rounds is
taken (the machine is shared: the least disturbed round). The added cost is on minus off.

    python bench/int64_rule.py             # the table for docs/benchmarks.md
    python bench/int64_rule.py --rounds 5  # quicker, noisier
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
    logits = torch.randn(256, 1000, device=dev)
    target = torch.randint(0, 1000, (256,)).to(dev)
    ints = torch.arange(4096).to(dev)
    return {
        "embedding (32x128 int64 indices)": lambda: functional.embedding(idx, weight),
        "cross_entropy (256 int64 targets)": lambda: functional.cross_entropy(logits, target),
        "arange(4096) int64": lambda: torch.arange(4096, device=dev),
        "int64 add (4096) + 1": lambda: ints + 1,
        "int64 sum (4096)": lambda: ints.sum(),
    }


def _child(rounds: int) -> None:
    import torch

    torch.set_num_threads(1)
    import neuron_lab  # noqa: F401  (installs the backend)

    ops = _ops()
    out = {}
    for name, fn in ops.items():
        for _ in range(20):
            fn()
        per_call = []
        for _ in range(rounds):
            t0 = time.perf_counter_ns()
            for _ in range(CALLS):
                fn()
            per_call.append((time.perf_counter_ns() - t0) / CALLS / 1000)
        out[name] = min(per_call)
    print(json.dumps(out))


def _run(core: str, rule: str, rounds: int) -> dict[str, float]:
    env = dict(os.environ, NEURON_LAB_CORE=core, NEURON_LAB_EMULATE_DOWNCAST=rule)
    r = subprocess.run([sys.executable, __file__, "--child", "--rounds", str(rounds)], env=env, capture_output=True,
                       text=True, timeout=600)
    if r.returncode:
        raise SystemExit(f"{core} core, NEURON_LAB_EMULATE_DOWNCAST={rule}: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.rounds)
        return
    print("| op | core | rule off, us/call | rule on, us/call | added, us |")
    print("|---|---|---|---|---|")
    for core in ("compiled", "python"):
        off, on = _run(core, "0", args.rounds), _run(core, "1", args.rounds)
        for name in off:
            print(f"| {name} | {core} | {off[name]:.1f} | {on[name]:.1f} | {on[name] - off[name]:+.1f} |")


if __name__ == "__main__":
    main()
