"""Python patches for what a PrivateUse1 backend cannot register at all, or not from pure Python.

The pure-Python core needs a patch for each C++ hook it lacks (storage allocation, pinned memory,
device allocator stats, device synchronize); the compiled core registers those in C++. Both need
``Module.to`` to keep Parameter identity, which torch 2.13 offers no PrivateUse1 hook for, and
``torch.compile``'s default backend to pick the neuron one for device graphs, as TorchNeuron's does. Each
patch delegates to PyTorch's own code for every other device.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from neuron_lab.backend.emulator import device_module as nmod
from neuron_lab.backend.emulator import runtime as _rt
from neuron_lab.backend.emulator.host import _ALIAS_ATTR

_C = torch._C
HELD_PARAMETERS = ("a graph from a forward pass still holds this module's parameters, so the move gives it new "
                   "Parameter objects (as PyTorch does for any move set_data refuses); an optimizer made before the "
                   "move still holds the old ones")
_originals: dict[tuple[Any, str], Any] = {}
_torch_swap_tensors = torch.utils.swap_tensors


def _patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
    orig = getattr(owner, name)
    _originals[(owner, name)] = orig
    setattr(owner, name, make(orig))


def _is_neuron(device: Any) -> bool:
    if device is None:
        return False
    if isinstance(device, int):
        return False
    try:
        return torch.device(device).type == "neuron"
    except (RuntimeError, TypeError):
        return False


def _accelerator_is_neuron() -> bool:
    acc = _originals[(_C, "_accelerator_getAccelerator")]()
    return acc is not None and acc.type == "neuron"


# -- storage allocation: C++ would call the (missing) PrivateUse1 allocator and crash ---------
def _storage_new(orig):
    def __new__(cls, *args, device=None, **kwargs):
        if _is_neuron(device) and cls is torch.UntypedStorage and not kwargs:
            if not args:
                return _rt.get().memory.new_storage(0)
            if len(args) == 1 and isinstance(args[0], int):
                return _rt.get().memory.new_storage(args[0])
            raise RuntimeError("neuron emulator: UntypedStorage(..., device='neuron') takes a size in bytes")
        if device is None:
            return orig(cls, *args, **kwargs)
        return orig(cls, *args, device=device, **kwargs)

    return __new__


# -- pinned host memory: no pinned allocator exists, so pinned buffers are tracked here ------
_pinned: dict[int, weakref.ref] = {}


def _pin_memory(orig):
    def pin_memory(self, device=None):
        if self.is_cpu and (device is None or _is_neuron(device)):
            if _is_pinned_storage(self):
                return self
            out = self.clone(memory_format=torch.contiguous_format) if not self.is_contiguous() else self.clone()
            st = out.untyped_storage()
            ptr = st.data_ptr()
            _pinned[ptr] = weakref.ref(st, lambda _r, ptr=ptr: _pinned.pop(ptr, None))
            return out
        return orig(self, device) if device is not None else orig(self)

    return pin_memory


def _is_pinned_storage(t: torch.Tensor) -> bool:
    ref = _pinned.get(t.untyped_storage().data_ptr())
    return ref is not None and ref() is not None


def _is_pinned(orig):
    def is_pinned(self, device=None):
        if self.is_cpu and (device is None or _is_neuron(device)):
            return _is_pinned_storage(self)
        return orig(self, device) if device is not None else orig(self)

    return is_pinned


# -- torch.accelerator: the C++ DeviceAllocator and synchronizeDevice a Python guard lacks ----
def _nested_stats() -> dict[str, Any]:
    """CUDA's nested ``getDeviceStats`` shape, which ``torch.accelerator.memory_stats`` flattens into CUDA's keys
    (``torch.neuron.memory_stats`` has TorchNeuron's shape instead)."""
    nested: dict[str, Any] = {}
    for key, value in nmod._mem().stats(nmod.current_device()).items():
        node = nested
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return nested


def _on_neuron(replacement: Callable[..., Any]):
    def make(orig):
        def patched(*args):
            return replacement(*args) if _accelerator_is_neuron() else orig(*args)

        patched.__name__ = getattr(orig, "__name__", "patched")
        return patched

    return make


_ACCELERATOR_PATCHES: dict[str, Callable[..., Any]] = {
    "_accelerator_synchronizeDevice": lambda idx=None: nmod.synchronize(),
    "_accelerator_isAllocatorInitialized": lambda: True,
    "_accelerator_getDeviceStats": lambda idx=None: _nested_stats(),
    "_accelerator_resetPeakStats": lambda idx=None: nmod.reset_peak_memory_stats(),
    "_accelerator_resetAccumulatedStats": lambda idx=None: nmod.reset_accumulated_memory_stats(),
    "_accelerator_emptyCache": lambda: nmod.empty_cache(),
    "_accelerator_emptyHostCache": lambda: None,
    "_accelerator_getMemoryInfo": lambda idx=None: nmod.mem_get_info(),
}


# -- Module moves keep Parameter identity (and so weight ties), as set_data does on CUDA -------
def _poisoned_accumulate(grad_outputs):
    raise RuntimeError("backward through a graph recorded before its parameters moved between cpu and neuron; "
                       "run forward again after the move")


def _held_elsewhere(t: torch.Tensor) -> bool:
    """swap_tensors' own rule: nothing but an AccumulateGrad node may hold the TensorImpl.

    A graph still alive after a forward pass holds the parameters it saved for backward.
    """
    if t._use_count() == 1:
        return False
    if t._use_count() == 2 and t.is_leaf:
        edge = torch.autograd.graph.get_gradient_edge(t)  # kept while counting: a node made just now holds t too
        held = t._use_count() != 2  # 2 still: the node existed already and is the other holder
        del edge
        return held
    return True


def _check_swappable(t: torch.Tensor) -> None:
    if _held_elsewhere(t):
        raise RuntimeError(f"cannot move a tensor whose TensorImpl is held elsewhere (use count {t._use_count()})")
    if t._use_count() == 2:  # its AccumulateGrad node: a graph recorded before the move must not reach it
        torch.autograd.graph.get_gradient_edge(t).node.register_prehook(_poisoned_accumulate)


def _swap_like_set_data(t1: torch.Tensor, t2: torch.Tensor) -> None:
    """``t1.data = t2`` for a move across cpu and neuron, which set_data itself refuses.

    PyTorch's swap_tensors refuses weakly referenced tensors (the workbench, dynamo and users keep
    weak references to parameters) and trades ``__class__``, ``__dict__`` and hooks with the temporary,
    so a moved Parameter would lose its attributes and hooks and an UninitializedParameter its class.
    This swaps only the TensorImpl and re-registers the tensor's hooks on the one it now holds.
    """
    if is_traceable_wrapper_subclass(t1) or is_traceable_wrapper_subclass(t2):
        return _torch_swap_tensors(t1, t2)  # their inner tensors live in __dict__: only the full swap is right
    _check_swappable(t1)
    hooks, post_hooks = t1._backward_hooks, t1._post_accumulate_grad_hooks
    torch._C._swap_tensor_impl(t1, t2)
    t1.__dict__.pop(_ALIAS_ATTR, None)  # a host alias cached for the TensorImpl it no longer holds
    if hooks is not None:
        t1._backward_hooks = hooks
    if post_hooks is not None:
        t1._post_accumulate_grad_hooks = post_hooks


@contextlib.contextmanager
def _swap_on_conversion(module: torch.nn.Module, target: Any) -> Iterator[None]:
    crossing = _is_neuron(target) or any(
        t.device.type == "neuron" for t in _module_tensors(module)) and not _is_neuron(target)
    if not crossing or torch.__future__.get_swap_module_params_on_conversion():
        yield  # nothing crosses, or the user chose PyTorch's swap semantics
        return
    if any(_held_elsewhere(p) for p in module.parameters()):
        # PyTorch's own path, which TorchNeuron takes for every move (set_data refuses PrivateUse1).
        warnings.warn(HELD_PARAMETERS, UserWarning, stacklevel=4)
        yield
        return
    torch.__future__.set_swap_module_params_on_conversion(True)
    torch.utils.swap_tensors = _swap_like_set_data  # Module._apply looks it up at call time
    try:
        yield
    finally:
        torch.utils.swap_tensors = _torch_swap_tensors
        torch.__future__.set_swap_module_params_on_conversion(False)


def _module_tensors(module: torch.nn.Module) -> Iterator[torch.Tensor]:
    yield from module.parameters()
    yield from module.buffers()


def _module_to(orig):
    def to(self, *args, **kwargs):
        device = torch._C._nn._parse_to(*args, **kwargs)[0]
        if device is None:
            return orig(self, *args, **kwargs)
        with _swap_on_conversion(self, device):
            return orig(self, *args, **kwargs)

    return to


def _module_move(target: str | None):
    def make(orig):
        def move(self, *args, **kwargs):
            with _swap_on_conversion(self, target or kwargs.get("device", args[0] if args else None)):
                return orig(self, *args, **kwargs)

        move.__name__ = orig.__name__
        return move

    return make


def _auto_select_neuron(orig):
    """``torch.compile``'s default backend on a graph of device tensors is the neuron backend, as TorchNeuron
    documents (2.33 reference-torch-compile: "auto-selected when running on a Neuron device"); Inductor has no
    code generation for the device. Looked up by name, as Dynamo resolves ``backend="neuron"``."""

    def __call__(self, model_, inputs_, **kwargs):
        if any(isinstance(t, torch.Tensor) and t.device.type == "neuron" for t in inputs_):
            from torch._dynamo.backends.registry import lookup_backend

            return lookup_backend("neuron")(model_, inputs_)
        return orig(self, model_, inputs_, **kwargs)

    return __call__


def install(python_core: bool) -> None:
    """Apply the patches once: all of them for the pure-Python core, the Module ones for the compiled core."""
    if _originals:
        return
    if python_core:
        _patch(torch.UntypedStorage, "__new__", _storage_new)
        _patch(torch.Tensor, "pin_memory", _pin_memory)
        _patch(torch.Tensor, "is_pinned", _is_pinned)
        _originals[(_C, "_accelerator_getAccelerator")] = _C._accelerator_getAccelerator
        for name, replacement in _ACCELERATOR_PATCHES.items():
            _patch(_C, name, _on_neuron(replacement))
    _patch(torch.nn.Module, "to", _module_to)
    _patch(torch.nn.Module, "neuron", _module_move("neuron"))
    _patch(torch.nn.Module, "cpu", _module_move("cpu"))
    _patch(torch.nn.Module, "to_empty", _module_move(None))
    _patch(torch._TorchCompileInductorWrapper, "__call__", _auto_select_neuron)
