"""``torch.compile(backend="neuron")`` on the emulator: results, training, TorchNeuron's options and metrics.

The default lowering runs each graph op by op on the device; the host Inductor lowering is asked for
explicitly (``inductor`` fixture). Inductor compiles cost seconds, so graphs are tiny and each test
checks everything one compile shows.
"""

from __future__ import annotations

import logging
import re
import warnings

import pytest
import torch
import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters
from torch._functorch import aot_autograd

from neuron_lab.backend.emulator import runtime
from neuron_lab.backend.emulator.lowering import DYNAMIC_ERROR, LOWERING_ENV, set_lowering

NEURON = torch.device("neuron", 0)
METRIC_KEYS = {"graph_id", "graph_name", "model_name", "has_collectives", "graph_node_count", "timestamp",
               "torch_neuronx_fx_passes_us", "torch_neuronx_lower_us", "torch_neuronx_compile_us",
               "graph_type", "lowering", "lowering_reason", "unlowered", "fallback_execution"}


class TinyMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(nn.functional.gelu(self.a(x)))


class Branchy(nn.Module):
    """A data-dependent Python branch: Dynamo must break the graph at ``.item()``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.lin(x))
        if y.sum().item() > 0:
            return y * 2
        return y - 1


@pytest.fixture(autouse=True)
def fresh_dynamo(monkeypatch):
    monkeypatch.delenv(LOWERING_ENV, raising=False)
    set_lowering(None)
    torch._dynamo.reset()
    torch.neuron.reset_dynamo_metrics()
    yield
    torch._dynamo.reset()


@pytest.fixture
def inductor(monkeypatch):
    """Graphs lowered by host Inductor, asked for as a user does: through the environment variable."""
    monkeypatch.setenv(LOWERING_ENV, "inductor")


def twins(cls: type[nn.Module]) -> tuple[nn.Module, nn.Module]:
    """The same weights on the CPU and on the device."""
    torch.manual_seed(0)
    cpu = cls()
    dev = cls().to("neuron")
    dev.load_state_dict(cpu.state_dict())
    return cpu, dev


def next_aot_id() -> int:
    """The id aot_autograd gives the next graph it traces (its counter is an ``itertools.count``)."""
    return int(re.fullmatch(r"count\((\d+)\)", repr(aot_autograd.AOT_COUNTER)).group(1))


def test_inference_matches_eager_runs_on_device_and_records_metrics(inductor) -> None:
    cpu, dev = twins(TinyMLP)
    compiled = torch.compile(dev, backend="neuron")
    x = torch.randn(5, 8)
    aot_id = next_aot_id()
    before = counters["neuron"]["compiled_graphs"]
    with torch.no_grad():
        y = compiled(x.to("neuron"))
        y2 = compiled((2 * x).to("neuron"))  # same shapes: no recompile, the lowered graph is reused
        ref, ref2 = cpu(x), cpu(2 * x)
    assert y.device == NEURON and y2.device == NEURON
    torch.testing.assert_close(y.cpu(), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(y2.cpu(), ref2, rtol=1e-5, atol=1e-6)

    (m,) = torch.neuron.get_dynamo_metrics()
    assert set(m) == METRIC_KEYS
    assert m["graph_name"] == f"TinyMLP_{aot_id}_inference_0"
    assert (m["model_name"], m["graph_type"], m["lowering"], m["lowering_reason"]) == \
        ("TinyMLP", "inference", "inductor", None)
    assert m["has_collectives"] is False and m["unlowered"] == [] and m["fallback_execution"] is False
    assert m["graph_node_count"] > 0 and re.fullmatch(r"[0-9a-f]{16}", m["graph_id"])
    assert 0 < m["torch_neuronx_fx_passes_us"] and 0 < m["torch_neuronx_lower_us"]
    assert m["torch_neuronx_compile_us"] == m["torch_neuronx_fx_passes_us"] + m["torch_neuronx_lower_us"]
    assert counters["neuron"]["compiled_graphs"] == before + 1

    torch.neuron.reset_dynamo_metrics()
    assert torch.neuron.get_dynamo_metrics() == []


def test_training_step_grads_match_eager_with_forward_and_backward_graphs(inductor) -> None:
    cpu, dev = twins(TinyMLP)
    compiled = torch.compile(dev, backend="neuron")
    aot_id = next_aot_id()
    for step in range(2):  # the second step runs the already lowered graphs
        x, target = torch.randn(6, 8), torch.randn(6, 4)
        for m in (cpu, dev):
            m.zero_grad()
        nn.functional.mse_loss(cpu(x), target).backward()
        loss = nn.functional.mse_loss(compiled(x.to("neuron")), target.to("neuron"))
        loss.backward()
        assert loss.device == NEURON
        for (name, p_cpu), p_dev in zip(cpu.named_parameters(), dev.parameters()):
            assert p_dev.grad.device == NEURON
            torch.testing.assert_close(p_dev.grad.cpu(), p_cpu.grad, rtol=0, atol=1e-5, msg=f"{name} step {step}")

    metrics = torch.neuron.get_dynamo_metrics()
    assert [(m["graph_name"], m["graph_type"], m["lowering"]) for m in metrics] == [
        (f"TinyMLP_{aot_id}_forward_0", "forward", "inductor"),
        (f"TinyMLP_{aot_id}_backward_0", "backward", "inductor"),
    ]
    assert all(m["graph_node_count"] > 0 and m["torch_neuronx_lower_us"] > 0 for m in metrics)


def test_graph_break_on_item_compiles_two_graphs_with_correct_results() -> None:
    cpu, dev = twins(Branchy)
    compiled = torch.compile(dev, backend="neuron")
    with torch.no_grad():
        for x in (torch.ones(3, 4), -torch.ones(3, 4) * 10):
            torch.testing.assert_close(compiled(x.to("neuron")).cpu(), cpu(x), rtol=1e-5, atol=1e-6)
    metrics = torch.neuron.get_dynamo_metrics()
    assert len(metrics) >= 2
    assert {m["model_name"] for m in metrics} == {"Branchy"}  # resume functions after the break too
    assert all(re.fullmatch(r"Branchy_\d+_inference_0", m["graph_name"]) for m in metrics)


def _angle(y, x):
    return torch.atan2(y, x) * 2  # the line an unlowered atan2 is reported at


def test_a_graph_torchneuron_would_not_lower_raises_its_setup_error_by_default(monkeypatch) -> None:
    """2.33's default (TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION unset or 1): the graph's setup fails and raises."""
    monkeypatch.delenv("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", raising=False)
    compiled = torch.compile(_angle, backend="neuron", options={"model_name": "equiformer"})
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed,
                       match="Neuron backend NEFF execution setup failed with unexpected error: no lowering to "
                             "StableHLO for aten::atan2 at .*test_compile.py:[0-9]+ `return torch.atan2"):
        compiled(torch.randn(3, 3, device="neuron"), torch.randn(3, 3, device="neuron"))
    (m,) = torch.neuron.get_dynamo_metrics()
    assert m["model_name"] == "equiformer" and m["graph_name"].startswith("equiformer_")
    assert (m["lowering"], m["fallback_execution"]) == ("failed", False)
    reason = runtime.get().coverage.classify("aten::atan2", frozenset({"float32"}))[1]
    line = _angle.__code__.co_firstlineno + 1
    assert m["unlowered"] == [{"node": "atan2", "op": "aten::atan2", "file": __file__, "line": line,
                               "reason": reason}]


def test_with_fallback_execution_a_graph_that_would_not_lower_runs_eagerly_with_torchneurons_log(
        monkeypatch, caplog) -> None:
    monkeypatch.setenv("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "0")
    compiled = torch.compile(_angle, backend="neuron")
    y, x = torch.randn(3, 3), torch.randn(3, 3)
    with caplog.at_level(logging.WARNING, logger="torch_neuronx.neuron_dynamo_backend"):
        out = compiled(y.to("neuron"), x.to("neuron"))
    torch.testing.assert_close(out.cpu(), _angle(y, x))
    assert [r.getMessage().split(":")[0] for r in caplog.records] == \
        ["Execution failed", "Falling back to original GraphModule execution"]
    (m,) = torch.neuron.get_dynamo_metrics()
    assert (m["lowering"], m["fallback_execution"]) == ("failed", True)


def test_a_host_op_inside_a_lowered_graph_is_no_fallback_but_is_one_in_eager_mode() -> None:
    """TorchNeuron runs linalg_inv_ex on the host in eager mode; inside a graph it lowers, the op is the graph's."""
    rt = runtime.get()
    seen: list[str] = []
    unsubscribe = rt.recorder.subscribe(lambda e, *_: seen.append(e.kind), kinds={"fallback", "host"})
    try:
        a = torch.eye(3, device="neuron") * 2
        compiled = torch.compile(lambda t: torch.linalg.inv(t).sum() * 2, backend="neuron")
        assert compiled(a).item() == 3.0 and seen == []
        torch.linalg.inv(a)
        assert seen == ["host"]
    finally:
        unsubscribe()
    (m,) = torch.neuron.get_dynamo_metrics()
    assert (m["lowering"], m["unlowered"]) == ("eager", [])


