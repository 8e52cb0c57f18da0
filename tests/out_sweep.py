"""``out=`` conformance sweep: what PyTorch's ``TestCommon.test_out`` checks, on `neuron` against the CPU.

For each OpInfo entry that supports ``out=`` in float32 on the CPU, each CPU sample (up to MAX_SAMPLES) is
called without ``out=`` on both devices, then into outs made from that result, case by case as test_out makes
them: an ``empty_like`` out and a NaN-filled one (values ignored; strides and data pointer kept), one of the
wrong shape (resized, with PyTorch's resize warning) and a ``long`` one for a floating result (an unsafe cast:
refused). Each case's outcome on `neuron` (raised or not; strides, data pointer and warning) must be the
CPU's, and the values written must agree at the OpInfo's float32 tolerances. On `neuron` a CPU out must also
be refused (a factory called without ``device=`` excepted), as test_out requires of every device but the CPU.
An entry is ``cpu_error`` when no sample's ``out=`` call runs on the CPU (outside the rate's denominator)::

    python tests/out_sweep.py --out out/out_sweep.json
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import opinfo_sweep as common
import torch
from torch.testing import make_tensor

MAX_SAMPLES = 6  # per entry: each sample costs five out= calls on each device
KNOWN_FAILURES = Path(__file__).with_name("out_known_failures.txt")
RESIZE_WARNING = "An output with one or more elements was resized"
_FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128)


def _skips_test_out(op) -> bool:
    """Whether the OpInfo itself skips or xfails test_out on every device (lu writes its out= in Python)."""
    return any(getattr(d, "cls_name", None) == "TestCommon" and getattr(d, "test_name", None) == "test_out"
               and getattr(d, "device_type", None) is None for d in op.decorators)


def entries() -> list:
    """The OpInfo entries of the OpInfo sweep that take ``out=``, but those PyTorch exempts from test_out."""
    return [op for op in common.entries() if op.supports_out and not _skips_test_out(op)]


def _tensors(x: Any) -> list[torch.Tensor] | None:
    """``x`` as a list of tensors, or None when it is neither a tensor nor a sequence of them (test_out skips)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in x):
        return list(x)
    return None


def _like(expected: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    return fn(expected) if isinstance(expected, torch.Tensor) else tuple(fn(t) for t in expected)


def _nan_or_max(t: torch.Tensor) -> torch.Tensor:
    try:
        return torch.full_like(t, torch.iinfo(t.dtype).max)
    except TypeError:
        return torch.full_like(t, float("nan"))


def _wrong_shape(t: torch.Tensor) -> torch.Tensor:
    shape = list(t.shape) or [1]
    shape[-1] += 1
    return make_tensor(shape, dtype=t.dtype, device="cpu")


# test_out's cases, each a transform of the (CPU) result into the outs the op then writes.
CASES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "empty_like": torch.empty_like,
    "nan-filled": _nan_or_max,
    "wrong shape": _wrong_shape,
    "long": lambda t: make_tensor(t.shape, dtype=torch.long, device="cpu"),
}


def _ptrs(out: Any) -> tuple[int, ...]:
    return tuple(t.data_ptr() for t in _tensors(out))


def _strides(out: Any) -> tuple[tuple[int, ...], ...]:
    return tuple(t.stride() for t in _tensors(out))


def _outcome(op, sample, out: Any) -> tuple[tuple, Any]:
    """(what test_out looks at: raised, strides and data pointers kept, resize warned; the out afterwards)."""
    strides, ptrs = _strides(out), _ptrs(out)
    common._seed()
    with warnings.catch_warnings(record=True) as caught, common._time_limit(common.SAMPLE_TIMEOUT_S):
        warnings.simplefilter("always")
        try:
            op(sample.input, *sample.args, **sample.kwargs, out=out)
        except (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError) as e:
            return ("raised", type(e).__name__), None
    warned = any(RESIZE_WARNING in str(w.message) for w in caught)
    return ("ran", _strides(out) == strides, _ptrs(out) == ptrs, warned), out


