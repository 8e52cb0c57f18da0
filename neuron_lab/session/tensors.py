"""The live device tensors, one row per storage, with every name that refers to it and who holds it.

The data behind the Tensors view. A scan reads metadata only (no device op, no copy, nothing moved),
holds tensors only while it runs, and accounts for every allocated byte: what it cannot name
becomes an "unknown" row, so the table's total is what the backend counts on all its devices together.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from html import escape
from typing import Any

import torch

from neuron_lab import backend as _backend
from neuron_lab.session.cells import CellLocator
from neuron_lab.session.devices import MAX_DEPTH
from neuron_lab.units import ShownAsText, format_size

NAMESPACE = "namespace"
OUTPUT_CACHE = "IPython output cache"
TRACEBACK = "IPython traceback"
AUTOGRAD = "autograd graph"
UNKNOWN = "unknown"
HELD_BY = (NAMESPACE, OUTPUT_CACHE, TRACEBACK, AUTOGRAD, UNKNOWN)  # a storage held several ways shows the first

MAX_GRAPH_NODES = 20_000  # autograd nodes one scan visits
MAX_GRAPH_NAMES = 3  # names a storage held only by graphs gets (one per saving node)
_OUT_NAME = re.compile(r"_\d+|_{1,3}")


@dataclass(frozen=True)
class TensorRow:
    """One device storage: views of it are one row, their names merged."""

    names: tuple[str, ...]
    shape: tuple[int, ...] | None  # of the first tensor found viewing the whole storage
    dtype: str | None
    bytes: int
    requires_grad: bool | None  # None where no tensor was found
    held_by: str  # one of HELD_BY
    ptr: int | None  # the storage's data pointer; None for the remainder nobody could list

    def as_dict(self) -> dict[str, Any]:
        return {"names": list(self.names), "shape": list(self.shape) if self.shape is not None else None,
                "dtype": self.dtype, "bytes": self.bytes, "requires_grad": self.requires_grad,
                "held_by": self.held_by, "ptr": self.ptr}


@dataclass
class TensorTable(ShownAsText):
    device_type: str
    allocated: int  # what the backend counts on all its devices at the scan
    rows: list[TensorRow] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(r.bytes for r in self.rows)

    def as_dict(self) -> dict[str, Any]:
        return {"device_type": self.device_type, "total": self.total, "allocated": self.allocated,
                "rows": [r.as_dict() for r in self.rows]}

    def _cells(self, r: TensorRow) -> list[str]:
        grad = {True: "yes", False: "", None: "?"}[r.requires_grad]
        shape = list(r.shape) if r.shape is not None else ""
        return [format_size(r.bytes), r.held_by, r.dtype or "", str(shape), grad, ", ".join(r.names) or "-"]

    def summary(self) -> str:
        n = len(self.rows)
        return (f"{n} {self.device_type} storage{'s' if n != 1 else ''}: {format_size(self.total)} "
                f"(memory_allocated {format_size(self.allocated)})")

    def __str__(self) -> str:
        lines = [self.summary()]
        if self.rows:
            lines.append(f"  {'bytes':>12}  {'held by':<20}  {'dtype':<9}  {'shape':<14}  {'grad':<4}  names")
            for r in self.rows:
                size, held, dtype, shape, grad, names = self._cells(r)
                lines.append(f"  {size:>12}  {held:<20}  {dtype:<9}  {shape:<14}  {grad:<4}  {names}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        cell = 'style="padding:1px 8px;text-align:left;vertical-align:top"'
        head = "".join(f"<th {cell}>{h}</th>" for h in ("bytes", "held by", "dtype", "shape", "grad", "names"))
        body = "".join("<tr>" + "".join(f"<td {cell}>{escape(c)}</td>" for c in self._cells(r)) + "</tr>"
                       for r in self.rows)
        return (f"<div style='font-family:monospace;font-size:12px'>{escape(self.summary())}</div>"
                f"<table style='border-collapse:collapse;font-size:12px'><thead><tr>{head}</tr></thead>"
                f"<tbody>{body}</tbody></table>")


# -- the scan ------------------------------------------------------------------------------------
@dataclass
class _Storage:
    """What a scan learned about one storage; metadata only, never the tensor."""

    nbytes: int
    shape: tuple[int, ...]
    dtype: str
    requires_grad: bool
    whole: bool  # the tensor described views all of the storage
    rank: int  # index into HELD_BY
    names: list[str] = field(default_factory=list)
    graph_names: list[str] = field(default_factory=list)


def _meta(t: torch.Tensor, nbytes: int) -> tuple[tuple[int, ...], str, bool, bool]:
    return (tuple(t.shape), str(t.dtype).removeprefix("torch."), t.requires_grad,
            t.numel() * t.element_size() == nbytes)


class _Scan:
    def __init__(self, device_type: str) -> None:
        self.device_type = device_type
        self.storages: dict[int, _Storage] = {}
        self.param_names: dict[int, str] = {}  # id(parameter) -> its module name, for optimizer state
        self.roots: list[tuple[str, Any]] = []  # (name, grad_fn) of every tensor found
        self.optimizers: list[tuple[str, torch.optim.Optimizer, str]] = []
        self.fallback_names = False  # walking frames that hide from tracebacks: name only what nothing else names
        self.module_names: dict[int, str] = {}  # id(module) -> its path from a namespace name ("model.blocks.0.attn")
        self.where = ""  # walking a frame's locals: " in <function> at <line>", after each name

    def tensor(self, t: torch.Tensor, name: str, held_by: str, root: bool = True, context: str | None = None) -> None:
        if root and t.grad_fn is not None:
            self.roots.append((name, t.grad_fn, context))
        if (t.is_leaf or t.retains_grad) and t.grad is not None:  # .grad of other non-leaves warns
            self.tensor(t.grad, f"{name}.grad", held_by, root)
        if t.device.type != self.device_type:
            return
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, nested, storage-less subclasses
            return
        ptr, nbytes = st.data_ptr(), st.nbytes()
        rank = HELD_BY.index(held_by)
        s = self.storages.get(ptr)
        if s is None:
            s = self.storages[ptr] = _Storage(nbytes, *_meta(t, nbytes), rank)
        elif not s.whole and t.numel() * t.element_size() == nbytes:
            s.shape, s.dtype, s.requires_grad, s.whole = _meta(t, nbytes)
        s.rank = min(s.rank, rank)
        names = s.graph_names if held_by == AUTOGRAD else s.names
        if self.fallback_names and (s.names or s.graph_names):
            return
        name += self.where if held_by != AUTOGRAD else ""
        if name not in names and (held_by != AUTOGRAD or len(names) < MAX_GRAPH_NAMES):
            names.append(name)

    def walk(self, obj: Any, name: str, held_by: str, depth: int = MAX_DEPTH, context: str | None = None) -> None:
        """Name the tensors ``obj`` holds the way ``devices.tensors_in`` finds them (``context``: the user's module and
        line a library frame's tensors belong to, which names them and what their graphs saved)."""
        if isinstance(obj, torch.Tensor):
            self.tensor(obj, name, held_by, context=context)
        elif isinstance(obj, torch.nn.Module):
            if held_by == NAMESPACE:
                for n, m in obj.named_modules(prefix=name):
                    self.module_names.setdefault(id(m), n)
            for n, p in obj.named_parameters(prefix=name, remove_duplicate=False):
                self.param_names.setdefault(id(p), n)
                self.tensor(p, n, held_by)
            for n, b in obj.named_buffers(prefix=name, remove_duplicate=False):
                self.tensor(b, n, held_by)
        elif isinstance(obj, torch.optim.Optimizer):
            self.optimizers.append((name, obj, held_by))  # after every module, so parameters have their names
        elif depth > 0 and isinstance(obj, (list, tuple)):
            for i, x in enumerate(obj):
                self.walk(x, f"{name}[{i}]", held_by, depth - 1, context)
        elif depth > 0 and isinstance(obj, Mapping):
            for k, x in list(obj.items()):
                self.walk(x, f"{name}[{k!r}]", held_by, depth - 1, context)

    def walk_safely(self, obj: Any, name: str, held_by: str, context: str | None = None) -> None:
        try:
            self.walk(obj, name, held_by, context=context)
        except Exception:  # noqa: BLE001  a user object that fails to answer (dead weakproxy, odd Mapping)
            pass

    def walk_optimizers(self) -> None:
        for name, opt, held_by in self.optimizers:
            pnames: dict[int, str] = {}
            for gi, group in enumerate(opt.param_groups):
                for pi, p in enumerate(group["params"]):
                    owner = self.param_names.get(id(p))
                    pnames[id(p)] = owner or f"{name}.param_groups[{gi}].params[{pi}]"
                    if owner is None:
                        self.tensor(p, pnames[id(p)], held_by)
            for p, state in list(opt.state.items()):
                pname = pnames.get(id(p)) or self.param_names.get(id(p), "?")
                for k, v in list(state.items()):
                    if isinstance(v, torch.Tensor):
                        self.tensor(v, f"{name}.state[{pname}].{k}", held_by)

    def walk_graphs(self) -> None:
        """Saved tensors of the autograd graphs behind every tensor found (``_saved_*``, leaves' variables)."""
        seen: dict[int, Any] = {}  # keeps nodes alive while the scan runs, so their ids stay unique
        queue = deque((name, fn, True, context) for name, fn, context in self.roots)
        while queue and len(seen) < MAX_GRAPH_NODES:
            root, fn, top, context = queue.popleft()
            if fn is None or id(fn) in seen:
                continue
            seen[id(fn)] = fn
            for attr, value in _saved(fn):
                tensors = [(attr, value)] if isinstance(value, torch.Tensor) else \
                    [(f"{attr}[{i}]", t) for i, t in enumerate(value) if isinstance(t, torch.Tensor)] \
                    if isinstance(value, (list, tuple)) else []
                for what, t in tensors:
                    self.tensor(t, _saved_name(root, fn, top, what, context), AUTOGRAD, root=False)
            queue.extend((root, nxt, False, context) for nxt, _ in fn.next_functions)

    def walk_tracebacks(self, shell: Any, tracebacks: list[Any] | None = None) -> None:
        """Locals of the last traceback's function frames (the cell's own frame is the namespace); ``tracebacks``:
        these instead of the ones IPython and ``sys`` keep (an error being shown has none of them yet).

        A local of the user's is named with its function and line ("h in Block.forward at In[3] line 21"). Library
        frames (torch's, neuron_lab's: the emulator's op dispatch, which also hides from IPython's tracebacks) come
        last and only name storages that no frame of the user's holds, in the user's terms: the module running there
        and the user's line that called it ("activation in model.blocks.0.attn at In[3] line 21"), never a library
        function's locals. What their autograd graphs saved is named the same way ("saved for backward by
        MmBackward0 in ...").
        """
        seen: set[int] = set()
        frames: list[tuple[bool, Any, str, str]] = []  # (a library's, frame, its place in the user's terms, what)
        locator = CellLocator(shell)
        if tracebacks is None:
            tracebacks = [getattr(sys, "last_traceback", None),
                          getattr(getattr(sys, "last_exc", None), "__traceback__", None),
                          getattr(shell.InteractiveTB, "tb", None),
                          getattr(getattr(getattr(shell, "last_execution_result", None), "error_in_exec", None),
                                  "__traceback__", None)]
        for tb in tracebacks:
            where, module = None, None
            while tb is not None:
                f = tb.tb_frame
                library = _library_frame(f)
                if not library:
                    where = locator.site(f.f_code.co_filename, tb.tb_lineno).label
                owner = f.f_locals.get("self")
                if isinstance(owner, torch.nn.Module) and id(owner) in self.module_names:
                    module = self.module_names[id(owner)]
                if id(f) not in seen and f.f_code.co_flags & inspect.CO_OPTIMIZED:
                    seen.add(id(f))
                    if library:
                        frames.append((True, f, _context(module or f"{f.f_code.co_name}()", where),
                                       "activation" if module else "temporary"))
                    else:
                        frames.append((False, f, _context(f.f_code.co_qualname, where), ""))
                tb = tb.tb_next
        for library, f, context, what in sorted(frames, key=lambda frame: frame[0]):
            self.fallback_names, self.where = library, f" in {context}"
            for n, v in list(f.f_locals.items()):
                if isinstance(v, torch.nn.Module) and id(v) in self.module_names:
                    continue  # a module of the namespace's (a method's ``self``): its tensors have their names
                self.walk_safely(v, what if library else n, TRACEBACK, context)
        self.where = ""
        self.fallback_names = False


_LIBRARIES = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch, sys.modules["neuron_lab"]))


