"""Real models' AdamW training steps on `neuron` as ratios to CPU eager, measured in one run, single-threaded.

Issue 31's targets, compiled core: tiny GPT-2, Llama and BERT (transformers) and resnet18 (transformers' ResNet in
resnet-18's layout: timm's needs torchvision, which does not import beside the CPU torch wheel), one AdamW
step each (forward, loss, backward, step, zero_grad), built by bench/model_zoo.py's builders (tiny configs,
random init, nothing downloaded), plus a small MLP's step and a 64x64 add. The CPU and `neuron` copies of a
model (same weights, same batch) run alternately, round by round; each round's ratio is the device run's
process CPU time over the CPU run's, so a busy machine's other processes do not count. Median and
interquartile range over rounds. Each workload runs in processes of its own, as a user's training does: in one
process a model's step ran on the heap the models before it left (resnet18 after the transformers faulted in
freed memory again: 0.90x alone, 1.11-1.23x after them). And in three: a process draws its own speed, CPU eager's
included (resnet18's CPU step took 95-107 ms in most processes and 153 ms in some, where the ratio fell to 0.91x),
so the figure pools the rounds of three processes.

    python bench/real_models.py [--rounds 9] [--processes 3] [--figures out/bench/real_models.json] [--workload NAME]
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import time

import figures
import model_zoo
import torch

import neuron_lab  # noqa: F401  (activates the emulator when autoload is off)

MODELS = {"tiny GPT-2 AdamW step": ("gpt2", 1.10), "tiny Llama AdamW step": ("llama", 1.10),
          "tiny BERT AdamW step": ("bert", 1.10),
          "resnet18 (transformers ResNet, resnet-18 layout) AdamW step": ("resnet18", 1.05)}


def _cpu_time(fn, number: int) -> float:
    t = time.process_time()
    for _ in range(number):
        fn()
    return time.process_time() - t


def _ratio_rounds(runs: dict, rounds: int, number: int) -> list[float]:
    for fn in runs.values():
        fn()  # warm up: first-call plans, caches, optimizer state
    out = []
    for _ in range(rounds):
        c = _cpu_time(runs["cpu"], number)
        n = _cpu_time(runs["neuron"], number)
        out.append(n / c)
    return out


def stepper(model, batch: dict, loss_fn, dev: str, foreach: bool | None = None):
    """One AdamW training step of a copy of `model` on `dev` (``foreach`` as AdamW takes it: None is its default,
    the single-tensor loop on the CPU and the `_foreach_` one on `neuron`)."""
    m = copy.deepcopy(model).to(dev).train()
    b = {k: v.to(dev) for k, v in batch.items()}
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=foreach)

    def step():
        loss_fn(m, b).backward()
        opt.step()
        opt.zero_grad()

    return step


def _trainer(model, batch: dict, loss_fn) -> dict:
    return {dev: stepper(model, batch, loss_fn, dev) for dev in ("cpu", "neuron")}


def mlp():
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 256))
    x = torch.randn(64, 256)
    return model, {"x": x, "y": x}, lambda m, b: torch.nn.functional.mse_loss(m(b["x"]), b["y"])


def _add():
    xs = {dev: (torch.randn(64, 64, device=dev), torch.randn(64, 64, device=dev)) for dev in ("cpu", "neuron")}
    return {dev: (lambda x=x, y=y: [x + y for _ in range(500)]) for dev, (x, y) in xs.items()}, 4


def _model(key: str):
    def runs():
        return _trainer(*model_zoo.ZOO[key][1]()), 2
    return runs


WORKLOADS = {"64x64 add": (_add, 1.3),
             "small MLP AdamW step (64x256, 3 layers)": (lambda: (_trainer(*mlp()), 10), 1.10)}
WORKLOADS |= {name: (_model(key), target) for name, (key, target) in MODELS.items()}


def measure_one(name: str, rounds: int) -> dict:
    """One workload's figure, in this process."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    make, target = WORKLOADS[name]
    runs, number = make()
    samples = _ratio_rounds(runs, rounds, number)
    return {**figures.figure(name, samples, "x", target), "samples": samples}


def measure(rounds: int, processes: int = 3) -> list[dict]:
    """Every workload's figure, over the rounds of ``processes`` child processes of its own (interleaved: each
    workload's first process, then each one's second, ...)."""
    samples: dict[str, list[float]] = {name: [] for name in WORKLOADS}
    for _ in range(processes):
        for name in list(samples):
            child = subprocess.run([sys.executable, __file__, "--workload", name, "--rounds", str(rounds)],
                                   capture_output=True, text=True, timeout=1800)
            if child.returncode == 0:
                samples[name] += json.loads(child.stdout.splitlines()[-1])["samples"]
            elif "ImportError" in child.stderr or "ModuleNotFoundError" in child.stderr:  # a missing library
                print(f"{name}: skipped ({child.stderr.strip().splitlines()[-1]})")
                del samples[name]
            else:
                raise RuntimeError(f"{name} failed:\n{child.stderr}")
    return [figures.figure(name, got, "x", WORKLOADS[name][1]) for name, got in samples.items()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9, help="rounds in each process")
    ap.add_argument("--processes", type=int, default=3, help="processes each workload runs in (their rounds pooled)")
    ap.add_argument("--figures", help="also write the figures here (bench/table.py reads them)")
    ap.add_argument("--workload", choices=list(WORKLOADS), help="measure this workload only, in this process, and "
                    "print its figure as JSON")
    args = ap.parse_args()
    if args.workload:
        print(json.dumps(measure_one(args.workload, args.rounds)))
        return
    rows = measure(args.rounds, args.processes)
    print("| workload (compiled core, ratio to CPU eager by CPU time) | median | IQR | target | holds |")
    print("|---|---|---|---|---|")
    for r in rows:
        lo, hi = r["spread"]
        print(f"| {r['name']} | {r['value']:.2f}x | {lo:.2f}-{hi:.2f} | <= {r['target']:.2f}x | "
              f"{'yes' if r['holds'] else 'NO'} |")
    figures.write(args.figures, rows)


if __name__ == "__main__":
    main()
