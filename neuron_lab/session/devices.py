"""The notebook's device: parse and check device strings, find tensors in a namespace, move them.

Moves are all-or-nothing: names are checked before anything moves, and if a move fails half
way (out of device memory, say) everything already moved goes back where it was.
"""

from __future__ import annotations

import copy
import traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from neuron_lab import backend as _backend

MAX_DEPTH = 3  # how deep into lists/tuples/dicts a scan looks


class DeviceError(ValueError):
    """A device string that does not parse, or a device that is not available here."""


def parse_device(text: str) -> torch.device:
    """``"neuron"`` → ``neuron:0``; raises :class:`DeviceError` for unknown or unavailable devices."""
    try:
        dev = torch.device(text)
    except (RuntimeError, TypeError) as e:
        raise DeviceError(f"{text!r} is not a device string (expected neuron, neuron:N, cpu, cuda or cuda:N)") from e
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type == "neuron":
        if not _backend.is_active():
            raise DeviceError(f"the neuron device is not available: {_backend.state().reason}")
        count = _backend.active().device_count()
    else:
        mod = getattr(torch, dev.type, None)
        available = mod is not None and getattr(mod, "is_available", lambda: False)()
        if not available:
            raise DeviceError(f"{dev.type} is not available on this machine")
        count = mod.device_count()
    index = dev.index or 0
    if index >= count:
        raise DeviceError(f"{dev.type}:{index} does not exist: this machine has {count} {dev.type} device"
                          + ("s" if count != 1 else ""))
    return torch.device(dev.type, index)


