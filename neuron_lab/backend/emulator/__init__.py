"""The bundled `neuron` device: real PrivateUse1 tensors over host memory.

``install()`` does, once per process, what TorchNeuron does at load time: rename PrivateUse1 to
``neuron`` and register the device module, hooks, guard, allocator and kernels. Two cores can serve
it: the compiled core (C++, ``csrc/``, built by the package against the installed torch) and the
pure-Python core (``python_core``), used when the compiled one is missing or forced off with
``NEURON_LAB_CORE=python``. Both run every op on zero-copy host aliases and report it against a
op coverage; the runtime hides which one runs.
"""

from __future__ import annotations

import traceback

import torch

from neuron_lab import settings
from neuron_lab.backend.emulator import lifecycle, neuronx_finder
from neuron_lab.backend.emulator import runtime as _rt

_DOWNCAST = settings.env("NEURON_LAB_EMULATE_DOWNCAST")
DOWNCAST_ENV = _DOWNCAST.name
# read at each call or compile, so checked here: a bad value warns at import, not never or at the first compile
_READ_LATER = (settings.env("NEURON_LAB_ABORTS"), settings.env("NEURON_LAB_COMPILE_LOWERING"))


def install(coverage=None) -> _rt.Runtime:
    """Install the emulator on the compiled core when it loads, else the pure-Python one; idempotent.

    Raises if another backend owns PrivateUse1, or if NEURON_LAB_CORE=compiled cannot be honoured.
    """
    if _rt.installed():
        return _rt.get()
    owner = torch._C._get_privateuse1_backend_name()
    if owner not in ("privateuseone", "neuron"):
        raise RuntimeError(f"PrivateUse1 is already the {owner!r} backend; the neuron emulator cannot install")
    if owner == "neuron" and hasattr(torch, "neuron"):
        raise RuntimeError("another 'neuron' backend is already registered in this process")

    # Validate the configuration before claiming PrivateUse1: a failed install must leave it free.
    from neuron_lab.backend import coverage as _coverage
    from neuron_lab.backend.emulator import cpp_core, topology

    topo = topology.detect()
    problems = list(topo.problems)
    if coverage is None:
        coverage, problem = _coverage.configured()
        if problem:
            problems.append(problem)
    want, problem = cpp_core.choice()
    emulate_downcast, downcast_problem = _DOWNCAST.switch()
    problems += [p for p in (problem, downcast_problem, *(var.choice()[1] for var in _READ_LATER)) if p]
    if want == "python":
        core, why = None, f"{cpp_core.CORE_ENV}=python"
    else:
        core, why = cpp_core.load()  # importing it registers its guard, hooks, allocator and kernels
        if core is None and want == "compiled":
            raise RuntimeError(f"{cpp_core.CORE_ENV}=compiled, but {why}")
    if owner != "neuron":
        torch.utils.rename_privateuse1_backend("neuron")

    if core is not None:
        recorder = cpp_core.CoreRecorder(core)
        pieces = dict(memory=cpp_core.CoreMemory(core), recorder=recorder, devices=cpp_core.CoreDevices(core),
                      bridge=cpp_core.CoreBridge(core), on_coverage=lambda c: cpp_core.set_coverage(core, c),
                      libraries=[], trace=cpp_core.CoreTrace(core))
        rt = _rt.Runtime(_rt.COMPILED, why, topo, coverage=coverage, **pieces)
        cpp_core.configure(core, topo.capacities, lambda name, dtypes: rt.classify(name, frozenset(dtypes)),
                           recorder, _allocation_site, emulate_downcast)
        core.register_direct(_rt.direct_ops())
    else:
        from neuron_lab.backend.emulator import python_core

        pieces = python_core.install(topo.capacities[0], lambda name, dtypes: _rt.get().classify(name, dtypes), why,
                                     len(topo.capacities), emulate_downcast)
        rt = _rt.Runtime(_rt.PYTHON, why, topo, coverage=coverage, **pieces)
    rt.problems = problems
    rt.emulate_downcast = emulate_downcast
    rt.on_coverage(coverage)
    _rt.set_runtime(rt)
    lifecycle.watch()  # the runtime counts as started at the user's first device use, as TorchNeuron's
    if topo.local_rank is not None:  # a torchrun rank starts on its own device, as under TorchNeuron
        if core is not None:
            rt.devices.set_device(topo.local_rank)
        elif topo.local_rank:
            problems.append(f"rank {topo.local_rank} runs on neuron:0: the pure-Python core has one device "
                            f"({why})")

    # Imported after the rename: these modules build `neuron` devices at import.
    from neuron_lab.backend.emulator import autocast, device_module, distributed, patches

    torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=False)
    torch._register_device_module("neuron", device_module)
    fallback_lib = torch.library.Library("_", "IMPL")
    aten_lib = torch.library.Library("aten", "IMPL")
    autocast.install(aten_lib, fallback_lib)
    rt.libraries += [fallback_lib, aten_lib]
    patches.install(python_core=core is None)
    _hide_from_dynamo()
    neuronx_finder.install()  # `import torch_neuronx` now finds the emulation, unless a real one is on sys.path
    distributed.register()  # init_process_group(backend="neuron"), as `import torch_neuronx` provides
    _backward_on_calling_thread()
    return rt


def _backward_on_calling_thread() -> None:
    """Run ``backward()`` on the thread that calls it, as ``torch.autograd.set_multithreading_enabled(False)`` does.

    On a real device autograd hands the device's backward kernels to its device thread. Here they are host
    kernels: the hand-off woke that thread on the other core, where every activation and gradient was cold in its
    caches, about a tenth of a training step (docs/benchmarks.md, "Seventh stop: backward on the calling thread").
    Results, reported ops, lines and memory are the same on either thread. While torch.profiler records the device
    the core puts backward back on the device thread, so a trace has TorchNeuron's threads, and
    ``set_multithreading_enabled(True)`` does so anywhere. PyTorch keeps the setting per thread: this is the
    installing thread's, the one that runs a notebook's cells, a script or a rank.
    """
    torch.autograd.set_multithreading_enabled(False)


def _allocation_site() -> list[str]:
    """The creating stack of a device allocation, for the compiled core's site recording."""
    return traceback.format_list(traceback.extract_stack()[:-1])


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
        n.startswith(__name__) or n in ("neuron_lab.backend.events", "neuron_lab.backend.coverage"))]
    for mod in ours:
        for v in vars(mod).values():
            members = vars(v).values() if isinstance(v, type) and v.__module__ == mod.__name__ else (v,)
            for f in members:
                f = getattr(f, "__func__", getattr(f, "fget", f))
                if isinstance(f, types.FunctionType) and f.__module__ == mod.__name__:
                    mark(f.__code__)
