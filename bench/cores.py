"""Both emulator cores side by side: each workload's cost on `neuron` as a ratio to CPU eager.

The core is fixed per process, so each core runs in a child process of its own
(``NEURON_LAB_CORE=compiled|python``). Inside a child, CPU and device runs are interleaved round by
round, single-threaded, and the median of the per-round ratios is reported: absolute times differ
2-3x between machines, ratios measured in one run do not.

    python bench/cores.py            # the table for docs/benchmarks.md
    python bench/cores.py --rounds 5 # quicker, noisier
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time

import figures

TARGETS = {  # the compiled core's targets (issue 13; add, MLP and fallback tightened by issue 31)
    "64x64 add": "<= 1.3x",
    "MLP AdamW step (64x256, 3 layers)": "<= 1.10x",
    "conv net step (32x3x32x32)": "<= 1.15x",
    "tiny GPT-2-style step": "<= 1.2x",
    "MLP 3x1024 AdamW step": "<= 1.05x",
    "recorded fallback op (call site), added us": "<= 3 us",
    "`import torch` with the autoload, added s": "<= 0.3 s",
}


def _workloads():
    import torch
    from torch import nn

    def add(dev):
        x, y = torch.randn(64, 64, device=dev), torch.randn(64, 64, device=dev)
        return lambda: [x + y for _ in range(200)]

    def trainer(make_model, make_batch, loss_fn, steps):
        def build(dev):
            torch.manual_seed(0)
            model = make_model().to(dev)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            batch = [b.to(dev) for b in make_batch()]

            def run():
                for _ in range(steps):
                    opt.zero_grad()
                    loss_fn(model, *batch).backward()
                    opt.step()
                float(loss_fn(model, *batch).detach().cpu())

            return run

        return build

    def mlp(width, depth):
        layers = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        return nn.Sequential(*layers[:-1])

    def conv():
        return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                             nn.Linear(32, 10))

    class TinyGPT(nn.Module):
        def __init__(self, vocab=256, dim=64, heads=4, layers=2, ctx=32):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
            layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.1, batch_first=True, norm_first=True,
                                               activation="gelu")
            self.blocks = nn.TransformerEncoder(layer, layers)
            self.head = nn.Linear(dim, vocab)
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(ctx), persistent=False)

        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            return self.head(self.blocks(x, mask=self.mask, is_causal=True))

    ce = nn.functional.cross_entropy
    mse = nn.functional.mse_loss
    return {
        "64x64 add": add,
        "MLP AdamW step (64x256, 3 layers)": trainer(lambda: mlp(256, 3), lambda: [torch.randn(64, 256)] * 2,
                                                     lambda m, x, t: mse(m(x), t), 5),
        "conv net step (32x3x32x32)": trainer(conv, lambda: [torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))],
                                              lambda m, x, t: ce(m(x), t), 3),
        "tiny GPT-2-style step": trainer(TinyGPT, lambda: [torch.randint(0, 256, (8, 32)),
                                                           torch.randint(0, 256, (8, 32))],
                                         lambda m, x, t: ce(m(x).flatten(0, 1), t.flatten()), 2),
        "MLP 3x1024 AdamW step": trainer(lambda: mlp(1024, 3), lambda: [torch.randn(64, 1024)] * 2,
                                         lambda m, x, t: mse(m(x), t), 2),
    }


def _timed(fn) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


def child(rounds: int) -> dict:
    import torch

    import neuron_lab
    from neuron_lab.backend.emulator import runtime

    torch.set_num_threads(1)
    out = {"core": runtime.get().core, "rows": {}, "ratios": {}}
    for name, build in _workloads().items():
        runs = {dev: build(dev) for dev in ("cpu", "neuron")}
        for fn in runs.values():
            fn()  # warm up
        ratios = []
        for _ in range(rounds):
            c = _timed(runs["cpu"])
            n = _timed(runs["neuron"])
            ratios.append(n / c)
        out["rows"][name] = f"{statistics.median(ratios):.2f}x"
        out["ratios"][name] = ratios

    # A fallback op (atan2 is CPU fallback in the TorchNeuron 2.33 profile) with and without a tracker that
    # records its call site.
    x = torch.randn(8, device="neuron")
    n_ops = 2000

    def plain():
        for _ in range(n_ops):
            torch.atan2(x, x)

    def tracked():
        with neuron_lab.track():
            for _ in range(n_ops):
                torch.atan2(x, x)

    def window():  # the window's own opening and closing: a cell's cost, not a call's
        with neuron_lab.track():
            pass

    plain(), tracked(), window()
    added = [(_timed(tracked) - _timed(plain) - _timed(window)) / n_ops * 1e6 for _ in range(rounds)]
    out["rows"]["recorded fallback op (call site), added us"] = f"+{statistics.median(added):.1f} us"
    out["fallback_us"] = added
    return out


def import_cost(core: str, rounds: int) -> str:
    """Seconds the autoload adds to `import torch` (interleaved with autoload off), median of rounds."""
    def run(autoload: str) -> float:
        env = {**os.environ, "NEURON_LAB_CORE": core, "TORCH_DEVICE_BACKEND_AUTOLOAD": autoload}
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], env=env, check=True)
        return time.perf_counter() - t

    run("1")
    added = [run("1") - run("0") for _ in range(rounds)]
    return f"+{statistics.median(added):.2f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--figures", help="also write the compiled core's fallback figure here (bench/table.py)")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.rounds)))
        return
    results, fallback_us, ratios = {}, {}, {}
    for core in ("compiled", "python"):
        env = {**os.environ, "NEURON_LAB_CORE": core, "OMP_NUM_THREADS": "1"}
        p = subprocess.run([sys.executable, __file__, "--child", "--rounds", str(args.rounds)], env=env,
                           capture_output=True, text=True)
        if p.returncode:
            sys.exit(f"the {core} core's run failed:\n{p.stderr[-3000:]}")
        out = json.loads(p.stdout.strip().splitlines()[-1])
        results[core], fallback_us[core], ratios[core] = out["rows"], out["fallback_us"], out["ratios"]
        results[core]["`import torch` with the autoload, added s"] = import_cost(core, max(3, args.rounds // 2))
    print("| workload (ratio to CPU eager, same process) | compiled core | pure-Python core | target (compiled) |")
    print("|---|---|---|---|")
    for name, target in TARGETS.items():
        print(f"| {name} | {results['compiled'][name]} | {results['python'][name]} | {target} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(copy.deepcopy(results), f, indent=1)
    # the compiled core's fallback (the figure), and the pure-Python core's ratios for the record (no target:
    # it is the fallback when the compiled core cannot load; the compiled core's ratios are bench/real_models.py's)
    figures.write(args.figures, [
        figures.figure("recorded fallback op (call site), added", fallback_us["compiled"], "us", 3.0),
        *(figures.figure(f"pure-Python core: {name}", xs, "x", None) for name, xs in ratios["python"].items()),
        figures.figure("pure-Python core: recorded fallback op (call site), added", fallback_us["python"], "us", None)])


if __name__ == "__main__":
    main()
