"""Op events: what ran natively, what fell back to the CPU, and what was silently downcast.

Both backends feed one :class:`OpRecorder`. It keeps cheap per-op aggregates always (the
TorchNeuron-style name sets are derived from them) and hands individual :class:`OpEvent`s to
subscribers only when somebody subscribed, so an idle workbench costs a dict update per op.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import CodeType
from typing import Any, NamedTuple

from torch import Tensor as _Tensor

from neuron_lab.kinds import KINDS, NOTES

# A code object's role for a subscriber that takes calls by line (``subscribe(..., roles=)``): a producer walking the
# calling frames skips INTERNAL ones, notes the innermost LIBRARY one and stops at the innermost USER one; at an ASK
# one it hands the call to the subscriber.
INTERNAL, LIBRARY, USER, ASK = 0, 1, 2, 3
Roles = Callable[[CodeType], int]
Subscriber = Callable[["OpEvent", tuple, dict], Any]

MAX_SIGNATURES = 4  # distinct (shapes, dtypes) kept per op
SIGNATURE_PROBES = 256  # calls per op that are inspected for a new signature


def op_key(name: str) -> str:
    """The op a name stands for, whatever overload or spelling: how names from TorchNeuron's op-tracking sets
    (``"aten::atan2.out"``, ``"aten::add.Tensor"``, a bare ``"add"``) meet the observer's (``"aten::atan2"``): the
    sets name one overload per op (a structured op's functional and in-place calls run as its ``.out``), so rows and
    set entries are matched by op, never by overload."""
    base = name.removeprefix("aten::").partition(".")[0]
    return base[:-1] if base.endswith("_") and not base.endswith("__") else base


class DeviceOp(NamedTuple):
    """An op the device itself reported for a window (TorchNeuron's ``get_fallback_ops()``), as it names it."""

    name: str  # TorchNeuron's name, overload included: "aten::add.Tensor"
    kind: str  # a name of neuron_lab.kinds.KINDS
    reason: str


@dataclass
class WindowAccount:
    """What a backend itself says about a tracked window, read once after the window's closing synchronize
    (:meth:`~neuron_lab.backend.interface.NeuronBackend.end_window`); empty where the observer is the whole account
    (the emulator)."""

    ops: list[DeviceOp] = field(default_factory=list)  # ops it reports as run off the device
    neff_compile_us: int = 0  # the device compiler's time (TorchNeuron: neuronx-cc, torch_neuronx_compile_us)
    neff_cache: tuple[int, int] | None = None  # (hits, misses) of the compiled-graph cache; None: not counted
    eager_graphs: list[str] = field(default_factory=list)  # compiled graphs that failed and ran eagerly, its words


class OpEvent(NamedTuple):
    """One op call as a subscriber sees it (a tuple: made once per reported call, so it must be cheap)."""

    name: str  # "aten::atan2"
    overload: str  # "out", "" for the default overload
    kind: str  # a name of neuron_lab.kinds.KINDS
    reason: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    host_ns: int  # time spent running the op on the host (a collective: from the call to its completion)
    nbytes: int = 0  # a collective's payload: the bytes of the tensors it was handed
    ranks: int = 0  # a collective's group size

    @property
    def qualified_name(self) -> str:
        return qualified(self.name, self.overload)


def qualified(name: str, overload: str) -> str:
    """``aten::atan2`` + ``out`` -> ``aten::atan2.out``: how TorchNeuron's op tracking names an op."""
    return f"{name}.{overload}" if overload else name


@dataclass
class OpStats:
    """Aggregate of every call of one (op, overload, kind)."""

    name: str
    overload: str
    kind: str
    reason: str
    count: int = 0
    host_ns: int = 0
    signatures: list[tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]] = field(default_factory=list)

    @property
    def qualified_name(self) -> str:
        return qualified(self.name, self.overload)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "overload": self.overload,
            "kind": self.kind,
            "reason": self.reason,
            "count": self.count,
            "host_ns": self.host_ns,
            "signatures": [
                {"shapes": [list(s) for s in shapes], "dtypes": list(dtypes)} for shapes, dtypes in self.signatures
            ],
        }


def signature_of(args: tuple, kwargs: dict) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]:
    """Shapes and dtypes of the tensor arguments (one level into lists), in order."""
    tensors: list[_Tensor] = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, _Tensor):
            tensors.append(a)
        elif isinstance(a, (list, tuple)):
            tensors.extend(b for b in a if isinstance(b, _Tensor))
    return tuple(tuple(t.shape) for t in tensors), tuple(str(t.dtype).removeprefix("torch.") for t in tensors)


