"""The backend interface over the real TorchNeuron (a ``torch-neuronx`` with its ``torch.backends`` entry point).

TorchNeuron's own tracking gives sets of unique op names; those sets are what
``get_fallback_ops``/``get_executed_ops`` return, read after a ``synchronize``. While somebody
subscribes, a dispatch-mode observer adds what the sets lack: one event per call with shapes and
dtypes, host time, transfer bytes, and (because it runs in the caller's thread) the caller's frame.
The observer judges each op by where the dispatcher sends it for PrivateUse1: a registered kernel
is native; no kernel means TorchNeuron's boxed CPU fallback; composite kernels are looked through
so the ops they decompose into are judged instead.

Verified here only against the fake ``torch_neuronx`` in ``tests/fake_torchneuronx``, which
implements the documented surface; there is no Trainium in CI.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any

import torch
from torch.utils import _python_dispatch

from neuron_lab.backend import compile_failures, syncs, torchneuron_env
from neuron_lab.backend.events import DeviceOp, OpEvent, OpRecorder, Roles, WindowAccount
from neuron_lab.backend.interface import NeuronBackend
from neuron_lab.compat.torch import DispatchMode
from neuron_lab.kinds import DOWNCAST, FALLBACK, HOST, NATIVE, SOURCE

_WIDE = {torch.float64: "float64", torch.int64: "int64"}
_CEA = torch._C.DispatchKey.CompositeExplicitAutograd
_has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
COMPOSITE, SILENT = "composite", "silent"  # observer routes besides NATIVE and FALLBACK
# Device plumbing that neither TorchNeuron's tracker nor the emulator reports as an op.
_PLUMBING = frozenset({"aten::empty", "aten::empty_strided", "aten::set_", "aten::resize_", "aten::_copy_from",
                       "aten::_copy_from_and_resize", "aten::_local_scalar_dense"})
_FALLBACK_REASON = "no PrivateUse1 kernel: TorchNeuron's boxed CPU fallback runs it"
# TorchNeuron's explicit host kernels: registered at PrivateUse1, they copy to the CPU, run there and copy back, and
# enter neither of its op-tracking sets, so only this table tells them from device kernels.
_LINALG = "tnx:torch_neuronx/python_ops/cpu_fallback_registrations.py:54-73"
_CPP = "tnx:torch_neuronx/csrc/core/NeuronBindings.cpp:432-433"
HOST_KERNELS: dict[str, str] = {
    **{f"aten::{op}": _LINALG for op in (
        "linalg_qr", "_linalg_svd", "_linalg_eigh", "linalg_cholesky_ex", "linalg_inv_ex", "linalg_lu_factor_ex",
        "linalg_ldl_factor_ex", "_linalg_slogdet", "_linalg_det", "cholesky_inverse", "triangular_solve")},
    "aten::select_backward": _CPP,
    "aten::argsort.stable": _CPP,
}
_HOST_REASON = ("TorchNeuron runs it on the CPU with a host kernel of its own (copies in, computes there, copies "
                "back) and reports it in neither op-tracking set" + SOURCE)
# TorchNeuron's NEFF cache counters (torch_neuronx.metrics, kept while TORCH_NEURONX_METRICS_ENABLED is on):
# tnx:torch_neuronx/csrc/core/compilation/CompilationCache.cpp:149-215,566 (a compile is a miss of both caches)
_CACHE_HITS = ("CompilationCache.InMemoryHits", "CompilationCache.PersistentHits")
_CACHE_MISSES = ("CompilationCache.TotalCompilations",)

# why a TorchNeuron profile has no device time, in the line the profile shows
NO_DEVICE_TIMING = ("no device time: the device gives torch.profiler no events of its own (its profile is the files "
                    "below); host times are enqueue times, the device runs asynchronously")


def _qualified(func: torch._ops.OpOverload) -> str:
    overload = func._schema.overload_name
    return f"{func._schema.name}.{overload}" if overload else func._schema.name


def _out_variant(func: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The ``out=`` overload a structured functional (or in-place) op is computed by."""
    base = func._schema.name.split("::")[1]
    functional = base[:-1] if base.endswith("_") and not base.endswith("__") else base
    packet = getattr(torch.ops.aten, functional, None)
    if packet is None:
        return None
    want = [a.name for a in func._schema.arguments]
    for name in packet.overloads():
        op = getattr(packet, name)
        args = op._schema.arguments
        if any(a.is_out for a in args) and [a.name for a in args if not a.is_out] == want:
            return op
    return None


