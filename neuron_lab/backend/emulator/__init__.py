"""The bundled `neuron` device: real PrivateUse1 tensors over host memory, in pure Python.

``install()`` does, once per process, what a C++ backend does at load time: rename PrivateUse1
to ``neuron``, register the device module, hooks and guard, and register one boxed fallback
that runs every op on zero-copy host aliases and reports it against a coverage profile.
"""

from __future__ import annotations

import torch

from neuron_lab.backend.emulator import runtime as _rt


class Hooks(torch._C._acc.PrivateUse1Hooks):
    """PrivateUse1HooksInterface as far as Python may override it: one always-available device."""

    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class Guard(torch._C._acc.DeviceGuard):
    """The Python device guard: one device, so only its type matters."""

    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


_hooks: list[object] = []  # the hook and guard objects must outlive registration


def install(profile=None) -> _rt.Runtime:
    """Install the emulator; idempotent. Raises if another backend owns PrivateUse1."""
    if _rt.installed():
        return _rt.get()
    owner = torch._C._get_privateuse1_backend_name()
    if owner not in ("privateuseone", "neuron"):
        raise RuntimeError(f"PrivateUse1 is already the {owner!r} backend; the neuron emulator cannot install")
    if owner == "neuron" and hasattr(torch, "neuron"):
        raise RuntimeError("another 'neuron' backend is already registered in this process")

    # Validate the configuration before claiming PrivateUse1: a failed install must leave it free.
    from neuron_lab.backend import profiles
    from neuron_lab.backend.emulator.memory import Allocator, capacity_from_env

    capacity = capacity_from_env()
    profile = profile if profile is not None else profiles.load()
    _hooks.extend([Hooks(), Guard()])
    if owner != "neuron":
        torch.utils.rename_privateuse1_backend("neuron")

    # Imported after the rename: these modules build `neuron` devices at import.
    from neuron_lab.backend.emulator import autocast, device_module, native, patches
    from neuron_lab.backend.emulator.ops import Executor
    from neuron_lab.backend.events import OpRecorder

    allocator, recorder = Allocator(capacity), OpRecorder()
    executor = Executor(allocator, recorder, profile)
    rt = _rt.Runtime(allocator, recorder, executor)
    _rt.set_runtime(rt)

    torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=False)
    torch._register_device_module("neuron", device_module)
    torch._C._acc.register_python_privateuseone_hook(_hooks[0])
    torch._C._acc.register_python_privateuseone_device_guard(_hooks[1])

    fallback_lib = torch.library.Library("_", "IMPL")
    fallback_lib.fallback(executor.fallback, "PrivateUse1")
    aten_lib = torch.library.Library("aten", "IMPL")
    native.install_native(executor, aten_lib)
    autocast.install(aten_lib, fallback_lib)
    rt.libraries += [fallback_lib, aten_lib]
    patches.install()
    _hide_from_dynamo()
    return rt


def _hide_from_dynamo() -> None:
    """Have Dynamo run the emulator's Python code as opaque kernels instead of compiling it.

    Between compiled graphs (after a graph break) ops on `neuron` tensors reach these kernels while
    Dynamo's frame hook is active, and it would try to compile them (it crashes in ``to_host``).
    Marking every code object of the emulator "skip, recursively" uses only the C hook, so
    ``torch._dynamo`` is still not imported with ``import torch``.
    """
    import sys
    import types

    from torch._C._dynamo import eval_frame

    skip = eval_frame._FrameExecStrategy(eval_frame._FrameAction.SKIP, eval_frame._FrameAction.SKIP)

    def mark(code: types.CodeType) -> None:
        eval_frame.set_code_exec_strategy(code, skip)
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                mark(c)

    ours = [m for n, m in list(sys.modules.items()) if m is not None and (
        n.startswith(__name__) or n in ("neuron_lab.backend.events", "neuron_lab.backend.profiles"))]
    for mod in ours:
        for v in vars(mod).values():
            members = vars(v).values() if isinstance(v, type) and v.__module__ == mod.__name__ else (v,)
            for f in members:
                f = getattr(f, "__func__", getattr(f, "fget", f))
                if isinstance(f, types.FunctionType) and f.__module__ == mod.__name__:
                    mark(f.__code__)
