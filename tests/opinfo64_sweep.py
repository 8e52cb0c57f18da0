"""OpInfo sweep in float64 under TorchNeuron's 64-bit rule: ``op_db``'s float64 samples on `neuron` against what
TorchNeuron computes for them.

TorchNeuron casts every float64 tensor input but 0-dim ones to float32 before its op runs (``python_ops/base.py``,
``_cast_float64_to_float32``), and the emulator does so by default (``NEURON_LAB_EMULATE_DOWNCAST=1``). So the
reference is the CPU run on those float32 inputs (each keeping its storage, offset and strides), its results in the
dtypes PyTorch gives for float64, compared at the OpInfo's float32 tolerances: a pass shows that the emulator computes
what TorchNeuron computes, not merely something near float64. The ops TorchNeuron registers with
``disable_dtype_autocast`` (copy_, _to_copy, contiguous, cat.out) keep float64, so their entries
(AUTOCAST_DISABLED) are compared with exact float64 instead. Every entry is also compared with exact float64 at
float64's tolerances (the plain comparison): an entry that passes against TorchNeuron's reference but not there
differs only because of the rule (``rule_only``). Statuses, samples and seeding are the float32 sweep's
(``tests/opinfo_sweep.py``); ``tests/test_opinfo64_conformance.py`` runs it in shards. For the full report::

    python tests/opinfo64_sweep.py --out out/opinfo64.json
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import opinfo_sweep as common
import torch
from torch.utils._python_dispatch import TorchDispatchMode

DTYPE = torch.float64
NARROW = torch.float32  # what TorchNeuron computes float64 in
MAX_SAMPLES = 20  # per entry: the float32 sweep covers the samples' breadth; this one the rule on each op
KNOWN_FAILURES = Path(__file__).with_name("opinfo64_known_failures.txt")
# Ops TorchNeuron registers with disable_dtype_autocast (python_ops/copy.py, to_copy.py, contiguous.py,
# xla_ops/concat_xla.py: cat.out, which torch.cat's composite calls on a backend): they keep float64.
KEEP_FLOAT64 = frozenset({"copy_", "_to_copy", "contiguous", "cat"})
# OpInfo entries whose op TorchNeuron registers with disable_dtype_autocast (python_ops/copy.py, to_copy.py,
# contiguous.py, xla_ops/concat_xla.py): float64 stays float64 there.
AUTOCAST_DISABLED = frozenset({"contiguous", "cat", "to", "double", "float", "half", "bfloat16", "bool", "byte",
                               "char", "int", "long", "short", "cfloat", "cdouble", "chalf"})
_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_WIDER = {torch.float32: torch.float64, torch.complex64: torch.complex128}


@dataclass
class EntryResult(common.EntryResult):
    """The verdict against TorchNeuron's reference, and whether the entry agrees with exact float64 too."""

    exact: bool = False  # every sample agrees with exact float64 CPU at float64's tolerances


def entries() -> list:
    """The OpInfo entries that declare float64 support on the CPU, in op_db's (stable) order."""
    from torch.testing._internal.common_methods_invocations import op_db

    return [op for op in op_db if DTYPE in op.supported_dtypes("cpu")]


def _narrow(t: torch.Tensor) -> torch.Tensor:
    """A float64 tensor as TorchNeuron hands it to its kernel: in float32, same layout and storage extent (so
    as_strided and views read the same elements)."""
    whole = torch.empty(0, dtype=DTYPE).set_(t.untyped_storage()).to(NARROW)
    return whole.as_strided(t.shape, t.stride(), t.storage_offset())


def _widen(t: torch.Tensor) -> torch.Tensor:
    """A result computed narrow in the dtype PyTorch gives for float64 (float32 as float64, complex64 as
    complex128), its layout kept."""
    wide = _WIDER.get(t.dtype)
    if wide is None or t.layout != torch.strided:
        return t
    whole = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage()).to(wide)
    return whole.as_strided(t.shape, t.stride(), t.storage_offset())


def _written(func, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors ``func``'s schema says it writes (in-place self, out=)."""
    found = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        v = args[i] if i < len(args) else kwargs.get(a.name)
        found += [t for t in (v if isinstance(v, (list, tuple)) else [v]) if isinstance(t, torch.Tensor)]
    return found


def _decomposes(func) -> bool:
    """Whether a backend without a kernel of its own (`neuron`) runs ``func`` as its composite (randn as empty and
    normal_): the rule then applies to the ops it is made of."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    name = func.name()
    return not has(name, "CPU") and (has(name, "CompositeExplicitAutograd")
                                     or has(name, "CompositeExplicitAutogradNonFunctional"))


class TorchNeuronRule(TorchDispatchMode):
    """TorchNeuron's 64-bit rule on the CPU, op by op where a backend sees ops: each op's float64 tensor arguments
    with dimensions are computed in float32 (``python_ops/base.py``, ``_cast_float64_to_float32``), written ones
    copied back, results in PyTorch's float64 dtypes. Views only relabel memory, and the ops TorchNeuron registers
    with ``disable_dtype_autocast`` keep float64."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket.__name__ in KEEP_FLOAT64 or any(
                r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns):
            return func(*args, **kwargs)
        if _decomposes(func):
            with self:
                return func.redispatch(_CPU_KEYS, *args, **kwargs)
        written = {id(t) for t in _written(func, args, kwargs)}
        flat = torch.utils._pytree.tree_leaves((args, kwargs))
        if not any(isinstance(t, torch.Tensor) and t.dtype == DTYPE and t.dim() != 0 for t in flat):
            return func(*args, **kwargs)
        try:  # an out= of float64 is the op's own float32 result, copied back (base.py keeps it aside)
            return self._narrowed(func, args, kwargs, lambda t: t.dim() != 0 or id(t) in written)
        except RuntimeError:  # a CPU kernel that wants one dtype: a 0-dim float64 joins the float32 ones
            return self._narrowed(func, args, kwargs, lambda t: True)

    @staticmethod
    def _narrowed(func, args: tuple, kwargs: dict, cast: Callable[[torch.Tensor], bool]) -> Any:
        """``func`` on the float64 tensors ``cast`` picks in float32, written ones copied back, results widened."""
        written = {id(t) for t in _written(func, args, kwargs)}
        narrowed: dict[int, tuple[torch.Tensor, torch.Tensor, bool]] = {}  # id(narrow) -> (original, narrow, written)

        def narrow(t):
            if isinstance(t, torch.Tensor) and t.dtype == DTYPE and t.layout == torch.strided and cast(t):
                n = _narrow(t)
                narrowed[id(n)] = (t, n, id(t) in written)
                return n
            return t

        n_args, n_kwargs = torch.utils._pytree.tree_map(narrow, (args, kwargs))
        out = func(*n_args, **n_kwargs)
        for orig, low, was_written in narrowed.values():
            if was_written:
                if orig.shape != low.shape:
                    orig.resize_(low.shape)
                orig.copy_(low)

        def back(r):
            if isinstance(r, torch.Tensor):
                return narrowed[id(r)][0] if id(r) in narrowed else _widen(r)
            return r

        return torch.utils._pytree.tree_map(back, out)


