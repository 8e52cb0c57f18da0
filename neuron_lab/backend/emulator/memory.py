"""The pure-Python core's device memory: host buffers presented as `neuron` storages, with exact accounting.

Every device StorageImpl is one :class:`Allocation`. Bytes count once per storage (views share it)
and are released when the storage's Python object dies, which PyTorch delays until the last view
dies (PyObject preservation). The weakref callback that notices the death is a C method
(``deque.append``), so no Python runs there and a Ctrl-C can neither be swallowed in it nor lose
the free; the accounting catches up (idempotently) before any count is read or changed. The registry
maps a storage's data pointer to its host bytes, which is also how C++-made storages around our
pointers are resolved.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from neuron_lab.backend.emulator.topology import CAPACITY_ENV
from neuron_lab.units import format_size

BLOCK = 512  # reserved bytes are rounded like the CUDA caching allocator's blocks

_CPU = torch.device("cpu")


@dataclass
class Allocation:
    """One live device storage."""

    ptr: int
    nbytes: int
    host: torch.UntypedStorage  # owns the bytes
    cpu_view: torch.UntypedStorage  # non-resizable CPU alias: CPU kernels may write but never reallocate
    storage_ref: weakref.ref
    created_ns: int
    dtype: torch.dtype | None = None  # of the tensor the storage was made for
    shape: tuple[int, ...] | None = None
    site: tuple[str, ...] | None = None  # creation stack, when requested
    frames: list[dict] | None = None  # creation stack for memory history, innermost first


class Allocator:
    """Counters with CUDA's ``memory_stats`` semantics for one emulated device.

    Its public methods take a device index, as the compiled core's do (only 0 exists here).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._device = torch.device("neuron", 0)  # needs PrivateUse1 renamed first
        self.record_sites = False
        # Reentrant: a garbage collection inside a locked section can run the weakref callback that
        # frees another storage (``_free``) on the same thread.
        self._lock = threading.RLock()
        self._live: dict[int, Allocation] = {}
        self._dead: deque[weakref.ref] = deque()  # storages that died, not yet accounted
        self._ptr_of: dict[int, int] = {}  # id(weakref) -> pointer
        self._windows: dict[int, int] = {}  # open peak windows: id -> the highest `allocated` since it opened
        self._next_window = 0
        self._history: deque[dict] | None = None  # memory history entries, as CUDA's snapshot spells them
        self._context = 0  # which stacks history keeps: 0 none, 1 live blocks, 2 and allocations, 3 and frees
        self._reset_all()

    def _reset_all(self) -> None:
        self.allocated = self.peak = 0
        self.reserved = self.peak_reserved = 0
        self.total_allocated = self.total_freed = 0
        self.total_reserved = self.total_released = 0
        self.n_alloc = self.n_free = 0
        self.peak_count = 0
        self.num_ooms = 0

    # -- allocation ------------------------------------------------------------------------
    def new_storage(self, nbytes: int, dtype: torch.dtype | None = None, shape=None) -> torch.UntypedStorage:
        """A fresh device storage of ``nbytes`` (zeroed host memory is not promised, as on a device)."""
        self._check_capacity(nbytes)
        host = torch.UntypedStorage(max(nbytes, 1))
        return self._register(host, nbytes, dtype, shape)

    def adopt(self, host: torch.UntypedStorage, dtype: torch.dtype | None = None, shape=None) -> torch.UntypedStorage:
        """Present an existing CPU storage (a kernel's result) as device memory, zero-copy."""
        nbytes = host.nbytes()
        self._check_capacity(nbytes)
        if host.data_ptr() == 0:
            host = torch.UntypedStorage(1)  # empty results may have no buffer; ours need a unique pointer
        return self._register(host, nbytes, dtype, shape)

    def _check_capacity(self, nbytes: int) -> None:
        self.settle()
        if self.allocated + nbytes > self.capacity:
            with self._lock:
                self.num_ooms += 1
                self._trace("oom", nbytes, _stack() if self._context >= 2 else None,
                            device_free=self.capacity - self.allocated)
            raise torch.OutOfMemoryError(
                f"neuron:0 out of memory (emulated): tried to allocate {format_size(nbytes)}; "
                f"{format_size(self.allocated)} of {format_size(self.capacity)} already allocated, "
                f"{format_size(self.capacity - self.allocated)} free. "
                f"The emulated capacity is set by {CAPACITY_ENV}."
            )

    def _register(self, host: torch.UntypedStorage, nbytes: int, dtype, shape) -> torch.UntypedStorage:
        ptr = host.data_ptr()
        storage = torch._C._construct_storage_from_data_pointer(ptr, self._device, nbytes)
        cpu_view = torch._C._construct_storage_from_data_pointer(ptr, _CPU, nbytes)
        rounded = -(-nbytes // BLOCK) * BLOCK
        site = tuple(traceback.format_list(traceback.extract_stack()[:-3])) if self.record_sites else None
        frames = _stack() if self._context else None
        ref = weakref.ref(storage, self._dead.append)
        with self._lock:
            self._drain()
            self._ptr_of[id(ref)] = ptr
            self._live[ptr] = Allocation(ptr, nbytes, host, cpu_view, ref, time.monotonic_ns(),
                                         dtype, tuple(shape) if shape is not None else None, site, frames)
            if self._history is not None:
                self._trace("segment_alloc", rounded, frames, addr=ptr)
                self._trace("alloc", nbytes, frames, addr=ptr)
            self.allocated += nbytes
            self.reserved += rounded
            self.total_allocated += nbytes
            self.total_reserved += rounded
            self.n_alloc += 1
            if self.allocated > self.peak:
                self.peak = self.allocated
            for w, p in self._windows.items():
                if self.allocated > p:
                    self._windows[w] = self.allocated
            if self.reserved > self.peak_reserved:
                self.peak_reserved = self.reserved
            if len(self._live) > self.peak_count:
                self.peak_count = len(self._live)
        return storage

    def _drain(self) -> None:
        """Account the storages that died; call with the lock held.

        Each is accounted before it leaves the queue, and accounting it twice is a no-op, so an
        interrupt anywhere in here loses nothing.
        """
        while self._dead:
            ref = self._dead[0]
            ptr = self._ptr_of.get(id(ref))
            a = self._live.get(ptr) if ptr is not None else None
            if a is not None and a.storage_ref is ref:
                del self._live[ptr]
                rounded = -(-a.nbytes // BLOCK) * BLOCK
                self.allocated -= a.nbytes
                self.reserved -= rounded
                self.total_freed += a.nbytes
                self.total_released += rounded
                self.n_free += 1
                if self._history is not None:  # noticed after the storage died: the stack is the allocation's
                    for action, size in (("free_requested", a.nbytes), ("free_completed", a.nbytes),
                                         ("segment_free", rounded)):
                        self._trace(action, size, a.frames, addr=ptr)
            self._ptr_of.pop(id(ref), None)
            self._dead.popleft()

    def settle(self) -> None:
        """Bring the counts up to date with every storage that died."""
        if self._dead:
            with self._lock:
                self._drain()

    # -- lookup ----------------------------------------------------------------------------
    def lookup(self, ptr: int) -> Allocation | None:
        return self._live.get(ptr)

    def live(self) -> list[Allocation]:
        """Live allocations, oldest first (a snapshot; holds no storage alive)."""
        with self._lock:
            self._drain()
            return sorted(self._live.values(), key=lambda a: a.created_ns)

    # -- the device-memory interface both cores offer ----------------------------------------
    def capacity_of(self, device: int = 0) -> int:
        return self.capacity

    def allocated_of(self, device: int = 0) -> int:
        self.settle()
        return self.allocated

    def empty_cache(self, device: int = 0) -> None:
        """Freed blocks are returned at once; there is no cache to empty."""

    def mem_get_info(self, device: int = 0) -> tuple[int, int]:
        self.settle()
        return self.capacity - self.allocated, self.capacity

    def set_record_sites(self, enabled: bool) -> None:
        self.record_sites = enabled

    # -- memory history (torch.neuron.memory): one segment per allocation, no cache -------------
    def record_history(self, enabled: bool, context: int, max_entries: int, clear: bool) -> None:
        """History on or off (off, or ``clear``, empties it); ``context`` as the compiled core's levels."""
        with self._lock:
            self._drain()
            kept = () if not enabled or clear or self._history is None else self._history
            self._history = deque(kept, maxlen=max(max_entries, 1)) if enabled else None
            self._context = context if enabled else 0

    def snapshot(self) -> dict:
        """Segments and history with the keys and values of ``torch.cuda.memory._snapshot()``."""
        with self._lock:
            self._drain()
            segments = [_segment(a) for a in sorted(self._live.values(), key=lambda a: a.ptr)]
            trace = list(self._history or ())
        return {"segments": segments, "device_traces": [trace],
                "allocator_settings": {"expandable_segments": False}, "external_annotations": []}

    def _trace(self, action: str, size: int, frames: list[dict] | None, **where: int) -> None:
        """Append one history entry (``addr=``, or ``device_free=`` for an OOM); call with the lock held."""
        if self._history is not None:
            self._history.append({"action": action, **where, "size": size, "stream": 0,
                                  "time_us": time.time_ns() // 1000,
                                  "frames": list(frames) if frames and self._context >= 2 else []})

    # -- statistics ------------------------------------------------------------------------
    def open_window(self, device: int = 0) -> int:
        """Start a peak of its own, leaving ``peak`` (what ``max_memory_allocated`` says) alone."""
        with self._lock:
            self._drain()
            self._next_window += 1
            self._windows[self._next_window] = self.allocated
            return self._next_window

    def close_window(self, window: int) -> int:
        """The highest allocated bytes since ``window`` opened; the window ends."""
        with self._lock:
            self._drain()
            return max(self._windows.pop(window, 0), self.allocated)

    def reset_peak(self, device: int = 0) -> None:
        with self._lock:
            self._drain()
            self.peak = self.allocated
            self.peak_reserved = self.reserved
            self.peak_count = len(self._live)

    def reset_accumulated(self, device: int = 0) -> None:
        with self._lock:
            self.total_allocated = self.total_freed = 0
            self.total_reserved = self.total_released = 0
            self.n_alloc = self.n_free = 0
            self.num_ooms = 0

    def stats(self, device: int = 0) -> dict[str, int]:
        """Flat keys as ``torch.cuda.memory_stats()`` spells them (pool: ``all``); torch.accelerator sorts them."""
        with self._lock:
            self._drain()
            n_live = len(self._live)
            groups = {
                "allocated_bytes": (self.allocated, self.peak, self.total_allocated, self.total_freed),
                "active_bytes": (self.allocated, self.peak, self.total_allocated, self.total_freed),
                "reserved_bytes": (self.reserved, self.peak_reserved, self.total_reserved, self.total_released),
                "allocation": (n_live, self.peak_count, self.n_alloc, self.n_free),
                "active": (n_live, self.peak_count, self.n_alloc, self.n_free),
                "segment": (n_live, self.peak_count, self.n_alloc, self.n_free),
            }
            flat: dict[str, int] = {}
            for key, (cur, peak, alloc, freed) in groups.items():
                for metric, v in (("current", cur), ("peak", peak), ("allocated", alloc), ("freed", freed)):
                    flat[f"{key}.all.{metric}"] = v
            flat["num_alloc_retries"] = 0
            flat["num_ooms"] = self.num_ooms
            flat["num_device_alloc"] = self.n_alloc
            flat["num_device_free"] = self.n_free
        return flat

    def values(self, device: int, keys: tuple[str, ...]) -> tuple[int, ...]:
        """The counters named by ``keys`` (flat keys), in their order."""
        stats = self.stats(device)
        return tuple(stats[k] for k in keys)


def torchneuron_stats(flat: dict[str, int]) -> dict[str, Any]:
    """A core's flat CUDA-style counters in the shape TorchNeuron's ``memory_stats()`` returns
    (``torch_neuronx/memory.py:28-54``, ``csrc/core/NeuronBindings.cpp:1239-1260``): both cores count the same
    numbers, so both give the same dict. ``num_tensor_frees`` counts freed storages and ``allocation_requests``
    allocations, as TorchNeuron's allocator counts them."""

    def group(key: str) -> dict[str, int]:
        return {m: flat[f"{key}.all.{m}"] for m in ("current", "peak", "allocated", "freed")}

    return {"allocated_bytes": group("allocated_bytes"), "reserved_bytes": group("reserved_bytes"),
            "active_bytes": group("active_bytes"), "num_alloc_retries": flat["num_alloc_retries"],
            "num_ooms": flat["num_ooms"], "num_tensor_frees": flat["allocation.all.freed"],
            "allocation_requests": flat["allocation.all.allocated"]}


def _stack() -> list[dict]:
    """The caller's Python stack, innermost first, as memory history frames."""
    frames, f = [], sys._getframe(1)
    while f is not None:
        frames.append({"filename": f.f_code.co_filename, "line": f.f_lineno, "name": f.f_code.co_name})
        f = f.f_back
    return frames


def _segment(a: Allocation) -> dict:
    """One live allocation as a snapshot segment holding one active block."""
    rounded = -(-a.nbytes // BLOCK) * BLOCK
    frames = a.frames or []
    block = {"address": a.ptr, "size": rounded, "requested_size": a.nbytes, "state": "active_allocated",
             "frames": frames}
    return {"device": 0, "address": a.ptr, "total_size": rounded, "allocated_size": rounded, "active_size": rounded,
            "requested_size": a.nbytes, "stream": 0, "segment_type": "small" if rounded <= 1 << 20 else "large",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": frames, "blocks": [block]}
