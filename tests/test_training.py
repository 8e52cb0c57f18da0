"""Training on the emulated device matches the CPU: autograd, optimizers (foreach and fused) and common layers;
optimizer steps run as a few direct `_foreach_` kernels; 64-bit work is reported, and optionally computed in 32 bits."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
from torch import nn

import neuron_lab.backend as nb
from neuron_lab.kinds import DOWNCAST

DEVICE = torch.device("neuron", 0)


def _mlp(depth: int = 2) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(16, 32), nn.ReLU()]
    for _ in range(depth - 2):
        layers += [nn.Linear(32, 32), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(32, 4))


def _train_pair(make_model, make_opt, x: torch.Tensor, y: torch.Tensor, steps: int):
    """Train a CPU model and a deep copy moved to the device side by side; return both."""
    torch.manual_seed(0)
    cpu = make_model()
    dev = copy.deepcopy(cpu).to("neuron")
    pairs = [(cpu, make_opt(cpu.parameters()), x, y), (dev, make_opt(dev.parameters()), x.to("neuron"), y.to("neuron"))]
    for _ in range(steps):
        for model, opt, inp, target in pairs:
            opt.zero_grad()
            nn.functional.mse_loss(model(inp), target).backward()
            opt.step()
    return cpu, dev, pairs[1][1]


def _max_diff(cpu: nn.Module, dev: nn.Module) -> float:
    diffs = [(a.detach() - b.detach().cpu()).abs().max().item()
             for a, b in zip(cpu.state_dict().values(), dev.state_dict().values()) if a.is_floating_point()]
    return max(diffs)


_OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "sgd-momentum-foreach": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, foreach=True),
    "sgd-momentum-fused": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, fused=True),
    "adam-foreach": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=True),
    "adam-fused": lambda p: torch.optim.Adam(p, lr=1e-2, fused=True),
    "adam-forloop": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=False),
    "adamw-foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, foreach=True),
    "adamw-fused": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, fused=True),
    "adamw-amsgrad-foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, amsgrad=True, foreach=True),
}


@pytest.mark.parametrize("name", list(_OPTIMIZERS))
def test_mlp_training_is_identical_to_cpu(name) -> None:
    torch.manual_seed(1)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    cpu, dev, opt = _train_pair(_mlp, _OPTIMIZERS[name], x, y, steps=5)
    assert _max_diff(cpu, dev) == 0.0
    assert {p.device for p in dev.parameters()} == {DEVICE}
    state_tensors = [v for s in opt.state.values() for k, v in s.items() if k != "step" and torch.is_tensor(v)]
    assert all(t.device == DEVICE for t in state_tensors)


# -- common layers ---------------------------------------------------------------------------------------
class _ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


class _EmbeddingLN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.ln, self.fc = nn.Embedding(20, 16), nn.LayerNorm(16), nn.Linear(16, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc(self.ln(self.emb(ids))).mean(1)


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn, self.fc = nn.MultiheadAttention(16, 4, batch_first=True), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.attn(x, x, x)[0]).mean(1)


class _Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
        self.fc = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.layer(x)).mean(1)


class _Recurrent(nn.Module):
    def __init__(self, cell: type[nn.Module]) -> None:
        super().__init__()
        self.rnn, self.fc = cell(16, 8, num_layers=2, batch_first=True), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.rnn(x)[0][:, -1])


_SEQ = (4, 6, 16)
_MODELS = {
    "conv-bn": (_ConvBN, lambda: torch.randn(4, 3, 8, 8)),
    "embedding-layernorm": (_EmbeddingLN, lambda: torch.randint(0, 20, (4, 6))),
    "multihead-attention": (_Attention, lambda: torch.randn(*_SEQ)),
    "transformer-encoder-layer": (_Encoder, lambda: torch.randn(*_SEQ)),
    "lstm": (lambda: _Recurrent(nn.LSTM), lambda: torch.randn(*_SEQ)),
    "gru": (lambda: _Recurrent(nn.GRU), lambda: torch.randn(*_SEQ)),
}


@pytest.mark.parametrize("name", list(_MODELS))
def test_layers_train_like_cpu(name) -> None:
    make_model, make_input = _MODELS[name]
    torch.manual_seed(2)
    x, y = make_input(), torch.randn(4, 4)
    cpu, dev, _ = _train_pair(make_model, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), x, y, steps=2)
    assert _max_diff(cpu, dev) <= 1e-4
    assert {t.device for t in [*dev.parameters(), *dev.buffers()]} == {DEVICE}
    assert torch.allclose(cpu(x), dev(x.to("neuron")).cpu(), atol=1e-4)


# -- optimizer steps as direct foreach kernels ---------------------------------------------------------------
def _step_calls(depth: int, **opt_kwargs) -> list:
    """The recorder's view of one optimizer step (after a warm-up step that creates the state)."""
    torch.manual_seed(0)
    model = _mlp(depth).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, **opt_kwargs)
    x = torch.randn(8, 16, device="neuron")
    for _ in range(2):
        opt.zero_grad()
        model(x).square().mean().backward()
        if _ == 0:
            opt.step()
    be = nb.active()
    be.clear_op_tracking()
    opt.step()
    return be.op_stats()


