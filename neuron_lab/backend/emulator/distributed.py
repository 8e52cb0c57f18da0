"""The `neuron` c10d backend on the emulator: ``init_process_group(backend="neuron")`` over gloo.

A `neuron` tensor's bytes are host memory, so each collective hands gloo the tensors' zero-copy host
aliases and gloo writes the results straight into device memory; no transport of our own. As
TorchNeuron's ``ProcessGroupNeuron`` is, the group is a Python subclass of the C++ ``ProcessGroup``
(PyTorch 2.13 cannot subclass the C++ ``Backend`` from Python), so it replaces the whole group and takes
CPU tensors too (they pass through). Each call returns a Work whose future's value is the caller's
device tensors, completed when gloo's work is. Reductions gloo lacks are built as TorchNeuron builds
them: AVG as SUM then divide, PREMUL_SUM as multiply then SUM.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from neuron_lab import settings
from neuron_lab.backend.emulator import interruptible, lifecycle, mismatch
from neuron_lab.backend.emulator import runtime as _rt
from neuron_lab.backend.events import OpEvent, signature_of
from neuron_lab.kinds import COLLECTIVE, SOURCE, UNSUPPORTED

BACKEND = "neuron"
ReduceOp = dist.ReduceOp


def register() -> None:
    """Register the ``neuron`` backend for the ``neuron`` device, once; a torch without c10d skips it."""
    if dist.is_available() and not hasattr(dist.Backend, BACKEND.upper()):
        dist.Backend.register_backend(BACKEND, create, devices=[BACKEND])


def create(store: dist.Store, rank: int, size: int, timeout: timedelta) -> ProcessGroupNeuron:
    """The creator c10d calls for each group; the first one checks, as TorchNeuron's does, that the runtime has not
    started (no device use before ``init_process_group``), then attaches this process to its rank's device."""
    global _attached
    if not _attached:
        lifecycle.check_before_process_group()
        _attached = True
        _attach(rank)
    return ProcessGroupNeuron(store, rank, size, timeout)


_attached = False


def _attach(rank: int) -> None:
    """What TorchNeuron does at the first group: ``NEURON_RT_VISIBLE_CORES`` defaults to the local rank, and
    that device becomes current. A process the emulator already mapped at install (``LOCAL_RANK`` set
    then, as torchrun does) keeps its mapping; one whose launcher set ``LOCAL_RANK`` later (``mp.spawn``
    workers) moves to ``neuron:{LOCAL_RANK}`` when that device exists."""
    local = settings.env("LOCAL_RANK").text()
    settings.env("NEURON_RT_VISIBLE_CORES").setdefault(local or str(rank))
    rt = _rt.get()
    if rt.topology.local_rank is None and local.isdigit() and int(local) < rt.devices.device_count():
        rt.devices.set_device(int(local))


def _host(x: Any) -> Any:
    """``x`` with every `neuron` tensor replaced by its zero-copy host alias (lists kept as lists)."""
    if isinstance(x, torch.Tensor):
        return _rt.get().bridge.to_host(x) if x.device.type == BACKEND else x
    if isinstance(x, (list, tuple)):
        return [_host(v) for v in x]
    return x


def _flat(x: Any) -> list[torch.Tensor]:
    """The tensors of a nested list, in order."""
    if isinstance(x, torch.Tensor):
        return [x]
    return [t for v in x for t in _flat(v)]


def _done(works: Sequence[dist.Work], value: Any, after: Callable[[], None] | None = None,
          group: ProcessGroupNeuron | None = None) -> dist.Work:
    """A completed Work whose value is ``value``, once every gloo work is done and ``after`` (a host fix-up) ran.

    The collective completes before the call returns (a device whose memory is the host's has nothing to
    overlap it with), so no Python callback is ever left to run on gloo's threads while the interpreter exits:
    one left there aborts the process ("terminate called without an active exception").
    """
    for w in works:
        interruptible.wait(w)
    if group is not None:
        # Gloo's worker drops its own reference to this work just after completing it; hold ours until the next
        # collective completes (its single worker has dropped this one by then), so the last reference, and with it
        # the host aliases' Python wrappers, is released on a Python thread, never on gloo's (see _GLOO_THREADS).
        group._last = list(works)
    if after is not None:
        after()
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(value)
    return _create_work_from_future(fut)


class _Pending(dist.Work):
    """Gloo's pending point-to-point work, keeping the device tensors it reads or writes alive until it is done (gloo
    holds only their host aliases)."""

    def __init__(self, work: dist.Work, tensors: list[torch.Tensor]) -> None:
        super().__init__()
        self._work, self._tensors = work, tensors
        self.on_done: Callable[[], None] | None = None  # run once, when a wait first returns or raises

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        try:
            return self._work.wait(timeout) if timeout else self._work.wait()  # gloo's own: no slices
        finally:
            done, self.on_done = self.on_done, None
            if done is not None:
                done()

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def is_success(self) -> bool:
        return self._work.is_success()

    def exception(self) -> Any:
        return self._work.exception()

    def source_rank(self) -> int:
        return self._work.source_rank()

    def result(self) -> list[torch.Tensor]:
        return self._tensors


