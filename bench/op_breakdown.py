"""Where a 64x64 add's instructions go, step by step, on `neuron` (compiled core) and on CPU eager.

Each device runs in a child under valgrind's callgrind (``bench/callgrind.py`` marks the counted stretch: ``N`` adds
after ``warm`` warm-up ones, single-threaded); ``callgrind_annotate --inclusive=yes`` gives each function's
inclusive instructions, and a step is one function's, or the difference of two nested ones. Instructions, not time:
a busy machine does not change them. The warm-up decides whether the op's first 256 calls, which probe their
signatures, are counted (``--warm 20``) or not (the default, the steady state a training loop sees).

    python bench/op_breakdown.py [--warm 300] [--calls 200]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import callgrind  # bench/ is the script directory

# (step, the function whose inclusive count it is, the nested function whose count is taken off), per device; a
# pattern is a substring of callgrind's symbol.
BINDING = ("torch::autograd::THPVariable_add(", "at::_ops::add_Tensor::call(")
AUTOGRAD = ("VariableType::(anonymous namespace)::add_Tensor(", "at::_ops::add_Tensor::redispatch(")
STEPS = {
    "neuron": [
        ("Python binding (argument parsing, wrapping the result)", *BINDING),
        ("autograd (VariableType)", *AUTOGRAD),
        ("dispatch to the PrivateUse1 kernel", "at::_ops::add_Tensor::redispatch(", "neuron_lab::direct("),
        ("the CPU kernel: at::cpu::add (meta, TensorIterator, output allocation, loop)", "at::cpu::add(", None),
        ("the CPU kernel: at::cpu::add_out into the result's block (meta, TensorIterator, resize, loop)",
         "at::cpu::add_out(", None),
        ("host aliases of the inputs (the blocks' cached CPU tensors)", "neuron_lab::host(", None),
        ("the result as device memory: block, StorageImpl, TensorImpl", "neuron_lab::presented(", None),
        ("the result's device memory first: block, StorageImpl, emptied alias (pooled)", "neuron_lab::pooled(", None),
        ("the result's device TensorImpl (settled)", "neuron_lab::settled(", None),
        ("  of which the allocator's block (register_block)", "NeuronAllocator::register_block(", None),
        ("freeing the result (THPVariable_dealloc)", "THPVariable_dealloc(", None),
        ("  of which the allocator's release", "NeuronAllocator::release(", None),
        ("the typed kernel's own: plain-path check, kind, count, clocks, probes", "neuron_lab::direct(",
         ["neuron_lab::presented(", "at::cpu::add(", "at::cpu::add_out(", "neuron_lab::host(", "neuron_lab::pooled(",
          "neuron_lab::settled("]),
    ],
    "cpu": [
        ("Python binding (argument parsing, wrapping the result)", *BINDING),
        ("autograd (VariableType)", *AUTOGRAD),
        ("dispatch to the CPU kernel", "at::_ops::add_Tensor::redispatch(", "wrapper_CPU_add_Tensor("),
        ("the CPU kernel: at::cpu::add (meta, TensorIterator, output allocation, loop)", "wrapper_CPU_add_Tensor(",
         None),
        ("freeing the result (THPVariable_dealloc)", "THPVariable_dealloc(", None),
    ],
}
LINE = re.compile(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)$")


def child(device: str, warm: int, calls: int) -> None:
    import torch

    import neuron_lab  # noqa: F401  (activates the emulator when autoload is off)

    torch.set_num_threads(1)
    x, y = torch.randn(64, 64, device=device), torch.randn(64, 64, device=device)
    for _ in range(warm):
        x + y
    with callgrind.count(device):
        for _ in range(calls):
            x + y


def inclusive(out_file: Path) -> tuple[int, dict[str, int]]:
    """The dump's total instructions and each function's inclusive count."""
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(out_file)],
                          capture_output=True, text=True, check=True).stdout
    total = int(re.search(r"^([\d,]+) .*PROGRAM TOTALS", text, re.M).group(1).replace(",", ""))
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if m := LINE.match(line):
            counts.setdefault(m.group(2), int(m.group(1).replace(",", "")))
    return total, counts


def _find(counts: dict[str, int], pattern: str) -> int:
    return max((n for name, n in counts.items() if pattern in name), default=0)


def measure(device: str, warm: int, calls: int) -> dict[str, float]:
    """Instructions per add, by step, for one device."""
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={d}/cg",
                        sys.executable, __file__, "--child", device, "--warm", str(warm), "--calls", str(calls)],
                       env=env, capture_output=True, text=True, check=True, timeout=1800)
        dumps = [f for f in Path(d).glob("cg.*") if f.name != "cg"]
        total, counts = inclusive(max(dumps, key=lambda f: f.stat().st_size))
    rows = {"total": total / calls}
    for step, outer, inner in STEPS[device]:
        inners = inner if isinstance(inner, list) else [inner] if inner else []
        rows[step] = (_find(counts, outer) - sum(_find(counts, i) for i in inners)) / calls
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warm", type=int, default=300)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.warm, args.calls)
        return
    if why := callgrind.missing():
        sys.exit(why)
    results = {dev: measure(dev, args.warm, args.calls) for dev in ("cpu", "neuron")}
    print(f"instructions per 64x64 add, {args.calls} adds after {args.warm}")
    print("| step | CPU eager | `neuron` |")
    print("|---|---|---|")
    steps = dict.fromkeys([s for dev in ("cpu", "neuron") for s, _, _ in STEPS[dev]])
    for step in steps:
        cells = [f"{results[dev][step]:,.0f}" if step in results[dev] else "-" for dev in ("cpu", "neuron")]
        print(f"| {step} | {' | '.join(cells)} |")
    cpu, dev = results["cpu"]["total"], results["neuron"]["total"]
    print(f"| **total** | **{cpu:,.0f}** | **{dev:,.0f}** ({dev / cpu:.3f}x) |")


if __name__ == "__main__":
    main()
