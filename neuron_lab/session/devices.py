"""The notebook's device: parse and check device strings, find tensors in a namespace, move them.

Moves are all-or-nothing: names are checked before anything moves, and if a move fails half
way (out of device memory, say) everything already moved goes back where it was.
"""

from __future__ import annotations

import copy
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from neuron_lab import backend as _backend
from neuron_lab.units import ShownAsText, format_size

MAX_DEPTH = 3  # how deep into lists/tuples/dicts a scan looks


class DeviceError(ValueError):
    """A device string that does not parse, or a device that is not available here."""


def default_device() -> torch.device | None:
    """The device ``torch.set_default_device`` set, or None when none is: what to give it back to restore it.

    ``torch.get_default_device()`` says "cpu" in both cases, and setting "cpu" back would leave a device mode on
    torch's stack (seen by every op, and in stacks) where there was none.
    """
    if getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None) is None:
        return None
    return torch.get_default_device()


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
    """The devices (``"neuron:0"``, ``"cpu"``) of the tensors ``obj`` holds."""
    return {str(t.device) for t in tensors_in(obj)}


def kind_of(obj: Any) -> str:
    """"parameter", "tensor", or the class name (``Linear``, ``AdamW``, ``list``)."""
    if isinstance(obj, torch.nn.Parameter):
        return "parameter"
    if isinstance(obj, torch.Tensor):
        return "tensor"
    return type(obj).__name__


def movable(obj: Any) -> bool:
    """Whether :func:`move` can move ``obj``: a tensor, module or optimizer, or a non-empty list/tuple/dict of them."""
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
class MoveReport(ShownAsText):
    device: str
    moved: list[Moved] = field(default_factory=list)
    stayed: list[Stayed] = field(default_factory=list)
    already: list[str] = field(default_factory=list)  # names whose tensors were all on the device already

    def __str__(self) -> str:
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


@dataclass
class _Move:
    """A move in progress: where to, what it did so far, and how to undo each step."""

    ns: dict[str, Any]
    device: torch.device
    report: MoveReport
    undo: list[Callable[[], object]] = field(default_factory=list)  # puts one thing back each, newest last
    memo: dict[int, torch.Tensor] = field(default_factory=dict)  # id(tensor) -> its copy: shared tensors copy once

    def on_device(self, obj: Any) -> bool:
        return devices_of(obj) == {str(self.device)}

    def rollback(self, error: BaseException) -> None:
        """Put everything back, and free the copies made so far now, not when another exception replaces
        ``error``: drop them from the memo and from the locals of the frames its traceback keeps
        (``Module._apply``'s, the movers')."""
        for fn in reversed(self.undo):
            fn()
        self.undo.clear()
        self.memo.clear()
        traceback.clear_frames(error.__traceback__)


Mover = Callable[[_Move, str, Any], int | None]  # moves one named object: the bytes it moved, None if none had to


def move(ns: dict[str, Any], names: list[str], device: torch.device) -> MoveReport:
    """Move the named objects to ``device`` in place in ``ns``; all or nothing.

    Raises ``KeyError`` for a name ``ns`` lacks and ``TypeError`` for an object that cannot move, before
    anything moves; any error while moving puts back everything moved so far, then propagates.
    """
    for n in names:
        _check_movable(ns, n)
    mv = _Move(ns, device, MoveReport(str(device)))
    try:
        for n in sorted(names, key=lambda n: _mover_of(ns[n])[0]):
            _move_name(mv, n)
    except BaseException as e:
        mv.rollback(e)
        raise
    mv.undo.clear()  # what was moved away goes now, when nothing else holds it, not at Python's next collection
    mv.memo.clear()
    return mv.report


def _check_movable(ns: dict[str, Any], name: str) -> None:
    if name not in ns:
        raise KeyError(name)
    if not movable(ns[name]):
        raise TypeError(f"{name} is a {type(ns[name]).__name__}; only tensors, nn.Modules, optimizers and "
                        "lists/tuples/dicts of tensors can be moved")


def _move_name(mv: _Move, name: str) -> None:
    """Move one named object with the mover for its kind; report it as moved or as already there."""
    obj = mv.ns[name]
    source = ", ".join(sorted(devices_of(obj))) or "-"
    nbytes = _mover_of(obj)[1](mv, name, obj)
    if nbytes is None:
        mv.report.already.append(name)
    else:
        mv.report.moved.append(Moved(name, kind_of(obj), nbytes, source))


def _move_module(mv: _Move, name: str, module: torch.nn.Module) -> int | None:
    """In place, with ``module.to``: its parameters keep their identity, so names bound to them follow."""
    if mv.on_device(module):
        return None
    first = next(iter(tensors_in(module)), None)
    nbytes = footprint(module)[1]
    if first is not None:  # registered first: a move that fails half way through the module goes back too
        mv.undo.append(lambda before=first.device: module.to(before))
    module.to(mv.device)
    return nbytes


