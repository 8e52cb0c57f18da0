"""How the emulated device runs ATen ops: natively, or as a reported CPU fallback.

Every op on a `neuron` tensor ends here, through the boxed PrivateUse1 fallback or a direct
kernel. Both paths compute on zero-copy host aliases; the op coverage only decides how
the call is *reported* (native, CPU fallback, host kernel), the way TorchNeuron reports it.
A handful of ops are device plumbing (allocation, copies, metadata views) and are never reported.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from neuron_lab.backend import syncs
from neuron_lab.backend.coverage import conditions
from neuron_lab.backend.coverage.conditions import ArgRule
from neuron_lab.backend.emulator import aborts, int64_rule, policy
from neuron_lab.backend.emulator.host import CPU_KEYS, HostBridge
from neuron_lab.backend.emulator.memory import Allocator
from neuron_lab.backend.events import OpRecorder, signature_of
from neuron_lab.kinds import DOWNCAST, OFF_DEVICE, SYNC

Tensor = torch.Tensor
aten = torch.ops.aten
_CPU = torch.device("cpu")
_DTYPE_NAMES = {d: str(d).removeprefix("torch.") for d in vars(torch).values() if isinstance(d, torch.dtype)}
_WIDE = frozenset(getattr(torch, name) for name in policy.WIDE_DTYPES)
_WIDENED = {torch.float32: torch.float64, torch.complex64: torch.complex128}  # narrow results the 64-bit rule widens


@dataclass
class _Plan:
    """What the schema says about one overload, computed once."""

    name: str
    overload: str
    write_returns: tuple[int | str | None, ...]  # per return: the argument it aliases when written
    generator: int | str | None  # where the Generator argument goes, if any
    generator_name: str | None
    mixed_ok: bool
    implicit_rng: bool
    is_view: bool
    write_args: tuple[int | str, ...]  # arguments the op writes (self of in-place ops, out=)
    number_args: tuple[int | str, ...]  # Tensor arguments that may arrive as Python numbers (wrapped scalars)
    arguments: dict[str, tuple[int | str, Any]]  # name -> (where it goes, its schema default): argument conditions


def _plan(op: torch._ops.OpOverload) -> _Plan:
    schema = op._schema
    positional = [a for a in schema.arguments if not a.kwarg_only]
    where: dict[str, int | str] = {}
    for i, a in enumerate(positional):
        where[a.name] = i
    for a in schema.arguments:
        if a.kwarg_only:
            where[a.name] = a.name
    writes: list[int | str | None] = []
    is_view = False
    for r in schema.returns:
        target = None
        if r.alias_info is not None:
            if r.alias_info.is_write:
                sets = r.alias_info.before_set
                for a in schema.arguments:
                    if a.alias_info is not None and a.alias_info.is_write and a.alias_info.before_set & sets:
                        target = where[a.name]
                        break
            else:
                is_view = True
        writes.append(target)
    gen_name = next((a.name for a in schema.arguments if a.type.kind() == "OptionalType"
                     and str(a.type.getElementType()) == "Generator"), None)
    gen = where[gen_name] if gen_name is not None else None
    name = schema.name
    write_args = tuple(where[a.name] for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
    # A wrapped-number tensor (the 2.0 of `copysign(t, 2.0)`) reaches a Python kernel as a Python number,
    # which re-calling the op accepts only for the few ops on PyTorch's allow-list.
    numbers = () if torch._C._should_allow_numbers_as_tensors(name.removeprefix("aten::")) else tuple(
        where[a.name] for a in schema.arguments if str(a.type) in ("Tensor", "Tensor?"))
    arguments = {a.name: (where[a.name], a.default_value) for a in schema.arguments}
    return _Plan(name, schema.overload_name, tuple(writes), gen, gen_name, name in policy.MIXED_OK,
                 name in policy.IMPLICIT_RNG,
                 is_view, write_args, numbers, arguments)


# (op name, device dtypes) -> (kind, reason, the argument conditions each call is tested against)
Classify = Callable[[str, frozenset[str]], tuple[str, str, tuple[ArgRule, ...]]]


def _tested(kind: tuple[str, str, tuple[ArgRule, ...]], plan: _Plan, args: tuple, kwargs: dict
            ) -> tuple[str, str, tuple[ArgRule, ...]]:
    """The kind of one call of an op with argument conditions: the first condition it meets, else ``kind``."""
    def value_of(name: str) -> Any:
        slot, default = plan.arguments.get(name, (name, None))
        if isinstance(slot, int) and slot < len(args):
            return args[slot]
        return kwargs.get(name, default)

    rule = next((r for r in kind[2] if conditions.met(r, value_of)), None)
    return kind if rule is None else (rule.kind, rule.shown, ())


class Executor:
    """Runs ops for the emulated device and reports each through the recorder."""

    def __init__(self, allocator: Allocator, recorder: OpRecorder, classify: Classify,
                 emulate_downcast: bool = False) -> None:
        self.allocator = allocator
        self.bridge = HostBridge(allocator)
        self.recorder = recorder
        self.generator = torch.Generator()
        self.emulate_downcast = emulate_downcast  # NEURON_LAB_EMULATE_DOWNCAST: 64-bit computed in 32-bit
        self._plans: dict[Any, _Plan] = {}
        self._kinds: dict[tuple, tuple[str, str, tuple[ArgRule, ...]]] = {}
        self.native: dict[str, Callable[..., Any]] = {}
        self.classify = classify
        self._aborts: frozenset[str] = frozenset()  # ops whose calls aborts.check looks at (a coverage's aborts)

    def set_coverage(self, abort_ops: list[str]) -> None:
        """The coverage changed: classify every op afresh, and check the calls of its ``abort_ops``."""
        self._kinds.clear()
        self._aborts = frozenset(abort_ops)

    def plan(self, op) -> _Plan:
        p = self._plans.get(op)
        if p is None:
            p = self._plans[op] = _plan(op)
        return p

    # -- the fallback ------------------------------------------------------------------------
    def fallback(self, op, *args, **kwargs):
        __tracebackhide__ = True  # noqa: F841
        native = self.native.get(op._schema.name)
        if native is not None:
            return native(op, *args, **kwargs)
        return self.run(op, args, kwargs)

    def _host_arg(self, a, plan: _Plan, dtypes: list[torch.dtype]):
        """One argument as the CPU kernel takes it; device dtypes are collected for classification.

        A method rather than a closure in ``run``: a recursive closure is a reference cycle per op call.
        """
        if isinstance(a, Tensor):
            if a.is_cpu:
                if a.dim() and not plan.mixed_ok:
                    raise RuntimeError(policy.DEVICE_MISMATCH.format(first="neuron:0", second="cpu", op=plan.name))
                return a
            dtypes.append(a.dtype)
            return self.bridge.to_host(a)
        if isinstance(a, (list, tuple)) and a and not isinstance(a[0], (int, float, bool)):
            return type(a)(self._host_arg(b, plan, dtypes) for b in a)
        if isinstance(a, torch.device) and a.type == "neuron":
            return _CPU
        return a

    def run(self, op, args: tuple, kwargs: dict):
        """Compute ``op`` on host aliases of its device arguments and report it."""
        __tracebackhide__ = True  # noqa: F841  (an op's error shows at the user's line, as a native kernel's does)
        plan = self._plans.get(op) or self.plan(op)
        if plan.write_args:
            _check_out_devices(plan, args, kwargs)
        if plan.name in self._aborts:
            aborts.check(plan.name, plan.overload, args, kwargs)
        dtypes: list[torch.dtype] = []
        conv = self._host_arg
        hargs = [conv(a, plan, dtypes) for a in args]
        hkwargs = {k: conv(v, plan, dtypes) for k, v in kwargs.items()}
        if plan.number_args:
            _wrap_numbers(plan.number_args, hargs, hkwargs)
        if plan.generator is not None:
            # Omitted trailing arguments keep their schema defaults: pass the generator by name.
            slot = plan.generator if isinstance(plan.generator, int) and plan.generator < len(hargs) else \
                plan.generator_name
            if isinstance(slot, int):
                if hargs[slot] is None:
                    hargs[slot] = self.generator
            elif hkwargs.get(slot) is None:
                hkwargs[slot] = self.generator

        kind_key = (plan.name, tuple(dtypes))
        kind = self._kinds.get(kind_key)
        if kind is None:
            kind = self._kinds[kind_key] = self.classify(plan.name, frozenset(_DTYPE_NAMES[d] for d in dtypes))
        if kind[2]:
            kind = _tested(kind, plan, args, kwargs)
        wide = [d for d in dtypes if d in _WIDE]

        drop_grad_input = plan.name in policy.ALWAYS_GRAD_INPUT and not hargs[-1][0]
        if drop_grad_input:
            hargs[-1] = [True, *hargs[-1][1:]]
        int_input = None
        if plan.name in policy.INT_AS_FLOAT and isinstance(hargs[0], Tensor) and not hargs[0].is_floating_point():
            int_input, hargs[0] = hargs[0].dtype, hargs[0].float()
        lowered = wide and self.emulate_downcast and not plan.is_view and not any(
            _DTYPE_NAMES[d] in policy.HOST_DTYPES for d in dtypes)
        int32 = lowered and torch.int64 in wide and plan.name not in policy.KEEPS_INT64 and kind[0] not in OFF_DEVICE
        t0 = time.perf_counter_ns()
        if int32:
            int32 = int64_rule.wrap_inputs(hargs, hkwargs, plan.write_args)
        if lowered and torch.float64 in wide:
            out = self._run_downcast(op, plan, hargs, hkwargs, args, kwargs)
        else:
            out = self._call(op, plan, hargs, hkwargs, args, kwargs)
        if int32:
            out = int64_rule.wrap_results(out, _written(plan, args, kwargs), self.bridge.to_host)
        host_ns = time.perf_counter_ns() - t0
        if int_input is not None:
            out = out.to(int_input)
        if drop_grad_input:
            out = (None, *out[1:])

        self.recorder.record(plan.name, plan.overload, kind[0], kind[1], args, kwargs, host_ns)
        if wide:
            reason = policy.downcast_reason({_DTYPE_NAMES[d] for d in wide}, self.emulate_downcast)
            self.recorder.record(plan.name, plan.overload, DOWNCAST, reason, args, kwargs, 0)
        if plan.name in syncs.DATA_DEPENDENT_OPS and self.recorder.wants(SYNC):
            self.recorder.emit(syncs.event(plan.name, *signature_of(args, kwargs)))
        return self._results(out, plan, args, kwargs)

    def _call(self, op, plan: _Plan, hargs: list, hkwargs: dict, args: tuple, kwargs: dict):
        __tracebackhide__ = True  # noqa: F841
        if plan.implicit_rng:
            return self._with_device_rng(op, hargs, hkwargs)
        try:
            out = op(*hargs, **hkwargs)
        except RuntimeError as e:
            if "not resizable" not in str(e):
                raise
            return self._run_resizing(op, plan, hargs, hkwargs, args, kwargs)
        if plan.write_args:
            _sync_layouts(plan.write_args, hargs, hkwargs, args, kwargs)
        return out

    def _with_device_rng(self, op, hargs, hkwargs):
        """Run an op that uses the default CPU generator on the device generator's stream."""
        cpu_state = torch.get_rng_state()
        torch.set_rng_state(self.generator.get_state())
        try:
            return op(*hargs, **hkwargs)
        finally:
            self.generator.set_state(torch.get_rng_state())
            torch.set_rng_state(cpu_state)

    def _run_resizing(self, op, plan, hargs, hkwargs, args, kwargs):
        """An ``out=`` that must grow: compute into host temporaries, resize the device output, copy.

        Only host aliases are swapped (they cannot grow); a float32 stand-in of the 64-bit rule grows by itself.
        """
        temps: list[tuple[Tensor, Tensor]] = []

        def temp(dev, host):
            if isinstance(dev, Tensor) and not dev.is_cpu and not host.untyped_storage().resizable():
                temps.append((dev, torch.empty(0, dtype=dev.dtype, device=_CPU)))
                return temps[-1][1]
            return host

        for slot in plan.write_args:
            holder, orig = (hargs, args) if isinstance(slot, int) else (hkwargs, kwargs)
            if isinstance(slot, int) and slot >= len(orig):
                continue
            dev = orig[slot]
            if isinstance(dev, Tensor):
                holder[slot] = temp(dev, holder[slot])
            elif isinstance(dev, (list, tuple)):
                holder[slot] = [temp(d, h) for d, h in zip(dev, holder[slot])]
        out = op(*hargs, **hkwargs)
        for d, t in temps:
            d.resize_(t.shape)
            self.bridge.to_host(d).copy_(t)
        return out

    def _run_downcast(self, op, plan, hargs, hkwargs, args, kwargs):
        """float64 in, float32 compute, float64 out: TorchNeuron's silent downcast made visible.

        TorchNeuron casts float64 tensors with dimensions (base.py, ``_cast_tensor_if_float64``): a call whose float64
        tensors are all 0-dim computes exactly; beside a cast one, a 0-dim one is cast too, as a float32 kernel
        reads it.
        """
        written: list[tuple[Tensor, Tensor]] = []  # (device tensor, the float32 stand-in the kernel writes)
        write_slots = set(plan.write_args)
        for i, a in enumerate(op._schema.arguments):
            if f"{plan.name}.{a.name}" in policy.UNDECLARED_WRITES:
                write_slots |= {i, a.name}

        if not any(_has_dims64(a) for a in (*hargs, *hkwargs.values())):
            return self._call(op, plan, hargs, hkwargs, args, kwargs)

        def down(slot, a, dev):
            if isinstance(a, Tensor) and a.dtype == torch.float64:
                low = a.to(torch.float32)
                if slot in write_slots:
                    written.append((dev, low))
                return low
            if isinstance(a, (list, tuple)) and a and isinstance(a[0], Tensor):  # a tensor list: each tensor
                return type(a)(down(slot, t, d) for t, d in zip(a, dev))
            return a

        hargs = [down(i, a, args[i]) for i, a in enumerate(hargs)]
        hkwargs = {k: down(k, v, kwargs.get(k)) for k, v in hkwargs.items()}
        if "dtype" in hkwargs and hkwargs["dtype"] == torch.float64:
            hkwargs["dtype"] = torch.float32
        out = self._call(op, plan, hargs, hkwargs, args, kwargs)  # other outs grow and take their layout as usual
        for dev, low in written:  # a kernel may have resized the stand-in (an out= that must grow)
            if dev.shape != low.shape:
                dev.resize_(low.shape)
            self.bridge.to_host(dev).copy_(low)

        def up(r):  # complex64 too: an FFT of float64 gives complex128
            if isinstance(r, Tensor) and r.dtype in _WIDENED:
                return r.to(_WIDENED[r.dtype])
            if isinstance(r, (list, tuple)):
                return type(r)(up(x) for x in r)
            return r

        return up(out)  # written results are mapped back to their device arguments by _results

    def _results(self, out, plan: _Plan, args: tuple, kwargs: dict):
        from_host = self.bridge.from_host
        writes = plan.write_returns

        def back(r, i):
            slot = writes[i] if i < len(writes) else None
            if slot is not None:
                return args[slot] if isinstance(slot, int) else kwargs[slot]
            if isinstance(r, Tensor):
                return from_host(r)
            if isinstance(r, list):
                return [from_host(x) if isinstance(x, Tensor) else x for x in r]
            return r

        if len(writes) > 1 or (isinstance(out, tuple) and len(writes) != 1):
            return tuple(back(r, i) for i, r in enumerate(out))
        if not writes:
            return out
        return back(out, 0)

    # -- direct kernels ----------------------------------------------------------------------
    def kernel(self, op) -> Callable[..., Any]:
        """A PrivateUse1 kernel for ``op`` that skips the empty + ``.out`` double call."""
        run = self.run

        def k(*args, **kwargs):
            __tracebackhide__ = True  # noqa: F841
            return run(op, args, kwargs)

        k.__name__ = f"neuron_{op._schema.name.split('::')[-1]}"
        return k


