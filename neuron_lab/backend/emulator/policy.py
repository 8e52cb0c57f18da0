"""The emulator's rules, written once for both cores.

Which ops need a quirk to run on the CPU, which are device plumbing, which dtypes TorchNeuron computes in
32 bits, and the messages a core raises: the pure-Python core (``ops``, ``native``) reads them here, and the
compiled core receives them from :func:`for_core` when it is configured (``cpp_core.configure``), turning
them into C++ tables once. A rule changed here changes both cores alike.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

from neuron_lab.backend import syncs
from neuron_lab.backend.emulator import DOWNCAST_ENV
from neuron_lab.kinds import OFF_DEVICE

# Ops that may take CPU index tensors beside device tensors, as on CUDA.
# Schema names of in-place overloads keep their underscore (aten::index_put_), so both spellings are listed.
MIXED_OK = frozenset({"aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl",
                      "aten::_index_put_impl_", "aten::_unsafe_index", "aten::_unsafe_index_put",
                      "aten::index_select", "aten::_unsafe_masked_index"})
# Ops the CPU lacks for integer inputs that devices support: computed in float32, cast back.
INT_AS_FLOAT = frozenset({"aten::histc"})
# Backward ops whose CPU kernel crashes when the input gradient is not wanted (torch 2.13's channels-last
# group_norm backward writes through an undefined grad_input): the input gradient is computed and dropped.
ALWAYS_GRAD_INPUT = frozenset({"aten::native_group_norm_backward"})
# Tensor arguments a CPU kernel writes though its schema does not mark them written (native_batch_norm's running
# statistics, so BatchNorm's and InstanceNorm's): under the 64-bit rule their float32 stand-ins are copied back.
UNDECLARED_WRITES = frozenset({"aten::native_batch_norm.running_mean", "aten::native_batch_norm.running_var"})
# Ops whose CPU kernel draws from the default CPU generator (no `generator` argument): they run on the
# device generator's stream instead.
IMPLICIT_RNG = frozenset({"aten::native_dropout"})

# Metadata-only ops: their CPU kernels build a view TensorImpl over the same storage and never
# touch data, so they run on the device tensor itself. TorchNeuron does not report them either.
VIEW_OPS = ("as_strided", "view", "_reshape_alias", "unfold", "view_as_real", "view_as_complex", "alias",
            "_unsafe_view", "as_strided_", "_mkldnn_transpose")
# Ops the compiled core's fallback runs on the device tensor itself (their CPU kernel, unreported): the views
# but the three it registers at::native kernels for, and binding a storage (``set_``). The pure-Python core
# routes every view op and ``set_`` to such kernels itself (``native``).
ON_DEVICE = frozenset({*(f"aten::{name}" for name in VIEW_OPS), "aten::set_"}) - {
    "aten::as_strided", "aten::view", "aten::_reshape_alias"}
# Device plumbing: allocation, copies into place, metadata views. Never reported as fallbacks
# whatever the coverage says; copies count as native ops and as transfer bytes.
PLUMBING = frozenset({*(f"aten::{name}" for name in VIEW_OPS), "aten::set_", "aten::empty", "aten::empty_strided",
                      "aten::_copy_from", "aten::_copy_from_and_resize", "aten::resize_", "aten::_local_scalar_dense",
                      "aten::copy_", "aten::_to_copy"})
# 64-bit dtypes TorchNeuron computes in 32 bits; a call on any of them is also reported as a downcast.
WIDE_DTYPES = ("float64", "int64")
# Dtypes TorchNeuron computes on the CPU (the device has no complex numbers): a call holding one keeps float64, so
# torch.complex(x, y) of float64 parts still writes its complex128 out.
HOST_DTYPES = ("complex128",)
# Ops that keep int64 on TorchNeuron under the 64-bit rule: its kernels of plumbing, copies and clone never cast int64
# (copy_, _to_copy and contiguous are registered with disable_dtype_autocast; clone, empty, set_, resize_ and the
# views are C++ kernels), while every other device kernel (torch-mlir and XLA) computes int64 in int32.
KEEPS_INT64 = PLUMBING | {"aten::clone", "aten::contiguous", "aten::new_empty", "aten::select_backward"}
DOWNCAST_REASON = "{names} on TorchNeuron computes in 32-bit{wraps} ({how} here; {env}={flip} {flip_does})"
INT64_WRAPS = ": int64 values beyond int32 wrap, copies keep int64"

# A device tensor beside one of another device (or a CPU tensor with dimensions outside MIXED_OK, or a CPU
# tensor the op writes: an out= or an in-place self).
DEVICE_MISMATCH = ("Expected all tensors to be on the same device, but found at least two devices, {first} and "
                   "{second}! (when checking argument for {op})")
# A CPU result of a layout device memory cannot hold (sparse, mkldnn).
UNSUPPORTED_LAYOUT = ("neuron emulator: {layout} tensors are not supported on the neuron device (device memory "
                      "holds dense, strided tensors only)")


def downcast_reason(wide: frozenset[str] | set[str], emulate_downcast: bool) -> str:
    """Why a call on the 64-bit dtypes ``wide`` is reported as a downcast, under NEURON_LAB_EMULATE_DOWNCAST."""
    names = sorted(wide)
    how = "computed in 32-bit" if emulate_downcast else "reported only"
    flip, flip_does = (("0", "keeps 64-bit exact") if emulate_downcast
                       else ("1", "computes float64 in float32 and int64 in int32"))
    return DOWNCAST_REASON.format(names="/".join(names), wraps=INT64_WRAPS if "int64" in names else "", how=how,
                                  env=DOWNCAST_ENV, flip=flip, flip_does=flip_does)


def for_core(emulate_downcast: bool, kinds: tuple[str, ...]) -> dict[str, Any]:
    """The rules as the compiled core's ``set_policy`` takes them: name lists, and every downcast reason made
    ahead (one per set of wide dtypes), so an op call looks its text up instead of building it. ``kinds`` is the
    core's numbering of the kinds: the ones that run off the device (computed on the CPU, int64 exact) by index."""
    subsets = [frozenset(c) for n in range(1, len(WIDE_DTYPES) + 1) for c in combinations(WIDE_DTYPES, n)]
    return dict(mixed_ok=sorted(MIXED_OK), int_as_float=sorted(INT_AS_FLOAT),
                always_grad_input=sorted(ALWAYS_GRAD_INPUT), implicit_rng=sorted(IMPLICIT_RNG),
                undeclared_writes=sorted(UNDECLARED_WRITES), keeps_int64=sorted(KEEPS_INT64),
                off_device_kinds=[i for i, k in enumerate(kinds) if k in OFF_DEVICE],
                host_dtypes=list(HOST_DTYPES),
                on_device=sorted(ON_DEVICE), data_dependent=sorted(syncs.DATA_DEPENDENT_OPS),
                downcast_reasons=[(sorted(s), downcast_reason(s, emulate_downcast)) for s in subsets],
                device_mismatch=DEVICE_MISMATCH, unsupported_layout=UNSUPPORTED_LAYOUT)
