"""Copies of what a run reads, so a second run of the same code leaves the user's objects alone.

One ``copy.deepcopy`` with one memo over everything copied keeps the objects' relations: an
optimizer copied with its model steps the copied parameters, and its state is keyed by them.
The memo is filled first with every reachable tensor already moved to the target device, so the
deep copy never copies a tensor twice and never leaves one on the source device.
"""

from __future__ import annotations

import ast
import copy
import types
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from neuron_lab.session.devices import state_follows_param

MAX_DEPTH = 4  # how deep into containers and plain objects tensors are looked for
_SHARED_OK = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.BuiltinMethodType, type,
              torch.device, torch.dtype, str, bytes, int, float, complex, bool, type(None), range, frozenset,
              types.EllipsisType)


def needs_copy(obj: Any) -> bool:
    """Whether a run could change ``obj``: code, classes, Python modules and immutable values cannot."""
    if isinstance(obj, tuple):
        return any(needs_copy(x) for x in obj)
    return not isinstance(obj, _SHARED_OK)


# -- what code reads ------------------------------------------------------------------------------
def mentioned(code: str) -> list[tuple[str, int]]:
    """Every name the code uses or assigns, with the line of its first mention, in source order."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    names = sorted((n.lineno, n.col_offset, n.id) for n in ast.walk(tree) if isinstance(n, ast.Name))
    seen: dict[str, int] = {}
    for line, _, name in names:
        seen.setdefault(name, line)
    return list(seen.items())


def _code_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _code_names(c)


def _functions_of(obj: Any, ns: Mapping[str, Any]) -> list[types.FunctionType]:
    """The notebook's own functions behind ``obj``: itself, a class's methods, an instance's class's."""
    cls = obj if isinstance(obj, type) else None if isinstance(obj, types.FunctionType) else type(obj)
    fns = [obj] if isinstance(obj, types.FunctionType) else []
    if cls is not None:
        fns += [f for f in vars(cls).values() if isinstance(f, types.FunctionType)]
    return [f for f in fns if f.__globals__ is ns]


def read_through(names: list[str], ns: Mapping[str, Any]) -> list[str]:
    """``names`` plus the globals the notebook's functions among them read, transitively."""
    out = list(dict.fromkeys(names))
    seen_fns: set[int] = set()
    i = 0
    while i < len(out):
        obj = ns.get(out[i])
        i += 1
        for f in _functions_of(obj, ns):
            if id(f) in seen_fns:
                continue
            seen_fns.add(id(f))
            out += [n for n in _code_names(f.__code__) if n in ns and n not in out]
    return out


# -- copying ------------------------------------------------------------------------------------
def _tensors(obj: Any, depth: int, seen: set[int]) -> Iterator[tuple[torch.Tensor, bool]]:
    """(tensor, follows the device move) for every tensor ``obj`` holds, each object visited once; containers and
    plain objects are looked into ``depth`` levels deep, modules and optimizers whole."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj, True
    elif isinstance(obj, torch.nn.Module):
        yield from _module_tensors(obj, seen)
    elif isinstance(obj, torch.optim.Optimizer):
        yield from _optimizer_tensors(obj)
    elif depth > 0 and needs_copy(obj):
        for child in _children(obj):
            yield from _tensors(child, depth - 1, seen)


def _module_tensors(module: torch.nn.Module, seen: set[int]) -> Iterator[tuple[torch.Tensor, bool]]:
    """Parameters and buffers, then the plain tensor attributes of every submodule (``self.mask = torch.ones(…)``)."""
    for t in (*module.parameters(), *module.buffers()):
        yield t, True
    for m in module.modules():
        attributes = [v for k, v in vars(m).items() if not k.startswith("_")]
        for v in attributes:
            yield from _tensors(v, 1, seen)


def _optimizer_tensors(opt: torch.optim.Optimizer) -> Iterator[tuple[torch.Tensor, bool]]:
    """The parameters, then the state's tensors (a CPU ``step`` stays where it is, as PyTorch keeps it)."""
    for g in opt.param_groups:
        yield from ((p, True) for p in g["params"])
    for p, state in opt.state.items():
        yield from ((v, state_follows_param(opt, p, k)) for k, v in state.items() if isinstance(v, torch.Tensor))


def _children(obj: Any) -> Iterable[Any]:
    """What a container or a plain object holds: items, a mapping's keys and values, an object's attributes."""
    if isinstance(obj, (list, tuple, set)):
        return obj
    if isinstance(obj, Mapping):
        return [x for kv in obj.items() for x in kv]
    if hasattr(obj, "__dict__"):
        return vars(obj).values()
    return ()


def tensors(obj: Any) -> Iterator[torch.Tensor]:
    """The tensors ``obj`` holds (as copies find them), each once."""
    for t, _ in _tensors(obj, MAX_DEPTH, set()):
        yield t


def _moved(t: torch.Tensor, device: torch.device | None) -> torch.Tensor:
    """A copy of ``t`` on ``device`` (None: where it is), keeping Parameter-ness, requires_grad and .grad."""
    target = t.device if device is None else device
    data = t.detach().to(target, copy=True)
    if isinstance(t, torch.nn.Parameter):
        out = torch.nn.Parameter(data, requires_grad=t.requires_grad)
    else:
        out = data.requires_grad_(t.requires_grad) if t.is_leaf else data
    if t.is_leaf and t.grad is not None:
        out.grad = t.grad.detach().to(target, copy=True)
    return out


@dataclass
class Copies:
    values: dict[str, Any] = field(default_factory=dict)  # name -> the copy
    shared: list[str] = field(default_factory=list)  # names that could not be copied: "it (generator)"


def copy_state(ns: Mapping[str, Any], names: list[str], source: torch.device, target: torch.device) -> Copies:
    """Deep copies of ``ns[name]`` for each name, tensors on ``source`` moved to ``target`` (others cloned).

    Code, classes and immutable values are not copied (a run cannot change them); objects that cannot
    be deep-copied (generators, open files) are listed in ``shared``.
    """
    out = Copies()
    todo = [n for n in names if n in ns and needs_copy(ns[n])]
    memo: dict[int, Any] = {}
    seen: set[int] = set()
    for n in todo:
        for t, follows in _tensors(ns[n], MAX_DEPTH, seen):
            if id(t) not in memo:
                memo[id(t)] = _moved(t, target if follows and t.device == source else None)
    methods = []
    for n in todo:
        obj = ns[n]
        if isinstance(obj, types.MethodType):
            methods.append(n)
            continue
        try:
            out.values[n] = copy.deepcopy(obj, memo)
        except Exception:
            out.shared.append(f"{n} ({type(obj).__name__})")
    for n in methods:  # a bound method follows its object when that was copied
        m = ns[n]
        owner = memo.get(id(m.__self__))
        if owner is not None:
            out.values[n] = types.MethodType(m.__func__, owner)
        elif needs_copy(m.__self__):
            out.shared.append(f"{n} (method of {type(m.__self__).__name__})")
    return out
