"""Compiled cells in a real IPython shell: what the report says about the graphs, and what stays out of the output.

The default lowering runs the graphs op by op on the device, so a compiled cell reports its ops and CPU
fallbacks as an eager cell does; dynamo's own warnings about a graph break go into the report, in plain
words, instead of onto the cell's stderr.
"""

from __future__ import annotations

import inspect
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
from neuron_lab.extension import session_of
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


GRAPH_FAILS = ("  compile failed: graph Net_{aot}_forward_0 would fail to compile on TorchNeuron: no lowering for "
               "aten::atan2 at In[1] line 10: return torch.atan2(h, x).sum(); ")


def test_a_graph_torchneuron_would_not_lower_reports_its_op_and_line_and_raises_or_runs_eagerly_per_the_setting(
        shell, monkeypatch) -> None:
    """TorchNeuron lowers a graph as a whole: an op it cannot lower fails the graph's setup, which raises under
    TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION's 2.33 default (no op of it a CPU fallback row), and with 0 runs the
    graph eagerly, its ops falling back at their own lines as in eager mode. One shell: dynamo keeps the first
    shell's ``__main__`` for its guards (``_import_module`` is cached), which a second shell's same model trips on."""
    monkeypatch.delenv("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", raising=False)
    run(shell, MODEL)
    res, _ = run(shell, "%%neuron compile\ncompiled_loss = net(x)", ok=False)
    assert isinstance(res.error_in_exec, torch._dynamo.exc.BackendCompilerFailed)
    assert "Neuron backend NEFF execution setup failed with unexpected error: no lowering to StableHLO for " \
           "aten::atan2" in str(res.error_in_exec)
    _, cap = run(shell, "%neuron report --last")  # a cell that raised shows its traceback, its report on asking
    (failure,) = [line for line in cap.stdout.splitlines() if line.startswith("  compile failed: graph ")]
    assert re.fullmatch(re.escape(GRAPH_FAILS).replace(r"\{aot\}", r"\d+") + re.escape(
        "it raised (TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=1, the 2.33 default; 0 runs the graph eagerly, its ops "
        "falling back as in eager mode)"), failure), cap.stdout
    assert not next(reversed(session_of(shell).history.values())).fallbacks
    assert " · no CPU fallbacks · " in cap.stdout, cap.stdout

    monkeypatch.setenv("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "0")
    torch._dynamo.reset()
    torch.neuron.reset_dynamo_metrics()
    _, eager = run(shell, "loss = net(x)\nloss.backward()\neager_grad = net.lin.weight.grad.clone()\nnet.zero_grad()")
    _, cap = run(shell, "%%neuron compile\ncompiled_loss = net(x)\ncompiled_loss.backward()")
    out = cap.stdout
    (failure,) = [line for line in out.splitlines() if line.startswith("  compile failed: graph ")]
    assert re.fullmatch(re.escape(GRAPH_FAILS).replace(r"\{aot\}", r"\d+") + re.escape(
        "it ran eagerly, its ops falling back as in eager mode (TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0; 1, the "
        "2.33 default, raises)"), failure), out
    row = "  aten::atan2.out                        1×"
    site = "      at In[1] line 10: return torch.atan2(h, x).sum()  (1×)"  # the node's line, as in eager mode
    for text in (eager.stdout, out):
        lines = text.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith(row))
        assert lines[at + 1].startswith("      rewrite: ") and lines[at + 2] == site, text  # the rewrite, then the line
    ns = shell.user_ns
    torch.testing.assert_close(ns["compiled_loss"].cpu(), ns["loss"].cpu(), rtol=0, atol=0)
    torch.testing.assert_close(ns["net"].lin.weight.grad.cpu(), ns["eager_grad"].cpu(), rtol=0, atol=0)
    metrics = torch.neuron.get_dynamo_metrics()
    assert {(m["lowering"], m["fallback_execution"]) for m in metrics if m["graph_type"] == "forward"} == \
        {("failed", True)}