def _check_sample(op, s, device_sample, want: Any, atol: float, rtol: float) -> str:
    """The first way ``device_sample`` differs from ``s`` under test_out's cases; "" when none does."""
    got = common._call(op, device_sample)[0]
    cases = dict(CASES)
    if not any(t.dtype in _FLOATING for t in _tensors(want)):
        del cases["long"]  # test_out tries the unsafe cast only for floating results
    for case, transform in cases.items():
        cpu_out = _like(want, transform)
        dev_out = _like(cpu_out, common._same_layout)
        cpu_seen, cpu_after = _outcome(op, s, cpu_out)
        dev_seen, dev_after = _outcome(op, device_sample, dev_out)
        if dev_seen != cpu_seen:
            return f"{case} out: {dev_seen} on neuron, {cpu_seen} on the CPU"
        if cpu_after is not None:
            torch.testing.assert_close(_like(dev_after, torch.Tensor.cpu), cpu_after, atol=atol, rtol=rtol,
                                       equal_nan=True, msg=lambda m, case=case: f"{case} out: {m.splitlines()[0]}")
    if not (op.is_factory_function and "device" not in device_sample.kwargs):
        cpu_out = _like(_like(got, torch.Tensor.cpu), torch.empty_like)
        seen, _ = _outcome(op, device_sample, cpu_out)
        if seen[0] != "raised":
            return "a CPU out for neuron inputs was taken, not refused"
    return ""


def run_entry(op, max_samples: int = MAX_SAMPLES) -> common.EntryResult:
    """test_out's cases for the first ``max_samples`` CPU samples of ``op``, on `neuron` against the CPU."""
    key = common.entry_key(op)
    t0 = time.perf_counter()

    def result(status: str, detail: str = "", n: int = 0) -> common.EntryResult:
        return common.EntryResult(key, status, detail, n, round(time.perf_counter() - t0, 4))

    try:
        samples = common._samples(op, "cpu", max_samples)
    except Exception as e:  # noqa: BLE001  (the generator failing on the CPU is a CPU-side verdict)
        return result("cpu_error", "sample_inputs: " + common._first_line(e))
    try:
        likes = common._samples(op, "neuron", max_samples)
    except Exception as e:  # noqa: BLE001
        return result("error", "sample_inputs on neuron: " + common._first_line(e))
    likes += [None] * (len(samples) - len(likes))
    atol, rtol = common.tolerances(op)
    compared, cpu_failure = 0, ""
    for i, (s, like) in enumerate(zip(samples, likes)):
        try:
            device_sample = common._sample_to_device(s, like)
        except Exception as e:  # noqa: BLE001
            return result("error", "moving the sample to neuron: " + common._first_line(e), compared)
        try:
            want = common._call(op, s)[0]
            seen, _ = _outcome(op, s, _like(want, torch.empty_like)) if _tensors(want) is not None else (
                ("not a tensor result, which test_out skips",), None)
        except Exception as e:  # noqa: BLE001
            cpu_failure = common._first_line(e)
            continue
        if seen[0] != "ran":
            cpu_failure = cpu_failure or f"sample {i}: out= on the CPU: {seen}"
            continue
        try:
            problem = _check_sample(op, s, device_sample, want, atol, rtol)
        except AssertionError as e:
            return result("fail", f"sample {i}: {common._first_line(e)}", compared)
        except Exception as e:  # noqa: BLE001
            return result("error", f"sample {i}: {common._first_line(e)}", compared)
        if problem:
            return result("fail", f"sample {i}: {problem}", compared)
        compared += 1
    if not compared:
        return result("cpu_error", cpu_failure or "no samples")
    return result("pass", "", compared)


def sweep(ops: list, max_samples: int = MAX_SAMPLES) -> list[common.EntryResult]:
    """Run entries single-threaded (deterministic reductions, no oversubscription under xdist)."""
    return common.single_threaded(lambda op: run_entry(op, max_samples), ops)


def main(argv: list[str] | None = None) -> int:
    common.run_cli(argv, __doc__, "out/out_sweep.json", entries, sweep, MAX_SAMPLES, KNOWN_FAILURES)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
