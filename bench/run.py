"""Emulator overhead against CPU eager, measured in one run, single-threaded.

Prints ratios (never absolute targets): per-op overhead of a small op, MLP AdamW training
steps at two sizes, and compiled against eager inference. Best-of wall clock: a quiet machine's figures.
`make bench` runs only the compiled inference (``--only-compiled``): bench/cores.py and bench/real_models.py
measure the add and the MLP steps by CPU time, round by round, which a busy machine does not skew.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time

import torch

import neuron_lab  # noqa: F401  (activates the emulator when autoload is off)

torch.set_num_threads(1)


def best_of(fn, repeat: int, number: int) -> float:
    """Seconds per call: the best of `repeat` runs of `number` calls (after one warm-up run)."""
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t) / number)
    return min(times)


def small_op(repeat: int) -> dict:
    res = {}
    for dev in ("cpu", "neuron"):
        x = torch.randn(64, 64, device=dev)
        y = torch.randn(64, 64, device=dev)
        res[dev] = best_of(lambda x=x, y=y: x + y, repeat, 5000)
    return {"name": "64x64 add, per op", "cpu_us": res["cpu"] * 1e6, "neuron_us": res["neuron"] * 1e6,
            "added_us": (res["neuron"] - res["cpu"]) * 1e6, "ratio": res["neuron"] / res["cpu"],
            "target": "<= 15 us added"}


def mlp(width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                               torch.nn.ReLU(), torch.nn.Linear(width, width))


def train_step(batch: int, width: int, repeat: int, number: int, target: str) -> dict:
    base = mlp(width)
    res = {}
    for dev in ("cpu", "neuron"):
        model = copy.deepcopy(base).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randn(batch, width, device=dev)
        t = torch.randn(batch, width, device=dev)

        def step(model=model, opt=opt, x=x, t=t):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x), t).backward()
            opt.step()

        res[dev] = best_of(step, repeat, number)
    return {"name": f"MLP AdamW step, batch {batch}, 3x{width}", "cpu_ms": res["cpu"] * 1e3,
            "neuron_ms": res["neuron"] * 1e3, "ratio": res["neuron"] / res["cpu"], "target": target}


def compiled_inference(repeat: int) -> dict:
    """Compiled speed is the host Inductor lowering's promise; the default lowering runs graphs op by op, as eager."""
    os.environ["NEURON_LAB_COMPILE_LOWERING"] = "inductor"
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 256),
                               torch.nn.GELU(), torch.nn.Linear(256, 256))
    x = torch.randn(64, 256)
    cpu_model = copy.deepcopy(base)
    dev_model = copy.deepcopy(base).to("neuron")
    xd = x.to("neuron")
    compiled = torch.compile(dev_model, backend="neuron")
    with torch.no_grad():
        compiled(xd)
        cpu = best_of(lambda: cpu_model(x), repeat, 200)
        eager = best_of(lambda: dev_model(xd), repeat, 200)
        comp = best_of(lambda: compiled(xd), repeat, 200)
    return {"name": "3x256 GELU MLP inference, batch 64, Inductor lowering", "cpu_eager_us": cpu * 1e6,
            "neuron_eager_us": eager * 1e6,
            "neuron_compiled_us": comp * 1e6, "ratio": comp / cpu, "eager_ratio": eager / cpu,
            "target": "compiled <= 1.15x CPU eager"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", help="also write the rows to this file")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--skip-compile", action="store_true")
    which.add_argument("--only-compiled", action="store_true", help="only the compiled inference")
    args = ap.parse_args()
    rows = [] if args.only_compiled else [small_op(args.repeat),
                                          train_step(64, 256, args.repeat, 50, "<= 2.0x CPU eager"),
                                          train_step(256, 1024, args.repeat, 5, "<= 1.2x CPU eager")]
    if not args.skip_compile:
        rows.append(compiled_inference(args.repeat))
    print(f"torch {torch.__version__}, 1 thread, best of {args.repeat}; ratios are neuron (emulated) / CPU eager")
    print(f"| {'workload':<40} | {'ratio':>7} | {'target':<28} | detail")
    print(f"|{'-' * 42}|{'-' * 9}|{'-' * 30}|-------")
    for r in rows:
        detail = ", ".join(f"{k}={v:.1f}" for k, v in r.items() if isinstance(v, float) and k != "ratio")
        print(f"| {r['name']:<40} | {r['ratio']:>6.2f}x | {r['target']:<28} | {detail}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
