"""Scaled dot-product attention runs as on Trainium: TorchNeuron's backend choice sends 4-D device inputs to the fused
overrideable op and its backward (one op each, reported as themselves), anything else to the math composite; values
and gradients equal the CPU's, and dropout's mask is the same in forward and backward."""

from __future__ import annotations

import pytest
import torch
from conftest import core
from torch.nn.functional import scaled_dot_product_attention as sdpa

aten = torch.ops.aten
FUSED = "aten::_scaled_dot_product_fused_attention_overrideable"
FUSED_BACKWARD = "aten::_scaled_dot_product_fused_attention_overrideable_backward"


def _qkv(*shapes, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g, dtype=dtype) for s in shapes]


def _run(dev: str, tensors: list[torch.Tensor], **kw) -> list[torch.Tensor]:
    """Output and the gradients of query, key and value (and of a float mask that asks for one)."""
    leaves = [t.detach().to(dev).requires_grad_() for t in tensors]
    mask = kw.pop("attn_mask", None)
    if mask is not None:
        mask = mask.detach().to(dev).requires_grad_(mask.requires_grad)
        if mask.requires_grad:
            leaves.append(mask)
    out = sdpa(*leaves[:3], attn_mask=mask, **kw)
    out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(dev, out.dtype))
    return [out.detach().cpu(), *(t.grad.cpu() for t in leaves)]


def test_the_choice_is_torchneurons_rule():
    q, k, v = (t.to("neuron") for t in _qkv((1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4)))
    assert aten._fused_sdp_choice(q, k, v) == 4  # overrideable
    assert aten._fused_sdp_choice(q, k, v, torch.zeros(3, 5, device="neuron"), 0.5, False) == 4
    assert aten._fused_sdp_choice(q[0], k[0], v[0]) == 0  # math: not 4-D


def test_sdpa_on_neuron_is_one_fused_op_forward_and_backward(b):
    q, k, v = (t.to("neuron").requires_grad_() for t in _qkv((2, 2, 4, 8), (2, 2, 4, 8), (2, 2, 4, 8)))
    b.clear_op_tracking()
    sdpa(q, k, v, is_causal=True).sum().backward()
    ops = b.get_executed_ops()
    assert {FUSED, FUSED_BACKWARD} <= ops
    assert not ops & {"aten::bmm", "aten::_softmax", "aten::_safe_softmax", "aten::_softmax_backward_data"}
    counts = {s.name: s.count for s in b.op_stats("native") if s.name in (FUSED, FUSED_BACKWARD)}
    assert counts == {FUSED: 1, FUSED_BACKWARD: 1}
    assert not any(s.name in (FUSED, FUSED_BACKWARD) for s in b.op_stats("downcast"))  # no int64 on the device


def test_inference_mode_runs_the_fused_op_too(b):
    q = torch.randn(1, 2, 4, 8, device="neuron")
    with torch.inference_mode():
        sdpa(q, q, q)
    assert FUSED in b.get_executed_ops() and "aten::bmm" not in b.get_executed_ops()


def test_3d_inputs_run_the_math_composite(b):
    q, k, v = (t.to("neuron") for t in _qkv((2, 4, 8), (2, 4, 8), (2, 4, 8)))
    b.clear_op_tracking()
    out = sdpa(q, k, v)
    ops = b.get_executed_ops()
    assert FUSED not in ops and "aten::bmm" in ops
    torch.testing.assert_close(out.cpu(), sdpa(*_qkv((2, 4, 8), (2, 4, 8), (2, 4, 8))))


@pytest.mark.parametrize("case", ["plain", "causal", "float-mask", "bool-mask", "mask-grad", "scale", "gqa",
                                  "value-dim", "bfloat16", "float64"])