def route(func: torch._ops.OpOverload) -> str:
    """Where PrivateUse1 dispatch sends ``func``, in the dispatcher's order of precedence."""
    name = func.name()
    if func._schema.name in _PLUMBING or any(r.alias_info is not None and not r.alias_info.is_write
                                              for r in func._schema.returns):
        return SILENT  # allocation and metadata views: TorchNeuron's tracker skips them too
    if _qualified(func) in HOST_KERNELS:
        return HOST
    if _has_kernel(name, "PrivateUse1"):
        return NATIVE
    if _has_kernel(name, "CompositeExplicitAutogradNonFunctional"):  # structured wrapper: empty + out=
        out = _out_variant(func)
        return NATIVE if out is not None and _has_kernel(out.name(), "PrivateUse1") else FALLBACK
    if _has_kernel(name, "CompositeExplicitAutograd"):
        return COMPOSITE
    return FALLBACK


def _tensors(tree: Any):
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, (list, tuple)):
        for a in tree:
            yield from _tensors(a)
    elif isinstance(tree, dict):
        for a in tree.values():
            yield from _tensors(a)


def _neuron(tree: Any) -> bool:
    return any(t.device.type == "neuron" for t in _tensors(tree))


def _targets_neuron(kwargs: dict) -> bool:
    d = kwargs.get("device")
    return d is not None and torch.device(d).type == "neuron"


