"""ModuleInfo conformance sweep: PyTorch's own ``module_db`` on `neuron`, forward and backward, against the CPU.

What PyTorch's ``TestModule.test_cpu_gpu_parity`` checks, with `neuron` in CUDA's place: each ModuleInfo entry,
per dtype (float32, float64) and mode (train, eval), builds its CPU module inputs (up to MAX_SAMPLES), builds
the module twice from the same constructor input, copies the CPU parameters and buffers into the device
module, and compares the forward outputs, then one backward's input and parameter gradients, under the same
seed on both sides. An entry is ``cpu_error`` when no sample runs on the CPU (outside the rate's
denominator), ``pass`` when every sample agrees, ``fail`` on a mismatch and ``error`` when the device raises.

Under TorchNeuron's 64-bit rule (the default; ``NEURON_LAB_EMULATE_DOWNCAST=0``, read when the emulator installs,
so in a process of its own, keeps 64-bit exact) float64 modules compute in float32, and are compared at float32's
tolerances; their expected differences are the ``downcast:`` lines of the known-failures file. For the full
report::

    python tests/moduleinfo_sweep.py --out out/moduleinfo.json
"""

from __future__ import annotations

import argparse
import copy
import itertools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import opinfo_sweep as common
import torch

MAX_SAMPLES = 12  # per entry: all of most modules' inputs; the transformer and RNN ones are capped
DTYPES = (torch.float32, torch.float64)
MODES = ("train", "eval")
KNOWN_FAILURES = Path(__file__).with_name("moduleinfo_known_failures.txt")
DOWNCAST = "downcast"  # the prefix of a key swept with the 64-bit rule on


@dataclass(frozen=True)
class Entry:
    """One ModuleInfo entry in one dtype and mode."""

    info: Any  # torch.testing._internal.common_modules.ModuleInfo
    dtype: torch.dtype
    mode: str

    @property
    def key(self) -> str:
        return f"{self.info.name}.{self.mode}.{str(self.dtype).removeprefix('torch.')}"


def emulates_downcast() -> bool:
    """Whether this process's emulator computes float64 in float32 (TorchNeuron's 64-bit rule)."""
    import neuron_lab  # noqa: F401  (installs the backend)
    from neuron_lab.backend.emulator import runtime

    return bool(runtime.get().emulate_downcast)


def key_of(entry: Entry, downcast: bool) -> str:
    return f"{DOWNCAST}:{entry.key}" if downcast else entry.key


def entries() -> list[Entry]:
    """Every ModuleInfo entry per dtype it declares on the CPU and per mode, in module_db's (stable) order."""
    from torch.testing._internal.common_modules import module_db

    return [Entry(info, dtype, mode) for info in module_db for dtype in DTYPES for mode in MODES
            if dtype in info.dtypes and (mode == "train" or info.train_and_eval_differ)]


def _to_device(x: Any, memo: dict[int, torch.Tensor] | None = None) -> Any:
    """A CPU forward input on `neuron`: detached copies keeping requires_grad, as test_cpu_gpu_parity makes them.

    A tensor passed twice (KLDivLoss's input as its own target) is one device tensor, so its gradient sums both.
    """
    memo = {} if memo is None else memo
    if isinstance(x, torch.Tensor):
        if id(x) not in memo:
            memo[id(x)] = x.detach().to("neuron").requires_grad_(x.requires_grad)
        return memo[id(x)]
    if isinstance(x, (list, tuple)) and not isinstance(x, torch.Size):
        items = [_to_device(v, memo) for v in x]
        return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
    if isinstance(x, dict):
        return {k: _to_device(v, memo) for k, v in x.items()}
    return copy.deepcopy(x)


def _leaves(x: Any) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


def _build(entry: Entry, module_input, device: str, fwd: tuple) -> torch.nn.Module:
    args, kwargs = module_input.constructor_input.args, module_input.constructor_input.kwargs
    common._seed()
    m = entry.info.module_cls(*args, **kwargs).to(entry.dtype).to(device)
    m.train(entry.mode == "train")
    if isinstance(m, torch.nn.modules.lazy.LazyModuleMixin):
        with torch.no_grad():
            m(*fwd[0], **fwd[1])
    return m