def test_ops_of_a_lowered_graph_never_fall_back() -> None:
    """TorchNeuron lowers a graph as a whole: an op that falls back in eager mode runs on the device inside one."""
    rt = runtime.get()
    assert rt.classify("aten::atan2", frozenset({"float32"}))[0] == "fallback"
    assert rt.classify("aten::mse_loss", frozenset({"float32"}))[0] == "possible"  # not registered for eager
    with rt.compiled_graph():
        assert rt.classify("aten::atan2", frozenset({"float32"}))[0] == "native"
        assert rt.classify("aten::mse_loss", frozenset({"float32"}))[0] == "native"
    assert rt.classify("aten::atan2", frozenset({"float32"}))[0] == "fallback"


def test_plain_function_without_module_is_named_model() -> None:
    out = torch.compile(lambda t: t + 1, backend="neuron")(torch.zeros(2, device="neuron"))
    assert out.tolist() == [1.0, 1.0]
    (m,) = torch.neuron.get_dynamo_metrics()
    assert re.fullmatch(r"model_\d+_inference_0", m["graph_name"])


def test_dynamic_true_is_rejected_with_a_clear_error() -> None:
    compiled = torch.compile(lambda t: t * 3, backend="neuron", dynamic=True)
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match=re.escape(DYNAMIC_ERROR)):
        compiled(torch.ones(4, 2, device="neuron"))
    assert "does not support dynamic=True" in DYNAMIC_ERROR and "recompile per shape" in DYNAMIC_ERROR


