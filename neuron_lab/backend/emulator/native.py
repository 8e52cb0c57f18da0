"""Device plumbing: allocation, copies, storage binding and views, plus directly registered kernels.

These are what a C++ backend implements itself. They are never reported as fallbacks, except
the copies, which count as native ops and as host/device transfer bytes.
"""

from __future__ import annotations

import torch

from neuron_lab.backend import syncs
from neuron_lab.backend.emulator import attention, policy
from neuron_lab.backend.emulator.ops import Executor, redispatch_to_cpu
from neuron_lab.backend.emulator.runtime import direct_ops
from neuron_lab.kinds import NATIVE

aten = torch.ops.aten
Tensor = torch.Tensor


def _contiguous_strides(size, memory_format) -> list[int]:
    if memory_format in (torch.channels_last, torch.channels_last_3d):
        return list(torch.empty(size, device="meta", memory_format=memory_format).stride())
    strides, acc = [], 1
    for n in reversed(size):
        strides.append(acc)
        acc *= max(n, 1)
    return strides[::-1]


def _nbytes(size, stride, dtype) -> int:
    if any(n == 0 for n in size):
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(size, stride))) * dtype.itemsize


def _check_device(device) -> None:
    if device is not None and torch.device(device).index not in (None, 0):
        raise RuntimeError(f"{torch.device(device)} is not available: the neuron emulator's pure-Python core has one "
                           "device (neuron:0); the compiled core has one per NeuronCore (`neuron-lab doctor` says "
                           "why it is not running)")


