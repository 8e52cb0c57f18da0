"""Autocast and RNN registrations that make CUDA-shaped code paths work on the emulated device.

``torch.autocast("neuron")`` needs a kernel at AutocastPrivateUse1 for every op: a fallthrough,
plus CUDA's cast policy for the ops that run in lower precision or must run in float32.
TorchNeuron registers the same CUDA-style lists. RNN composites pick fused CUDA-only cells for
any non-CPU device, so their decompositions are registered at AutogradPrivateUse1; ``lstm_cell`` and
``gru_cell`` (nn.LSTMCell, nn.GRUCell), which have none, get the CPU's own cell arithmetic there.
"""

from __future__ import annotations

import torch
from torch.amp.autocast_mode import _cast

_AUTOCAST = torch._C.DispatchKey.AutocastPrivateUse1
_AUTOCAST_KEYS = torch._C.DispatchKeySet(_AUTOCAST)

# CUDA's autocast lists (aten/src/ATen/autocast_mode.cpp), as TorchNeuron registers them.
LOWER_PRECISION = ("_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d",
                   "conv_transpose3d", "convolution", "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm",
                   "mv", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
                   "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell",
                   "rnn_relu_cell", "_scaled_dot_product_flash_attention", "scaled_dot_product_attention")
FP32 = ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
        "sinh", "tan", "pow", "softplus", "layer_norm", "native_layer_norm", "group_norm", "frobenius_norm",
        "nuclear_norm", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
        "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
        "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
        "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
        "softmax", "log_softmax", "cross_entropy_loss", "cumprod", "cumsum", "prod", "sum", "norm")
RNN_DECOMPOSED = ("lstm.input", "lstm.data", "gru.input", "gru.data", "rnn_tanh.input", "rnn_tanh.data",
                  "rnn_relu.input", "rnn_relu.data")


def _cast_kernel(op, target: torch.dtype | None):
    def kernel(*args, **kwargs):
        dtype = target or torch.get_autocast_dtype("neuron")
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_KEYS):
            return op(*_cast(args, "neuron", dtype), **_cast(kwargs, "neuron", dtype))

    return kernel


def _lstm_cell(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
    """ATen's CPU LSTMCell (RNN.cpp), op for op, so results match the CPU bit for bit."""
    gates = torch.nn.functional.linear(hx[0], w_hh, b_hh) + torch.nn.functional.linear(input, w_ih, b_ih)
    ingate, forgetgate, cellgate, outgate = gates.unsafe_chunk(4, 1)
    cy = forgetgate.sigmoid() * hx[1] + ingate.sigmoid() * cellgate.tanh()
    return outgate.sigmoid() * cy.tanh(), cy


def _gru_cell(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
    """ATen's CPU GRUCell (RNN.cpp), op for op."""
    igates = torch.nn.functional.linear(input, w_ih, b_ih).unsafe_chunk(3, 1)
    hgates = torch.nn.functional.linear(hx, w_hh, b_hh).unsafe_chunk(3, 1)
    reset_gate = (hgates[0] + igates[0]).sigmoid()
    input_gate = (hgates[1] + igates[1]).sigmoid()
    new_gate = (igates[2] + hgates[2] * reset_gate).tanh()
    return (hx - new_gate) * input_gate + new_gate


RNN_CELLS = {"lstm_cell": _lstm_cell, "gru_cell": _gru_cell}


def _overloads(name: str):
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        return []
    return [getattr(packet, o) for o in packet.overloads()]


def install(lib: torch.library.Library, fallback_lib: torch.library.Library) -> None:
    fallback_lib.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    for names, target in ((LOWER_PRECISION, None), (FP32, torch.float32)):
        for name in names:
            for op in _overloads(name):
                lib.impl(op._schema.overload_name and f"{name}.{op._schema.overload_name}" or name,
                         _cast_kernel(op, target), "AutocastPrivateUse1")
    table = torch._decomp.decomposition_table
    for qual in RNN_DECOMPOSED:
        packet, overload = qual.split(".")
        op = getattr(getattr(torch.ops.aten, packet), overload)
        if op in table:
            lib.impl(qual, table[op], "AutogradPrivateUse1")
    for name, cell in RNN_CELLS.items():
        lib.impl(name, cell, "AutogradPrivateUse1")
