"""Comparing what two runs produced, item by item, the way ``torch.testing.assert_close`` judges it.

:func:`compared` is the one entry: it picks what to compare, walks it down to tensors and numbers, and
returns an :class:`Item` for each and a :class:`Step` for each training step (the loss ``backward()`` was
called on); :mod:`neuron_lab.checks.agreement` judges the lot. A value passes when
``|actual - expected| <= atol + rtol * |expected|`` everywhere, with tolerances that default by dtype
(the less precise of the two sides). Unlike ``assert_close`` it does not stop at the first problem: it
measures every item (max absolute and relative error, the worst element) and says what differs. NaNs at
the same places count as equal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from neuron_lab.checks.runs import Loss, Run, Subject
from neuron_lab.report.checks import Item, Step

LAST = "last value"  # the item name of the code's last expression

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


def compared(subject: Subject, before: Mapping[str, Any], actual: Run, expected: Run, labels: tuple[str, str], *,
             names: tuple[str, ...] = (), rtol: float | None = None,
             atol: float | None = None) -> tuple[list[Item], list[Step]]:
    """What two finished runs produced, item by item (``names`` only when given, else what :func:`outputs` finds
    and the last value), and the loss of each training step both took; ``rtol``/``atol`` override the dtype
    defaults (both or neither). ``labels`` name the runs (``("neuron:0", "cpu")``) in "missing in" problems."""
    here, there = actual.namespace, expected.namespace
    items = [i for n in names or outputs(subject, before, here, there)
             for i in _variable(n, here, there, labels, rtol, atol)]
    if not names and not subject.last_is_name() and (comparable(actual.value) or comparable(expected.value)):
        items += _values(LAST, "", actual.value, expected.value, labels, rtol, atol)
    return items, _steps(actual.losses, expected.losses, rtol, atol)


def outputs(subject: Subject, before: Mapping[str, Any], *namespaces: Mapping[str, Any]) -> list[str]:
    """Names to compare: those the code mentions or creates, holding tensors, modules, optimizers or numbers."""
    order = [*subject.names(), *(n for ns in namespaces for n in ns if n not in before)]
    return [n for n in dict.fromkeys(order) if subject.visible(n)
            and any(n in ns and comparable(ns[n]) for ns in namespaces)]


def _variable(name: str, actual: Mapping[str, Any], expected: Mapping[str, Any], labels: tuple[str, str],
              rtol: float | None, atol: float | None) -> list[Item]:
    """The items of one variable of the two namespaces."""
    here, there = name in actual, name in expected
    if not here and not there:
        return [Item(name, name, False, "not defined after either run")]
    if not there:
        return [_missing(name, name, labels[1])]
    if not here:
        return [_missing(name, name, labels[0])]
    return _values(name, name, actual[name], expected[name], labels, rtol, atol)


def _values(name: str, var: str, actual: Any, expected: Any, labels: tuple[str, str], rtol: float | None,
            atol: float | None) -> list[Item]:
    """The items of one value in both runs: its leaves, path by path."""
    la, le = dict(leaves(name, actual)), dict(leaves(name, expected))
    if not la and not le:  # named with --vars, holding something else: compare by ==
        try:
            same = bool(actual == expected)
        except Exception:
            same = False
        return [Item(name, var, same, None if same else "values differ", actual_value=repr(actual)[:60],
                     expected_value=repr(expected)[:60])]
    out = []
    for path in dict.fromkeys([*la, *le]):
        if path not in le:
            out.append(_missing(path, var, labels[1]))
        elif path not in la:
            out.append(_missing(path, var, labels[0]))
        else:
            out.append(_leaf(path, var, la[path], le[path], rtol, atol))
    return out


def _steps(actual: list[Loss], expected: list[Loss], rtol: float | None, atol: float | None) -> list[Step]:
    """The loss of each training step both runs took, judged as a number of its dtype."""
    out = []
    for n, (a, e) in enumerate(zip(actual, expected), start=1):
        r, t = (rtol, atol) if rtol is not None and atol is not None else default_tolerances(a.dtype, e.dtype)
        out.append(Step(n, a.value, e.value, abs(a.value - e.value) <= t + r * abs(e.value), a.site))  # NaN fails
    return out


def _leaf(name: str, var: str, actual: Any, expected: Any, rtol: float | None, atol: float | None) -> Item:
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


def _past_int32(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether int64 values apart are TorchNeuron's 64-bit rule's: the expected ones go past int32, or the actual
    ones are the expected wrapped to int32."""
    info = torch.iinfo(torch.int32)
    return bool(((expected < info.min) | (expected > info.max)).any()) or bool(
        (actual == expected.to(torch.int32).to(torch.int64)).all())


def _missing(name: str, var: str, side: str) -> Item:
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
    ints = (a, e) if a.dtype == e.dtype == torch.int64 else None
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
    elif item.mismatched and actual.dtype == torch.float64:
        r32, a32 = _TOLERANCES[torch.float32]
        item.within_float32 = not bool((diff > max(atol, a32) + max(rtol, r32) * scale).any())
    elif item.mismatched and ints is not None:
        item.int32_wrap = _past_int32(*ints)
    if diff.numel():
        excess = torch.where(bad, diff - allowed, torch.full_like(diff, -1.0)) if item.mismatched else diff
        flat = int(excess.reshape(-1).argmax())
        item.worst = _unravel(flat, diff.shape)
        item.max_abs = float(diff.max())
        item.max_rel = float(rel.max())
        item.actual_value = _scalar(a.reshape(-1)[flat])
        item.expected_value = _scalar(e.reshape(-1)[flat])
        floats = actual.dtype.is_floating_point and expected.dtype.is_floating_point
        if item.mismatched and floats:  # how far over, and what would pass: a rounding gap, or a real one
            item.over = float((diff / allowed).max())
            item.atol_needed = float((diff - rtol * scale).max())
    else:
        item.max_abs = item.max_rel = 0.0
    return item


def _unravel(flat: int, shape: torch.Size) -> tuple[int, ...]:
    """The index of element ``flat`` of a tensor of ``shape``, as ``torch.unravel_index`` gives it (which imports
    sympy at its first call: most of a second of the first check's)."""
    index = []
    for n in reversed(shape):
        flat, i = divmod(flat, n)
        index.append(i)
    return tuple(reversed(index))


def _host(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.layout != torch.strided:
        t = t.to_dense()
    return t.to("cpu")


def _scalar(t: torch.Tensor) -> float | str:
    v = t.item()
    return f"{v:.7g}" if isinstance(v, complex) else float(v)


def mark_unchanged(items: list[Item], before: Mapping[str, Any], after: Mapping[str, Any]) -> None:
    """Flag the items a run left as it found them (``before``: the objects it ran on copies of), so a report can
    put what the run made or changed first."""
    for var in {i.var for i in items if i.var in before and i.var in after}:
        old, new = dict(leaves(var, before[var])), dict(leaves(var, after[var]))
        for i in items:
            if i.var == var and i.name in old and i.name in new:
                i.unchanged = _same(old[i.name], new[i.name])


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return (a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
                and bool(torch.equal(a.detach(), b.detach())))
    return type(a) is type(b) and not isinstance(a, torch.Tensor) and a == b