def test_a_shape_change_recompiles_and_runs_as_the_2_33_docs_say(shell) -> None:
    """A ragged last batch: 2.33 recompiles per new shape (the April 2026 build rejected the symbolic graph)."""
    run(shell, "import torch\nlin = torch.nn.Linear(4, 2).to('neuron')\n"
               "full, ragged = torch.randn(8, 4).to('neuron'), torch.randn(3, 4).to('neuron')")
    _, cap = run(shell, "%%neuron compile\na = lin(full)\nb = lin(ragged)")
    head = next(x for x in cap.stdout.splitlines() if x.startswith("neuron_lab In["))
    assert " · no CPU fallbacks · " in head and head.endswith(" · 2 graphs, 0 breaks, 1 recompile"), cap.stdout
    assert "      guard: 0/0: tensor 'args[0]' size mismatch at index 0. expected 8, actual 3" in cap.stdout
    ns = shell.user_ns
    for out, x in ((ns["a"], ns["full"]), (ns["b"], ns["ragged"])):
        torch.testing.assert_close(out.cpu(), ns["lin"](x).cpu())
    assert all(m["unlowered"] == [] for m in torch.neuron.get_dynamo_metrics())


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
        "      fix: compute both sides and choose with `torch.where(cond, a, b)` (or `torch.cond(pred, true_fn, "
        "false_fn, operands)`), or decide outside the compiled code, on the host",
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
        "      fix: the number decides a Python branch on this line, so `capture_scalar_outputs` would not remove "
        "this break: compute both sides and choose with `torch.where(cond, a, b)` (or `torch.cond(pred, true_fn, "
        "false_fn, operands)`), or decide outside the compiled code, on the host",
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


FULLGRAPH_NET = """\
import torch
class Branchy(torch.nn.Module):
    def forward(self, t):
        h = t * 2
        if h.sum() > 0:
            h = h + 1
        return h
branchy = Branchy()
t = torch.ones(3, device="neuron")
"""


def test_a_fullgraph_break_is_reported_at_its_line_with_why_and_fix_and_its_traceback_ends_in_the_cell(shell):
    """With --fullgraph dynamo raises where it would break the graph: the report lists that break as it would
    without --fullgraph, and says the compile failed there; the traceback is the user's frames only."""
    res, _ = run(shell, FULLGRAPH_NET)
    n = res.execution_count
    res, cap = run(shell, "%%neuron compile --fullgraph\nout = branchy(t)", ok=False)
    report = next(reversed(session_of(shell).history.values()))
    (b,) = report.compiles.breaks
    assert (b.site.label, b.site.source) == (f"In[{n}] line 5", "if h.sum() > 0:")
    assert b.reason.startswith("Python `if`/`while` on a tensor's value") and b.hint
    assert report.compiles.failures == [f"Branchy.__call__ (called at In[{res.execution_count}] line 2: "
                                        f"out = branchy(t)): a graph break at In[{n}] line 5, and fullgraph allows "
                                        "none"]
    lines = cap.stdout.splitlines()
    assert f"  graph break at In[{n}] line 5: if h.sum() > 0:" in lines and "0 graphs, 1 break" in cap.stdout
    # the traceback: the cell's line, then dynamo's message with the user's frames only
    assert not [f for f in ("modes.py", "eval_frame.py", "module.py") if f in cap.stdout], cap.stdout
    last = sys.last_traceback
    while last.tb_next is not None:
        last = last.tb_next
    assert last.tb_frame.f_code.co_filename.startswith("<ipython-input-") and last.tb_lineno == 2
    user_code = str(res.error_in_exec).split("from user code:\n", 1)[1].split("\n\n")[0]
    assert user_code.splitlines()[0] == f"  Cell In[{n}], line 5, in forward" and len(user_code.splitlines()) == 3
    assert f"  Cell In[{n}], line 5, in forward" in cap.stdout  # as IPython's traceback names the cell, not its file