def test_shapes_that_vary_recompile_and_stay_correct() -> None:
    compiled = torch.compile(lambda t: t * 3 + 1, backend="neuron")
    for n in (4, 6, 9, 4):
        x = torch.randn(n, 2)
        out = compiled(x.to("neuron"))
        assert out.device == NEURON and out.shape == (n, 2)
        torch.testing.assert_close(out.cpu(), x * 3 + 1)


def test_non_default_mode_warns_and_is_ignored() -> None:
    compiled = torch.compile(lambda t: torch.sin(t) + 1, backend="neuron", mode="max-autotune")
    x = torch.randn(4)
    with pytest.warns(UserWarning, match=re.escape(
            "Neuron backend does not support mode='max-autotune', falling back to default mode.")):
        out = compiled(x.to("neuron"))
    torch.testing.assert_close(out.cpu(), torch.sin(x) + 1)


def test_default_lowering_runs_the_graphs_op_by_op_on_the_device() -> None:
    cpu, dev = twins(TinyMLP)
    compiled = torch.compile(dev, backend="neuron")
    rec = runtime.get().recorder
    rec.clear()
    x = torch.randn(2, 8)
    with torch.no_grad():
        out = compiled(x.to("neuron"))
    torch.testing.assert_close(out.cpu(), cpu(x), rtol=1e-5, atol=1e-6)
    assert {"aten::addmm", "aten::gelu"} <= rec.names("native")  # the emulator ran each op

    cpu(x).sum().backward()
    compiled(x.to("neuron")).sum().backward()
    for p_cpu, p_dev in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(p_dev.grad.cpu(), p_cpu.grad, rtol=0, atol=1e-5)
    assert "aten::gelu_backward" in rec.names("native")

    metrics = torch.neuron.get_dynamo_metrics()
    assert [m["graph_type"] for m in metrics] == ["inference", "forward", "backward"]
    for m in metrics:
        assert (m["lowering"], m["lowering_reason"], m["torch_neuronx_lower_us"]) == ("eager", None, 0)
        assert m["torch_neuronx_compile_us"] == m["torch_neuronx_fx_passes_us"]


def test_an_unknown_lowering_compiles_with_the_default(monkeypatch) -> None:
    """As the install's warning says (test_backend_selection): the bad value is not an error at the first compile."""
    monkeypatch.setenv(LOWERING_ENV, "xla")
    out = torch.compile(lambda t: t + 1, backend="neuron")(torch.zeros(2, device="neuron"))
    assert out.tolist() == [1.0, 1.0]
    assert [m["lowering"] for m in torch.neuron.get_dynamo_metrics()] == ["eager"]


@torch.library.custom_op("neuron_lab_test::twice", mutates_args=(), device_types="neuron")
def twice(x: torch.Tensor) -> torch.Tensor:
    """A device-only kernel, as an NKI op would be: the host has no kernel for it."""
    return x * 2


