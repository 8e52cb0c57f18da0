"""Scaled dot-product attention as TorchNeuron runs it: one fused op, forward and backward.

TorchNeuron registers ``_fused_sdp_choice`` for PrivateUse1 (SdpBackendSelection.cpp): query, key and value on
the device and all 4-D take the overrideable backend, anything else the math composite. So on Trainium
``F.scaled_dot_product_attention`` is ``aten::_scaled_dot_product_fused_attention_overrideable`` and, in backward,
its ``_backward``. The compiled core makes the same choice and computes the same way (csrc/aten/attention.cpp),
except that it keeps the math arithmetic's softmax and mask from forward to backward, as CPU eager's autograd does,
instead of computing them again (the same bits, a third of a dropout transformer's extra step time).

The host kernels here compute those two ops on CPU tensors as the CPU's own SDPA does: without dropout its flash
kernels where they accept the arguments, else its math kernel's arithmetic. Dropout is TorchNeuron's: the mask is
drawn from the default CPU generator as the CPU's math kernel draws it (so a seed gives the CPU's mask, and
``torch.manual_seed`` reproduces a run), and ``philox_seed`` is that generator's state before the draw, from which
backward draws the same mask again. So ``philox_seed`` is a uint8 state and ``philox_offset`` an empty int32 tensor, as
TorchNeuron returns them, not the meta function's int64 scalars (an int64 would draw the 64-bit rule's report, and
wrap, on every backward); without dropout both are empty.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor
from torch._meta_registrations import alloc_with_matching_layout

aten = torch.ops.aten

MATH, OVERRIDEABLE = 0, 4  # SDPBackend's values
# The fused op and its backward, whose kernels here return TorchNeuron's philox seed and offset (a generator state, an
# empty int32), not the meta function's int64 scalars: host Inductor, which compiles against the meta function and
# checks every output's shape, cannot run them (TorchNeuron's own compiler decomposes them first).
FUSED_OPS = ("aten::_scaled_dot_product_fused_attention_overrideable",
             "aten::_scaled_dot_product_fused_attention_overrideable_backward")
_REDUCED = (torch.float16, torch.bfloat16)


def fused_sdp_choice(query: Tensor, key: Tensor, value: Tensor, attn_mask=None, dropout_p=0.0, is_causal=False, *,
                     scale=None, enable_gqa=False) -> int:
    """TorchNeuron's rule: on the device and all 4-D, overrideable, whatever the mask, dropout or causality."""
    on_device = query.device.type == torch._C._get_privateuse1_backend_name()
    return OVERRIDEABLE if on_device and query.dim() == key.dim() == value.dim() == 4 else MATH


def _flash(query: Tensor, key: Tensor, value: Tensor, bias: Tensor | None, dropout_p: float) -> bool:
    """Whether the CPU's flash kernels take these arguments (they raise on the others)."""
    d = query.size(-1)
    return (dropout_p == 0.0 and query.dtype == key.dtype == value.dtype and query.size(1) % key.size(1) == 0
            and key.size(1) == value.size(1)
            and key.size(-1) == d and value.size(-1) == d
            and (bias is None or (bias.dim() in (2, 4) and bias.dtype == query.dtype)))


def _batched(*ts: Tensor | None) -> list[Tensor | None]:
    """3-D (heads, length, dim) arguments as a batch of one, as the op's meta function reads them."""
    return [t.unsqueeze(0) if t is not None and t.dim() == 3 else t for t in ts]


def _groups(query: Tensor, key: Tensor) -> int:
    return query.size(1) // key.size(1)


def _repeated(t: Tensor, g: int) -> Tensor:
    """Key or value repeated to the query's heads; itself when they are equal (a copy would round differently)."""
    return t.repeat_interleave(g, 1) if g > 1 else t


def dropout_mask(state: Tensor | None, shape, dropout_p: float) -> Tensor:
    """The keep mask ATen's CPU dropout draws (``bernoulli_`` of 1 - p): from the default CPU generator (``state``
    None), or again from the generator state a call returned as ``philox_seed`` (the compiled core draws the same)."""
    g = None
    if state is not None:
        g = torch.Generator()
        g.set_state(state)
    return torch.empty(shape).bernoulli_(1.0 - dropout_p, generator=g).bool()