class _DeviceKernels:
    """The kernels a C++ backend writes itself, over one executor's allocator, host bridge and recorder.

    Kernels reached through the boxed fallback take the op first, as the fallback passes it. Keyword-only
    arguments keep their schema names: the dispatcher passes them by name.
    """

    def __init__(self, ex: Executor) -> None:
        self._ex = ex
        self._alloc = ex.allocator
        self._bridge = ex.bridge
        self._recorder = ex.recorder

    # -- allocation and storage ----------------------------------------------------------------
    def empty(self, op, size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None) -> Tensor:
        _check_device(device)
        dtype = dtype or torch.get_default_dtype()
        stride = _contiguous_strides(size, memory_format)
        return self._bind_new(size, stride, dtype)

    def empty_strided(self, op, size, stride, dtype=None, layout=None, device=None, pin_memory=None) -> Tensor:
        _check_device(device)
        return self._bind_new(size, stride, dtype or torch.get_default_dtype())

    def _bind_new(self, size, stride, dtype: torch.dtype) -> Tensor:
        storage = self._alloc.new_storage(_nbytes(size, stride, dtype), dtype, size)
        return self._bridge.bind(storage, size, stride, 0, dtype)

    def set_(self, op, t: Tensor, *args) -> Tensor:
        if not args:  # set_() gives the tensor an empty storage of its own device
            op, args = aten.set_.source_Storage_storage_offset, (self._alloc.new_storage(0), 0, [0], [1])
        return redispatch_to_cpu(op, t, *args)

    def resize_(self, op, t: Tensor, size, memory_format=None) -> Tensor:
        """Grow into a new storage holding the old bytes when the current one is too small.

        As ATen's own resize_: a tensor already of that size keeps its strides unless a memory format is given.
        """
        if list(t.shape) == list(size) and memory_format is None:
            return t
        stride = _contiguous_strides(size, memory_format)
        need = _nbytes(size, stride, t.dtype) + t.storage_offset() * t.element_size()
        st = t.untyped_storage()
        if need > st.nbytes():
            st = self._grown(st, need, t.dtype, size)
        redispatch_to_cpu(aten.set_.source_Storage_storage_offset, t, st, t.storage_offset(), size, stride)
        return t

    def _grown(self, st: torch.UntypedStorage, nbytes: int, dtype: torch.dtype, size) -> torch.UntypedStorage:
        new = self._alloc.new_storage(nbytes, dtype, size)
        old = st.nbytes()
        if old:
            bind, to_host = self._bridge.bind, self._bridge.to_host
            to_host(bind(new, [old], [1], 0, torch.uint8)).copy_(to_host(bind(st, [old], [1], 0, torch.uint8)))
        return new

    def local_scalar_dense(self, op, t: Tensor):
        self._recorder.record_transfer(d2h=t.element_size())
        syncs.emit(self._recorder, "aten::_local_scalar_dense", t)
        return aten._local_scalar_dense(self._bridge.to_host(t))

    # -- copies: native ops, and transfer bytes when they cross host and device ---------------
    def _host(self, t: Tensor) -> Tensor:
        return t if t.is_cpu else self._bridge.to_host(t)

    def copy_(self, dst: Tensor, src: Tensor, non_blocking=False) -> Tensor:
        self._host(dst).copy_(self._host(src))
        if src.is_cpu != dst.is_cpu:
            n = src.numel() * src.element_size()
            self._recorder.record_transfer(h2d=n if src.is_cpu else 0, d2h=n if dst.is_cpu else 0)
        self._recorder.record("aten::copy_", "", NATIVE, "", (dst, src), {}, 0)
        if dst.is_cpu and not src.is_cpu:
            syncs.emit(self._recorder, "aten::copy_", src)
        return dst

    def copy_from(self, op, src: Tensor, dst: Tensor, non_blocking=False) -> Tensor:
        return self.copy_(dst, src)

    def copy_from_and_resize(self, op, src: Tensor, dst: Tensor) -> Tensor:
        dst.resize_(src.shape)
        return self.copy_(dst, src)

    def to_copy(self, t: Tensor, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
                memory_format=None) -> Tensor:
        _check_device(device)
        target = torch.device(device) if device is not None else t.device
        r = aten._to_copy(self._host(t), dtype=dtype, layout=layout, device="cpu", memory_format=memory_format)
        self._recorder.record("aten::_to_copy", "", NATIVE, "", (t,), {}, 0)
        if t.is_cpu:
            self._recorder.record_transfer(h2d=r.numel() * r.element_size())
        if target.type == "cpu":
            self._recorder.record_transfer(d2h=r.numel() * r.element_size())
            if not t.is_cpu:
                syncs.emit(self._recorder, "aten::_to_copy", t)
            return r.pin_memory() if pin_memory else r
        if r.untyped_storage().data_ptr() == t.untyped_storage().data_ptr():
            r = r.clone()  # _to_copy must not alias its input
        return self._bridge.from_host(r)

    # -- convolution: the CPU's own op, run and reported as any other --------------------------
    def convolution(self, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
        return self._ex.run(aten.convolution.default, (input, weight, bias, stride, padding, dilation, transposed,
                                                       output_padding, groups), {})

    def convolution_backward(self, grad_output, input, weight, stride, padding, dilation, transposed, output_padding,
                             groups, output_mask):
        return self._ex.run(aten.convolution_backward.default,
                            (grad_output, input, weight, None, stride, padding, dilation, transposed, output_padding,
                             groups, output_mask), {})


def install_native(ex: Executor, lib: torch.library.Library) -> None:
    """Give the pure-Python core the kernels a C++ backend writes itself: plumbing, copies, convolution,
    and direct kernels for hot ops."""
    kernels = _DeviceKernels(ex)
    _route_plumbing(ex, kernels)
    _register_copies(lib, kernels)
    _register_convolution(lib, kernels)
    _register_attention(lib, ex)
    _register_direct_ops(lib, ex)


def _route_plumbing(ex: Executor, kernels: _DeviceKernels) -> None:
    """Allocation, storage binding and views, in ``ex.native``, which the boxed fallback consults first.

    These ops have no composite kernel, so they reach the fallback, which hands over the op: one kernel
    serves every overload (``set_`` has several, each view op too). They are device plumbing, which
    TorchNeuron does not report either, so they never reach the executor's reporting path.
    """
    ex.native.update({
        "aten::empty": kernels.empty,
        "aten::empty_strided": kernels.empty_strided,
        "aten::_copy_from": kernels.copy_from,
        "aten::_copy_from_and_resize": kernels.copy_from_and_resize,
        "aten::set_": kernels.set_,
        "aten::resize_": kernels.resize_,
        "aten::_local_scalar_dense": kernels.local_scalar_dense,
        **{f"aten::{name}": redispatch_to_cpu for name in policy.VIEW_OPS},
    })


def _register_copies(lib: torch.library.Library, kernels: _DeviceKernels) -> None:
    """``copy_`` and ``_to_copy`` as PrivateUse1 kernels of their own.

    Their CompositeExplicitAutograd kernels beat the fallback, so it never sees them; the composite
    ``_to_copy`` would also ask C++ for pinned memory on a ``non_blocking`` copy to the host, which
    Python hooks cannot provide. Each copy counts as one native op, plus transfer bytes.
    """
    lib.impl("copy_", kernels.copy_, "PrivateUse1")
    lib.impl("_to_copy", kernels.to_copy, "PrivateUse1")


def _register_convolution(lib: torch.library.Library, kernels: _DeviceKernels) -> None:
    """``convolution_overrideable`` and its backward, which a device must implement: their composite
    kernels raise for any backend that does not. They run the CPU's ``convolution`` through the executor."""
    lib.impl("convolution_overrideable", kernels.convolution, "PrivateUse1")
    lib.impl("convolution_backward_overrideable", kernels.convolution_backward, "PrivateUse1")


def _register_attention(lib: torch.library.Library, ex: Executor) -> None:
    """Scaled dot-product attention as TorchNeuron runs it (attention.py): its backend choice, and the fused
    overrideable op and backward, whose composite kernels raise, reported as themselves. Their host kernels are the
    CPU kernels the executor runs; Python cannot reach the C++ choice stub, so the composite's own dispatch is
    taken over at the device's keys."""
    lib.impl("_fused_sdp_choice", attention.fused_sdp_choice, "PrivateUse1")
    for key in ("AutogradPrivateUse1", "PrivateUse1"):  # the second under inference_mode, which skips autograd
        lib.impl("scaled_dot_product_attention", attention.sdpa, key)
    for op, host in ((aten._scaled_dot_product_fused_attention_overrideable.default, attention.fused_attention),
                     (aten._scaled_dot_product_fused_attention_overrideable_backward.default,
                      attention.fused_attention_backward)):
        name = op._schema.name.split("::")[-1]
        lib.impl(name, host, "CPU")
        lib.impl(name, ex.kernel(op), "PrivateUse1")


def _register_direct_ops(lib: torch.library.Library, ex: Executor) -> None:
    """Hot functional overloads (``runtime.direct_ops()``) straight to the executor, as a generated C++ backend
    registers kernels: one call each instead of the structured wrapper's ``empty`` + ``.out`` pair through
    the fallback, which halves their cost."""
    for name in direct_ops():
        packet, _, overload = name.partition(".")
        lib.impl(name, ex.kernel(getattr(getattr(aten, packet), overload or "default")), "PrivateUse1")
