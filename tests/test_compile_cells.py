"""Compiled cells in a real IPython shell: what the report says about the graphs, and what stays out of the output.

The default lowering runs the graphs op by op on the device, so a compiled cell reports its ops and CPU
fallbacks as an eager cell does; dynamo's own warnings about a graph break go into the report, in plain
words, instead of onto the cell's stderr.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import warnings

import pytest
import torch
import torch._dynamo
from shells import run
from torch._dynamo.variables.tensor import TensorVariable

from neuron_lab.backend.emulator.lowering import LOWERING_ENV
from neuron_lab.trace.tracker import Tracker

MODEL = """\
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        return torch.atan2(h, x).sum()

torch.manual_seed(0)
net = Net().to("neuron")
x = torch.randn(3, 4).to("neuron")
"""

BRANCHY = """\
def step(t):
    y = t * 2
    if y.sum() > 0:
        return y + 1
    return y - 1

compiled_step = torch.compile(step, backend="neuron")
z = compiled_step(x)
"""

ITEM = """\
class Gate(torch.nn.Module):
    def forward(self, t):
        if t.sum().item() > 0:
            return t * 2
        return t - 1

gate = Gate().to("neuron")
"""


class _CellStderr:
    """A log stream that writes to the current ``sys.stderr``, as a handler made inside a kernel does."""

    def write(self, text: str) -> None:
        sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.delenv(LOWERING_ENV, raising=False)
    torch._dynamo.reset()
    torch.neuron.reset_dynamo_metrics()
    yield
    torch._dynamo.reset()


@pytest.fixture
def dynamo_log_in_cell():
    """Dynamo's log records reach the cell's stderr (in a kernel, torch's handler writes to the cell's output)."""
    handler = logging.StreamHandler(_CellStderr())
    logger = logging.getLogger("torch._dynamo")
    logger.addHandler(handler)
    TensorVariable._warn_capture_scalar_outputs.cache_clear()  # dynamo warns once per process
    yield
    logger.removeHandler(handler)


def test_compiled_cell_reports_ops_and_fallbacks_inside_the_graphs_with_eager_numerics(shell) -> None:
    run(shell, MODEL)
    _, eager = run(shell, "loss = net(x)\nloss.backward()\neager_grad = net.lin.weight.grad.clone()\nnet.zero_grad()")
    _, cap = run(shell, "%%neuron compile\ncompiled_loss = net(x)\ncompiled_loss.backward()")
    out = cap.stdout
    head = next(x for x in out.splitlines() if x.startswith("neuron_lab In["))  # after any progress lines
    assert " · compile · " in head and "1 CPU fallback call (1 op)" in head and "1 graph, 0 breaks" in head
    assert int(head.split(" ops · ")[0].rsplit(" · ", 1)[1]) >= 10  # the graphs' ops, not 0
    row = "  aten::atan2.out                        1×"
    site = "      at In[1] line 10: return torch.atan2(h, x).sum()  (1×)"  # the node's line, as in eager mode
    for text in (eager.stdout, out):
        lines = text.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith(row))
        assert lines[at + 1] == site, text
    ns = shell.user_ns
    torch.testing.assert_close(ns["compiled_loss"].cpu(), ns["loss"].cpu(), rtol=0, atol=0)
    torch.testing.assert_close(ns["net"].lin.weight.grad.cpu(), ns["eager_grad"].cpu(), rtol=0, atol=0)
    metrics = torch.neuron.get_dynamo_metrics()
    assert {m["lowering"] for m in metrics} == {"eager"}
    assert {"forward", "backward"} <= {m["graph_type"] for m in metrics}


def test_graph_break_is_reported_in_plain_words_with_a_hint_and_nothing_on_stderr(shell, dynamo_log_in_cell) -> None:
    run(shell, MODEL)
    _, cap = run(shell, BRANCHY)
    assert cap.stderr == ""
    lines = cap.stdout.splitlines()
    assert "2 graphs, 1 break, 0 recompiles" in lines[0]
    at = lines.index("  graph break at In[2] line 3: if y.sum() > 0:")
    assert lines[at + 1:at + 4] == [
        "      why: Python `if`/`while` on a tensor's value: which way it goes depends on the data, which the "
        "compiler cannot see while tracing, so the graph ends here and Python decides at run time",
        "      fix: compute both sides and choose with `torch.where(cond, a, b)` (or `torch.cond`), or decide "
        "outside the compiled code",
        "      dynamo: generic_jump TensorVariable()",
    ]
    assert "neuron_lab/" not in cap.stdout

    # .item() makes dynamo log its 20-line warning, with the compile mode's frames in it: none of it shows
    run(shell, ITEM)
    _, cap = run(shell, "%%neuron compile\nw = gate(x)")
    assert cap.stderr == ""
    assert "Graph break" not in cap.stdout and "modes.py" not in cap.stdout
    lines = cap.stdout.splitlines()
    at = lines.index("  graph break at In[3] line 3: if t.sum().item() > 0:")
    assert lines[at + 1:at + 4] == [
        "      why: `.item()` (or `int()`, `float()`, `bool()` of a tensor) turns a device value into a Python "
        "number, which a compiled graph cannot hold",
        "      fix: Set `torch._dynamo.config.capture_scalar_outputs = True` or "
        "`export TORCHDYNAMO_CAPTURE_SCALAR_OUTPUTS=1` to include these operations in the captured graph.",
        "      dynamo: Unsupported Tensor.item() call with capture_scalar_outputs=False",
    ]

    # between cells nothing of this stays installed, and outside a cell's window the same warning reaches stderr
    from neuron_lab.trace import compiles

    assert warnings.showwarning is not compiles._show_unless_dynamo
    assert not [h for h in logging.getLogger("torch._dynamo").handlers if compiles._quiet in h.filters]
    shell.user_ns["gate2"] = type(shell.user_ns["gate"])()
    TensorVariable._warn_capture_scalar_outputs.cache_clear()
    from IPython.utils.capture import capture_output

    with capture_output() as raw:
        torch.compile(shell.user_ns["gate2"], backend="neuron")(torch.ones(2, device="neuron"))
    assert "Graph break from `Tensor.item()`" in raw.stderr


def test_compile_lowering_setting_chooses_inductor_and_unload_restores_the_default(shell) -> None:
    run(shell, "import torch\nt = torch.ones(3, device='neuron')")
    run(shell, '%config NeuronLab.compile_lowering = "inductor"')
    run(shell, "a = torch.compile(lambda v: v * 2 + 1, backend='neuron')(t)")
    run(shell, '%config NeuronLab.compile_lowering = "eager"')
    run(shell, "b = torch.compile(lambda v: v * 3 - 1, backend='neuron')(t)")
    assert shell.user_ns["a"].tolist() == [3.0] * 3 and shell.user_ns["b"].tolist() == [2.0] * 3
    assert [m["lowering"] for m in torch.neuron.get_dynamo_metrics()] == ["inductor", "eager"]
    run(shell, '%config NeuronLab.compile_lowering = "inductor"')
    shell.run_line_magic("unload_ext", "neuron_lab")
    from neuron_lab.backend.emulator import lowering

    assert lowering.lowering() == "eager"  # no env var: the emulator's default again
    shell.run_line_magic("load_ext", "neuron_lab")


def test_compiling_says_which_frame_how_many_graphs_and_how_long_from_any_thread() -> None:
    from torch._dynamo.backends.registry import lookup_backend

    seen: list[dict | None] = []

    def spying_backend(gm, example_inputs):
        fn = lookup_backend("neuron")(gm, example_inputs)
        th = threading.Thread(target=lambda: seen.append(tracker.compiling()))
        th.start()
        th.join()
        return fn

    def scaled(t):
        return t * 4

    tracker = Tracker().start()
    try:
        assert tracker.compiling() is None
        out = torch.compile(scaled, backend=spying_backend)(torch.ones(2, device="neuron"))
        assert tracker.compiling() is None
    finally:
        tracker.stop()
    assert out.tolist() == [4.0, 4.0]
    (snapshot,) = seen
    assert set(snapshot) == {"frame", "graphs", "elapsed_s", "phase", "site"}
    assert (snapshot["frame"], snapshot["graphs"], snapshot["phase"]) == ("scaled", 1, "lowering")  # in the backend
    assert snapshot["site"].startswith(f"{__file__}:")  # the line whose call compiled
    from neuron_lab.report.waits import compiling_line

    assert re.fullmatch(r"compiling scaled: lowering graph 1 to the neuron device — \d+ s", compiling_line(snapshot))
    assert 0 < snapshot["elapsed_s"] < 60
    assert tracker.compiling() is None


@pytest.mark.parametrize(("dynamo_text", "plain", "hint"), [
    ("Failed to trace builtin operator\n  Explanation: Dynamo does not know how to trace builtin operator `print` "
     "with argument types ['str'] (has_kwargs False)\n  Hint: Avoid calling builtin `print` with argument types "
     "['str']. Consider using an equivalent alternative function/method to `print`.\n  Hint: Please report an issue "
     "to PyTorch.", "a call to Python's `print`, which cannot be part of a compiled graph",
     "Avoid calling builtin `print` with argument types ['str']. Consider using an equivalent alternative "
     "function/method to `print`."),
    ("Attempted to call function marked as skipped\n  Explanation: Dynamo does not know how to trace the builtin "
     "`time.sleep.` This function is either a Python builtin (e.g. _warnings.warn) or a third-party C/C++ Python "
     "extension (perhaps created with pybind).\n  Hint: If it is a Python builtin, please file an issue on GitHub "
     "so the PyTorch team can add support for it and see the next case for a workaround.\n  Hint: If it is a "
     "third-party C/C++ Python extension, please either wrap it into a PyTorch-understood custom operator.",
     "a call to `time.sleep`, a function the compiler does not trace into (a Python builtin or a C extension)",
     "call it outside the compiled code; for a C extension of your own, register it as a custom op "
     "(`torch.library.custom_op`)"),
    ("Dynamic shape operator\n  Explanation: Operator `aten.nonzero.default`'s output shape depends on input "
     "Tensor data.\n  Hint: Enable tracing of dynamic shape operators with "
     "`torch._dynamo.config.capture_dynamic_output_shape_ops = True`",
     "`aten.nonzero.default` makes a tensor whose shape depends on the data (a boolean mask, `nonzero`, `unique`): "
     "a compiled graph needs its shapes before it runs",
     "Enable tracing of dynamic shape operators with `torch._dynamo.config.capture_dynamic_output_shape_ops = True`"),
    ("Some new break\n  Explanation: Dynamo cannot do this yet.", "Dynamo cannot do this yet", ""),
])
def test_dynamo_break_reasons_read_in_plain_words(dynamo_text: str, plain: str, hint: str) -> None:
    from neuron_lab.trace.compiles import explain_break

    assert explain_break(dynamo_text) == (plain, dynamo_text.splitlines()[0], hint)
