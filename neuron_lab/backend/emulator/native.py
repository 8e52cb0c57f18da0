"""Device plumbing: allocation, copies, storage binding and views, plus directly registered kernels.

These are what a C++ backend implements itself. They are never reported as fallbacks, except
the copies, which count as native ops and as host/device transfer bytes.
"""

from __future__ import annotations

import torch

from neuron_lab.backend.emulator.ops import Executor, redispatch_to_cpu
from neuron_lab.backend.emulator.runtime import direct_ops
from neuron_lab.backend.events import NATIVE

aten = torch.ops.aten
Tensor = torch.Tensor

# Metadata-only ops: their CPU kernels build a view TensorImpl over the same storage and never
# touch data, so they run on the device tensor itself. TorchNeuron does not report them either.
VIEW_OPS = ("as_strided", "view", "_reshape_alias", "unfold", "view_as_real", "view_as_complex", "alias",
            "_unsafe_view", "as_strided_", "_mkldnn_transpose")



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


def install_native(ex: Executor, lib: torch.library.Library) -> None:
    """Fill ``ex.native`` (reached through the boxed fallback) and register the direct kernels."""
    alloc, bridge = ex.allocator, ex.bridge
    default_dtype = torch.get_default_dtype

    def empty(op, size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        _check_device(device)
        dtype = dtype or default_dtype()
        stride = _contiguous_strides(size, memory_format)
        return bridge.bind(alloc.new_storage(_nbytes(size, stride, dtype), dtype, size), size, stride, 0, dtype)

    def empty_strided(op, size, stride, dtype=None, layout=None, device=None, pin_memory=None):
        _check_device(device)
        dtype = dtype or default_dtype()
        return bridge.bind(alloc.new_storage(_nbytes(size, stride, dtype), dtype, size), size, stride, 0, dtype)

    def host(t: Tensor) -> Tensor:
        return t if t.is_cpu else bridge.to_host(t)

    def transfer(src: Tensor, dst: Tensor) -> None:
        n = src.numel() * src.element_size()
        if src.is_cpu != dst.is_cpu:
            ex.recorder.record_transfer(h2d=n if src.is_cpu else 0, d2h=n if dst.is_cpu else 0)

    def copy_(self, src, non_blocking=False):
        host(self).copy_(host(src))
        transfer(src, self)
        ex.recorder.record("aten::copy_", "", NATIVE, "", (self, src), {}, 0)
        return self

    def copy_from(op, self, dst, non_blocking=False):
        return copy_(dst, self)

    def copy_from_and_resize(op, self, dst):
        dst.resize_(self.shape)
        return copy_(dst, self)

    def to_copy(self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
                memory_format=None):
        _check_device(device)
        target = torch.device(device) if device is not None else self.device
        r = aten._to_copy(host(self), dtype=dtype, layout=layout, device="cpu", memory_format=memory_format)
        ex.recorder.record("aten::_to_copy", "", NATIVE, "", (self,), {}, 0)
        if self.is_cpu:
            ex.recorder.record_transfer(h2d=r.numel() * r.element_size())
        if target.type == "cpu":
            ex.recorder.record_transfer(d2h=r.numel() * r.element_size())
            return r.pin_memory() if pin_memory else r
        if r.untyped_storage().data_ptr() == self.untyped_storage().data_ptr():
            r = r.clone()  # _to_copy must not alias its input
        return bridge.from_host(r)

    def set_(op, self, *args):
        if not args:  # set_() gives the tensor an empty storage of its own device
            op, args = aten.set_.source_Storage_storage_offset, (alloc.new_storage(0), 0, [0], [1])
        return redispatch_to_cpu(op, self, *args)

    def resize_(op, self, size, memory_format=None):
        stride = _contiguous_strides(size, memory_format)
        need = _nbytes(size, stride, self.dtype) + self.storage_offset() * self.element_size()
        st = self.untyped_storage()
        if need > st.nbytes():
            new = alloc.new_storage(need, self.dtype, size)
            old = st.nbytes()
            if old:
                bridge.to_host(bridge.bind(new, [old], [1], 0, torch.uint8)).copy_(
                    bridge.to_host(bridge.bind(st, [old], [1], 0, torch.uint8)))
            st = new
        redispatch_to_cpu(aten.set_.source_Storage_storage_offset, self, st, self.storage_offset(), size, stride)
        return self

    def local_scalar_dense(op, self):
        ex.recorder.record_transfer(d2h=self.element_size())
        return aten._local_scalar_dense(bridge.to_host(self))

    def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
        return ex.run(aten.convolution.default, (input, weight, bias, stride, padding, dilation, transposed,
                                                 output_padding, groups), {})

    def convolution_backward(grad_output, input, weight, stride, padding, dilation, transposed, output_padding,
                             groups, output_mask):
        return ex.run(aten.convolution_backward.default,
                      (grad_output, input, weight, None, stride, padding, dilation, transposed, output_padding,
                       groups, output_mask), {})

    ex.native.update({
        "aten::empty": empty,
        "aten::empty_strided": empty_strided,
        "aten::_copy_from": copy_from,
        "aten::_copy_from_and_resize": copy_from_and_resize,
        "aten::set_": set_,
        "aten::resize_": resize_,
        "aten::_local_scalar_dense": local_scalar_dense,
        **{f"aten::{name}": redispatch_to_cpu for name in VIEW_OPS},
    })
    lib.impl("copy_", copy_, "PrivateUse1")
    lib.impl("_to_copy", to_copy, "PrivateUse1")
    lib.impl("convolution_overrideable", convolution, "PrivateUse1")
    lib.impl("convolution_backward_overrideable", convolution_backward, "PrivateUse1")
    for name in direct_ops():
        packet, _, overload = name.partition(".")
        lib.impl(name, ex.kernel(getattr(getattr(aten, packet), overload or "default")), "PrivateUse1")
