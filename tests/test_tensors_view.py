"""The data behind the Tensors view in a real in-process IPython shell: one row per device storage with
every name that refers to it, exact bytes, who holds it, a total equal to memory_allocated, no leaks."""

from __future__ import annotations

import gc
import json

import fake_torchneuronx
from conftest import core
from shells import run

from neuron_lab import backend
from neuron_lab.session.tensors import TensorRow, TensorTable, device_tensors
from neuron_lab.units import format_size


def scan(sh) -> TensorTable:
    table = device_tensors(sh)
    assert table.total == table.allocated == backend.active().memory_allocated()
    return table


def row_named(table: TensorTable, name: str) -> TensorRow:
    (row,) = [r for r in table.rows if name in r.names]
    return row


def ptr_of(sh, expr: str) -> int:
    return eval(expr, sh.user_ns).untyped_storage().data_ptr()


# -- names ----------------------------------------------------------------------------------------
def test_parameters_grads_buffers_and_adam_state_have_dotted_names(shell):
    run(shell, "import torch\n"
               "model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).to('neuron')\n"
               "opt = torch.optim.Adam(model.parameters())\n"
               "model(torch.randn(5, 4, device='neuron')).sum().backward()\n"
               "opt.step()")
    t = scan(shell)
    mine = {r.names: r for r in t.rows if any(n.startswith(("model", "opt")) for n in r.names)}
    expected = {("model.0.weight",): ([3, 4], True), ("model.0.bias",): ([3], True),
                ("model.1.weight",): ([3], True), ("model.1.bias",): ([3], True),
                ("model.1.running_mean",): ([3], False), ("model.1.running_var",): ([3], False)}
    for p in ("model.0.weight", "model.0.bias", "model.1.weight", "model.1.bias"):
        shape = expected[(p,)][0]
        expected[(f"{p}.grad",)] = (shape, False)
        expected[(f"opt.state[{p}].exp_avg",)] = (shape, False)
        expected[(f"opt.state[{p}].exp_avg_sq",)] = (shape, False)
    assert set(mine) == set(expected) | {("model.1.num_batches_tracked",)}
    for names, (shape, grad) in expected.items():
        r = mine[names]
        assert (list(r.shape), r.dtype, r.bytes, r.requires_grad, r.held_by) == \
               (shape, "float32", 4 * (12 if shape == [3, 4] else 3), grad, "namespace")
    steps = mine[("model.1.num_batches_tracked",)]
    assert (steps.shape, steps.dtype, steps.bytes) == ((), "int64", 8)
    # Adam keeps ``step`` on the CPU (not capturable): it is no device storage
    assert not [n for r in t.rows for n in r.names if n.endswith(".step")]


def test_parameters_only_an_optimizer_holds_are_named_by_param_group(shell):
    run(shell, "import torch\n"
               "opt = torch.optim.Adam([torch.ones(2, device='neuron'),\n"
               "                        torch.zeros(5, device='neuron', requires_grad=True)])\n"
               "opt.param_groups[0]['params'][1].grad = torch.ones(5, device='neuron')\n"
               "opt.step()")
    t = scan(shell)
    p = "opt.param_groups[0].params[1]"
    assert row_named(t, p).names == (p,)
    assert (row_named(t, p).bytes, row_named(t, p).requires_grad) == (20, True)
    assert row_named(t, f"{p}.grad").names == (f"{p}.grad",)
    assert row_named(t, f"opt.state[{p}].exp_avg").bytes == 20
    assert row_named(t, f"opt.state[{p}].exp_avg_sq").held_by == "namespace"
    assert row_named(t, "opt.param_groups[0].params[0]").bytes == 8


def test_views_and_containers_merge_into_one_row_per_storage(shell):
    run(shell, "import torch\n"
               "x = torch.zeros(4, 8, device='neuron')\n"
               "v = x[1]\n"
               "xs = [v, (x.t(),)]\n"
               "d = {'k': x, 3: torch.ones(2, device='neuron', dtype=torch.float16)}\n"
               "deep = [[[[torch.ones(3, device='neuron')]]]]")  # deeper than devices.MAX_DEPTH
    t = scan(shell)
    r = row_named(t, "x")
    assert set(r.names) == {"x", "v", "xs[0]", "xs[1][0]", "d['k']"}
    assert (r.shape, r.dtype, r.bytes, r.held_by, r.ptr) == ((4, 8), "float32", 128, "namespace", ptr_of(shell, "x"))
    assert (row_named(t, "d[3]").dtype, row_named(t, "d[3]").bytes) == ("float16", 4)
    (lost,) = [r for r in t.rows if r.ptr == ptr_of(shell, "deep[0][0][0][0]")]
    assert (lost.names, lost.held_by, lost.bytes, lost.shape, lost.dtype, lost.requires_grad) == \
           ((), "unknown", 12, (3,), "float32", None)