def _library_frame(f: Any) -> bool:
    return bool(f.f_locals.get("__tracebackhide__")) or f.f_code.co_filename.startswith(_LIBRARIES)


_SAVED_ATTRS: dict[type, tuple[str, ...]] = {}


def _saved(fn: Any) -> list[tuple[str, Any]]:
    """(attribute, value) of what an autograd node keeps for backward; nothing once backward freed it."""
    cls = type(fn)
    attrs = _SAVED_ATTRS.get(cls)
    if attrs is None:
        attrs = _SAVED_ATTRS[cls] = tuple(a for a in dir(cls) if a.startswith("_saved_")
                                          or a in ("saved_tensors", "variable"))
    out = []
    for a in attrs:
        try:
            out.append((a, getattr(fn, a)))
        except RuntimeError:  # "Trying to backward through the graph a second time": freed by backward
            pass
    if isinstance(fn, torch.autograd.function.BackwardCFunction):  # a custom Function's ctx.<attr> = tensor
        out += [(a, v) for a, v in vars(fn).items() if isinstance(v, torch.Tensor)]
    return out


def _context(owner: str, where: str | None) -> str:
    """A library frame's place in the user's terms: the module (or function) running and the user's line below it."""
    return owner if where is None else f"{owner} at {where}"


def _saved_name(root: str, fn: Any, top: bool, attr: str, context: str | None) -> str:
    """What one autograd node saved for backward: "y.grad_fn…MulBackward0._saved_self" from a tensor of the
    namespace's; "saved for backward by MmBackward0 in model.blocks.0.attn at In[3] line 21" from a frame's."""
    if context is not None:
        return f"saved for backward by {type(fn).__name__} in {context}"
    return f"{root}.grad_fn.{attr}" if top else f"{root}.grad_fn…{type(fn).__name__}.{attr}"


