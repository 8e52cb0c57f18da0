"""Emulator bugs PyTorch's own device-generic suites found (issue 32), each held to what PyTorch does on the CPU
or on CUDA, on both cores (``make test`` runs this file on each)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import neuron_lab  # noqa: F401  (installs the backend)


def test_resize_to_its_own_size_keeps_a_strided_tensors_values() -> None:
    cpu = torch.arange(10.0)[::2]
    dev = torch.arange(10.0).to("neuron")[::2]
    for t in (cpu, dev):
        t.resize_(5)
    assert dev.stride() == cpu.stride() == (2,)
    assert dev.cpu().tolist() == cpu.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]


def test_resize_with_a_memory_format_restrides_as_aten_does() -> None:
    cpu = torch.arange(24.0).reshape(2, 3, 4)[:, :, ::2]
    dev = torch.arange(24.0).to("neuron").reshape(2, 3, 4)[:, :, ::2]
    for t in (cpu, dev):
        t.resize_(2, 3, 2, memory_format=torch.contiguous_format)
    assert dev.stride() == cpu.stride() == (6, 2, 1)
    assert torch.equal(dev.cpu(), cpu)


def test_softmax_into_a_strided_out_matches_the_cpu() -> None:
    x = torch.randn(4, 6)
    cpu_out, dev_out = torch.empty(6, 4).t(), torch.empty(6, 4, device="neuron").t()
    torch.softmax(x, 1, out=cpu_out)
    torch.softmax(x.to("neuron"), 1, out=dev_out)
    assert dev_out.stride() == cpu_out.stride()
    torch.testing.assert_close(dev_out.cpu(), cpu_out)


@pytest.mark.parametrize("out", [torch.empty(()), torch.empty(4)], ids=["0-dim", "sized"])
def test_a_cpu_out_for_device_inputs_is_refused_as_pytorch_refuses_it(out: torch.Tensor) -> None:
    x = torch.randn(3, 4, device="neuron")
    with pytest.raises(RuntimeError, match=r"Expected all tensors to be on the same device, .* neuron:0 and cpu!"):
        torch.amax(x, 0, out=out)
    assert out.shape in ((), (4,))  # left as it was


def test_a_device_out_still_takes_device_results() -> None:
    x = torch.randn(3, 4, device="neuron")
    out = torch.empty(0, device="neuron")
    torch.amax(x, 0, out=out)
    torch.testing.assert_close(out.cpu(), x.cpu().amax(0))


def test_float64_results_under_the_64_bit_rule(run_python) -> None:
    """With TorchNeuron's 64-bit rule on, an ``out=`` the kernel must grow is grown on the device too."""
    got = run_python("""
        import json, torch, neuron_lab
        x = torch.tensor([-1.5, 2.25, float("inf")], dtype=torch.float64)
        d = x.to("neuron")
        out = torch.empty(0, dtype=torch.float64, device="neuron")
        torch.abs(d, out=out)
        print(json.dumps(dict(abs=d.abs().cpu().tolist(), dtype=str(d.abs().dtype),
                              isfinite=torch.isfinite(d).cpu().tolist(), out=out.cpu().tolist())))
    """, {"NEURON_LAB_EMULATE_DOWNCAST": "1"})
    assert got == dict(abs=[1.5, 2.25, float("inf")], dtype="torch.float64", isfinite=[True, True, False],
                       out=[1.5, 2.25, float("inf")])


def test_a_module_moves_while_a_forward_graph_still_holds_its_parameters() -> None:
    """accelerate's offload and device_map paths do this: ``model.cpu()`` with a forward's output alive."""
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)).to("neuron")
    out = model(torch.randn(2, 4, device="neuron"))
    with pytest.warns(UserWarning, match="new Parameter objects"):
        model.cpu()
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    out.sum().backward()  # the graph recorded on the device still runs, into the parameters it saved
    assert model(torch.randn(2, 4)).shape == (2, 4)


def test_a_module_with_no_live_graph_keeps_its_parameter_objects() -> None:
    model = nn.Linear(4, 4)
    weight = model.weight
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.to("neuron")
    assert model.weight is weight and weight.device.type == "neuron"
    model(torch.randn(2, 4, device="neuron")).sum().backward()
    opt.step()


