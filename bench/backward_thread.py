"""What running `neuron`'s backward on autograd's device thread costs a training step, against the calling thread.

The emulator runs backward on the thread that calls it (``backend/emulator/__init__.py`` says why); PyTorch's
``torch.autograd.set_multithreading_enabled(True)`` puts it back on autograd's device thread, as a real device
has it. Each model's step (bench/real_models.py's) runs on the CPU, on `neuron` and on `neuron` with the device
thread, interleaved round by round; each ratio is process CPU time over the CPU step's. Median and IQR.

    python bench/backward_thread.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics

import model_zoo
import real_models
import torch


def _device_thread(step):
    def run():
        with torch.autograd.set_multithreading_enabled(True):
            step()
    return run


def _quartiles(xs: list[float]) -> str:
    q = statistics.quantiles(xs, n=4)
    return f"{statistics.median(xs):.2f}x ({q[0]:.2f}-{q[2]:.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print("| step | backward on the calling thread | on autograd's device thread |")
    print("|---|---|---|")
    models = {"small MLP": (real_models.mlp, 10)}
    models |= {name: (model_zoo.ZOO[key][1], 2) for name, (key, _) in real_models.MODELS.items()}
    for name, (build, number) in models.items():
        torch.manual_seed(0)
        built = build()
        cpu, neuron = (real_models.stepper(*built, dev) for dev in ("cpu", "neuron"))
        runs = {"calling": neuron, "device": _device_thread(neuron)}
        for f in (cpu, *runs.values()):
            f()
        ratios: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(args.rounds):
            c = real_models._cpu_time(cpu, number)
            for k, f in runs.items():
                ratios[k].append(real_models._cpu_time(f, number) / c)
        print(f"| {name} | {_quartiles(ratios['calling'])} | {_quartiles(ratios['device'])} |", flush=True)


if __name__ == "__main__":
    main()