def _has_dims64(a) -> bool:
    """Whether ``a`` is (or lists) a float64 tensor with dimensions: what TorchNeuron's 64-bit rule casts."""
    if isinstance(a, Tensor):
        return a.dtype == torch.float64 and a.dim() != 0
    return isinstance(a, (list, tuple)) and any(isinstance(t, Tensor) and _has_dims64(t) for t in a)


def _written(plan: _Plan, args: tuple, kwargs: dict) -> list[Tensor]:
    """The device tensors a call wrote: its in-place self, its out= (each of a list)."""
    found = []
    for slot in plan.write_args:
        holder = args if isinstance(slot, int) else kwargs
        if isinstance(slot, int) and slot >= len(args) or isinstance(slot, str) and slot not in kwargs:
            continue
        for t in holder[slot] if isinstance(holder[slot], (list, tuple)) else (holder[slot],):
            if isinstance(t, Tensor) and not t.is_cpu:
                found.append(t)
    return found


def _check_out_devices(plan: _Plan, args: tuple, kwargs: dict) -> None:
    """A CPU ``out=`` or in-place self beside device inputs (the fallback runs only when there are some) is
    refused, 0-dim or not, as PyTorch refuses an output of another device."""
    for slot in plan.write_args:
        holder = args if isinstance(slot, int) else kwargs
        if isinstance(slot, int) and slot >= len(args) or isinstance(slot, str) and slot not in kwargs:
            continue
        written = holder[slot]
        for t in written if isinstance(written, (list, tuple)) else (written,):
            if isinstance(t, Tensor) and t.is_cpu:
                raise RuntimeError(policy.DEVICE_MISMATCH.format(first="neuron:0", second="cpu", op=plan.name))