def test_torch_compile_default_backend_is_the_neuron_backend_for_device_tensors() -> None:
    """TorchNeuron 2.33 auto-selects its backend on a Neuron device; Inductor has no code for `neuron`."""
    import torch_neuronx

    before = len(torch_neuronx.get_dynamo_metrics())
    x = torch.randn(5, device="neuron")
    got = torch.compile(lambda a: a.sin() + 1)(x)
    assert got.device.type == "neuron"
    torch.testing.assert_close(got.cpu(), x.cpu().sin() + 1)
    assert len(torch_neuronx.get_dynamo_metrics()) == before + 1  # compiled by the neuron backend


# Found by the ModuleInfo and out= sweeps (tests/moduleinfo_sweep.py, tests/out_sweep.py).

@pytest.mark.parametrize("cell", [nn.LSTMCell, nn.GRUCell])
def test_rnn_cells_run_on_the_device_as_on_the_cpu(cell) -> None:
    """ATen picks CUDA's fused cells (no CPU kernel) for any non-CPU input; the device runs the CPU's arithmetic."""
    torch.manual_seed(0)
    cpu = cell(3, 4)
    dev = cell(3, 4).to("neuron")
    dev.load_state_dict(cpu.state_dict())
    x = torch.randn(2, 3)
    want, got = cpu(x), dev(x.to("neuron"))
    for w, g in zip(torch.utils._pytree.tree_leaves(want), torch.utils._pytree.tree_leaves(got)):
        torch.testing.assert_close(g.cpu(), w)
    sum(t.sum() for t in torch.utils._pytree.tree_leaves(got)).backward()
    sum(t.sum() for t in torch.utils._pytree.tree_leaves(want)).backward()
    torch.testing.assert_close(dev.weight_ih.grad.cpu(), cpu.weight_ih.grad)


def test_an_out_a_kernel_restrides_reads_back_with_its_own_shape() -> None:
    """matmul of a vector into a 1-D out computes into it as [1, n], then squeezes it back in place."""
    x, w = torch.randn(10), torch.randn(10, 5)
    out = torch.empty(5, device="neuron")
    torch.matmul(x.to("neuron"), w.to("neuron"), out=out)
    assert out.shape == out.cpu().shape == (5,)
    torch.testing.assert_close(out.cpu(), x @ w)


def test_batch_norm_running_statistics_under_the_64_bit_rule(run_python) -> None:
    """native_batch_norm writes its running statistics though its schema does not say so; float64 ones too."""
    got = run_python("""
        import json, torch, neuron_lab
        x = torch.randn(4, 3, dtype=torch.float64) * 3 + 5
        cpu, dev = torch.nn.BatchNorm1d(3).double(), torch.nn.BatchNorm1d(3).double().to("neuron")
        y = dev(x.to("neuron"))
        cpu(x)
        # l1_loss on float64: a kernel that grows its float32 stand-in out= (it crashed the compiled core)
        loss = torch.nn.functional.l1_loss(y, torch.zeros_like(y))
        print(json.dumps(dict(mean=(dev.running_mean.cpu() - cpu.running_mean).abs().max().item(),
                              var=(dev.running_var.cpu() - cpu.running_var).abs().max().item(),
                              dtype=str(y.dtype), loss_dtype=str(loss.dtype))))
    """, {"NEURON_LAB_EMULATE_DOWNCAST": "1"})
    assert got["mean"] < 1e-5 and got["var"] < 1e-5  # was the initial 0 and 1: never updated
    assert got["dtype"] == got["loss_dtype"] == "torch.float64"


def test_complex_from_float64_parts_under_the_64_bit_rule(run_python) -> None:
    """TorchNeuron computes complex on the CPU, so a call with a complex128 out keeps float64 (it raised here)."""
    got = run_python("""
        import json, torch, neuron_lab
        re, im = torch.tensor([1.5, -2.0], dtype=torch.float64), torch.tensor([0.25, 3.0], dtype=torch.float64)
        z = torch.complex(re.to("neuron"), im.to("neuron"))
        p = torch.polar(re.abs().to("neuron"), im.to("neuron"))
        print(json.dumps(dict(dtype=str(z.dtype), z=torch.equal(z.cpu(), torch.complex(re, im)),
                              polar=torch.equal(p.cpu(), torch.polar(re.abs(), im)))))
    """, {"NEURON_LAB_EMULATE_DOWNCAST": "1"})
    assert got == dict(dtype="torch.complex128", z=True, polar=True)