# -- who holds it ---------------------------------------------------------------------------------
def test_a_tensor_only_the_output_cache_holds(shell):
    run(shell, "import torch\nz = torch.ones(6, device='neuron')")
    res, _ = run(shell, "z")
    n = res.execution_count
    assert row_named(scan(shell), "z").names == ("z", f"Out[{n}]", "_", f"_{n}")
    assert row_named(scan(shell), "z").held_by == "namespace"
    run(shell, "del z")
    r = row_named(scan(shell), f"Out[{n}]")
    assert (r.names, r.held_by, r.bytes, r.shape) == ((f"Out[{n}]", "_", f"_{n}"), "IPython output cache", 24, (6,))


def test_a_tensor_only_an_autograd_graph_holds(shell):
    run(shell, "import torch\n"
               "a = torch.randn(6, device='neuron', requires_grad=True)\n"
               "w = torch.randn(6, device='neuron', requires_grad=True)\n"
               "y = (a * w).sum()\n"
               "a_ptr, w_ptr = a.untyped_storage().data_ptr(), w.untyped_storage().data_ptr()\n"
               "del a, w")
    t = scan(shell)
    rows = {r.ptr: r for r in t.rows}
    a, w = rows[shell.user_ns["a_ptr"]], rows[shell.user_ns["w_ptr"]]
    assert (a.held_by, a.bytes, a.shape, a.requires_grad) == ("autograd graph", 24, (6,), True)
    assert a.names == ("y.grad_fn…MulBackward0._saved_self", "y.grad_fn…AccumulateGrad.variable")
    assert w.names == ("y.grad_fn…MulBackward0._saved_other", "y.grad_fn…AccumulateGrad.variable")
    assert w.held_by == "autograd graph"
    assert (row_named(t, "y").held_by, row_named(t, "y").bytes) == ("namespace", 4)
    # backward frees the saved tensors; the leaves stay, held by the graph's AccumulateGrad nodes
    run(shell, "y.backward()")
    t = scan(shell)
    rows = {r.ptr: r for r in t.rows}
    assert rows[shell.user_ns["a_ptr"]].names == ("y.grad_fn…AccumulateGrad.variable",)
    grads = [r for r in t.rows if r.names == ("y.grad_fn…AccumulateGrad.variable.grad",)]
    assert [(r.held_by, r.bytes) for r in grads] == [("autograd graph", 24)] * 2


def test_a_graph_held_tensor_also_in_the_namespace_is_named_only_by_the_namespace(shell):
    run(shell, "import torch\n"
               "x = torch.randn(3, device='neuron', requires_grad=True)\n"
               "loss = (x * x).sum()")
    r = row_named(scan(shell), "x")
    assert (r.names, r.held_by) == (("x",), "namespace")


def test_a_local_of_the_last_traceback(shell):
    run(shell, "import torch\n"
               "def step():\n"
               "    big = torch.zeros(7, device='neuron')\n"
               "    raise ValueError('boom')\n"
               "step()", ok=False)
    n = shell.execution_count - 1
    r = row_named(scan(shell), f"big in step at In[{n}] line 4")  # the local, its function, the line it stopped at
    assert (r.names, r.held_by, r.bytes, r.shape) == ((f"big in step at In[{n}] line 4",), "IPython traceback", 28,
                                                      (7,))
    ptr = r.ptr
    run(shell, "%neuron free")
    assert ptr not in {r.ptr for r in scan(shell).rows}


def test_an_op_that_raises_on_the_device_shows_and_holds_like_a_native_kernel(shell):
    import re

    res, cap = run(shell, "import torch\n"
                          "def evaluate():\n"
                          "    a = torch.ones(2, 3).to('neuron')\n"
                          "    return a @ a\n"
                          "evaluate()", ok=False)
    tb = re.sub(r"\x1b\[[0-9;]*m", "", cap.stdout)
    # The compiled core has no Python frames to hide; the pure-Python core's dispatch frames are hidden.
    assert "----> 4     return a @ a" in tb and ("skipping hidden 3 frame" in tb or core() == "compiled")
    assert "emulator/ops.py" not in tb
    rows = scan(shell).rows
    n = shell.execution_count - 1
    assert [r.names for r in rows if r.held_by == "IPython traceback"] == [(f"a in evaluate at In[{n}] line 4",)]