_FIRST_COMPILE = """
import json, sys
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from neuron_lab.extension import session_of
from neuron_lab.trace import compiler_loading
sh = InteractiveShell()
with capture_output():
    sh.run_line_magic("load_ext", "neuron_lab")
    sh.run_cell("import torch\\nnet = torch.nn.Linear(2, 2).to('neuron')\\nx = torch.ones(2, device='neuron')")
    before = "torch._functorch.aot_autograd" in sys.modules
    sh.run_cell("%%neuron compile\\ny = net(x)", store_history=True)
c = next(reversed(session_of(sh).history.values())).compiles
print(json.dumps({"before": before, "after": "torch._functorch.aot_autograd" in sys.modules,
                  "dynamo_s": compiler_loading.load_s, "loading_s": c.loading_s}))
"""


def test_a_first_compile_counts_the_backend_registrys_imports_as_loading_the_compiler(run_python) -> None:
    """Listing dynamo's backends the first time imports AOTAutograd (a second or more) after dynamo loaded: loading
    the compiler, not running the cell (a --fullgraph break's report read "run 2.46 s" for 0 ops)."""
    out = run_python(_FIRST_COMPILE, {})
    assert not out["before"] and out["after"]
    assert out["loading_s"] > out["dynamo_s"] > 0, out


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


def test_compiling_names_the_compiled_call_through_a_graph_break_inside_what_it_calls() -> None:
    """A break inside a called function has dynamo compile that function, then its resumption, while the compiled
    call runs: the progress line keeps the call's name (a module's class, as compile mode compiles it)."""
    from torch._dynamo.backends.registry import lookup_backend

    seen: list[str] = []

    def spying_backend(gm, example_inputs):
        seen.append(tracker.compiling()["frame"])
        return lookup_backend("neuron")(gm, example_inputs)

    def inner(t):
        t = t * 2
        if t.sum() > 0:  # a Python branch on a tensor: a graph break in the function outer calls
            t = t + 1
        return t

    def outer(t):
        return inner(t) * 3

    tracker = Tracker().start()
    try:
        out = torch.compile(outer, backend=spying_backend)(torch.ones(2, device="neuron"))
    finally:
        tracker.stop()
    assert out.tolist() == [9.0, 9.0]
    assert len(seen) >= 2 and set(seen) == {"outer"}, seen


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
    # a fullgraph error's text: its hints lose to ours, which the same break logged without hints reads
    ("Data-dependent branching\n  Explanation: Detected data-dependent branching (e.g. `if my_tensor.sum() > 0:`). "
     "Dynamo does not support tracing dynamic control flow.\n  Hint: For the common pattern `if tensor_cond: x = "
     "transform(x)` (e.g. clamping inf/nan values), consider making the code branchless by always applying the "
     "transform.\n  Hint: Use `torch.cond` to express dynamic control flow.",
     "Python `if`/`while` on a tensor's value: which way it goes depends on the data, which the compiler cannot "
     "see while tracing, so the graph ends here and Python decides at run time",
     "compute both sides and choose with `torch.where(cond, a, b)` (or `torch.cond(pred, true_fn, false_fn, "
     "operands)`), or decide outside the compiled code, on the host"),
])
def test_dynamo_break_reasons_read_in_plain_words(dynamo_text: str, plain: str, hint: str) -> None:
    from neuron_lab.trace.compiles import explain_break

    assert explain_break(dynamo_text) == (plain, dynamo_text.splitlines()[0], hint)