# -- finding tensors ---------------------------------------------------------------------------
def tensors_in(obj: Any, depth: int = MAX_DEPTH) -> Iterable[torch.Tensor]:
    """Tensors an object holds: itself, a module's parameters and buffers, an optimizer's state,
    and the items of lists, tuples and dicts (``depth`` levels deep)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, torch.nn.Module):
        yield from obj.parameters()
        yield from obj.buffers()
    elif isinstance(obj, torch.optim.Optimizer):
        for state in obj.state.values():
            yield from (v for v in state.values() if isinstance(v, torch.Tensor))
    elif depth > 0 and isinstance(obj, (list, tuple)):
        for x in obj:
            yield from tensors_in(x, depth - 1)
    elif depth > 0 and isinstance(obj, Mapping):
        for x in obj.values():
            yield from tensors_in(x, depth - 1)


def footprint(obj: Any, device_type: str | None = None) -> tuple[int, int]:
    """(tensor count, bytes) of the distinct tensors ``obj`` holds, on ``device_type`` if given."""
    seen: set[int] = set()
    n = nbytes = 0
    try:
        for t in tensors_in(obj):
            if id(t) in seen or (device_type is not None and t.device.type != device_type):
                continue
            seen.add(id(t))
            n += 1
            nbytes += t.numel() * t.element_size()
    except ReferenceError:  # a dead weakproxy somewhere in a container
        pass
    return n, nbytes


def devices_of(obj: Any) -> set[str]:
    return {str(t.device) for t in tensors_in(obj)}


def kind_of(obj: Any) -> str:
    """"parameter", "tensor", or the class name (``Linear``, ``AdamW``, ``list``)."""
    if isinstance(obj, torch.nn.Parameter):
        return "parameter"
    if isinstance(obj, torch.Tensor):
        return "tensor"
    return type(obj).__name__


def movable(obj: Any) -> bool:
    if isinstance(obj, (torch.Tensor, torch.nn.Module, torch.optim.Optimizer)):
        return True
    if isinstance(obj, (list, tuple, dict)):
        try:
            items = obj.values() if isinstance(obj, dict) else obj
            return bool(items) and all(movable(x) for x in items)
        except ReferenceError:
            return False
    return False


# -- moving -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Moved:
    name: str
    kind: str
    nbytes: int
    source: str  # the devices it was on


@dataclass(frozen=True)
class Stayed:
    name: str
    kind: str
    nbytes: int
    where: str
    why: str


@dataclass
class MoveReport:
    device: str
    moved: list[Moved] = field(default_factory=list)
    stayed: list[Stayed] = field(default_factory=list)
    already: list[str] = field(default_factory=list)  # names whose tensors were all on the device already

    def __str__(self) -> str:
        from neuron_lab.units import format_size

        lines = []
        if self.moved:
            total = sum(m.nbytes for m in self.moved)
            lines.append(f"moved to {self.device} ({format_size(total)}):")
            lines += [f"  {m.name:<20} {m.kind:<16} {format_size(m.nbytes):>12}  from {m.source}" for m in self.moved]
        else:
            lines.append(f"nothing moved to {self.device}")
        if self.already:
            lines.append(f"already on {self.device}: {', '.join(self.already)}")
        if self.stayed:
            lines.append(f"still elsewhere ({format_size(sum(s.nbytes for s in self.stayed))}):")
            lines += [f"  {s.name:<20} {s.kind:<16} {format_size(s.nbytes):>12}  on {s.where}: {s.why}"
                      for s in self.stayed]
        return "\n".join(lines)

    def _repr_pretty_(self, p, cycle: bool) -> None:
        p.text(str(self))


def _move_tensor(t: torch.Tensor, device: torch.device, memo: dict[int, torch.Tensor]) -> torch.Tensor:
    done = memo.get(id(t))
    if done is not None:
        return done
    if t.device == device:
        out = t
    elif isinstance(t, torch.nn.Parameter):
        out = torch.nn.Parameter(t.detach().to(device), requires_grad=t.requires_grad)
    elif t.is_leaf and t.requires_grad:
        out = t.detach().to(device).requires_grad_(True)
    else:
        out = t.to(device)
    memo[id(t)] = out
    return out


def _same_kind_of_dict(obj: dict, items: dict) -> dict:
    """A dict of ``obj``'s type holding ``items``: a ``defaultdict`` keeps its ``default_factory``, an
    ``OrderedDict`` its order, a subclass its attributes (``copy.copy``, then the moved values set)."""
    if type(obj) is dict:
        return items
    try:
        out = copy.copy(obj)
    except Exception:
        out = type(obj)()  # may raise TypeError: the caller puts everything back and says so
    for k, v in items.items():
        out[k] = v
    return out


def _move_container(obj: Any, device: torch.device, memo: dict[int, torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        return _move_tensor(obj, device, memo)
    if isinstance(obj, dict):
        return _same_kind_of_dict(obj, {k: _move_container(v, device, memo) for k, v in obj.items()})
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_move_container(v, device, memo) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_move_container(v, device, memo) for v in obj)
    return obj


def _state_key_moves(opt: torch.optim.Optimizer, param: torch.Tensor, key: str) -> bool:
    """Whether an optimizer state entry follows its parameter (PyTorch keeps a CPU ``step`` unless
    the group is capturable or fused, as ``Optimizer.load_state_dict`` does)."""
    if key != "step":
        return True
    for g in opt.param_groups:
        if any(p is param for p in g["params"]):
            return bool(g.get("capturable") or g.get("fused"))
    return False


def move(ns: dict[str, Any], names: list[str], device: torch.device) -> MoveReport:
    """Move the named objects to ``device`` in place in ``ns``; all or nothing."""
    for n in names:
        if n not in ns:
            raise KeyError(n)
        if not movable(ns[n]):
            raise TypeError(f"{n} is a {type(ns[n]).__name__}; only tensors, nn.Modules, optimizers and "
                            "lists/tuples/dicts of tensors can be moved")
    order = sorted(names, key=lambda n: 0 if isinstance(ns[n], torch.nn.Module) else
                   1 if isinstance(ns[n], torch.optim.Optimizer) else 2)
    report = MoveReport(str(device))
    undo: list[Any] = []  # callables that put things back, newest last
    memo: dict[int, torch.Tensor] = {}
    moved_tensor_ids: set[int] = set()
    try:
        for n in order:
            obj = ns[n]
            on = devices_of(obj)
            if on == {str(device)} and not isinstance(obj, torch.optim.Optimizer):  # an optimizer's params are checked
                report.already.append(n)
                continue
            src = ", ".join(sorted(on)) or "-"
            off: set[str] = set()
            if isinstance(obj, torch.nn.Module):
                first = next(iter(tensors_in(obj)), None)
                before = first.device if first is not None else None
                nbytes = footprint(obj)[1]
                obj.to(device)
                if before is not None:
                    undo.append(lambda m=obj, d=before: m.to(d))
                moved_tensor_ids.update(id(t) for t in tensors_in(obj))
            elif isinstance(obj, torch.optim.Optimizer):
                nbytes = 0
                for p, state in obj.state.items():
                    for k, v in list(state.items()):
                        if isinstance(v, torch.Tensor) and v.device != device and _state_key_moves(obj, p, k):
                            nbytes += v.numel() * v.element_size()
                            state[k] = v.to(device)
                            undo.append(lambda s=state, k=k, v=v: s.__setitem__(k, v))
                off = {str(p.device) for g in obj.param_groups for p in g["params"] if p.device != device}
                if off:
                    report.stayed.append(Stayed(n, "its parameters", 0, ", ".join(sorted(off)),
                                                "its step() will fail until the model that owns them moves too"))
            else:
                if isinstance(obj, torch.Tensor) and id(obj) in moved_tensor_ids:
                    continue  # a parameter or buffer of a model that just moved, in place
                nbytes = footprint(obj)[1]
                ns[n] = _move_container(obj, device, memo)
                undo.append(lambda n=n, o=obj: ns.__setitem__(n, o))
            if isinstance(obj, torch.optim.Optimizer) and nbytes == 0 and not off:
                report.already.append(n)  # its state is where PyTorch keeps it for this device already
            else:
                report.moved.append(Moved(n, kind_of(obj), nbytes, src))
    except BaseException as e:
        for fn in reversed(undo):
            fn()
        # The copies made so far must be freed now, not when the next exception replaces this one: drop them
        # from the memo, and from the locals of the frames the traceback keeps (Module._apply's, ours).
        undo.clear()
        memo.clear()
        traceback.clear_frames(e.__traceback__)
        raise
    return report


def stayed_elsewhere(ns: dict[str, Any], device: torch.device, skip: Iterable[str] = ()) -> list[Stayed]:
    """Objects in ``ns`` that still hold tensors on another device than ``device``."""
    skip = set(skip)
    out = []
    for n, obj in list(ns.items()):
        if n in skip or n.startswith("_") or not movable(obj):
            continue
        try:
            elsewhere = {d for d in devices_of(obj) if d != str(device)}
        except ReferenceError:
            continue
        if elsewhere:
            nbytes = sum(footprint(obj, torch.device(d).type)[1] for d in elsewhere)
            out.append(Stayed(n, kind_of(obj), nbytes, ", ".join(sorted(elsewhere)), "not moved"))
    return out