def test_what_the_scan_cannot_name_is_unknown_and_the_total_is_memory_allocated(shell):
    run(shell, "import torch\n"
               "class Box:\n"
               "    pass\n"
               "box = Box()\n"
               "box.t = torch.zeros(10, 3, device='neuron', dtype=torch.bfloat16)")
    t = scan(shell)
    (r,) = [r for r in t.rows if r.ptr == ptr_of(shell, "box.t")]
    assert (r.names, r.held_by, r.bytes, r.shape, r.dtype, r.requires_grad) == \
           ((), "unknown", 60, (10, 3), "bfloat16", None)


# -- guarantees -----------------------------------------------------------------------------------
def test_a_scan_keeps_nothing_alive_runs_no_device_op_and_leaves_the_namespace(shell):
    run(shell, "import torch, weakref\n"
               "x = torch.zeros(1000, device='neuron', requires_grad=True)\n"
               "y = (x * 2).sum()\n"
               "ref = weakref.ref(x)")
    run(shell, "x[:3]")
    b = backend.active()
    ns, hidden = shell.user_ns, shell.user_ns_hidden
    before = ({k: id(v) for k, v in ns.items()}, {k: id(v) for k, v in hidden.items()},
              {k: id(v) for k, v in shell.history_manager.output_hist.items()}, b.op_calls(), b.memory_allocated())
    for _ in range(2):
        table = device_tensors(shell)
    assert before == ({k: id(v) for k, v in ns.items()}, {k: id(v) for k, v in hidden.items()},
                      {k: id(v) for k, v in shell.history_manager.output_hist.items()}, b.op_calls(),
                      b.memory_allocated())
    assert row_named(table, "x").bytes == 4000
    run(shell, "%neuron free\ndel x, y")
    gc.collect()
    assert shell.user_ns["ref"]() is None
    assert b.memory_allocated() == before[-1] - 4000 - 4  # x and the sum (x * 2 was never kept)
    assert not [r for r in device_tensors(shell).rows if "x" in r.names]


def test_rows_are_sorted_by_bytes_and_render_as_text_html_and_json(shell):
    run(shell, "import torch\n"
               "small = torch.ones(2, device='neuron')\n"
               "d = {'big': torch.ones(64, device='neuron')}")
    t = scan(shell)
    assert [r.bytes for r in t.rows] == sorted((r.bytes for r in t.rows), reverse=True)
    text = str(t)
    assert text.splitlines()[0] == (f"{len(t.rows)} neuron storages: {format_size(t.total)} "
                                    f"(memory_allocated {format_size(t.allocated)})")
    assert "bytes  held by" in text.splitlines()[1]
    line = next(ln for ln in text.splitlines() if ln.endswith("d['big']"))
    assert line.split() == ["256", "B", "namespace", "float32", "[64]", "d['big']"]
    html = t._repr_html_()
    assert html.count("<tr>") == len(t.rows) + 1 and "d[&#x27;big&#x27;]" in html
    d = json.loads(json.dumps(t.as_dict()))
    assert (d["total"], d["allocated"], d["device_type"]) == (t.total, t.allocated, "neuron")
    assert {"names": ["small"], "shape": [2], "dtype": "float32", "bytes": 8, "requires_grad": False,
            "held_by": "namespace", "ptr": ptr_of(shell, "small")} in d["rows"]


PROGRAM = """
import json
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from neuron_lab.session.tensors import device_tensors
sh = InteractiveShell()
with capture_output():
    sh.run_line_magic("load_ext", "neuron_lab")
    sh.run_cell("import torch\\nx = torch.ones(8, 2, device='neuron')\\n"
                "deep = [[[[torch.ones(5, device='neuron')]]]]", store_history=True)
print(json.dumps(device_tensors(sh).as_dict()))
"""


def test_over_torchneuron_what_nobody_can_list_is_one_remainder_row():
    out = fake_torchneuronx.run(PROGRAM, site=fake_torchneuronx.SITE, timeout=180).json()
    assert (out["total"], out["allocated"]) == (84, 84)
    assert out["rows"] == [
        {"names": ["x"], "shape": [8, 2], "dtype": "float32", "bytes": 64, "requires_grad": False,
         "held_by": "namespace", "ptr": out["rows"][0]["ptr"]},
        {"names": [], "shape": None, "dtype": None, "bytes": 20, "requires_grad": None, "held_by": "unknown",
         "ptr": None}]