def test_a_graph_that_fails_and_runs_eagerly_reports_its_fallback_at_its_own_line_through_modules_from_several_cells(
        shell, monkeypatch) -> None:
    """The op's FX node came from In[h] line 4, called from In[n] line 8: each cell is a file of its own, and dynamo's
    code for ``forward`` reads as its ``def`` line, so only the node's stack says where the op came from."""
    monkeypatch.setenv("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "0")  # the graph fails, then runs eagerly
    head, _ = run(shell, "import torch\nclass AngleHead(torch.nn.Module):\n    def forward(self, h, x):\n"
                         "        return torch.atan2(h, x)")
    net, _ = run(shell, "class TwoCellNet(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                        "        self.lin = torch.nn.Linear(8, 8)\n        self.head = AngleHead()\n"
                        "    def forward(self, idx):\n        h = self.lin(idx)\n"
                        "        return self.head(h, idx).sum()\n"
                        "net = TwoCellNet().to('neuron')\nx = torch.randn(4, 8).to('neuron')")
    res, cap = run(shell, "loss = torch.compile(net, backend='neuron')(x)\nloss.backward()")
    h, n, c = head.execution_count, net.execution_count, res.execution_count
    (row,) = next(reversed(session_of(shell).history.values())).fallbacks
    (sc,) = row.sites
    assert (row.op, sc.site.cell, sc.site.line, sc.via) == ("aten::atan2.out", h, 4, None)
    assert f"      at In[{h}] line 4: return torch.atan2(h, x)  (1×)" in cap.stdout
    assert sc.stacks == [(f"In[{c}] line 1 in <module>: loss = torch.compile(net, backend='neuron')(x)",
                          f"In[{n}] line 8 in forward: return self.head(h, idx).sum()",
                          f"In[{h}] line 4 in forward: return torch.atan2(h, x)")]  # not dynamo's `def forward`


ITEM_BREAK = ("Unsupported Tensor.item() call with capture_scalar_outputs=False\n  Explanation: Dynamo does not "
              "support tracing `Tensor.item()` with config.capture_scalar_outputs=False.\n  Hint: Set "
              "`torch._dynamo.config.capture_scalar_outputs = True` or `export TORCHDYNAMO_CAPTURE_SCALAR_OUTPUTS=1` "
              "to include these operations in the captured graph.")


@pytest.mark.parametrize(("source", "captured_helps"), [
    ("n = int(t.sum().item())", True),  # the number flows on into tensor ops: capturing it removes the break
    ("if x.item() > 50:", False),
    ("while t.max().item() > 1.0:", False),
    ("y = a if t.sum().item() > 0 else b", False),
])
def test_item_advice_says_capture_scalar_outputs_only_where_it_removes_the_break(source: str,
                                                                                 captured_helps: bool) -> None:
    from neuron_lab.trace.compiles import explain_break

    _, _, hint = explain_break(ITEM_BREAK, source)
    assert ("capture_scalar_outputs = True" in hint) is captured_helps, hint
    assert ("`torch.cond(" in hint and "would not remove this break" in hint) is not captured_helps, hint


GPT2 = """\
import transformers
gpt = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=100,
                                                           n_positions=32)).to("neuron")
ids = torch.randint(0, 100, (1, 8)).to("neuron")
"""


def test_a_graph_break_inside_a_library_names_its_line_the_cell_line_and_why_in_plain_words(shell) -> None:
    """GPT-2's loss logs a one-time warning (`logger.warning_once`), which dynamo cannot trace: the graph of GPT-2's
    forward ends at its `loss = self.loss_function(` line, and dynamo's graph calls that `step_unsupported`."""
    modeling_gpt2 = pytest.importorskip("transformers.models.gpt2.modeling_gpt2")
    lines, _ = inspect.getsourcelines(modeling_gpt2)
    (at,) = [i for i, line in enumerate(lines, 1) if "loss = self.loss_function(" in line]
    run(shell, "import torch\n" + GPT2)
    res, cap = run(shell, "compiled = torch.compile(gpt, backend='neuron')\nout = compiled(input_ids=ids, labels=ids)")
    n = res.execution_count
    (b,) = next(reversed(session_of(shell).history.values())).compiles.breaks
    assert (b.via.short_label, b.site.label) == (f"gpt2/modeling_gpt2.py:{at}", f"In[{n}] line 2")
    assert b.reason.startswith("a call to a `logging.Logger` method") and "step_unsupported" not in cap.stdout
    assert (f"  graph break at gpt2/modeling_gpt2.py:{at} `loss = self.loss_function(` ← In[{n}] line 2: "
            "out = compiled(input_ids=ids, labels=ids)") in cap.stdout
    assert "      fix: Add the logging method to `torch._dynamo.config.ignore_logging_functions`." in cap.stdout
