"""Zero-copy bridges between `neuron` tensors and the host tensors that compute for them.

``bind`` makes a device tensor over a device storage with any size/stride/offset, by running
``set_``'s CPU kernel (metadata only) on a PrivateUse1 TensorImpl. ``to_host`` makes the
non-resizable CPU alias a kernel computes on; ``from_host`` presents a kernel's result as device
memory, rebinding views of an input to that input's storage instead of counting them again.
"""

from __future__ import annotations

import torch

from neuron_lab.backend.emulator import policy
from neuron_lab.backend.emulator.memory import Allocator

CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_CPU = torch.device("cpu")  # explicit everywhere: a user's torch.set_default_device("neuron") reaches kernels too
_set_handle = torch.ops.aten.set_.source_Storage_storage_offset._handle
_create_empty = torch._C._acc.create_empty_tensor
_ALIAS_ATTR = "_neuron_lab_host"


class HostBridge:
    def __init__(self, allocator: Allocator) -> None:
        self.allocator = allocator

    def bind(self, storage: torch.UntypedStorage, size, stride, offset: int, dtype: torch.dtype) -> torch.Tensor:
        t = _create_empty([0], dtype)
        _set_handle.redispatch_boxed(CPU_KEYS, t, storage, offset, size, stride)
        return t

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        """The CPU alias of a device tensor's bytes, cached on the tensor while its layout and the alias's hold.

        A kernel may restride an ``out=`` alias in place (mm into a 1-D out), so a cached alias counts only while
        its own layout is still the one it was made for.
        """
        st = t.untyped_storage()
        key = (st.data_ptr(), t.storage_offset(), t.shape, t.stride())
        cached = t.__dict__.get(_ALIAS_ATTR)
        if cached is not None and cached[0] == key:
            h = cached[1]
            if h.storage_offset() == key[1] and h.shape == key[2] and h.stride() == key[3]:
                return h
        alloc = self.allocator.lookup(key[0])
        if alloc is None:
            raise RuntimeError(f"neuron emulator: storage at 0x{key[0]:x} is not device memory it allocated")
        h = torch.empty(0, dtype=t.dtype, device=_CPU).set_(alloc.cpu_view, key[1], key[2], key[3])
        _copy_math_bits(t, h)
        t.__dict__[_ALIAS_ATTR] = (key, h)
        return h

    def from_host(self, r: torch.Tensor, device: int | None = None) -> torch.Tensor:
        """A device tensor over a host result's bytes (no copy); there is one device, so ``device`` is 0."""
        if r.layout is not torch.strided:
            raise NotImplementedError(policy.UNSUPPORTED_LAYOUT.format(layout=r.layout))
        st = r.untyped_storage()
        alloc = self.allocator.lookup(st.data_ptr())
        device_storage = alloc.storage_ref() if alloc is not None else None
        if device_storage is None:
            device_storage = self.allocator.adopt(st, r.dtype, r.shape)
        t = self.bind(device_storage, r.shape, r.stride(), r.storage_offset(), r.dtype)
        _copy_math_bits(r, t)
        return t


def _copy_math_bits(src: torch.Tensor, dst: torch.Tensor) -> None:
    """Carry the lazy conjugate/negative bits (``x.conj()``, fft's inverse) that ``set_`` does not."""
    if src.is_conj():
        torch._C._set_conj(dst, True)
    if src.is_neg():
        torch._C._set_neg(dst, True)
