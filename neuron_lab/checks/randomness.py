"""Random ops made comparable: the reference run of a parity check replays the device run's random draws.

Two devices never draw the same random numbers from their own generators, and one training step mixes
draws from several (batch indices on the CPU, dropout on the device). So the device run records what
every random ATen op (the ops PyTorch tags ``nondeterministic_seeded``) produced, in order, and the
reference run gets the same values back from its random ops, one by one, as long as both draw alike.
Dropout is one draw whichever way it is spelled: ``native_dropout`` on an accelerator, ``bernoulli_``
on the CPU; the reference keeps its own arithmetic and takes only the device's mask. Draws are matched on
what they drew (kind, shapes, probability), never on which kernel drew them: SDPA runs a fused kernel on
`neuron` (TorchNeuron's overrideable op) and, on the CPU, its flash kernel without dropout (tagged random, it draws
nothing) and its math kernel with. A fused kernel's dropout is drawn inside it: where the backend can say which mask
a call drew (the emulator's, from the call's ``philox_seed``), that mask is one bernoulli draw the reference's math
kernel takes, else the draw cannot be replayed. Where the two runs draw differently (another op, another
shape) that draw comes from the reference's own generator, the difference is said, and the replay picks up
again at the next recorded draw that matches.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from neuron_lab import backend
from neuron_lab.compat.torch import DispatchMode
from neuron_lab.report.checks import Randomness

MAX_BYTES = 512 * 2**20  # what the device run's recorded draws may hold; later draws are not recorded
LOOKAHEAD = 16  # recorded draws a reference draw may skip to find its match (the device drew those alone)
_BERNOULLI = "bernoulli"
_FUSED_ATTENTION = "_scaled_dot_product_fused_attention_overrideable"  # TorchNeuron's SDPA: draws its dropout itself


@dataclass
class Draw:
    """One random op call: what it drew (``kind``, ``shape``, a keep probability for dropout) and its values."""

    op: str  # "aten::native_dropout"
    kind: str  # "bernoulli" for every dropout mask and bernoulli with a float p; else the op
    shapes: tuple[tuple[int, ...], ...]
    p: float | None = None
    values: tuple[torch.Tensor, ...] = ()  # on the CPU

    @property
    def is_dropout(self) -> bool:
        return self.kind == _BERNOULLI

    def matches(self, other: Draw) -> bool:
        same_p = self.p is None and other.p is None or (
            self.p is not None and other.p is not None and abs(self.p - other.p) <= 1e-12)
        return self.kind == other.kind and self.shapes == other.shapes and same_p

    def describe(self) -> str:
        shapes = ", ".join(str(list(s)) for s in self.shapes)
        return f"{self.op} {shapes}" + (f" (p {self.p:g})" if self.p is not None else "")


def _op(func: Any) -> str:
    return f"aten::{func._overloadpacket.__name__}"


def _args(func: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by schema name, defaults filled in."""
    out = {}
    for i, a in enumerate(func._schema.arguments):
        if i < len(args):
            out[a.name] = args[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
    return out


def _draw(func: Any, args: tuple, kwargs: dict, out: Any) -> Draw | None:
    """What a random op call drew, without values (None: it drew nothing, as dropout in eval mode)."""
    name = func._overloadpacket.__name__
    given = _args(func, args, kwargs)
    if given.get("dropout_p", None) == 0:  # attention kernels: random only through their dropout
        return None
    if name == "native_dropout":
        if given.get("train") is False:
            return None
        return Draw(_op(func), _BERNOULLI, (tuple(given["input"].shape),), 1.0 - given["p"])
    if name == _FUSED_ATTENTION:  # its mask has the attention weights' shape: (..., query length, key length)
        shape = (*given["query"].shape[:-1], given["key"].shape[-2])
        return Draw(_op(func), _BERNOULLI, (shape,), 1.0 - given["dropout_p"])
    tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    p = given.get("p")
    if name in ("bernoulli", "bernoulli_") and isinstance(p, float):
        return Draw(_op(func), _BERNOULLI, (tuple(tensors[0].shape),), p)
    return Draw(_op(func), name.removesuffix("_"), tuple(tuple(t.shape) for t in tensors))


def _values(draw: Draw, out: Any) -> tuple[torch.Tensor, ...]:
    tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    if draw.op == f"aten::{_FUSED_ATTENTION}":
        mask = backend.active().attention_dropout_mask(out[6], draw.shapes[0], 1.0 - draw.p)
        if mask is not None:
            return (mask.reshape(draw.shapes[0]),)
        draw.kind = _FUSED_ATTENTION  # the backend cannot say which mask it drew: no reference draw matches
    if draw.kind == _BERNOULLI:  # the mask: dropout's second output, bernoulli's only one
        return (tensors[-1].detach().to("cpu", torch.bool),)
    return tuple(t.detach().to("cpu", copy=True) for t in tensors)


_RANDOM: dict[Any, bool] = {}  # by op overload: every op of a run comes through the modes, so this stays cheap


def _random(func: Any) -> bool:
    r = _RANDOM.get(func)
    if r is None:
        r = _RANDOM[func] = torch.Tag.nondeterministic_seeded in func.tags
    return r


class _Mode(DispatchMode):
    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Dynamo compiles as usual under this mode; the compiled code's random ops still come through it."""
        return True


_ATTENTION: dict[Any, bool] = {}  # by op overload: a fused attention kernel (the math path is decomposed)


def _attention(func: Any) -> bool:
    r = _ATTENTION.get(func)
    if r is None:
        r = _ATTENTION[func] = func._overloadpacket.__name__.startswith("_scaled_dot_product_") and \
            "backward" not in func._overloadpacket.__name__
    return r


class Recorder(_Mode):
    """Records every random draw of the run it is active in (``exclude``: our own copies are not the run's), and
    the fused attention kernels it ran (their dropout draws happen inside them, and their rounding is their own)."""

    def __init__(self, exclude: Callable[[], Any] = contextlib.nullcontext) -> None:
        super().__init__()
        self.exclude = exclude
        self.attention: dict[str, None] = {}  # "aten::_scaled_dot_product_fused_attention_overrideable"
        self.draws: list[Draw] = []
        self.unrecorded = 0  # draws past MAX_BYTES
        self._bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if _attention(func):
            self.attention.setdefault(_op(func))
        if _random(func):
            draw = _draw(func, args, kwargs, out)
            if draw is not None:
                self._record(draw, out)
        return out

    def _record(self, draw: Draw, out: Any) -> None:
        if self.unrecorded:
            self.unrecorded += 1
            return
        with self.exclude():
            draw.values = _values(draw, out)
        self._bytes += sum(t.numel() * t.element_size() for t in draw.values)
        if self._bytes > MAX_BYTES:
            self.unrecorded = 1
            return
        self.draws.append(draw)


class Replayer(_Mode):
    """Serves recorded draws to the run it is active in, in order, matching each draw on what it draws."""

    def __init__(self, draws: list[Draw]) -> None:
        super().__init__()
        self.draws = draws
        self.served = 0  # recorded draws given to the run
        self.at = 0  # the next recorded draw to match
        self.own = 0  # draws the run made from its own generators (nothing recorded matched)
        self.mismatch: tuple[int, Draw] | None = None  # the first draw that did not match: (its index, it)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not _random(func):
            return func(*args, **kwargs)
        if func._overloadpacket.__name__ == "native_dropout":
            return self._dropout(func, args, kwargs)
        out = func(*args, **kwargs)
        draw = _draw(func, args, kwargs, out)
        recorded = self._next(draw)
        if recorded is not None:
            tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            with torch.no_grad():
                for t, v in zip(tensors, recorded.values):
                    t.copy_(v)
        return out

    def _dropout(self, func, args, kwargs):
        """``native_dropout`` with the recorded mask: ``input * mask * 1/(1-p)``, as ATen computes it."""
        draw = _draw(func, args, kwargs, None)
        recorded = self._next(draw) if draw is not None else None
        if recorded is None:
            return func(*args, **kwargs)
        given = _args(func, args, kwargs)
        x, keep = given["input"], 1.0 - given["p"]
        mask = recorded.values[0].to(x.device)
        with torch.no_grad():
            return x.mul(mask).mul_(0.0 if keep == 0 else 1.0 / keep), mask

    def _next(self, draw: Draw | None) -> Draw | None:
        """The recorded draw that ``draw`` replays (skipping recorded draws the run did not make), or None:
        counted as the run's own draw."""
        if draw is None:
            return None
        for k in range(self.at, min(self.at + LOOKAHEAD, len(self.draws))):
            if self.draws[k].matches(draw):
                if k > self.at and self.mismatch is None:
                    self.mismatch = (self.at, draw)
                self.at, self.served = k + 1, self.served + 1
                return self.draws[k]
        if self.mismatch is None:
            self.mismatch = (self.at, draw)
        self.own += 1
        return None


@contextlib.contextmanager
def recording(exclude: Callable[[], Any] = contextlib.nullcontext) -> Iterator[Recorder]:
    with Recorder(exclude) as r:
        yield r


@contextlib.contextmanager
def replaying(recorder: Recorder) -> Iterator[Replayer]:
    with Replayer(recorder.draws) as r:
        yield r


def summary(recorder: Recorder, replayer: Replayer) -> Randomness:
    """How the two runs' random draws were made comparable, for the report."""
    drawn = len(recorder.draws) + recorder.unrecorded
    ops = Counter(d.op for d in recorder.draws)
    out = Randomness(drawn, replayer.served, sorted(ops.items(), key=lambda kv: -kv[1]), replayer.own,
                     recorder.unrecorded)
    if replayer.mismatch is not None:
        at, theirs = replayer.mismatch
        expected = recorder.draws[at] if at < len(recorder.draws) else None
        out.differs = (f"random op {at + 1}: {expected.describe() if expected else 'none'} in the device run, "
                       f"{theirs.describe()} in the reference run")
    elif replayer.served < len(recorder.draws):
        out.differs = (f"the reference run made {replayer.served} of the device run's {len(recorder.draws)} random "
                       f"draws")
    return out
