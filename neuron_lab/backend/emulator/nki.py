"""``torch_neuronx.nki_op`` on the emulator: a custom op whose body is torch code runs as one device kernel.

TorchNeuron registers an NKI kernel as a custom op (as ``torch.library.triton_op`` does for Triton). Here the
op is defined with its body as its CPU kernel and no `neuron` kernel, so a call on device tensors reaches the
emulator's fallback, which runs the body on zero-copy host aliases of the arguments: the body's own torch ops
are host work, not the device's, and the call is reported once, as an NKI kernel (kind ``nki``), never as a
CPU fallback. The body doubles as the fake kernel, so the op traces under ``torch.compile``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch

from neuron_lab.backend.emulator import runtime
from neuron_lab.backend.emulator.not_emulated import NotEmulatedError

REASON = "NKI kernel (torch_neuronx.nki_op): runs on the device; the emulator runs its torch body"


class NkiOp:
    """What :func:`nki_op` returns: call it like the function; ``register_autograd`` and ``register_fake``
    work as on ``torch.library.custom_op``'s result."""

    def __init__(self, qualname: str, fn: Callable[..., Any]) -> None:
        ns, name = qualname.split("::")
        self.qualname = qualname
        self.op = getattr(getattr(torch.ops, ns), name).default
        self.__name__, self.__doc__, self.__wrapped__ = fn.__name__, fn.__doc__, fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.op(*args, **kwargs)

    def register_autograd(self, backward: Callable[..., Any], *, setup_context: Callable[..., Any] | None = None
                          ) -> None:
        torch.library.register_autograd(self.qualname, backward, setup_context=setup_context)

    def register_fake(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        return torch.library.register_fake(self.qualname, fn, allow_override=True)

    def __repr__(self) -> str:
        return f"<NKI op {self.qualname} (emulated: runs its torch body)>"


def nki_op(name: str, fn: Callable[..., Any] | None = None, mutates_args: Iterable[str] | str = ()
           ) -> NkiOp | Callable[[Callable[..., Any]], NkiOp]:
    """Register ``fn`` as the custom op ``name`` ("namespace::op"), usable as a decorator: the schema comes from
    ``fn``'s type hints and ``mutates_args``, as for ``torch.library.custom_op``."""
    ns, sep, opname = name.partition("::")
    if not sep or not ns.isidentifier() or not opname.isidentifier():
        raise ValueError(f"nki_op needs a name like 'mylib::rmsnorm', not {name!r}")

    def register(body: Callable[..., Any]) -> NkiOp:
        schema = torch.library.infer_schema(body, mutates_args=mutates_args)
        lib = torch.library.Library(ns, "FRAGMENT")
        lib.define(opname + schema)
        lib.impl(opname, body, "CPU")  # the fallback hands it host aliases of the device arguments
        torch.library.register_fake(name, body, lib=lib)
        rt = runtime.get()
        rt.libraries.append(lib)
        rt.nki_ops[name] = REASON
        return NkiOp(name, body)

    return register if fn is None else register(fn)


NKI_INSTALL = ("wrap_nki runs NKI kernels through NKI's CPU simulator, which needs AWS's `nki` package: "
               "pip install nki --extra-index-url https://pip.repos.neuron.amazonaws.com (the PyPI packages named "
               "`nki` and `neuronx-cc` are placeholders that raise WRONG PACKAGE); or make the kernel's torch "
               "reference the body of an nki_op to run it here")


def wrap_nki(kernel: Callable[..., Any], **kwargs: Any) -> Callable[..., Any]:
    """``torch_neuronx.wrap_nki(kernel)``: on the emulator, a callable that runs an ``@nki.jit`` kernel through
    ``nki.simulate_kernel`` on the tensors' host memory (inside an nki_op body they are host aliases)."""
    try:
        import nki
    except ImportError:
        nki = None
    simulate = getattr(nki, "simulate_kernel", None)
    if simulate is None:
        raise NotEmulatedError(NKI_INSTALL)

    def run(*args: Any) -> Any:
        arrays = [a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else a for a in args]
        out = simulate(kernel, *arrays, **kwargs)
        if isinstance(out, tuple):
            return tuple(torch.from_numpy(o) if isinstance(o, np.ndarray) else o for o in out)
        return torch.from_numpy(out) if isinstance(out, np.ndarray) else out

    return run