class _Observer(DispatchMode):
    """Sees every op before the backend does; records those that run on a `neuron` device (a compat mode: the first op
    of a session that compiles nothing loads no compiler)."""

    def __init__(self, recorder: OpRecorder) -> None:
        super().__init__()
        self.recorder = recorder
        self.enabled = True
        self._routes: dict[Any, str] = {}

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Without this, Dynamo refuses to compile while any dispatch mode is on the stack, so merely
        subscribing would silently turn every ``torch.compile`` into eager execution."""
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.enabled:
            return func(*args, **kwargs)
        how = self._routes.get(func)
        if how is None:
            how = self._routes[func] = route(func)
        on_device = _neuron(args) or _neuron(kwargs) or _targets_neuron(kwargs)
        if how == COMPOSITE and on_device:
            with self:  # look through: the ops it decomposes into are the ones the device runs
                return func._op_dk(_CEA, *args, **kwargs)
        t0 = time.perf_counter_ns()
        out = func(*args, **kwargs)
        host_ns = time.perf_counter_ns() - t0
        name = func._schema.name
        if how == SILENT:
            if name == "aten::_local_scalar_dense" and on_device:
                self.recorder.record_transfer(d2h=args[0].element_size())
                syncs.emit(self.recorder, name, args[0])
            return out
        if not (on_device or _neuron(out)):
            return out
        kind = how if how in (FALLBACK, HOST) else NATIVE
        overload = func._schema.overload_name
        reason = "" if kind == NATIVE else _FALLBACK_REASON if kind == FALLBACK else \
            _HOST_REASON + HOST_KERNELS[_qualified(func)]
        self.recorder.record(name, overload, kind, reason, args, kwargs, 0 if kind == NATIVE else host_ns)
        self._transfers(name, args, out)
        if name in syncs.DATA_DEPENDENT_OPS and on_device:
            syncs.emit(self.recorder, name, args[0])
        wide = sorted({_WIDE[t.dtype] for t in _tensors((args, kwargs)) if t.dtype in _WIDE
                       and t.device.type == "neuron"})
        if wide:
            self.recorder.record(name, overload, DOWNCAST, f"{'/'.join(wide)} computed in 32-bit by TorchNeuron",
                                 args, kwargs, 0)
        return out

    def _transfers(self, name: str, args: tuple, out: Any) -> None:
        if name == "aten::_to_copy":
            src, dst = args[0], out
        elif name == "aten::copy_":
            dst, src = args[0], args[1]
        else:
            return
        if isinstance(src, torch.Tensor) and src.device.type != dst.device.type:
            n = src.numel() * src.element_size()
            self.recorder.record_transfer(h2d=n if dst.device.type == "neuron" else 0,
                                          d2h=n if src.device.type == "neuron" else 0)
            if src.device.type == "neuron":
                syncs.emit(self.recorder, name, src)


def _as_dict(m: Any) -> dict[str, Any]:
    if isinstance(m, dict):
        return dict(m)
    if dataclasses.is_dataclass(m):
        return dataclasses.asdict(m)
    return dict(vars(m))


class TorchNeuronBackend(NeuronBackend):
    kind = "torchneuron"
    lowering_metric = "torch_neuronx_lower_us"  # NeuronCompilationMetrics' lowering time

    def __init__(self) -> None:
        import torch_neuronx  # loaded already by TorchNeuron's autoload or by neuron_lab.backend.activate()

        super().__init__(OpRecorder())
        self._tnx = torch_neuronx
        self._observer: _Observer | None = None
        self._subscribers = 0
        self._lock = threading.Lock()
        self._windows: list[_Window] = []  # tracked windows open now, innermost last
        self._compiled: set[Any] = set()  # NEFF cache keys of the graphs whose compile time a window counted
        self._capacity: int | None = None

    @property
    def version(self) -> str:
        return metadata.version("torch-neuronx")

    @property
    def description(self) -> str:
        return f"TorchNeuron (torch-neuronx {self.version})"

    @property
    def name(self) -> str:
        return f"TorchNeuron {self.version}"

    @property
    def build(self) -> str:
        bt = torchneuron_env.build_type()
        return (f"{bt} (torch_neuronx._build_config.BUILD_TYPE)" if bt else
                "unknown: torch_neuronx has no _build_config (an editable install, which takes the DEV defaults)")

    @property
    def torchneuron_settings(self) -> str:
        return "read by TorchNeuron; those it set at import when unset are marked"

    def torchneuron_setting(self, name: str) -> str:
        return torchneuron_env.who_set(name)

    def device_count(self) -> int:
        return torch.neuron.device_count()

    def capacity(self) -> int | None:
        """None until the user's code has started the Neuron runtime: ``get_device_properties`` runs
        ``_lazy_init`` (nrt_init, which takes every NeuronCore), and a rank that finds the runtime started fails
        ``init_process_group`` (tnx torch_neuronx/__init__.py:209-238, distributed/backend.py:292-295)."""
        if self._capacity is None and self._tnx.is_neuron_runtime_initialized():
            self._capacity = int(torch.neuron.get_device_properties(0).total_memory)
        return self._capacity

    # memory: the interface's reads (nested memory_stats, a synchronize before each) are TorchNeuron's already

    # -- ops: TorchNeuron's sets are the truth; the observer adds counts while subscribed ------
    def get_fallback_ops(self) -> set[str]:
        self.synchronize()
        return set(self._tnx.get_fallback_ops())

    def get_executed_ops(self) -> set[str]:
        self.synchronize()
        return set(self._tnx.get_executed_ops())

    def clear_op_tracking(self) -> None:
        self._tnx.clear_op_tracking()
        self.recorder.clear()

    def subscribe(self, fn: Callable[[OpEvent, tuple, dict], Any], kinds: frozenset[str] | set[str] | None = None,
                  roles: Roles | None = None) -> Callable[[], None]:
        """Events for ops on `neuron` from now on; the observer is active while anyone subscribes."""
        unsubscribe_recorder = self.recorder.subscribe(fn, kinds, roles)
        with self._lock:
            self._subscribers += 1
            if self._observer is None:
                self._observer = _Observer(self.recorder)
                _python_dispatch._push_mode(self._observer)
        done = False

        def unsubscribe() -> None:
            nonlocal done
            if done:
                return
            done = True
            unsubscribe_recorder()
            with self._lock:
                self._subscribers -= 1
                if self._subscribers == 0 and self._observer is not None:
                    self._stop_observer(self._observer)
                    self._observer = None

        return unsubscribe

    @staticmethod
    def _stop_observer(obs: _Observer) -> None:
        """Pop the observer; if another mode was pushed above it, leave it in place but inert."""
        obs.enabled = False
        if _python_dispatch._get_current_dispatch_mode() is obs:
            _python_dispatch._pop_mode()

    def dynamo_metrics(self) -> list[dict]:
        self.synchronize()
        return [_as_dict(m) for m in self._tnx.get_dynamo_metrics()]

    def lowering_us(self) -> int:
        """torch-mlir lowering so far, from dynamo's own timings (``dynamo_timed("torch_neuronx_lower")``, which
        ``torch_neuronx_lower_us`` copies): a plain read, so Dynamo's compile callbacks do not force a device sync
        mid-cell as ``get_dynamo_metrics()`` would (tnx:neuron_dynamo_backend/metrics.py:194-195,217-222)."""
        from torch._dynamo.utils import compilation_time_metrics

        return round(sum(compilation_time_metrics.get("torch_neuronx_lower", ())) * 1e6)

    # -- a tracked window: TorchNeuron's own account of it ----------------------------------------
    def begin_window(self) -> frozenset[str]:
        """Clears TorchNeuron's op tracking (its sets have no window of their own: the user's own tracking restarts
        too) and starts counting. A window inside another (``neuron_lab.track()`` in a cell) clears nothing: its
        account is the outer one's so far."""
        if not self._windows:
            self._tnx.clear_op_tracking()
        self._windows.append(_Window(self._cache_counts(), self._metric_count()))
        return frozenset({NATIVE})

    def end_window(self) -> WindowAccount:
        """Read after the window's closing synchronize: nothing here synchronizes again."""
        if not self._windows:
            return WindowAccount()
        window = self._windows.pop()
        window.close()
        ops = [DeviceOp(n, FALLBACK, "") for n in sorted(self._tnx.get_fallback_ops())]
        records = [_as_dict(m) for m in self._tnx.get_dynamo_metrics()][window.metrics:]
        # a record's compile time is its NEFF cache entry's (tnx:neuron_dynamo_backend/metrics.py:134-150,213-214):
        # a graph whose key (graph_id) was compiled before found its NEFF in the cache and compiled nothing now
        fresh = [m for m in records if m.get("graph_id") not in self._compiled]
        self._compiled.update(m.get("graph_id") for m in records)
        once = {m.get("graph_id"): m for m in fresh}.values()
        neff_us = sum(int(m.get("torch_neuronx_compile_us") or 0) for m in once)
        before, after = window.cache, self._cache_counts()
        cache = None if before is None or after is None else (after[0] - before[0], after[1] - before[1])
        return WindowAccount(ops, neff_us, cache, window.eager)

    def _metric_count(self) -> int:
        from torch._dynamo.utils import counters

        return int(counters["neuron"]["compiled_graphs"])  # tnx:neuron_dynamo_backend/metrics.py:199 (no sync)

    def _cache_counts(self) -> tuple[int, int] | None:
        """(hits, misses) of the NEFF cache so far; None where TorchNeuron keeps no metrics (not enabled)."""
        try:
            from torch_neuronx import metrics
        except ImportError:
            return None
        if not metrics.is_enabled():
            return None
        value = metrics.get_counter_value
        return (sum(int(value(n) or 0) for n in _CACHE_HITS), sum(int(value(n) or 0) for n in _CACHE_MISSES))


    # -- profiling: TorchNeuron's Kineto plugin hands torch.profiler no device events (processTrace is a no-op,
    # tnx:csrc/profiler/Session.cpp:249-257); NRT writes its own files where profile_output_dir says (:65-75)
    @property
    def device_timing(self) -> bool:
        return False

    @property
    def device_lanes(self) -> str:
        return NO_DEVICE_TIMING

    def profiler_config(self, output_dir: str) -> str | None:
        """TorchNeuron's keys, "key:value;..." (tnx:csrc/profiler/README.md:86-93). Its parser splits on ";" and
        ":" and drops a pair that is not exactly key:value (tnx:csrc/profiler/NConfigParser.cpp:112-122), and trims
        spaces, so such a folder would silently leave NRT writing into its default one: refused here instead."""
        if any(c in output_dir for c in ":;") or output_dir != output_dir.strip():
            raise ValueError(f"TorchNeuron's profiler cannot write into {output_dir!r}: its config string takes no "
                             "':' or ';' and no leading or trailing spaces in a folder name")
        return f"profile_output_dir:{output_dir}"


class _Window(logging.Handler):
    """One tracked window's baselines, and the compiled graphs TorchNeuron's dynamo backend ran eagerly in it (what
    its logger says, the only trace such a run leaves)."""

    def __init__(self, cache: tuple[int, int] | None, metrics: int) -> None:
        super().__init__(logging.WARNING)
        self.cache, self.metrics = cache, metrics
        self.eager: list[str] = []
        self._failed = ""
        logging.getLogger(compile_failures.LOGGER).addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text.startswith(compile_failures.EXECUTION_FAILED):
            self._failed = text.removeprefix(compile_failures.EXECUTION_FAILED).strip().split("\n")[0][:200]
        elif text.startswith(compile_failures.EAGER_MESSAGE):
            why = f": {self._failed}" if self._failed else ""
            self.eager.append(f"a compiled graph failed on the device and ran eagerly (TorchNeuron: execution "
                              f"failed{why}; TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=1 raises instead)")
            self._failed = ""

    def close(self) -> None:
        logging.getLogger(compile_failures.LOGGER).removeHandler(self)
        super().close()