def test_adamw_foreach_step_runs_torchneurons_foreach_kernels_and_the_composites_per_tensor_ops() -> None:
    """TorchNeuron registers kernels for `_foreach_add`, `_sub`, `_mul`, `_div` and `_norm`: each such call is one
    call for the whole list. AdamW's other `_foreach_` ops have a composite kernel, which the dispatcher runs before a
    backend's fallback: TorchNeuron receives their per-tensor ops, one call a tensor, and all of those run natively.
    (Walkthrough 48: every AdamW report listed the four composites under "may fall back on TorchNeuron".)"""
    stats = _step_calls(depth=2, foreach=True)  # 4 parameter tensors
    assert {s.kind for s in stats} == {"native"}
    lists = {"aten::_foreach_add_": 1, "aten::_foreach_div_": 1, "aten::_foreach_mul_": 2}
    per_tensor = {"aten::lerp_": 4, "aten::addcmul_": 4, "aten::sqrt": 4, "aten::addcdiv_": 4}
    assert {s.name: s.count for s in stats} == lists | per_tensor
    deeper = {s.name: s.count for s in _step_calls(depth=6, foreach=True)}  # 12 parameter tensors
    assert deeper == lists | {name: 12 for name in per_tensor}  # a list's kernel does not grow with the tensors


_FOREACH_INPLACE = {  # the in-place overloads of the `_foreach_` ops TorchNeuron registers, and a 0-dim device tensor
    "add_.Scalar": lambda a, b, c: torch._foreach_add_(a, 0.5),
    "add_.List": lambda a, b, c: torch._foreach_add_(a, b, alpha=2),
    "add_.ScalarList": lambda a, b, c: torch._foreach_add_(a, [1.0, 2.0, 3.0]),
    "add_.Tensor": lambda a, b, c: torch._foreach_add_(a, c[0][0, 0].clone(), alpha=3),
    "sub_.List": lambda a, b, c: torch._foreach_sub_(a, b, alpha=0.5),
    "mul_.ScalarList": lambda a, b, c: torch._foreach_mul_(a, [0.5, 1.5, 2.5]),
    "div_.List": lambda a, b, c: torch._foreach_div_(a, c),
}
# The others run PyTorch's composite on the device, as on TorchNeuron: their per-tensor op, one call a tensor (as it
# reaches the device: an in-place structured op through its `.out` overload, `maximum_` through `clamp_min`).
_FOREACH_COMPOSITE = {
    "addcmul_.Scalar": (lambda a, b, c: torch._foreach_addcmul_(a, b, c, value=0.3), "aten::addcmul_"),
    "addcdiv_.ScalarList": (lambda a, b, c: torch._foreach_addcdiv_(a, b, c, [0.1, 0.2, 0.3]), "aten::addcdiv_"),
    "lerp_.List": (lambda a, b, c: torch._foreach_lerp_(a, b, c), "aten::lerp"),
    "lerp_.Scalar": (lambda a, b, c: torch._foreach_lerp_(a, b, 0.1), "aten::lerp_"),
    "maximum_.List": (lambda a, b, c: torch._foreach_maximum_(a, b), "aten::clamp_min"),
    "sqrt_": (lambda a, b, c: torch._foreach_sqrt_(c), "aten::sqrt"),
    "reciprocal_": (lambda a, b, c: torch._foreach_reciprocal_(c), "aten::reciprocal"),
}