_OPTION_FIELDS = ("reduceOp", "rootRank", "rootTensor", "timeout", "asyncOp")


def _as_sum(opts: Any) -> Any:
    """A copy of ``opts`` with ``reduceOp`` SUM: the caller's own options stay as given (a coalesced call hands the
    same options to each of its tensors)."""
    copy = type(opts)()
    for name in _OPTION_FIELDS:
        if hasattr(opts, name):
            setattr(copy, name, getattr(opts, name))
    copy.reduceOp = ReduceOp.SUM
    return copy


def _sum_instead(opts: Any, size: int, inputs: list[torch.Tensor], outputs: list[torch.Tensor],
                 in_place: bool) -> tuple[Any, list[torch.Tensor], Callable[[], None] | None]:
    """Gloo's options, inputs and fix-up for ``opts.reduceOp``: AVG and PREMUL_SUM become SUM."""
    op = opts.reduceOp
    if op == ReduceOp.PREMUL_SUM:
        factor = op.factor
        if in_place:
            for t in inputs:
                t.mul_(factor)
        else:
            inputs = [t * factor for t in inputs]
        return _as_sum(opts), inputs, None
    if op != ReduceOp.AVG:
        return opts, inputs, None

    def average() -> None:
        for t in outputs:
            if t.is_floating_point() or t.is_complex():
                t.div_(size)
            else:
                t.floor_divide_(size)

    return _as_sum(opts), inputs, average


FP8 = frozenset(str(d).removeprefix("torch.") for d in (getattr(torch, n, None) for n in dir(torch) if "float8" in n)
                if isinstance(d, torch.dtype))
_APRIL = SOURCE + "torch-neuronx's ProcessGroupNeuron and its distributed tests' skip reasons (April 2026 source)"
# The collectives whose can_handle turns an empty tensor away in the April source (python_ops/xla_ops/*_xla.py):
# two of the seven empty-tensor gates derive_profile.py records; the other five guard no ATen op it can name.
_EMPTY_GATES = {"all_reduce": "AllReduceXLAOp", "all_to_all": "AllToAllXlaOp"}


def unsupported(pg: dist.ProcessGroup, name: str, tensors: list[torch.Tensor], args: tuple) -> str:
    """Why TorchNeuron's process group would refuse this call ("" when it runs there): the emulator still runs it,
    and the report says so."""
    dtypes = {t.dtype for t in tensors}
    if name in ("send", "recv"):
        return ("TorchNeuron's process group has no point-to-point send/recv (it raises \"No backend type "
                "associated with device type neuron\"); pipeline schedules need it" + _APRIL
                + "; releases after 2.33 may add it")
    if name == "barrier" and pg is not dist.distributed_c10d._world.default_pg:
        return "TorchNeuron's barrier runs on the default group only (nrt_barrier), not on a subgroup" + _APRIL
    if name == "all_to_all_single" and any(len(set(s)) > 1 for s in args[2:4] if s):
        return ("TorchNeuron's all_to_all_single takes equal splits only (uneven splits raise NotImplementedError)"
                + _APRIL)
    if any(d.is_complex for d in dtypes) and name.startswith("all_reduce"):
        return "TorchNeuron does not all_reduce complex tensors" + _APRIL
    if torch.float64 in dtypes and name == "broadcast":
        return "TorchNeuron does not broadcast float64 tensors (the device has no 64-bit floats)" + _APRIL
    gate = next((g for prefix, g in _EMPTY_GATES.items() if name.startswith(prefix)), None)
    if gate is not None and any(t.numel() == 0 for t in tensors):
        return f"TorchNeuron's {name} refuses an empty tensor ({gate}.can_handle: \"cannot be empty\")" + _APRIL
    if name.startswith("all_gather") and {str(d).removeprefix("torch.") for d in dtypes} & FP8:
        return "TorchNeuron does not all_gather fp8 tensors" + _APRIL
    return ""


# While torch.profiler records, a collective's span ends and its event is emitted under this lock, so the spans'
# order by end is the events' order (DDP's and FSDP2's come from autograd's thread), which pairs them up.
_ORDER = threading.Lock()