def test_values_and_gradients_equal_the_cpu(case):
    shapes = [(2, 4, 5, 8), (2, 4, 6, 8), (2, 4, 6, 8)]
    kw: dict = {}
    dtype = {"bfloat16": torch.bfloat16, "float64": torch.float64}.get(case, torch.float32)
    if case == "causal":
        kw["is_causal"] = True
    elif case in ("float-mask", "mask-grad"):
        kw["attn_mask"] = torch.randn(2, 1, 5, 6, dtype=dtype).requires_grad_(case == "mask-grad")
    elif case == "bool-mask":
        kw["attn_mask"] = torch.rand(5, 6, generator=torch.Generator().manual_seed(1)) > 0.3
    elif case == "scale":
        kw["scale"] = 0.3
    elif case == "gqa":
        shapes[1:] = [(2, 2, 6, 8), (2, 2, 6, 8)]
        kw["enable_gqa"] = True
    elif case == "value-dim":
        shapes[2] = (2, 4, 6, 3)
    tensors = _qkv(*shapes, dtype=dtype)
    cpu = _run("cpu", tensors, **dict(kw))
    dev = _run("neuron", tensors, **dict(kw))
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-4)
    for c, d in zip(cpu, dev, strict=True):
        assert d.dtype == c.dtype and d.shape == c.shape
        torch.testing.assert_close(d, c, **tol)


@pytest.mark.parametrize("value_dim", [8, 3], ids=["flash", "math"])
@pytest.mark.parametrize("layout", ["contiguous", "heads-inner"])
def test_outputs_are_the_meta_functions_shapes_and_layout(layout, value_dim):
    """A compiled graph's views of the output were traced on the meta function's layout (the query's order), and its
    logsumexp is contiguous (the CPU's flash kernel lays its own out (B, S, H))."""
    q, k, v = (t.to("neuron") for t in _qkv((2, 4, 5, 8), (2, 4, 6, 8), (2, 4, 6, value_dim)))
    if layout == "heads-inner":  # as a model's q.view(B, T, H, D).transpose(1, 2)
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    out, lse, cum_q, cum_k, max_q, max_k, seed, offset, debug = aten._scaled_dot_product_fused_attention_overrideable(
        q, k, v)
    with torch.device("meta"):
        meta = aten._scaled_dot_product_fused_attention_overrideable(q.to("meta"), k.to("meta"), v.to("meta"))
    assert (out.shape, out.dtype, lse.shape, lse.dtype) == (meta[0].shape, meta[0].dtype, meta[1].shape, meta[1].dtype)
    assert (out.stride(), lse.stride()) == (meta[0].stride(), meta[1].stride())
    assert (max_q, max_k) == (5, 6) and cum_q is None and cum_k is None and debug is None
    assert seed.numel() == offset.numel() == 0 and out.device.type == lse.device.type == "neuron"  # no dropout


def test_dropout_draws_the_cpus_mask_and_uses_it_forward_and_backward():
    """As TorchNeuron: the mask comes from the default CPU generator as the CPU's math kernel draws it, so a seed gives
    the CPU's values and gradients, and backward draws the same mask again from the state returned as philox_seed."""
    tensors = _qkv((2, 2, 5, 8), (2, 2, 6, 8), (2, 2, 6, 8))
    for kw in ({"dropout_p": 0.3, "is_causal": True}, {"dropout_p": 0.5, "attn_mask": torch.randn(5, 6)}):
        torch.manual_seed(7)
        cpu = _run("cpu", tensors, **dict(kw))
        after_cpu = torch.rand(3)
        torch.manual_seed(7)
        dev = _run("neuron", tensors, **dict(kw))
        assert torch.equal(torch.rand(3), after_cpu)  # the CPU generator moved on as the CPU run's did
        for c, d in zip(cpu, dev, strict=True):
            torch.testing.assert_close(d, c, atol=1e-5, rtol=1e-4)


