"""TorchNeuron's 64-bit rule for int64, in the pure-Python core (the compiled core's twin is in ``dispatch.cpp``).

A device kernel on TorchNeuron takes int64 tensors as int32 (``python_ops/dtype_autocast.py:52-70``: every
non-0-dim int64 tensor and every int64 tensor of a list) and gives its int32 result back as int64 (torch-mlir's
``kernel.py:480-515``; the XLA kernels' ``kernels/type_converter.py:15-19``). The emulator computes in int64 on
inputs wrapped to int32 and wraps the int64 results: the values int32 gives, exactly for ring ops (add, mul, sum,
cumsum, neg). Values that fit in int32 are untouched, so the cost of an ordinary call is one range check per int64
tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from typing import Any

import torch
from torch import Tensor

_INT32 = torch.iinfo(torch.int32)


def fits(t: Tensor) -> bool:
    """Whether every value of an int64 host tensor fits in int32 (the cheap path: nothing to wrap)."""
    if not t.numel() or t.layout != torch.strided:  # a sparse result is refused as the device's anyway
        return True
    lo, hi = torch.aminmax(t)
    return _INT32.min <= int(lo) and int(hi) <= _INT32.max


def _wrapped(t: Tensor) -> Tensor:
    return t.to(torch.int32).to(torch.int64)


def _input(a: Any, written: bool, cast: list[bool], in_list: bool = False) -> Any:
    if isinstance(a, Tensor):
        if a.dtype != torch.int64 or (a.dim() == 0 and not in_list):
            return a
        cast[0] = True
        if fits(a):
            return a
        if written:  # an in-place self or an out=: its device bytes hold the wrapped values, as TorchNeuron's do
            return a.copy_(a.to(torch.int32))
        return _wrapped(a)
    if isinstance(a, (list, tuple)) and any(isinstance(b, Tensor) for b in a):
        return type(a)(_input(b, written, cast, True) for b in a)
    return a


def wrap_inputs(hargs: list, hkwargs: dict, writes: Container[int | str]) -> bool:
    """Give the kernel its int64 host arguments as TorchNeuron's autocast gives them: wrapped to int32. Whether
    there was one it casts (a call on 0-dim int64 tensors alone is not cast: its results stay exact too)."""
    cast = [False]
    for i, a in enumerate(hargs):
        hargs[i] = _input(a, i in writes, cast)
    for k, v in hkwargs.items():
        hkwargs[k] = _input(v, k in writes, cast)
    return cast[0]


def wrap_results(out: Any, written: list[Tensor], to_host: Callable[[Tensor], Tensor]) -> Any:
    """The int64 results as TorchNeuron restores its int32 ones: new results wrapped, written device tensors
    (``written``) wrapped in place."""
    for dev in written:
        h = to_host(dev)
        if h.dtype == torch.int64 and not fits(h):
            h.copy_(h.to(torch.int32))

    def wrap(r: Any) -> Any:
        if isinstance(r, Tensor):
            return _wrapped(r) if r.dtype == torch.int64 and not fits(r) else r
        if isinstance(r, (list, tuple)):
            return type(r)(wrap(x) for x in r)
        return r

    return wrap(out)
