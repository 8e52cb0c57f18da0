"""TorchNeuron's explicit host kernels: registered at PrivateUse1, they copy the inputs to the CPU, run the op there
and copy the results back, and enter neither op-tracking set (no ``_log_offloaded_op``): the 11 linalg kernels of
tnx:torch_neuronx/python_ops/cpu_fallback_registrations.py:39-73 and the C++ ``argsort.stable``
(tnx:torch_neuronx/csrc/core/NeuronBindings.cpp:433).
"""

from __future__ import annotations

from typing import Any

import torch

LINALG = ("linalg_qr", "_linalg_svd", "_linalg_eigh", "linalg_cholesky_ex", "linalg_inv_ex", "linalg_lu_factor_ex",
          "linalg_ldl_factor_ex", "_linalg_slogdet", "_linalg_det", "cholesky_inverse", "triangular_solve")


def _on_cpu(op: Any):
    def kernel(*args: Any, **kwargs: Any) -> Any:
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        out = op(*(a.cpu() if isinstance(a, torch.Tensor) else a for a in args), **kwargs)
        if isinstance(out, tuple):
            return tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in out)
        return out.to(device)

    return kernel


def register(lib: torch.library.Library) -> None:
    for name in LINALG:
        lib.impl(name, _on_cpu(getattr(torch.ops.aten, name).default), "PrivateUse1")
    lib.impl("argsort.stable", _on_cpu(torch.ops.aten.argsort.stable), "PrivateUse1")