def _bmm_operands(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """A 4-D ``matmul``'s operands as it hands them to ``bmm`` (reshaped, so copied where not viewable): its backward
    multiplies these, so computing on them keeps autograd's rounding."""
    return a.reshape(-1, a.size(-2), a.size(-1)), b.reshape(-1, b.size(-2), b.size(-1))


def _bmm_backward(grad: Tensor, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """``bmm``'s two gradients, as its autograd formula computes them, for ``_bmm_operands``' ``a`` and ``b``."""
    g = grad.reshape(a.size(0), a.size(1), b.size(2))
    return g.bmm(b.transpose(1, 2)), a.transpose(1, 2).bmm(g)


class _Math(NamedTuple):
    qs: Tensor  # the query times sqrt(scale), as bmm took it
    kt: Tensor  # the key, transposed, times sqrt(scale), as bmm took it
    p: Tensor  # the probabilities
    lse: Tensor
    noise: Tensor | None  # dropout's: kept entries (1 - p) ** -1, else 0; None without dropout


def _math(q: Tensor, k: Tensor, bias: Tensor | None, dropout_p: float, is_causal: bool, scale: float,
          state: Tensor | None) -> _Math:
    """PyTorch's math kernel step by step, so with its rounding (inputs in the accumulation dtype, key repeated to the
    query's heads): the scale's square root on each side, an additive mask, ``_safe_softmax`` (0 where a row is all
    masked), dropout's noise divided by 1 - p as ATen's dropout does."""
    sf = math.sqrt(abs(scale))
    qs, kt = _bmm_operands(q * (-sf if scale < 0 else sf), k.transpose(-2, -1) * sf)
    s = qs.bmm(kt).view(*q.shape[:-1], k.size(-2))
    if is_causal:
        bias = torch.ones(s.size(-2), s.size(-1), dtype=torch.bool).tril()
    if bias is not None:
        s = s + (bias.to(s.dtype) if bias.dtype != torch.bool else torch.zeros_like(bias, dtype=s.dtype).masked_fill(
            bias.logical_not(), -math.inf))
    p = aten._safe_softmax(s, -1)
    noise = None
    if dropout_p > 0.0:
        keep = dropout_mask(state, p.shape, dropout_p).to(p.dtype)
        noise = keep.zero_() if dropout_p >= 1.0 else keep.div_(1.0 - dropout_p)
    return _Math(qs, kt, p, torch.logsumexp(s, -1), noise)


def _acc(*ts: Tensor | None) -> list[Tensor | None]:
    return [t.float() if t is not None and t.dtype in _REDUCED else t for t in ts]


def fused_attention(query: Tensor, key: Tensor, value: Tensor, attn_bias=None, dropout_p=0.0, is_causal=False,
                    return_debug_mask=False, *, scale=None):
    """``_scaled_dot_product_fused_attention_overrideable`` on host tensors, outputs as its meta function says."""
    q, k, v, bias = _batched(query, key, value, attn_bias)
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    state = torch.get_rng_state() if dropout_p > 0.0 else torch.empty(0, dtype=torch.uint8)
    if _flash(q, k, v, bias, dropout_p):
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal, attn_mask=bias,
                                                                    scale=scale)
    else:
        g = _groups(q, k)
        qa, ka, va, ba = _acc(q, _repeated(k, g), _repeated(v, g), bias)
        m = _math(qa, ka, ba, dropout_p, is_causal, scale, None)
        out, lse = torch.matmul(m.p if m.noise is None else m.p * m.noise, va).to(q.dtype), m.lse
    out = out.squeeze(0) if query.dim() == 3 else _laid_out_as_meta(out, query)
    # the logsumexp contiguous and in float, as the meta function gives it (the CPU's flash lays it out (B, S, H));
    # float64 keeps its own (exact 64-bit numerics: backward needs every bit)
    lse = (lse if q.dtype == torch.float64 else lse.float()).contiguous()
    return out, lse, None, None, q.size(2), k.size(2), state, torch.empty(0, dtype=torch.int32), None


def _laid_out_as_meta(out: Tensor, query: Tensor) -> Tensor:
    """The output in the layout the op's meta function gives it (the query's dimension order): a compiled graph's
    views of it were traced on that layout, and Inductor asserts it."""
    want = alloc_with_matching_layout(query, tuple(out.shape))
    return out if want.stride() == out.stride() else want.copy_(out)


def fused_attention_backward(grad_out: Tensor, query: Tensor, key: Tensor, value: Tensor, attn_bias, grad_input_mask,
                             out: Tensor, logsumexp: Tensor, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                             philox_seed: Tensor, philox_offset: Tensor, *, scale=None):
    """``_scaled_dot_product_fused_attention_overrideable_backward`` on host tensors: the CPU's flash backward where
    the forward ran flash and no bias gradient is asked for, else what autograd computes through the math kernel,
    over the forward's dropout mask."""
    three_d = query.dim() == 3
    go, q, k, v, o, bias = _batched(grad_out, query, key, value, out, attn_bias)
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    want_bias = bias is not None and grad_input_mask[3]
    if _flash(q, k, v, bias, dropout_p) and not want_bias:
        dq, dk, dv = aten._scaled_dot_product_flash_attention_for_cpu_backward(
            go, q, k, v, o, logsumexp, 0.0, is_causal, attn_mask=bias, scale=scale)
        db = None
    else:
        g = _groups(q, k)
        goa, qa, ka, va, ba = _acc(go, q, _repeated(k, g), _repeated(v, g), bias)
        m = _math(qa, ka, ba, dropout_p, is_causal, scale, philox_seed)
        # what autograd computes through that math, op by op
        sf = math.sqrt(abs(scale))
        pd, vb = _bmm_operands(m.p if m.noise is None else m.p * m.noise, va)
        dp, dv = _bmm_backward(goa, pd, vb)
        dp, dv = dp.view(m.p.shape), dv.view(va.shape)
        if m.noise is not None:
            dp = dp * m.noise
        ds = aten._softmax_backward_data(dp, m.p, -1, m.p.dtype)
        dq, dk = _bmm_backward(ds, m.qs, m.kt)
        dq = dq.view(qa.shape) * (-sf if scale < 0 else sf)
        dk = (dk.view(*ka.shape[:-2], ka.size(-1), ka.size(-2)) * sf).transpose(-2, -1)
        if g > 1:
            dk, dv = (t.unflatten(1, (k.size(1), g)).sum(2) for t in (dk, dv))
        db = _sum_to(ds, bias).to(bias.dtype) if want_bias else None
        dq, dk, dv = dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
    if three_d:
        dq, dk, dv = dq.squeeze(0), dk.squeeze(0), dv.squeeze(0)
    return _like(dq, query), _like(dk, key), _like(dv, value), db


def _like(grad: Tensor, input: Tensor) -> Tensor:
    """A gradient in its input's layout, as the backward's meta function gives it (``empty_like``)."""
    want = torch.empty_like(input)
    return grad if want.stride() == grad.stride() else want.copy_(grad)


def _sum_to(grad: Tensor, like: Tensor) -> Tensor:
    """A broadcast argument's gradient: summed over the dimensions it was broadcast along."""
    lead = grad.dim() - like.dim()
    dims = [i for i in range(grad.dim()) if i < lead or like.size(i - lead) == 1 and grad.size(i) != 1]
    return grad.sum(dims, keepdim=True).reshape(like.shape) if dims else grad


def sdpa(query: Tensor, key: Tensor, value: Tensor, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
         enable_gqa=False) -> Tensor:
    """``scaled_dot_product_attention`` for the pure-Python core, which cannot register the C++ choice stub: the
    composite's overrideable branch (a boolean mask made additive, as ``convert_boolean_attn_mask``), else the
    composite itself, which then takes math."""
    if fused_sdp_choice(query, key, value) != OVERRIDEABLE:
        return aten.scaled_dot_product_attention.default.decompose(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill(attn_mask.logical_not(), -math.inf)
    return aten._scaled_dot_product_fused_attention_overrideable(
        query, key, value, attn_mask, dropout_p, is_causal, False, scale=scale)[0]