def _observed(name: str, payload: int | None) -> Callable[[Callable[..., dist.Work]], Callable[..., dist.Work]]:
    """Report each call of the wrapped collective as a ``collective`` event (``payload``: the index of the argument
    holding the tensors it was handed), and as ``unsupported`` too when TorchNeuron would refuse it; while
    torch.profiler records the device, the call is also a kernel on its device's lane, named as reports name it
    (``c10d::all_reduce.sum``). Both run from the call to its completion: for point-to-point, whose work is left
    pending, to the first wait that returns (the line reported is then that wait's, for ``isend``/``irecv``)."""
    def wrap(method: Callable[..., dist.Work]) -> Callable[..., dist.Work]:
        @functools.wraps(method)
        def call(self: ProcessGroupNeuron, *args: Any, **kwargs: Any) -> dist.Work:
            global _waiting
            _waiting = (name, self, args[payload] if payload is not None and payload < len(args) else None)
            try:
                return observed(self, *args, **kwargs)
            finally:
                _waiting = None

        def observed(self: ProcessGroupNeuron, *args: Any, **kwargs: Any) -> dist.Work:
            rt = _rt.get()
            recorder = rt.recorder
            reported = recorder.wants(COLLECTIVE) or recorder.wants(UNSUPPORTED)
            traced = rt.trace.active()
            if not reported and not traced:
                return method(self, *args, **kwargs)
            given = (*args, *kwargs.values())
            tensors = _flat(given[payload]) if payload is not None and payload < len(given) else []
            opts = next((a for a in given if hasattr(a, "reduceOp")), None)
            op = opts.reduceOp.op.name.lower() if opts is not None else ""  # before AVG/PREMUL_SUM become SUM
            limit = unsupported(self, name, tensors, given) if reported else ""
            start, clock = time.perf_counter_ns(), rt.trace.clock() if traced else 0

            def finish() -> None:
                nbytes = sum(t.numel() * t.element_size() for t in tensors)
                with _ORDER if traced else contextlib.nullcontext():
                    if traced:
                        on = next((t.device.index for t in tensors if t.device.type == BACKEND), self.device_index)
                        rt.trace.collective(f"c10d::{name}.{op}" if op else f"c10d::{name}", on, nbytes, clock,
                                            rt.trace.clock())
                    if reported:
                        shapes, dtypes = signature_of(tuple(tensors), {})
                        event = OpEvent(f"c10d::{name}", op, COLLECTIVE, "", shapes, dtypes,
                                        time.perf_counter_ns() - start, nbytes, self.size())
                        recorder.emit(event, tuple(tensors))
                        if limit:
                            recorder.emit(event._replace(kind=UNSUPPORTED, reason=limit), tuple(tensors))

            try:
                work = method(self, *args, **kwargs)
            except BaseException:  # a collective that raised (a peer gone, the group's timeout): at its line too
                finish()
                raise
            if isinstance(work, _Pending):
                work.on_done = finish
            else:
                finish()
            return work
        return call
    return wrap


# The collective this process is in, while it is in one (a plain assignment per call): read from another thread while
# the main thread is blocked in it (``waiting_in``), so a stuck cell can say what each rank waits for.
_waiting: tuple[str, ProcessGroupNeuron, Any] | None = None


def waiting_in() -> dict[str, Any] | None:
    """The collective the main thread is blocked in: its op, group and tensors' shapes; None when it is in none."""
    entered = _waiting
    if entered is None:
        return None
    name, group, payload = entered
    tensors = _flat(payload) if payload is not None else []
    return {"op": name, "group": group.group_name or "default", "size": group.size(),
            "shapes": [list(t.shape) for t in tensors],
            "dtypes": [str(t.dtype).removeprefix("torch.") for t in tensors]}


# A gloo work holds the host aliases it was handed, each with a Python wrapper; whichever thread drops the work's last
# reference decrefs those wrappers, taking the GIL. On gloo's worker thread during interpreter finalization, taking
# the GIL ends the thread (pthread_exit), whose unwinding through a noexcept destructor aborts the process
# ("terminate called without an active exception"). So gloo runs one worker thread (collectives here complete one
# at a time anyway), each group holds its latest works until the next completes, and at exit those are kept for good.
_GLOO_THREADS = 1
_groups: weakref.WeakSet[ProcessGroupNeuron] = weakref.WeakSet()


@atexit.register
def _keep_last_works() -> None:
    """Before finalization: the works gloo's worker may not have dropped yet are never released (the OS frees them)."""
    for group in list(_groups):
        last, group._last = group._last, []
        if last:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(last))