def _lists() -> list[list[torch.Tensor]]:
    torch.manual_seed(0)
    return [[torch.randn(4, 3) for _ in range(3)], [torch.randn(4, 3) for _ in range(3)],
            [torch.rand(4, 3) + 1 for _ in range(3)]]


@pytest.mark.parametrize("overload", _FOREACH_INPLACE)
def test_foreach_in_place_matches_the_cpu_as_one_call(overload: str) -> None:
    lists = _lists()
    on_cpu = [[t.clone() for t in ts] for ts in lists]
    on_dev = [[t.to("neuron") for t in ts] for ts in lists]
    be = nb.active()
    be.clear_op_tracking()
    _FOREACH_INPLACE[overload](*on_dev)
    stats = [s for s in be.op_stats() if s.name.startswith("aten::_foreach_")]
    _FOREACH_INPLACE[overload](*on_cpu)
    for cpu, dev in zip(on_cpu, on_dev):
        for a, b in zip(cpu, dev):
            torch.testing.assert_close(b.cpu(), a)
    assert [(s.name, s.count) for s in stats] == [("aten::_foreach_" + overload.split(".")[0], 1)]


@pytest.mark.parametrize("overload", _FOREACH_COMPOSITE)
def test_a_foreach_op_torchneuron_registers_no_kernel_for_runs_its_per_tensor_op_and_matches_the_cpu(overload):
    run, op = _FOREACH_COMPOSITE[overload]
    lists = _lists()
    on_cpu = [[t.clone() for t in ts] for ts in lists]
    on_dev = [[t.to("neuron") for t in ts] for ts in lists]
    be = nb.active()
    be.clear_op_tracking()
    run(*on_dev)
    stats = be.op_stats()
    run(*on_cpu)
    for cpu, dev in zip(on_cpu, on_dev):
        for a, b in zip(cpu, dev):
            torch.testing.assert_close(b.cpu(), a)
    assert not [s for s in stats if s.name.startswith("aten::_foreach_")]
    assert sum(s.count for s in stats if s.name == op) == 3  # one call a tensor of the list


def test_adamw_fused_step_is_two_kernels() -> None:
    stats = _step_calls(depth=4, fused=True)
    # The step counters live on the device for fused optimizers: one foreach increment, then the fused update.
    assert [(s.name, s.kind, s.count) for s in stats] == [("aten::_foreach_add_", "native", 1),
                                                          ("aten::_fused_adamw_", "native", 1)]


# -- 64-bit dtypes ------------------------------------------------------------------------------------------------
_WIDE_OPS = {
    "aten::add": lambda d, i: d + d,
    "aten::mul": lambda d, i: d * 3,
    "aten::sum": lambda d, i: d.sum(),
    "aten::mm": lambda d, i: d.view(2, 2) @ d.view(2, 2),
    "aten::cumsum": lambda d, i: d.cumsum(0),
    "aten::index": lambda d, i: torch.arange(4.0, device="neuron")[i],
    "aten::eq": lambda d, i: i == i,
    "aten::sort": lambda d, i: torch.sort(d),
}


@pytest.mark.parametrize("op", list(_WIDE_OPS))
def test_every_op_on_64_bit_tensors_is_reported_as_downcast(op) -> None:
    d = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64, device="neuron")
    i = torch.tensor([3, 0], device="neuron")
    be = nb.active()
    be.clear_op_tracking()
    _WIDE_OPS[op](d, i)
    down = {s.name: s for s in be.op_stats(DOWNCAST)}
    assert op in down, sorted(down)
    ran = sum(s.count for s in be.op_stats() if s.name == op and s.kind != DOWNCAST)
    assert down[op].count == ran >= 1
    assert "32-bit" in down[op].reason and ("float64" in down[op].reason or "int64" in down[op].reason)
    assert down[op].reason.startswith(("float64", "int64"))


def test_32_bit_work_is_not_reported_as_downcast() -> None:
    be = nb.active()
    x = torch.randn(4, 4, device="neuron")
    be.clear_op_tracking()
    ((x @ x).relu().sum() + x.int().amax()).item()  # (an int32 sum would promote to int64)
    assert be.op_stats(DOWNCAST) == []
    assert be.op_stats()