def _move_optimizer(mv: _Move, name: str, opt: torch.optim.Optimizer) -> int | None:
    """Its state, in place, where PyTorch keeps it for the device; its parameters are its model's to move,
    so parameters left elsewhere are reported as staying (its ``step()`` would fail)."""
    nbytes = 0
    for state, key, value in _state_to_move(opt, mv.device):
        nbytes += value.numel() * value.element_size()
        state[key] = value.to(mv.device)
        mv.undo.append(lambda state=state, key=key, value=value: state.__setitem__(key, value))
    elsewhere = {str(p.device) for g in opt.param_groups for p in g["params"] if p.device != mv.device}
    if elsewhere:
        mv.report.stayed.append(Stayed(name, "its parameters", 0, ", ".join(sorted(elsewhere)),
                                       "its step() will fail until the model that owns them moves too"))
    elif nbytes == 0:
        return None  # its state is where PyTorch keeps it for this device already
    return nbytes


def _move_value(mv: _Move, name: str, value: Any) -> int | None:
    """A tensor, or a list/tuple/dict of them: the name is bound to a copy on the device."""
    if mv.on_device(value):
        return None
    nbytes = footprint(value)[1]
    mv.ns[name] = _copy_to(value, mv.device, mv.memo)
    mv.undo.append(lambda ns=mv.ns: ns.__setitem__(name, value))
    return nbytes


# The mover of each kind of object, in the order a move runs them: modules first, so their parameters are on the
# device (in place) when an optimizer over them checks where they are.
_MOVERS: tuple[tuple[type | tuple[type, ...], Mover], ...] = (
    (torch.nn.Module, _move_module),
    (torch.optim.Optimizer, _move_optimizer),
    ((torch.Tensor, list, tuple, dict), _move_value),
)


def _mover_of(obj: Any) -> tuple[int, Mover]:
    """(rank in :data:`_MOVERS`, mover) of an object that :func:`movable` accepts."""
    return next((rank, mover) for rank, (kinds, mover) in enumerate(_MOVERS) if isinstance(obj, kinds))


def state_follows_param(opt: torch.optim.Optimizer, param: torch.Tensor, key: str) -> bool:
    """Whether an optimizer state entry follows its parameter to a device (PyTorch keeps a CPU ``step``
    unless the group is capturable or fused, as ``Optimizer.load_state_dict`` does)."""
    if key != "step":
        return True
    for g in opt.param_groups:
        if any(p is param for p in g["params"]):
            return bool(g.get("capturable") or g.get("fused"))
    return False


def _state_to_move(opt: torch.optim.Optimizer, device: torch.device) -> list[tuple[dict, str, torch.Tensor]]:
    """(state, key, tensor) of the optimizer's state tensors that follow their parameter to ``device``."""
    return [(state, k, v) for p, state in opt.state.items() for k, v in state.items()
            if isinstance(v, torch.Tensor) and v.device != device and state_follows_param(opt, p, k)]


# -- copies on the device: one per kind of value ---------------------------------------------------
def _copy_to(value: Any, device: torch.device, memo: dict[int, torch.Tensor]) -> Any:
    """``value`` with every tensor in it on ``device``; what holds no tensor comes back as it is."""
    if isinstance(value, torch.Tensor):
        return _copy_tensor(value, device, memo)
    if isinstance(value, dict):
        return _copy_dict(value, device, memo)
    if isinstance(value, (list, tuple)):
        return _copy_sequence(value, device, memo)
    return value


def _copy_tensor(t: torch.Tensor, device: torch.device, memo: dict[int, torch.Tensor]) -> torch.Tensor:
    """One copy per tensor; a Parameter stays a Parameter and a leaf that requires grad stays a leaf."""
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


def _copy_dict(d: dict, device: torch.device, memo: dict[int, torch.Tensor]) -> dict:
    """A dict of ``d``'s type: a ``defaultdict`` keeps its ``default_factory``, an ``OrderedDict`` its order,
    a subclass its attributes (``copy.copy``, then the moved values set)."""
    items = {k: _copy_to(v, device, memo) for k, v in d.items()}
    if type(d) is dict:
        return items
    try:
        out = copy.copy(d)
    except Exception:
        out = type(d)()  # may raise TypeError: the move puts everything back and says so
    for k, v in items.items():
        out[k] = v
    return out


def _copy_sequence(seq: list | tuple, device: torch.device, memo: dict[int, torch.Tensor]) -> list | tuple:
    """A list or tuple of ``seq``'s type; a named tuple is rebuilt field by field."""
    items = (_copy_to(v, device, memo) for v in seq)
    return type(seq)(*items) if isinstance(seq, tuple) and hasattr(seq, "_fields") else type(seq)(items)


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