def test_dropout_drops_with_probability_p_and_scales_the_rest():
    p = 0.25
    q = torch.zeros(4, 4, 64, 8, device="neuron")  # uniform attention over 64 keys
    v = torch.ones(4, 4, 64, 8, device="neuron")
    out, _, _, _, _, _, seed, offset, _ = aten._scaled_dot_product_fused_attention_overrideable(q, q, v, None, p)
    assert seed.dtype == torch.uint8 and offset.dtype == torch.int32  # TorchNeuron's: a CPU generator's state
    g = torch.Generator()
    g.set_state(seed.cpu())
    kept = torch.empty(4, 4, 64, 64).bernoulli_(1 - p, generator=g)
    assert abs(kept.mean().item() - (1 - p)) < 0.02
    expected = kept.mean(-1, keepdim=True).expand(4, 4, 64, 8) / (1 - p)  # each kept weight 1/64, times 1/(1-p)
    torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(core() != "compiled", reason="the compiled core keeps the forward's work; the pure-Python core's "
                    "backward computes it again")
def test_the_backward_takes_the_forwards_probabilities_and_mask_once():
    """CPU eager's math kernel keeps its softmax and dropout mask for autograd; the compiled core keeps them too, by the
    forward's logsumexp, so its backward draws nothing again. So a backward given another philox_seed still takes the
    forward's mask, once: the next one computes it again from the seed it is given, and the two agree to the bit
    where the seed is the forward's. Under no_grad nothing is kept."""
    q, k, v = (t.to("neuron") for t in _qkv((2, 2, 5, 8), (2, 2, 6, 8), (2, 2, 6, 8)))
    go = torch.linspace(-1, 1, 2 * 2 * 5 * 8).reshape(2, 2, 5, 8).to("neuron")
    torch.manual_seed(8)
    other = torch.get_rng_state().to("neuron")

    def forward():
        torch.manual_seed(7)
        return aten._scaled_dot_product_fused_attention_overrideable(q, k, v, None, 0.3, True)

    def backward(fwd, seed, query=q):
        out, lse, cum_q, cum_k, max_q, max_k, _, offset, _ = fwd
        return [g.cpu() for g in aten._scaled_dot_product_fused_attention_overrideable_backward(
            go, query, k, v, None, [True, True, True, False], out, lse, cum_q, cum_k, max_q, max_k, 0.3, True, seed,
            offset)[:3]]

    fwd = forward()
    kept, drawn, other_mask = backward(fwd, other), backward(fwd, fwd[6]), backward(fwd, other)
    assert all(torch.equal(a, b) for a, b in zip(kept, drawn, strict=True))
    assert not torch.equal(other_mask[0], drawn[0])
    fwd = forward()
    assert not torch.equal(backward(fwd, other, q.clone())[0], drawn[0])  # other inputs: the seed's mask
    with torch.no_grad():
        fwd = forward()
    assert not torch.equal(backward(fwd, other)[0], drawn[0])


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_a_transformers_step_with_sdpa_matches_the_cpu(b, arch):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if arch == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, attn_implementation="sdpa"))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, hidden_size=32, intermediate_size=64,
            vocab_size=100, max_position_embeddings=32, attn_implementation="sdpa"))
    ids = torch.randint(0, 100, (2, 16))
    cpu_loss = model(input_ids=ids, labels=ids).loss
    cpu_loss.backward()
    cpu_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.to("neuron")
    b.clear_op_tracking()
    loss = model(input_ids=ids.to("neuron"), labels=ids.to("neuron")).loss
    loss.backward()
    torch.testing.assert_close(loss.cpu(), cpu_loss.detach(), atol=1e-5, rtol=1e-5)
    for g, c in zip((p.grad.cpu() for p in model.parameters()), cpu_grads, strict=True):
        torch.testing.assert_close(g, c, atol=1e-4, rtol=1e-3)
    counts = {s.name: s.count for s in b.op_stats("native")}
    assert counts[FUSED] == counts[FUSED_BACKWARD] == 2  # one per layer
    assert "aten::_softmax" not in counts