def test_float64_computes_in_float32_by_default() -> None:
    """TorchNeuron's 64-bit rule is the default: the 1e-10 tail is below float32's precision, the dtype stays."""
    x = torch.tensor([1 + 1e-10], dtype=torch.float64, device="neuron")
    y = x * 1.0
    assert y.dtype == torch.float64 and y.item() == 1.0


_DOWNCAST_SCRIPT = """
import json, torch
import neuron_lab.backend as nb
from neuron_lab.kinds import DOWNCAST
x = torch.tensor([1 + 1e-10, 2.0], dtype=torch.float64, device="neuron")
stored = x[0].item()  # a copy moves bytes: the value arrives intact
y, z = x * 1.0, x + 0.0
out = torch.empty(2, dtype=torch.float64, device="neuron")
torch.mul(x, 1.0, out=out)
inplace = x.clone()
inplace.mul_(1.0)
m = (x.view(2, 1) @ x.view(1, 2))
big = torch.tensor([2**40 + 1], device="neuron")
print(json.dumps({
    "stored": stored,
    "values": [y[0].item(), z[0].item(), out[0].item(), inplace[0].item(), m[0, 0].item(), x.sum().item()],
    "dtypes": sorted({str(t.dtype) for t in (y, z, out, inplace, m, x.sum())}),
    "int64": (big + 0).item(),
    "reason": next(s.reason for s in nb.active().op_stats(DOWNCAST) if s.name == "aten::mul"),
}))
"""


def test_emulated_downcast_computes_float64_in_float32(run_python) -> None:
    r = run_python(_DOWNCAST_SCRIPT, {"NEURON_LAB_EMULATE_DOWNCAST": ""})  # unset or empty: the default, on
    assert r["stored"] == 1 + 1e-10
    assert r["values"] == [1.0, 1.0, 1.0, 1.0, 1.0, 3.0]  # the 1e-10 tail is below float32 precision
    assert r["dtypes"] == ["torch.float64"]
    assert r["int64"] == 1  # int64 computes in int32 too: 2**40 + 1 wraps (tests/test_int64_rule.py)
    assert "computed in 32-bit" in r["reason"]


def test_exact_64_bit_as_a_setting(run_python) -> None:
    r = run_python(_DOWNCAST_SCRIPT, {"NEURON_LAB_EMULATE_DOWNCAST": "0"})
    assert r["values"] == [1 + 1e-10] * 4 + [(1 + 1e-10) ** 2, 3 + 1e-10]  # x[0] * x[0] in m
    assert r["int64"] == 2**40 + 1
    assert "reported only" in r["reason"] and "NEURON_LAB_EMULATE_DOWNCAST=1 computes float64 in float32" in r["reason"]


def _backward_threads(x: torch.Tensor) -> list[int]:
    """The threads the hook on a backward's device gradient ran on."""
    seen: list[int] = []
    y = (x * 2).sum()
    y.register_hook(lambda g: seen.append(threading.get_ident()))
    y.backward()
    return seen


def test_backward_runs_on_the_calling_thread_and_other_threads_keep_autograds() -> None:
    # The emulator's device kernels are host kernels: autograd's device thread, on the other core, ran each
    # backward on cold caches. The thread that installed the emulator runs its own; PyTorch's switch restores it.
    x = torch.ones(4, device="neuron", requires_grad=True)
    assert _backward_threads(x) == [threading.get_ident()] and x.grad.tolist() == [2.0] * 4
    with torch.autograd.set_multithreading_enabled(True):
        (other,) = _backward_threads(x)
    assert other != threading.get_ident() and x.grad.tolist() == [4.0] * 4
    assert not torch._C._is_multithreading_enabled()
    seen: list[list[int]] = []
    t = threading.Thread(target=lambda: seen.append(_backward_threads(x)))
    t.start()
    t.join(timeout=60)
    assert not t.is_alive(), "a backward on a user thread did not end in 60 s"
    ((ran_on,),) = seen
    assert ran_on not in (threading.get_ident(), t.ident) and x.grad.tolist() == [6.0] * 4