class ProcessGroupNeuron(dist.ProcessGroup):
    """The emulated ``neuron`` process group: gloo on host aliases of device tensors."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        opts = dist.ProcessGroupGloo._Options()
        opts._devices = [dist.ProcessGroupGloo.create_default_device()]
        opts._threads = _GLOO_THREADS
        opts._timeout = timeout
        self._gloo = dist.ProcessGroupGloo(store, rank, size, opts)
        # the rank's device (current once the first group attached it): the lane of calls with no device tensor
        self.device_index = _rt.get().devices.current_device()
        self._group_name = ""
        self._last: list[dist.Work] = []
        _groups.add(self)

    # -- identity: DeviceMesh, DTensor and functional collectives look groups up by name -------------
    def name(self) -> str:
        return BACKEND

    def _get_backend_name(self) -> str:
        return BACKEND

    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:
        return self._group_name

    # -- reductions ------------------------------------------------------------------------------
    @_observed("all_reduce", 0)
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.AllreduceOptions()
        hosts = _host(tensors)
        mismatch.check(self._gloo, self.size(), "all_reduce", hosts)
        opts, hosts, after = _sum_instead(opts, self.size(), hosts, hosts, in_place=True)
        return _done([self._gloo.allreduce(hosts, opts)], tensors, after, group=self)

    @_observed("all_reduce_coalesced", 0)
    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        hosts = _host(tensors)
        opts, hosts, after = _sum_instead(opts, self.size(), hosts, hosts, in_place=True)
        return _done([self._gloo.allreduce_coalesced(hosts, opts)], tensors, after, group=self)

    @_observed("reduce", 0)
    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.ReduceOptions()
        hosts = _host(tensors)
        root = opts.rootRank == self.rank()
        opts, hosts, after = _sum_instead(opts, self.size(), hosts, hosts if root else [], in_place=True)
        return _done([self._gloo.reduce(hosts, opts)], tensors, after, group=self)

    @_observed("reduce_scatter", 1)
    def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                       opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        outs, ins = _host(outputs), _host(input_lists)
        opts, flat, after = _sum_instead(opts, self.size(), _flat(ins), outs, in_place=False)
        it = iter(flat)
        ins = [[next(it) for _ in group] for group in ins]
        return _done([self._gloo.reduce_scatter(outs, ins, opts)], outputs, after, group=self)

    @_observed("reduce_scatter_tensor", 1)
    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        out = _host(output)
        opts, (inp,), after = _sum_instead(opts, self.size(), [_host(input)], [out], in_place=False)
        return _done([self._gloo._reduce_scatter_base(out, inp, opts)], output, after, group=self)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> dist.Work:
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return _done(works, outputs)

    # -- data movement ---------------------------------------------------------------------------
    @_observed("broadcast", 0)
    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.BroadcastOptions()
        return _done([self._gloo.broadcast(_host(tensors), opts)], tensors, group=self)

    @_observed("all_gather", 1)
    def allgather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.AllgatherOptions()
        return _done([self._gloo.allgather(_host(output_lists), _host(inputs), opts)], output_lists, group=self)

    @_observed("all_gather_coalesced", 1)
    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                            opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.AllgatherOptions()
        work = self._gloo.allgather_coalesced(_host(output_lists), _host(inputs), opts)
        return _done([work], output_lists, group=self)

    @_observed("all_gather_into_tensor", 1)
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.AllgatherOptions()
        return _done([self._gloo._allgather_base(_host(output), _host(input), opts)], output, group=self)

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> dist.Work:
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return _done(works, outputs)

    @_observed("all_to_all_single", 1)
    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                          input_split_sizes: list[int], opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.AllToAllOptions()
        work = self._gloo.alltoall_base(_host(output), _host(input), output_split_sizes, input_split_sizes, opts)
        return _done([work], output, group=self)

    alltoall_base = all_to_all_single

    @_observed("all_to_all", 1)
    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.AllToAllOptions()
        return _done([self._gloo.alltoall(_host(outputs), _host(inputs), opts)], outputs, group=self)

    @_observed("gather", 1)
    def gather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
               opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.GatherOptions()
        return _done([self._gloo.gather(_host(output_lists), _host(inputs), opts)], output_lists, group=self)

    @_observed("scatter", 0)
    def scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.ScatterOptions()
        return _done([self._gloo.scatter(_host(outputs), _host(input_lists), opts)], outputs, group=self)

    @_observed("barrier", None)
    def barrier(self, opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.BarrierOptions()
        return _done([self._gloo.barrier(opts)], None, group=self)

    # -- point to point --------------------------------------------------------------------------
    @_observed("send", 0)
    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int) -> dist.Work:  # noqa: N803 (c10d's names)
        """Gloo's own Work, left pending: a send completes only once its peer receives (``isend`` then ``recv`` on
        both ranks must not deadlock). Gloo writes into the device memory's host alias itself."""
        return _Pending(self._gloo.send(_host(tensors), dstRank, tag), tensors)

    @_observed("recv", 0)
    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int) -> dist.Work:  # noqa: N803
        """Gloo's own Work, as :meth:`send`."""
        return _Pending(self._gloo.recv(_host(tensors), srcRank, tag), tensors)

    @_observed("recv", 0)
    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> dist.Work:
        """Gloo's pending Work, as :meth:`recv`: the caller asks it for the sender's rank."""
        return _Pending(self._gloo.recv_anysource(_host(tensors), tag), tensors)