def test_several_float64_results_under_the_64_bit_rule_each_keep_their_own_memory() -> None:
    """The 64-bit rule's float64 copy of each float32 result is dropped once on the device; the compiled core took a
    later result's storage, at the freed address, for the earlier one: LayerNorm's weight and bias gradients on an
    empty batch shared one uninitialised buffer (the CPU gives two zero tensors)."""
    w = torch.ones(5, dtype=torch.float64, device="neuron")
    g = torch.empty(0, 5, dtype=torch.float64, device="neuron")
    stat = torch.empty(0, 1, dtype=torch.float64, device="neuron")
    for _ in range(4):  # freed addresses are reused on some calls, not all
        torch.randn(1000, dtype=torch.float64, device="neuron").mul_(7)  # leaves non-zero bytes behind
        _, dw, db = torch.ops.aten.native_layer_norm_backward(g, g, [5], stat, stat, w, w, [True, True, True])
        assert dw.untyped_storage().data_ptr() != db.untyped_storage().data_ptr()
        assert dw.dtype == db.dtype == torch.float64 and dw.cpu().tolist() == db.cpu().tolist() == [0.0] * 5


def test_results_under_the_64_bit_rule_keep_the_dtypes_pytorch_gives() -> None:
    """float64 computed in float32 still returns what PyTorch returns for float64: an FFT's complex128 (it was
    complex64), every tensor of a list result (histogramdd's bin edges were float32 on the compiled core)."""
    x = torch.randn(8, dtype=torch.float64)
    f = torch.fft.rfft(x.to("neuron"))
    assert f.dtype == torch.complex128 and torch.allclose(f.cpu(), torch.fft.rfft(x), atol=1e-5)
    h = torch.histogramdd(torch.rand(10, 2, dtype=torch.float64).to("neuron"), bins=[3, 3])
    assert h.hist.dtype == torch.float64 and [e.dtype for e in h.bin_edges] == [torch.float64] * 2


_X64 = torch.tensor([[3.0, 1.0, 2.0], [0.0, 5.0, 4.0]], dtype=torch.float64)


@pytest.mark.parametrize(("op", "outs"), [
    (lambda x, out: torch.kthvalue(x, 2, 1, out=out), (torch.float64, torch.long)),
    (lambda x, out: torch.median(x, 1, out=out), (torch.float64, torch.long)),
    (lambda x, out: torch.logical_and(x, x > 1, out=out[0]), (torch.bool,)),
    (lambda x, out: torch.eq(x, 2.0, out=out[0]), (torch.bool,)),
], ids=["kthvalue", "median", "logical_and", "eq"])
@pytest.mark.parametrize("size", [(1,), (6,)], ids=["grows", "same-numel"])
def test_a_non_float64_out_under_the_64_bit_rule_takes_the_cpus_shape(op, outs, size) -> None:
    """Beside float64 inputs computed in float32, an out= of another dtype (indices, a mask) is resized as on the
    CPU: one that must grow raised "not resizable" on the pure-Python core; one with room kept its old shape."""
    want = op(_X64, tuple(torch.empty(size, dtype=d) for d in outs))
    got = op(_X64.to("neuron"), tuple(torch.empty(size, dtype=d, device="neuron") for d in outs))
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert (g.dtype, g.shape, g.stride()) == (w.dtype, w.shape, w.stride())
        assert g.cpu().tolist() == w.tolist()


def test_the_64_bit_rule_leaves_a_call_of_0_dim_float64_tensors_exact() -> None:
    """TorchNeuron's base.py casts float64 tensors with dimensions only: 0-dim ones alone compute in float64 (they were
    computed in float32 here); beside a tensor with dimensions, the call computes in float32."""
    a, b = torch.tensor(1 + 1e-10, dtype=torch.float64), torch.tensor(1e-10, dtype=torch.float64)
    alone = torch.add(a.to("neuron"), b.to("neuron"))
    assert alone.dtype == torch.float64 and alone.item() == 1 + 2e-10
    beside = torch.add(a.reshape(1).to("neuron"), b.to("neuron"))
    assert beside.dtype == torch.float64 and beside.cpu().tolist() == [1.0]
