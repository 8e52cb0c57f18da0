"""The compiled core's Python side: load it, configure it, and read its counters.

The C++ core (``_core``, built from ``csrc/``) registers the device guard, hooks, allocator, generators
and the PrivateUse1 kernels itself when it is imported, so importing it is the commitment: ``load()``
is called only once the emulator is going to install. Per-op counts stay in C++; Python is called
only for the op kinds a subscriber asked for (for a subscriber that takes calls by line, only for a line's first
calls: the core counts the rest at their line, ``csrc/lines.cpp``), and to classify an op the first time it meets a
new dtype set.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

from neuron_lab import settings
from neuron_lab.backend import syncs
from neuron_lab.backend.emulator import aborts, policy
from neuron_lab.backend.events import OpEvent, OpRecorder, OpStats, qualified
from neuron_lab.kinds import DOWNCAST, KINDS, NATIVE, SYNC

if TYPE_CHECKING:
    from neuron_lab.backend.coverage import Coverage

_CORE = settings.env("NEURON_LAB_CORE")
CORE_ENV, CORE_CHOICES = _CORE.name, _CORE.choices
# The core numbers kinds in this order (it is told at configure): the two it makes itself first, then the rest.
CORE_KINDS = (NATIVE, DOWNCAST, *(k for k in KINDS if k not in (NATIVE, DOWNCAST)))
_new_tuple = tuple.__new__  # an OpEvent made without its generated __new__ (a Python call per delivered op)


def choice(env: dict[str, str] | None = None) -> tuple[str, str | None]:
    """The requested core and, for a bad value, the problem to report."""
    return _CORE.choice(env)


_MODULE = "neuron_lab.backend.emulator._core"
_RECORD = "neuron_lab.backend.emulator._core_torch"  # setup.py writes it beside the core it builds
_REBUILD = "pip install --no-build-isolation --force-reinstall neuron_lab"  # builds the core against this torch


def built_for() -> str | None:
    """The torch version the installed core was built against, from its record; None for a core without one."""
    try:
        return importlib.import_module(_RECORD).TORCH_VERSION
    except ImportError:
        return None


def _minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def load() -> tuple[ModuleType | None, str]:
    """The compiled core module, or None with the reason it cannot be used.

    A core built for another torch minor is not imported at all: its C++ ABI against this libtorch can crash the
    process, not just fail the import."""
    if importlib.util.find_spec(_MODULE) is None:
        return None, ("the compiled core is not built in this install (no compiler at install time, or "
                      f"NEURON_LAB_BUILD_CORE=0); build it for this torch with `{_REBUILD}`")
    built, running = built_for(), _minor(torch.__version__)
    if built is not None and _minor(built) != running:
        return None, (f"built for torch {_minor(built)}, this is torch {running}: running the pure-Python core; "
                      f"install the neuron_lab wheel built for torch {running}, or build from source with "
                      f"`{_REBUILD}`")
    try:
        return importlib.import_module(_MODULE), "compiled core loaded"
    except ImportError as e:
        return None, (f"the compiled core does not load against torch {torch.__version__} "
                      f"({str(e).splitlines()[0]}); build it for this torch with `{_REBUILD}`")


@dataclass(frozen=True)
class LiveBlock:
    """One live allocation, spelled as the pure-Python core's ``Allocation``."""

    ptr: int
    nbytes: int
    dtype: torch.dtype | None
    shape: tuple[int, ...] | None
    created_ns: int
    site: tuple[str, ...] | None


class CoreMemory:
    """Device memory as the compiled core counts it, per device."""

    def __init__(self, core: ModuleType) -> None:
        self._core = core

    def capacity_of(self, device: int = 0) -> int:
        return self._core.capacity(device)

    def allocated_of(self, device: int = 0) -> int:
        return self._core.memory_allocated(device)

    def stats(self, device: int = 0) -> dict[str, int]:
        return self._core.memory_stats(device)  # unsorted: torch.accelerator sorts its own copy

    def values(self, device: int, keys: tuple[str, ...]) -> tuple[int, ...]:
        return self._core.memory_values(device, keys)  # no dict of every counter: a reading's few

    def reset_peak(self, device: int = 0) -> None:
        self._core.reset_peak(device)

    def reset_accumulated(self, device: int = 0) -> None:
        self._core.reset_accumulated(device)

    def empty_cache(self, device: int = 0) -> None:
        self._core.empty_cache(device)

    def mem_get_info(self, device: int = 0) -> tuple[int, int]:
        return self._core.mem_get_info(device)

    def open_window(self, device: int = 0) -> int:
        return self._core.open_window(device)

    def close_window(self, window: int) -> int:
        return self._core.close_window(window)

    def set_record_sites(self, enabled: bool) -> None:
        self._core.set_record_sites(enabled)

    def record_history(self, enabled: bool, context: int, max_entries: int, clear: bool) -> None:
        self._core.record_memory_history(enabled, context, max_entries, clear)

    def snapshot(self) -> dict[str, Any]:
        return self._core.memory_snapshot()

    def live(self) -> list[LiveBlock]:
        return [LiveBlock(ptr, n, getattr(torch, dtype) if dtype else None, shape, created, site)
                for ptr, n, dtype, shape, created, site, _device in self._core.live_allocations()]


@functools.lru_cache(maxsize=64)
def _mask(kinds: frozenset[str]) -> int:
    """The core's bit per kind, found once per set of kinds (a tracked cell subscribes and unsubscribes the same)."""
    return sum(1 << CORE_KINDS.index(k) for k in kinds)


