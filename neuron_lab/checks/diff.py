"""Comparing what two runs produced, item by item, the way ``torch.testing.assert_close`` judges it.

A value passes when ``|actual - expected| <= atol + rtol * |expected|`` everywhere, with tolerances
that default by dtype (the less precise of the two sides). Unlike ``assert_close`` it does not stop at
the first problem: it measures every item (max absolute and relative error, the worst element) and
says what differs. NaNs at the same places count as equal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from neuron_lab.report.checks import Item

# torch.testing.assert_close's defaults: (rtol, atol)
_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex32: (1e-3, 1e-5),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}
_PY_FLOAT, _PY_COMPLEX = torch.float32, torch.complex64  # Python numbers mostly come from .item() of 32-bit tensors
MAX_DEPTH = 3


def default_tolerances(*dtypes: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for comparing these dtypes: the loosest of theirs; 0, 0 for integers and bool."""
    pairs = [_TOLERANCES.get(d, (0.0, 0.0)) for d in dtypes]
    return max(p[0] for p in pairs), max(p[1] for p in pairs)


def _name(d: torch.dtype) -> str:
    return str(d).removeprefix("torch.")


def leaves(name: str, obj: Any, depth: int = MAX_DEPTH) -> list[tuple[str, Any]]:
    """The comparable values ``obj`` holds, with a path each: tensors, a module's parameters and
    buffers, an optimizer's state (by parameter index), numbers, and these inside lists, tuples and dicts."""
    if isinstance(obj, torch.Tensor):
        return [(name, obj)]
    if isinstance(obj, (bool, int, float, complex)):
        return [(name, obj)]
    if isinstance(obj, torch.nn.Module):
        return ([(f"{name}.{k}", p) for k, p in obj.named_parameters()] +
                [(f"{name}.{k}", b) for k, b in obj.named_buffers()])
    if isinstance(obj, torch.optim.Optimizer):
        params = [p for g in obj.param_groups for p in g["params"]]
        out = []
        for i, p in enumerate(params):
            for k, v in obj.state.get(p, {}).items():
                out += leaves(f"{name}.state[{i}].{k}", v, 0)
        return out
    if depth <= 0:
        return []
    if isinstance(obj, (list, tuple)):
        return [x for i, v in enumerate(obj) for x in leaves(f"{name}[{i}]", v, depth - 1)]
    if isinstance(obj, Mapping):
        return [x for k, v in obj.items() for x in leaves(f"{name}[{k!r}]", v, depth - 1)]
    return []


def comparable(obj: Any) -> bool:
    return bool(leaves("", obj))


def compare(name: str, var: str, actual: Any, expected: Any, rtol: float | None = None,
            atol: float | None = None) -> Item:
    """One item's verdict and errors; ``rtol``/``atol`` override the dtype defaults (both or neither)."""
    if isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor):
        return _tensors(name, var, actual, expected, rtol, atol)
    numbers = (bool, int, float, complex)
    if isinstance(actual, numbers) and isinstance(expected, numbers) and type(actual) is type(expected):
        exact, judged = {complex: (torch.complex128, _PY_COMPLEX), float: (torch.float64, _PY_FLOAT)}.get(
            type(actual), (torch.int64, torch.int64))
        a, e = torch.tensor(actual, dtype=exact, device="cpu"), torch.tensor(expected, dtype=exact, device="cpu")
        if rtol is None or atol is None:
            rtol, atol = default_tolerances(judged)
        item = _tensors(name, var, a, e, rtol, atol)
        item.actual_dtype = item.expected_dtype = type(actual).__name__
        item.actual_shape = item.expected_shape = None
        return item
    return Item(name, var, False, f"type {type(actual).__name__} vs {type(expected).__name__}",
                actual_dtype=type(actual).__name__, expected_dtype=type(expected).__name__)


def missing(name: str, var: str, side: str) -> Item:
    return Item(name, var, False, f"missing in the {side} run")


def _tensors(name: str, var: str, actual: torch.Tensor, expected: torch.Tensor, rtol: float | None,
             atol: float | None) -> Item:
    item = Item(name, var, False, actual_dtype=_name(actual.dtype), expected_dtype=_name(expected.dtype),
                actual_shape=tuple(actual.shape), expected_shape=tuple(expected.shape), numel=actual.numel())
    if rtol is None or atol is None:
        rtol, atol = default_tolerances(actual.dtype, expected.dtype)
    item.rtol, item.atol = rtol, atol
    if actual.shape != expected.shape:
        item.problem = f"shape {list(actual.shape)} vs {list(expected.shape)}"
        return item
    try:
        a = _host(actual)
        e = _host(expected)
    except Exception as ex:  # sparse layouts, meta tensors, ...
        item.problem = f"not comparable: {type(ex).__name__}: {str(ex).splitlines()[0] if str(ex) else ''}"
        return item
    wide = torch.complex128 if a.is_complex() or e.is_complex() else torch.float64
    a, e = a.to(wide), e.to(wide)
    diff = (a - e).abs()
    nan_a, nan_e = a.isnan(), e.isnan()
    if not wide.is_complex:  # equal infinities are equal (inf - inf is nan)
        same_inf = a.isinf() & (a == e)
        diff = torch.where(same_inf, torch.zeros_like(diff), diff)
    diff = torch.where(nan_a & nan_e, torch.zeros_like(diff), torch.where(nan_a | nan_e, torch.inf, diff))
    diff = torch.nan_to_num(diff, nan=torch.inf)
    scale = e.abs()
    allowed = atol + rtol * torch.nan_to_num(scale, nan=0.0)
    bad = diff > allowed
    rel = torch.where(diff == 0, torch.zeros_like(diff), diff / scale)
    rel = torch.nan_to_num(rel, nan=torch.inf)
    item.mismatched = int(bad.sum())
    item.passed = item.mismatched == 0 and actual.dtype == expected.dtype
    if actual.dtype != expected.dtype:
        item.problem = f"dtype {_name(actual.dtype)} vs {_name(expected.dtype)}"
    if diff.numel():
        excess = torch.where(bad, diff - allowed, torch.full_like(diff, -1.0)) if item.mismatched else diff
        flat = int(excess.reshape(-1).argmax())
        flat_index = torch.tensor(flat, device="cpu")
        item.worst = tuple(int(i) for i in torch.unravel_index(flat_index, diff.shape)) if diff.dim() else ()
        item.max_abs = float(diff.max())
        item.max_rel = float(rel.max())
        item.actual_value = _scalar(a.reshape(-1)[flat])
        item.expected_value = _scalar(e.reshape(-1)[flat])
    else:
        item.max_abs = item.max_rel = 0.0
    return item


def _host(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.layout != torch.strided:
        t = t.to_dense()
    return t.to("cpu")


def _scalar(t: torch.Tensor) -> float | str:
    v = t.item()
    return f"{v:.7g}" if isinstance(v, complex) else float(v)