@twice.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def test_graph_inductor_cannot_lower_runs_eagerly_and_says_why(inductor) -> None:
    compiled = torch.compile(lambda t: twice(t) + 1, backend="neuron")
    x = torch.randn(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compiled(x.to("neuron"))
    torch.testing.assert_close(out.cpu(), x * 2 + 1)
    (m,) = torch.neuron.get_dynamo_metrics()
    reason = "no CPU kernel for neuron_lab_test::twice, so host Inductor cannot run it"
    assert (m["lowering"], m["lowering_reason"]) == ("eager", reason)
    assert any(reason in str(w.message) and m["graph_name"] in str(w.message) for w in caught)


@torch.library.custom_op("neuron_lab_test::device_scaled", mutates_args=(), device_types=("neuron", "cpu"))
def device_scaled(x: torch.Tensor) -> torch.Tensor:
    return x * 3


@device_scaled.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    if x.device.type != "neuron":
        raise RuntimeError("device_scaled is traced for neuron tensors only")
    return torch.empty_like(x)


def test_inductor_failure_falls_back_to_eager_on_the_device(inductor) -> None:
    compiled = torch.compile(lambda t: device_scaled(t) - 1, backend="neuron")
    x = torch.randn(3)
    with pytest.warns(UserWarning, match="runs eagerly on the device: host Inductor failed"):
        out = compiled(x.to("neuron"))
    torch.testing.assert_close(out.cpu(), x * 3 - 1)
    torch.testing.assert_close(compiled((2 * x).to("neuron")).cpu(), x * 6 - 1)  # stays eager, no retry
    (m,) = torch.neuron.get_dynamo_metrics()
    assert m["lowering"] == "eager"
    assert m["lowering_reason"].startswith("host Inductor failed: ")
    assert "device_scaled is traced for neuron tensors only" in m["lowering_reason"]


def test_compile_cells_work_with_neuron_as_the_default_device() -> None:
    """`%neuron device neuron --default` is the natural notebook set-up; compiled cells must run under it."""
    from shells import loaded_shell, run

    with loaded_shell() as sh:
        run(sh, "%neuron device neuron --default")
        try:
            run(sh, "import torch\nnet = torch.nn.Linear(4, 2)\nx = torch.ones(3, 4)")
            run(sh, "%%neuron compile\ny = net(x).relu().sum(0)")
            run(sh, "%neuron mode compile")
            run(sh, "z = (net(x) * 2).sum()")
            run(sh, "%neuron mode eager")
            ns = sh.user_ns
            assert ns["x"].device.type == "neuron" and ns["y"].device.type == "neuron"
            ones = torch.ones(3, 4, device="cpu")
            want = torch.nn.functional.linear(ones, ns["net"].weight.cpu(), ns["net"].bias.cpu())
            assert torch.allclose(ns["y"].cpu(), want.relu().sum(0)) and torch.allclose(ns["z"].cpu(), (want * 2).sum())
        finally:
            torch.set_default_device(None)


def test_inductor_lowers_attention_whose_key_the_host_lays_out_differently(inductor) -> None:
    """gpt2's and t5's attention (a key concatenated to an empty cache, transposed, scaled, batched) once made
    host Inductor fail with "Cannot view a tensor with shape [2, 2, 16, 16] and strides (512, 16, 1, 32) as
    (4, 16, 16)" and the graph silently ran eagerly; plain CPU Inductor compiles it."""

    def attention_scores(q, k):
        q = q.view(2, 16, 2, 16).transpose(1, 2)
        k = torch.cat([torch.zeros(2, 2, 0, 16, device=k.device), k.view(2, 16, 2, 16).transpose(1, 2)], -2)
        return torch.matmul(q, k.transpose(-1, -2) * 0.5)

    q, k = torch.randn(2, 16, 32), torch.randn(2, 16, 32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(attention_scores, backend="neuron")(q.to("neuron"), k.to("neuron"))
    torch.testing.assert_close(out.cpu(), attention_scores(q, k))
    (m,) = torch.neuron.get_dynamo_metrics()
    assert (m["lowering"], m["lowering_reason"]) == ("inductor", None)
    assert not [w for w in caught if "runs eagerly" in str(w.message)]


def test_a_graph_with_fused_attention_runs_eagerly_under_host_inductor_and_says_why(inductor) -> None:
    """TorchNeuron's fused attention returns its philox seed and offset (a generator state, an empty int32), not the
    meta function's int64 scalars, which host Inductor checks at run time: the graph runs eagerly on the device with
    that reason, where it once stopped the step with Inductor's stride assertion (its logsumexp's layout first)."""

    def attend(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    q, k, v = (torch.randn(2, 16, 4, 8).transpose(1, 2) for _ in range(3))
    with pytest.warns(UserWarning, match="runs eagerly on the device"):
        out = torch.compile(attend, backend="neuron")(q.to("neuron"), k.to("neuron"), v.to("neuron"))
    torch.testing.assert_close(out.cpu(), attend(q, k, v))
    (m,) = torch.neuron.get_dynamo_metrics()
    reason = ("aten::_scaled_dot_product_fused_attention_overrideable: its philox seed and offset are TorchNeuron's, "
              "not the meta function's scalars that host Inductor checks")
    assert (m["lowering"], m["lowering_reason"]) == ("eager", reason)