class CoreRecorder(OpRecorder):
    """The op aggregates the compiled core keeps, behind :class:`OpRecorder`'s reading interface.

    The core calls :meth:`deliver` for the kinds some subscriber wants; everything else is counted in C++, and so
    are the further calls at a line whose subscriber returned a tally for it (:meth:`OpRecorder.subscribe`).
    """

    def __init__(self, core: ModuleType) -> None:  # noqa: D107  (the counters live in the core, not here)
        self._lock = threading.Lock()
        self._subscribers = []
        self._wanted = frozenset()
        self._by_kind = {}
        self._core = core

    def deliver(self, name: str, overload: str, kind: str, reason: str, shapes: tuple, dtypes: tuple,
                host_ns: int, args: tuple) -> Any:
        """Hands one call to the kind's subscribers; returns what a sole subscriber returned (a line's tally and how
        many of its next calls it takes, :meth:`OpRecorder.subscribe`)."""
        event = (syncs.event(qualified(name, overload), shapes, dtypes) if kind == SYNC
                 else _new_tuple(OpEvent, (name, overload, kind, reason, shapes, dtypes, host_ns, 0, 0)))
        fns = self._by_kind.get(kind, ())
        if len(fns) == 1:
            return fns[0](event, args, {})
        for fn in fns:
            fn(event, args, {})
        return None

    def _wanted_changed(self) -> None:
        self._core.set_wanted(_mask(self._wanted))
        # The core counts calls by line for the kinds whose one subscriber takes them so (one such subscriber only:
        # the core keeps one set of roles); the counts it kept under the old subscribers go to their tallies first.
        by_line = [(fn, kinds, roles) for fn, kinds, roles in self._subscribers if roles is not None]
        fn, kinds, roles = by_line[0] if len(by_line) == 1 else (None, frozenset(), None)
        # a sole subscriber's kinds are all its own (a tracked cell's window alone)
        lined = _mask(kinds if len(self._subscribers) == 1 else
                      frozenset(k for k in kinds if self._by_kind.get(k) == (fn,)))
        self._hand_over(self._core.set_lines(lined, roles, threading.main_thread().ident))

    def flush(self, keep: bool = True) -> None:
        counts = self._core.take_lines()
        if keep:
            self._hand_over(counts)

    @staticmethod
    def _hand_over(counts: list[tuple[Any, int, int]]) -> None:
        for tally, calls, host_ns in counts:
            tally(calls, host_ns)

    def stats(self, kind: str | None = None) -> list[OpStats]:
        rows = [OpStats(name, overload, k, reason, count, host_ns,
                        [(tuple(tuple(s) for s in shapes), tuple(dtypes)) for shapes, dtypes in sigs])
                for name, overload, k, reason, count, host_ns, sigs in self._core.op_rows()
                if kind is None or k == kind]
        return sorted(rows, key=lambda s: (-s.count, s.name, s.overload))

    def names(self, kind: str) -> set[str]:
        return {st.name for st in self.stats(kind)}

    def clear(self) -> None:
        self._core.clear_ops()

    @property
    def calls(self) -> int:  # type: ignore[override]
        return self._core.op_calls()

    @property
    def h2d_bytes(self) -> int:  # type: ignore[override]
        return self._core.transfers()[0]

    @property
    def d2h_bytes(self) -> int:  # type: ignore[override]
        return self._core.transfers()[1]

    @property
    def transfers_total(self) -> tuple[int, int]:  # type: ignore[override]
        t = self._core.transfers()
        return t[2], t[3]


class CoreDevices:
    """Device selection and generators, served by the core's guard and hooks."""

    def __init__(self, core: ModuleType) -> None:
        self._core = core

    def device_count(self) -> int:
        return self._core.device_count()

    def current_device(self) -> int:
        return self._core.current_device()

    def set_device(self, index: int) -> None:
        self._core.set_device(index)

    def check(self, index: int) -> int:
        try:
            return self._core.checked_index(index)
        except RuntimeError as e:  # TorchNeuron's set_device raises ValueError for a bad index
            raise ValueError(str(e)) from None

    def generator(self, index: int) -> torch.Generator:
        return self._core.default_generator(index)


class CoreTrace:
    """The device's lanes in torch.profiler, for work the core does not run itself (collectives)."""

    def __init__(self, core: ModuleType) -> None:
        self.active = core.tracing
        self.clock = core.profile_clock
        self.collective = core.trace_collective


class CoreBridge:
    """Zero-copy host views for code that computes on the host itself (compiled graphs)."""

    def __init__(self, core: ModuleType) -> None:
        self.to_host = core.to_host
        self._from_host = core.from_host

    def from_host(self, r: torch.Tensor, device: int | None = None) -> torch.Tensor:
        return self._from_host(r, -1 if device is None else device)


def set_coverage(core: ModuleType, coverage: Coverage) -> None:
    """The coverage changed: the core classifies every op afresh and hands the calls of the coverage's abort ops to
    ``aborts.check`` (no other op calls into Python for it)."""
    core.forget_kinds()
    core.set_aborts(coverage.abort_ops(), aborts.check)


def configure(core: ModuleType, capacities: list[int], classify: Any, recorder: CoreRecorder, site: Any,
              emulate_downcast: bool) -> None:
    core.set_policy(policy.for_core(emulate_downcast, CORE_KINDS))  # the rules the Python core reads from policy.py
    core.configure(capacities, list(CORE_KINDS), classify, recorder.deliver, site, emulate_downcast)
    # torch.profiler: calls of off-device kinds are host work ("CPU fallback: aten::nonzero"), the rest device kernels
    core.set_trace_kinds(list(CORE_KINDS),
                         [KINDS[k].call.removesuffix(" call") if KINDS[k].off_device else "" for k in CORE_KINDS])