def _wrap_numbers(slots: tuple[int | str, ...], hargs: list, hkwargs: dict) -> None:
    """Turn Python numbers given for Tensor arguments back into 0-dim tensors.

    The dtype is the one the number would have promoted to against the first tensor argument, so the
    0-dim tensor promotes as the wrapped number did (it never widens a result the number would not).
    """
    ref = next((a for a in hargs if isinstance(a, Tensor)), None)
    for slot in slots:
        holder = hargs if isinstance(slot, int) else hkwargs
        if isinstance(slot, int) and slot >= len(hargs) or isinstance(slot, str) and slot not in hkwargs:
            continue
        v = holder[slot]
        if isinstance(v, (bool, int, float, complex)):
            holder[slot] = torch.tensor(v, device=_CPU) if ref is None else torch.tensor(
                v, dtype=torch.result_type(ref, v), device=_CPU)


def _sync_layouts(slots: tuple[int | str, ...], hargs: list, hkwargs: dict, args: tuple, kwargs: dict) -> None:
    """Give written device tensors the shape a CPU kernel gave their host aliases.

    A kernel resizes an ``out=`` alias in place when its storage is big enough (always for zero-size
    results); that changes the alias's metadata only, so the device tensor must take the same layout. A float32
    stand-in of the 64-bit rule is no alias: its copy-back settles that one.
    """
    for slot in slots:
        if isinstance(slot, int):
            if slot >= len(args):
                continue
            dev, host = args[slot], hargs[slot]
        else:
            if slot not in kwargs:
                continue
            dev, host = kwargs[slot], hkwargs[slot]
        for d, h in zip(dev, host) if isinstance(dev, (list, tuple)) else ((dev, host),):
            if isinstance(d, Tensor) and isinstance(h, Tensor) and not d.is_cpu and h.dtype == d.dtype and (
                    h.shape != d.shape or h.stride() != d.stride() or h.storage_offset() != d.storage_offset()):
                redispatch_to_cpu(aten.set_.source_Storage_storage_offset, d, d.untyped_storage(),
                                  h.storage_offset(), h.shape, h.stride())


def redispatch_to_cpu(op, *args, **kwargs):
    """Metadata-only kernels (views) run their CPU implementation on the device tensor itself."""
    return op.redispatch(CPU_KEYS, *args, **kwargs)