def ipython_own(ns: dict[str, Any], hidden: dict[str, Any], name: str) -> bool:
    """IPython's own entries, as ``%who`` tells them: a hidden name still bound to the hidden value."""
    return name in hidden and hidden[name] is ns[name]


def device_tensors(shell: Any, tracebacks: list[Any] | None = None, synchronize: bool = True) -> TensorTable:
    """The live storages of the backend's device and who holds them, biggest first; holds no tensor once it
    returns. ``tracebacks``: the ones whose frames hold tensors, where not IPython's last ones. ``synchronize``:
    False where the last cell's closing synchronize is the latest device work (a view rebuilt between cells)."""
    b = _backend.active()
    scan = _Scan(b.device_type)
    ns, hidden = shell.user_ns, shell.user_ns_hidden
    items = list(ns.items())
    for name, obj in items:
        if not ipython_own(ns, hidden, name):
            scan.walk_safely(obj, name, NAMESPACE)
    out = getattr(getattr(shell, "history_manager", None), "output_hist", None) or {}
    for k, obj in list(out.items()):
        scan.walk_safely(obj, f"Out[{k}]", OUTPUT_CACHE)
    for name, obj in items:
        if _OUT_NAME.fullmatch(name) and ipython_own(ns, hidden, name):
            scan.walk_safely(obj, name, OUTPUT_CACHE)
    for name in ("_", "__", "___"):
        obj = getattr(shell.displayhook, name, None)
        if obj is not ns.get(name):
            scan.walk_safely(obj, name, OUTPUT_CACHE)
    scan.walk_tracebacks(shell, tracebacks)
    scan.walk_optimizers()
    scan.walk_graphs()

    rows = [TensorRow(tuple(s.names or s.graph_names), s.shape, s.dtype, s.nbytes, s.requires_grad,
                      HELD_BY[s.rank], ptr) for ptr, s in scan.storages.items()]
    allocated = b.allocated_everywhere(synchronize)  # the rows are every device's
    rows += [TensorRow((), a.shape, a.dtype, a.nbytes, None, UNKNOWN, a.ptr)
             for a in b.live_allocations() if a.ptr not in scan.storages]
    rest = allocated - sum(r.bytes for r in rows)
    if rest > 0:  # what the backend counts but cannot list (TorchNeuron), or a scan missed
        rows.append(TensorRow((), None, None, rest, None, UNKNOWN, None))
    rows.sort(key=lambda r: (-r.bytes, r.names))
    return TensorTable(b.device_type, allocated, rows)