def _clone(x: Any, key: str | None = None) -> Any:
    """A CPU sample value for a second CPU run: a tensor keeps its storage, offset and strides."""
    if not isinstance(x, torch.Tensor) or x.layout != torch.strided:
        return x
    whole = torch.empty(0, dtype=x.dtype).set_(x.untyped_storage()).clone()
    return whole.as_strided(x.shape, x.stride(), x.storage_offset()).requires_grad_(x.requires_grad)


def reference(op, sample) -> tuple[Any, Any]:
    """What TorchNeuron computes for ``sample`` (a CPU sample): the op under TorchNeuronRule."""
    with TorchNeuronRule():
        return common._call(op, sample)


def run_entry(op, max_samples: int = MAX_SAMPLES) -> EntryResult:
    """Compare the first ``max_samples`` float64 CPU samples of ``op`` on `neuron` against TorchNeuron's reference."""
    key = common.entry_key(op)
    t0 = time.perf_counter()

    def result(status: str, detail: str = "", n: int = 0, exact: bool = False) -> EntryResult:
        return EntryResult(key, status, detail, n, round(time.perf_counter() - t0, 4), exact)

    try:
        samples = common._samples(op, "cpu", max_samples, DTYPE)
    except Exception as e:  # noqa: BLE001  (the generator failing on the CPU is a CPU-side verdict)
        return result("cpu_error", "sample_inputs: " + common._first_line(e))
    try:
        likes = common._samples(op, "neuron", max_samples, DTYPE)
    except Exception as e:  # noqa: BLE001  (making the same samples on the device is part of conformance)
        return result("error", "sample_inputs on neuron: " + common._first_line(e))
    likes += [None] * (len(samples) - len(likes))
    cases, cpu_failure = [], ""
    for s, like in zip(samples, likes):
        try:
            device_sample = common._sample_to_device(s, like)  # before the CPU calls, which may mutate their inputs
        except Exception as e:  # noqa: BLE001
            return result("error", "moving the sample to neuron: " + common._first_line(e), len(cases))
        again = copy.copy(s)
        again.input, again.args, again.kwargs = (common._map(v, _clone) for v in (s.input, s.args, s.kwargs))
        try:
            exact = common._call(op, s)
            want = exact if op.name in AUTOCAST_DISABLED else reference(op, again)
        except Exception as e:  # noqa: BLE001
            cpu_failure = common._first_line(e)
            continue
        cases.append((s, device_sample, want, exact))
    if not cases:
        return result("cpu_error", cpu_failure or "no samples")
    agrees_exactly, tolerance = True, DTYPE if op.name in AUTOCAST_DISABLED else NARROW
    for i, (s, device_sample, want, exact) in enumerate(cases):
        try:
            got = common._call(op, device_sample)
        except Exception as e:  # noqa: BLE001
            return result("error", f"sample {i}: {common._first_line(e)}", i)
        try:
            common._compare(op, s, got, want, tolerance)
        except Exception as e:  # noqa: BLE001  (a mismatch, or results of different structure)
            return result("fail", f"sample {i}: {common._first_line(e)}", i)
        if agrees_exactly:
            try:
                common._compare(op, s, got, exact, DTYPE)
            except Exception:  # noqa: BLE001
                agrees_exactly = False
    return result("pass", "", len(cases), agrees_exactly)


def sweep(ops: list, max_samples: int = MAX_SAMPLES) -> list[EntryResult]:
    """Every entry's verdict, in order."""
    return common.single_threaded(lambda op: run_entry(op, max_samples), ops)


def summarize(results: list[EntryResult]) -> dict[str, Any]:
    """The float32 sweep's summary, and how many passing entries differ from exact float64 only by the rule."""
    report = common.summarize(results)
    report["exact"] = sum(r.status == "pass" and r.exact for r in results)
    report["rule_only"] = sorted(r.key for r in results if r.status == "pass" and not r.exact)
    return report


def main(argv: list[str] | None = None) -> int:
    report = common.run_cli(argv, __doc__, "out/opinfo64.json", entries, sweep, MAX_SAMPLES, KNOWN_FAILURES, summarize)
    print(f"exact: {report['exact']}, differ only by the 64-bit rule: {len(report['rule_only'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