class OpRecorder:
    """Thread-safe op aggregates plus an optional event stream.

    Backward kernels run on autograd's device thread, so updates take a lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stats: dict[tuple[str, str, str], OpStats] = {}
        self._subscribers: list[tuple[Subscriber, frozenset[str], Roles | None]] = []
        self._wanted: frozenset[str] = frozenset()  # kinds some subscriber wants
        self._by_kind: dict[str, tuple[Subscriber, ...]] = {}  # kind: its subscribers
        self.calls = 0  # ops recorded since the process started (downcast notes excluded); never cleared
        self.h2d_bytes = 0  # since the last clear()
        self.d2h_bytes = 0
        self.transfers_total = (0, 0)  # (h2d, d2h) since the process started; never cleared: windows diff it

    # -- recording -------------------------------------------------------------------------
    def record(self, name: str, overload: str, kind: str, reason: str, args: tuple, kwargs: dict, host_ns: int) -> None:
        key = (name, overload, kind)
        with self._lock:
            st = self._stats.get(key)
            if st is None:
                st = self._stats[key] = OpStats(name, overload, kind, reason)
            st.count += 1
            st.host_ns += host_ns
            if kind not in NOTES:  # a downcast is a note on a call that is recorded as well
                self.calls += 1
            probe = st.count <= SIGNATURE_PROBES and len(st.signatures) < MAX_SIGNATURES
        sig = None
        if probe:
            sig = signature_of(args, kwargs)
            with self._lock:
                if sig not in st.signatures and len(st.signatures) < MAX_SIGNATURES:
                    st.signatures.append(sig)
        if kind in self._wanted:
            if sig is None:
                sig = signature_of(args, kwargs)
            event = OpEvent(name, overload, kind, reason, sig[0], sig[1], host_ns)
            for fn in self._by_kind.get(kind, ()):
                fn(event, args, kwargs)

    def wants(self, kind: str) -> bool:
        """Whether a subscriber takes events of ``kind`` (producers skip making them otherwise)."""
        return kind in self._wanted

    def emit(self, event: OpEvent, args: tuple = ()) -> None:
        """Hand ``event`` (a collective: made by Python code, not by a core's op path) to its subscribers; no
        aggregates are kept for it."""
        for fn in self._by_kind.get(event.kind, ()):
            fn(event, args, {})

    def record_transfer(self, h2d: int = 0, d2h: int = 0) -> None:
        with self._lock:
            self.h2d_bytes += h2d
            self.d2h_bytes += d2h
            th, td = self.transfers_total
            self.transfers_total = (th + h2d, td + d2h)

    # -- subscription ------------------------------------------------------------------------
    def subscribe(self, fn: Subscriber, kinds: frozenset[str] | set[str] | None = None,
                  roles: Roles | None = None) -> Callable[[], None]:
        """Call ``fn(event, args, kwargs)`` for every op of ``kinds`` (default: all) from now on.

        Returns the unsubscribe function. Kinds nobody asked for cost no event at all. With ``roles`` (the
        subscriber's role of a code object), a producer that counts calls by line itself (the compiled core) may hand
        ``fn`` only a line's first call: once ``fn`` returns ``(tally, n)`` for a call, the producer counts further
        calls of that op at that line and hands them over as ``tally(calls, host_ns)`` at :meth:`flush`, except those
        of the next ``n`` calls whose calling frames differ from every call it handed ``fn`` at the line (their stacks
        may be new), which ``fn`` gets.
        """
        entry = (fn, frozenset(KINDS if kinds is None else kinds), roles)
        with self._lock:
            self._subscribers.append(entry)
            self._subscribers_changed()

        def unsubscribe() -> None:
            with self._lock:
                if entry in self._subscribers:
                    self._subscribers.remove(entry)
                self._subscribers_changed()

        return unsubscribe

    def _subscribers_changed(self) -> None:
        """Each kind's subscribers as a tuple, made once here (a delivery takes one dict look-up and copies
        nothing), and the kinds anybody wants."""
        if len(self._subscribers) == 1:  # a tracked cell's window alone: every kind it asked for is its own
            fn, kinds, _ = self._subscribers[0]
            by_kind = dict.fromkeys(kinds, (fn,))
        else:
            by_kind = {}
            for fn, kinds, _ in self._subscribers:
                for k in kinds:
                    by_kind[k] = (*by_kind.get(k, ()), fn)
        self._by_kind = by_kind
        self._wanted = frozenset(by_kind)
        self._wanted_changed()

    def _wanted_changed(self) -> None:
        """Hook for recorders whose producer must know which kinds to deliver."""

    def flush(self, keep: bool = True) -> None:
        """Hand the calls a producer counted by line to their subscribers' tallies (``keep=False``: drop them).

        Readers call it before reading a subscriber's counts mid-window; a change of subscribers flushes too."""

    # -- reading -----------------------------------------------------------------------------
    def stats(self, kind: str | None = None) -> list[OpStats]:
        with self._lock:
            rows = [st for st in self._stats.values() if kind is None or st.kind == kind]
        return sorted(rows, key=lambda s: (-s.count, s.name, s.overload))

    def names(self, kind: str) -> set[str]:
        with self._lock:
            return {st.name for st in self._stats.values() if st.kind == kind}

    def clear(self) -> None:
        with self._lock:
            self._stats.clear()
            self.h2d_bytes = 0
            self.d2h_bytes = 0

