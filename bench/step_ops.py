"""Which ops of a model's training step cost most over CPU eager on `neuron`, and through which path of the core.

One AdamW step of each tiny model (bench/model_zoo.py's builders, bench/real_models.py's step) runs on `neuron`
under a ``TorchDispatchMode`` that counts each ATen op with a device tensor among its arguments or results (the
ops as they reach the backend, below autograd) by its tensors' dtypes and devices (an int64 add takes the 64-bit
rule's path, a float32 one the typed kernel) and keeps each such class's first call. Each is then replayed,
under valgrind's callgrind (bench/callgrind.py), ``--calls`` times on `neuron` and the same times on CPU copies of
its arguments (same sizes, strides and offsets), after uncounted calls: on `neuron` until the op is past the core's
256 signature probes (``--warm`` calls for an op the core does not count itself, a composite's), the steady state a
training loop sees; on the CPU a few. An op's extra instructions per call times its calls per step ranks
it. The path is the core's: a typed kernel (csrc/aten/unboxed.cpp), the boxed fallback (``run()`` in
csrc/aten/dispatch.cpp, registered directly or as the catch-all fallback), a backend kernel (csrc/aten/kernels.cpp:
copies, allocation, views) or an ATen composite (views and decompositions, whose inner ops take one of the others).

    python bench/step_ops.py [--models gpt2,llama,bert] [--calls 30] [--warm 260] [--top 15]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys

import callgrind
import model_zoo
import real_models
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

import neuron_lab  # noqa: F401  (activates the emulator when autoload is off)
from neuron_lab.backend.emulator import _core
from neuron_lab.backend.emulator.runtime import direct_ops

MARK = "STEP_OPS "  # the counted child's result line


class _Census(TorchDispatchMode):
    """Counts the step's device ops and keeps each one's first call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: collections.Counter = collections.Counter()
        self.first: dict = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if any(isinstance(t, torch.Tensor) and t.device.type == "neuron" for t in tree_leaves((args, kwargs, out))):
            key = (func, tuple((t.dtype, t.device.type) for t in tree_leaves((args, kwargs))
                               if isinstance(t, torch.Tensor)))
            self.calls[key] += 1
            self.first.setdefault(key, (args, kwargs))
        return out


def _name(func) -> str:
    s = func._schema
    return s.name.removeprefix("aten::") + (f".{s.overload_name}" if s.overload_name else "")


def path_of(func) -> str:
    """The core's path for `func` on `neuron`."""
    qual = func._schema.name + (f".{func._schema.overload_name}" if func._schema.overload_name else "")
    name = _name(func)
    if name in set(_core.typed_ops()):
        return "typed"
    if torch._C._dispatch_has_kernel_for_dispatch_key(qual, "PrivateUse1"):
        return "boxed" if name in direct_ops() else "backend kernel"
    if torch._C._dispatch_has_kernel_for_dispatch_key(qual, "CompositeExplicitAutograd"):
        return "composite"
    return "boxed"


def _on_cpu(args, kwargs):
    """CPU copies of a call's arguments, each tensor over a copy of its storage with its own layout."""
    storages: dict = {}

    def cpu(v):
        if isinstance(v, torch.device) and v.type == "neuron":
            return torch.device("cpu")
        if not isinstance(v, torch.Tensor) or v.device.type != "neuron":
            return v
        key = v.untyped_storage().data_ptr()
        if key not in storages:
            storages[key] = v.untyped_storage().cpu()
        t = torch.empty(0, dtype=v.dtype).set_(storages[key], v.storage_offset(), v.size(), v.stride())
        return t.requires_grad_(v.requires_grad) if v.is_leaf and v.dtype.is_floating_point else t

    return tree_map(cpu, args), {k: tree_map(cpu, x) for k, x in kwargs.items()}


def _warm_calls(func, most: int) -> int:
    """Calls that take `func` past the core's signature probes (``most`` when the core does not count it)."""
    s = func._schema
    seen = sum(row[4] for row in _core.op_rows() if (row[0], row[1]) == (s.name, s.overload_name))
    return max(3, most - seen) if seen else most


def counted(models: list[str], calls: int, warm: int) -> None:
    torch.set_num_threads(1)
    result = {}
    for model in models:
        torch.manual_seed(0)
        step = real_models.stepper(*model_zoo.ZOO[model][1](), "neuron")
        for _ in range(3):
            step()
        census = _Census()
        with census:
            step()
        rows = []
        for i, (key, n) in enumerate(census.calls.most_common()):
            func, (args, kwargs) = key[0], census.first[key]
            on = {"neuron": (args, kwargs), "cpu": _on_cpu(args, kwargs)}
            with torch.no_grad():
                for dev, (a, k) in on.items():
                    for _ in range(_warm_calls(func, warm) if dev == "neuron" else 3):
                        func(*a, **k)
                    with callgrind.count(f"{model}|{i}|{dev}"):
                        for _ in range(calls):
                            func(*a, **k)
            rows.append({"op": _name(func), "path": path_of(func), "calls": n, "key": f"{model}|{i}"})
        result[model] = rows
    print(MARK + json.dumps(result))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt2,llama,bert")
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--warm", type=int, default=260)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--json", help="also write every op's row here")
    ap.add_argument("--counted", action="store_true", help=argparse.SUPPRESS)  # the run under callgrind
    args = ap.parse_args()
    if args.counted:
        counted(args.models.split(","), args.calls, args.warm)
        return
    if why := callgrind.missing():
        sys.exit(why)
    dumps, out = callgrind.run([__file__, "--counted", "--models", args.models, "--calls", str(args.calls),
                                "--warm", str(args.warm)])
    result = json.loads(next(line for line in out.splitlines() if line.startswith(MARK))[len(MARK):])
    for model, classes in result.items():
        ops: dict = {}  # an op's classes together, each weighted by its calls
        for c in classes:
            cpu, dev = (dumps[f"{c['key']}|{d}"][0][1] / args.calls for d in ("cpu", "neuron"))
            r = ops.setdefault(c["op"], {"op": c["op"], "path": c["path"], "calls": 0, "cpu": 0.0, "neuron": 0.0})
            r["calls"] += c["calls"]
            r["cpu"] += cpu * c["calls"]
            r["neuron"] += dev * c["calls"]
        for r in ops.values():
            r.update(step=r["neuron"] - r["cpu"], cpu=r["cpu"] / r["calls"], neuron=r["neuron"] / r["calls"])
            r["extra"] = r["neuron"] - r["cpu"]
        result[model] = rows = sorted(ops.values(), key=lambda r: -r["step"])
        by_path: collections.Counter = collections.Counter()
        for r in rows:
            by_path[r["path"]] += r["step"]
        total = sum(r["step"] for r in rows)
        print(f"\n{model}: {sum(r['calls'] for r in rows)} device op calls a step, {total / 1e6:.2f} M extra "
              f"instructions over CPU eager (" + ", ".join(f"{p} {v / 1e6:.2f} M" for p, v in by_path.most_common())
              + ")")
        print("| op | path | calls a step | CPU instr a call | `neuron` instr a call | extra a call | extra a step |")
        print("|---|---|---|---|---|---|---|")
        for r in rows[:args.top]:
            print(f"| `{r['op']}` | {r['path']} | {r['calls']} | {r['cpu']:,.0f} | {r['neuron']:,.0f} | "
                  f"{r['extra']:,.0f} | {r['step'] / 1e3:,.0f} k |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