def _run(entry: Entry, module_input, fwd: tuple, device: str, state: dict | None) -> tuple[dict, dict]:
    """Build on ``device`` (with ``state``'s values, when given), run ``fwd`` and one backward; what to compare."""
    m = _build(entry, module_input, device, fwd)
    if state is not None:
        with torch.no_grad():
            for name, t in m.state_dict(keep_vars=True).items():
                t.copy_(state[name])
    before = {k: v.detach().cpu().clone() for k, v in m.state_dict().items()}
    inputs = _leaves(fwd)
    for t in inputs:
        if t.requires_grad:
            t.retain_grad()  # non-leaf CPU inputs (a var made by abs()) are leaves on the device: compare both
    common._seed()
    with common._time_limit(common.SAMPLE_TIMEOUT_S):
        out = m(*fwd[0], **fwd[1])
        outs = [o for o in _leaves(out) if o.requires_grad]
        common._seed()
        grads_out = [torch.randn(o.shape, dtype=o.dtype) for o in outs]
        if outs:
            torch.autograd.backward(outs, [g.to(o.device) for g, o in zip(grads_out, outs)])
    result = {
        "forward": [o.detach().cpu() for o in _leaves(out)],
        "input grads": [None if t.grad is None else t.grad.cpu() for t in inputs],
        "parameter grads": [None if p.grad is None else p.grad.cpu() for p in m.parameters()],
        "buffers": [b.detach().cpu() for b in m.buffers()],
    }
    return before, result


def _summary(message: str) -> str:
    """assert_close's message on one line: what differs and by how much."""
    return " ".join(line.strip() for line in message.splitlines() if line.strip())


def run_entry(entry: Entry, downcast: bool = False, max_samples: int = MAX_SAMPLES) -> common.EntryResult:
    """Compare the first ``max_samples`` CPU module inputs of ``entry`` on `neuron` against the CPU."""
    key = key_of(entry, downcast)
    t0 = time.perf_counter()

    def result(status: str, detail: str = "", n: int = 0) -> common.EntryResult:
        return common.EntryResult(key, status, detail, n, round(time.perf_counter() - t0, 4))

    try:
        common._seed()
        with common._time_limit(common.SAMPLE_TIMEOUT_S):
            inputs = list(itertools.islice(entry.info.module_inputs_func(
                entry.info, device="cpu", dtype=entry.dtype, requires_grad=True, training=entry.mode == "train"),
                max_samples))
    except Exception as e:  # noqa: BLE001  (the generator failing on the CPU is a CPU-side verdict)
        return result("cpu_error", "module_inputs: " + common._first_line(e))
    # under the 64-bit rule float64 is computed in float32, so float32's tolerances apply
    atol, rtol = common.DEFAULT_TOLERANCES[torch.float32 if downcast else entry.dtype]
    compared, cpu_failure = 0, ""
    for i, module_input in enumerate(inputs):
        if module_input.forward_input is None:
            continue
        fwd = (module_input.forward_input.args, module_input.forward_input.kwargs)
        try:
            device_fwd = _to_device(fwd)  # before the CPU run, which may write its inputs
        except Exception as e:  # noqa: BLE001
            return result("error", f"input {i}: moving it to neuron: {common._first_line(e)}", compared)
        try:
            state, want = _run(entry, module_input, fwd, "cpu", None)
        except Exception as e:  # noqa: BLE001
            cpu_failure = common._first_line(e)
            continue
        try:
            _, got = _run(entry, module_input, device_fwd, "neuron", state)
        except Exception as e:  # noqa: BLE001
            return result("error", f"input {i}: {common._first_line(e)}", compared)
        try:
            for what in want:
                torch.testing.assert_close(got[what], want[what], atol=atol, rtol=rtol, equal_nan=True,
                                           msg=lambda m, what=what: f"{what}: {_summary(m)}")
        except Exception as e:  # noqa: BLE001  (a mismatch, or results of different structure)
            return result("fail", f"input {i}: {common._first_line(e)}", compared)
        compared += 1
    if not compared:
        return result("cpu_error", cpu_failure or "no forward inputs")
    return result("pass", "", compared)


def sweep(items: list[Entry], max_samples: int = MAX_SAMPLES) -> list[common.EntryResult]:
    """Run entries single-threaded (deterministic reductions, no oversubscription under xdist)."""
    downcast = emulates_downcast()
    # oneDNN's convolutions sum in an order that follows the buffers' alignment, which device memory does not share
    with torch.backends.mkldnn.flags(enabled=False):
        return common.single_threaded(lambda e: run_entry(e, downcast, max_samples), items)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("out/moduleinfo.json"))
    p.add_argument("--samples", type=int, default=MAX_SAMPLES)
    p.add_argument("--dtype", choices=[str(d).removeprefix("torch.") for d in DTYPES], help="one dtype only")
    p.add_argument("--only", nargs="*", help="module names to run (default: all)")
    a = p.parse_args(argv)
    items = [e for e in entries() if (not a.only or e.info.name in a.only)
             and (not a.dtype or e.dtype == getattr(torch, a.dtype))]
    t0 = time.perf_counter()
    report = common.summarize(sweep(items, a.samples))
    report["wall_seconds"] = round(time.perf_counter() - t0, 2)
    report["downcast"] = emulates_downcast()
    common.publish(a.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
