"""The IPython extension in a real in-process InteractiveShell: loading, every `%neuron` subcommand and
bad input, `%%neuron` cells, the per-cell report's exact contents, leaks, re-entrancy and unload."""

from __future__ import annotations

import collections
import gc
import json
import weakref

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from shells import in_child_shell, run
from traitlets.config import Config

import neuron_lab
from neuron_lab import modes
from neuron_lab.extension import session_of
from neuron_lab.session.devices import default_device
from neuron_lab.session.free import FreeReport


def usage_error(sh, line: str) -> str:
    """Run a line magic that must be refused; return the message IPython printed."""
    res, cap = run(sh, line, ok=False)
    assert not res.success
    from IPython.core.error import UsageError

    err = res.error_in_exec
    assert isinstance(err, UsageError), f"{type(err).__name__}: {err}"
    return str(err)


def state(sh):
    s = session_of(sh)
    return (s.device, s.mode, s.compile_options, sh.user_ns.get("device"), torch.get_default_device(),
            modes.patched())


def last_report(sh):
    return next(reversed(session_of(sh).history.values()))


# -- loading --------------------------------------------------------------------------------------
def test_load_prints_one_line_and_loading_twice_is_harmless():
    c = Config()
    c.HistoryAccessor.enabled = False
    sh = InteractiveShell(config=c)
    try:
        with capture_output() as cap:
            sh.run_line_magic("load_ext", "neuron_lab")
        lines = cap.stdout.strip().splitlines()
        assert len(lines) == 1
        assert lines[0].startswith(
            "neuron_lab 0.1.0: emulator backend, coverage torchneuron-combined · device neuron:0")
        assert "GiB" in lines[0] and lines[0].endswith("mode default · compiled core")
        with capture_output() as cap:
            sh.run_line_magic("load_ext", "neuron_lab")
            neuron_lab.load_ipython_extension(sh)  # a direct second call, too
        assert "neuron_lab 0.1.0" not in cap.stdout
        assert sum(getattr(f, "__self__", None) is session_of(sh) for f in sh.events.callbacks["post_run_cell"]) == 1
        assert sh.user_ns["device"] == torch.device("neuron", 0)
    finally:
        with capture_output():
            sh.run_line_magic("unload_ext", "neuron_lab")
        InteractiveShell.clear_instance()


def test_listed_in_the_shell_config_it_loads_at_startup(tmp_path):
    import subprocess
    import sys

    profile = tmp_path / "profile_default"
    profile.mkdir()
    (profile / "ipython_config.py").write_text("c.InteractiveShellApp.extensions = ['neuron_lab']\n")
    proc = subprocess.run([sys.executable, "-m", "IPython", f"--ipython-dir={tmp_path}",
                           "--HistoryManager.enabled=False", "-c", "%neuron status"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("neuron_lab 0.1.0: emulator backend")
    assert "mode:    default" in proc.stdout


def test_unload_undoes_everything_and_loading_again_works(shell):
    run(shell, "%neuron mode compile")
    run(shell, "%neuron device cpu --default")
    before = {k: list(v) for k, v in shell.events.callbacks.items()}
    session = session_of(shell)
    assert session.pre_run_cell in before["pre_run_cell"]
    run(shell, "%unload_ext neuron_lab")
    assert session_of(shell) is None
    assert all(getattr(f, "__self__", None) is not session for v in shell.events.callbacks.values() for f in v)
    assert torch.nn.Module.__call__ is torch.nn.Module._wrapped_call_impl
    assert not modes.patched()
    assert torch.get_default_device() == torch.device("cpu")
    assert "neuron" not in shell.magics_manager.magics["line"]
    assert "neuron" not in shell.magics_manager.magics["cell"]
    assert not any(type(c).__name__ in ("NeuronLab", "NeuronMagics") for c in shell.configurables)
    from torch._dynamo.callback import callback_handler

    assert not callback_handler.start_callbacks and not callback_handler.end_callbacks
    res, _ = run(shell, "%neuron status", ok=False)
    assert "not found" in str(res.error_in_exec)
    _, cap = run(shell, "%load_ext neuron_lab")
    assert "neuron_lab 0.1.0" in cap.stdout
    _, cap = run(shell, "import torch\ny = torch.atan2(torch.ones(2, device='neuron'), torch.ones(2, device='neuron'))")
    assert "aten::atan2.out" in cap.stdout


def test_unload_from_inside_a_compile_mode_cell_restores_module_call(shell):
    run(shell, "%neuron mode compile")
    run(shell, "%unload_ext neuron_lab")
    assert torch.nn.Module.__call__ is torch.nn.Module._wrapped_call_impl
    run(shell, "%load_ext neuron_lab")


def test_mode_alone_shows_the_mode_and_changes_nothing(shell):
    """Walkthrough 47 point 10: `%neuron mode` alone was a UsageError; `%neuron device` alone shows the device."""
    assert run(shell, "%neuron mode")[1].stdout == "mode for the cells that follow: default\n"
    run(shell, "%neuron mode compile --fullgraph")
    before = state(shell)
    shown = run(shell, "%neuron mode")[1].stdout
    assert shown == "mode for the cells that follow: compile (backend=neuron, fullgraph)\n"
    assert state(shell) == before
    assert f"mode:    {shown.split(': ', 1)[1]}" in run(shell, "%neuron status")[1].stdout  # the words status uses
    run(shell, "%neuron mode default")


# -- %neuron: parsing and bad input ----------------------------------------------------------------
@pytest.mark.parametrize("line, message", [
    ("%neuron frobnicate", "invalid choice: 'frobnicate'"),
    ("%neuron status --verbose", "%neuron status: unrecognized arguments: --verbose\nusage: %neuron status"),
    ("%neuron free now", "%neuron free: unrecognized arguments: now\nusage: %neuron free"),
    ("%neuron device tpu:0", "'tpu:0' is not a device string"),
    ("%neuron device cuda", "cuda is not available on this machine"),
    ("%neuron device neuron:9", "neuron:9 does not exist: this machine has 4 neuron devices"),
    ("%neuron device neuron --move no_such_name", "no variable named no_such_name; nothing was moved"),
    ("%neuron device --all", "--move and --all need a DEVICE"),
    ("%neuron mode turbo", "invalid choice: 'turbo'"),
    ("%neuron mode eager --fullgraph", "--fullgraph, --backend and --dynamic go with `compile`"),
    ("%neuron mode --fullgraph", "--fullgraph, --backend and --dynamic go with `compile`: `%neuron mode compile"),
    ("%neuron mode compile --backend nonesuch", "unknown torch.compile backend 'nonesuch'"),
    ("%neuron mode compile --dynamic", "%neuron mode: torch.compile(backend='neuron') rejects dynamic=True"),
    ("%neuron report 999", "no report for cell 999"),
    ("%neuron report seven", "CELL must be a cell number or `all`"),
    ("%neuron compile", "is a cell magic"),
])
def test_bad_input_is_a_usage_error_that_changes_nothing(shell, line, message):
    before = state(shell)
    msg = usage_error(shell, line)
    assert message in msg
    assert "usage:" in msg or "cell magic" in msg or "no report" in msg
    assert state(shell) == before


def test_bad_cell_magic_forms_are_usage_errors_and_the_body_does_not_run(shell):
    for first in ("%%neuron status", "%%neuron", "%%neuron device", "%%neuron device cpu --move x",
                  "%%neuron compile --bogus", "%%neuron device nowhere", "%%neuron compile --dynamic"):
        before = state(shell)
        res, _ = run(shell, f"{first}\nran = True", ok=False)
        assert not res.success, first
        assert "ran" not in shell.user_ns, first
        assert state(shell) == before


@pytest.mark.parametrize("first, message", [
    ("%%neuron compile --bogus", "%%neuron compile: unrecognized arguments: --bogus"),
    ("%%neuron --bogus", "%%neuron: unrecognized arguments: --bogus"),
])
def test_a_cell_forms_parse_errors_name_the_cell_form(shell, first, message):
    """A cell's first line is named as written, `%%neuron ...`, in every parse error (the line form's prefix was
    built apart in two places)."""
    from IPython.core.error import UsageError

    res, _ = run(shell, f"{first}\nran = True", ok=False)
    assert isinstance(res.error_in_exec, UsageError) and str(res.error_in_exec).startswith(message), res.error_in_exec
    assert "ran" not in shell.user_ns


def test_a_bad_config_value_is_dropped_with_a_message_and_the_extension_still_loads(shell):
    run(shell, "%config NeuronLab.report_detail = 'bogus'", ok=False)
    run(shell, "%unload_ext neuron_lab")
    _, cap = run(shell, "%load_ext neuron_lab")
    assert "neuron_lab: NeuronLab.report_detail = 'bogus' ignored: The 'report_detail' trait" in cap.stdout
    assert session_of(shell) is not None and session_of(shell).config.report_detail == "table"
    assert shell.find_line_magic("neuron") is not None


def test_help_lists_every_subcommand(shell):
    doc = shell.find_line_magic("neuron").__doc__
    for sub in ("status", "device", "mode", "report", "reset", "free", "compile", "eager"):
        assert f"--- {sub} ---" in doc
    assert "--move NAME" in doc and "--fullgraph" in doc


def test_help_leads_with_five_examples_each_a_working_command(shell):
    """`%neuron?` starts with the common tasks, one line each, before the reference; every example line is a
    command the real parser accepts, and each one runs in the shell."""
    from neuron_lab.magics import parser

    shown = shell.object_inspect_text("%neuron")
    doc = shown[shown.index("Docstring:"):]
    head, _, rest = doc.partition("Examples:\n")
    block, _, reference = rest.partition("\n\nCommands:\n")
    assert len(head) < 400 and "--- status ---" in reference  # the examples come first, the reference after
    lines = block.splitlines()
    assert [line.split("#")[0].strip() for line in lines] == [
        "%neuron device neuron", "%%neuron compile", "%neuron report --full", "%%neuron parity --against cpu",
        "%neuron dashboard"]
    assert all(len(line) <= 110 and "  # " in line for line in lines)
    run(shell, "import torch")
    body = "x = torch.ones(4).to(device)\ny = (x * 2).sum()"
    for line in lines:
        command = line.split("#")[0].strip()
        cell = command.startswith("%%")
        args = parser.parse(parser.build(), command.lstrip("%").removeprefix("neuron").strip(), cell=cell)
        assert args.command == command.split()[1]
        run(shell, f"{command}\n{body}" if cell else command)
    assert len(doc) < 11300  # every option's one line (ranks' engines, hosts, sbatch and ssh options: past 10000)


def test_a_moving_line_with_a_non_movable_name_is_refused(shell):
    run(shell, "import torch\nt = torch.ones(4, device='neuron')\ns = 'text'")
    msg = usage_error(shell, "%neuron device cpu --move t s")
    assert "cannot move s (str)" in msg
    assert shell.user_ns["t"].device.type == "neuron"  # nothing moved


# -- status, device, moves ---------------------------------------------------------------------------
def test_status_shows_backend_device_mode_memory_and_totals(shell):
    run(shell, "import torch\nx = torch.ones(256, device='neuron')\ny = torch.atan2(x, x)")
    run(shell, "v = torch.ones(8, device='neuron', dtype=torch.float64).topk(2)")  # float64 topk: gated, possible
    res, _ = run(shell, "%neuron status")
    text = str(res.result)
    assert "backend: emulator" in text
    assert "device:  neuron:0 (variable `device`)" in text
    assert "mode:    default" in text
    assert "capacity 24.00 GiB" in text and "allocated" in text
    assert "1 CPU fallback call, 1 possible fallback call," in text  # the session counts the two apart
    # the backend says it, as data: the magic does not branch; 64-bit computes as on Trainium by default
    assert ("differs: synchronous execution (on Trainium an error or a slow op shows at a later sync), no Adaptive "
            "Eager fusion\n") in text


def test_device_switch_sets_the_variable_and_default_device(shell):
    run(shell, "%neuron device cpu")
    assert shell.user_ns["device"] == torch.device("cpu") and session_of(shell).device == torch.device("cpu")
    assert torch.get_default_device() == torch.device("cpu")
    _, cap = run(shell, "%neuron device neuron --default")
    assert shell.user_ns["device"] == torch.device("neuron", 0)
    assert torch.get_default_device() == torch.device("neuron", 0)
    assert "also torch's default device" in cap.stdout
    run(shell, "%unload_ext neuron_lab")  # gives back torch's default exactly: none set, no device mode on the stack
    assert torch.get_default_device() == torch.device("cpu") and default_device() is None
    assert not torch.overrides._get_current_function_mode_stack()
    run(shell, "%load_ext neuron_lab")
    run(shell, "%neuron device neuron --default")
    run(shell, "%config NeuronLab.device_variable = 'dev'")
    assert shell.user_ns["dev"] == torch.device("neuron", 0)  # the new name holds the device at once
    run(shell, "%neuron device cpu")
    assert shell.user_ns["dev"] == torch.device("cpu")
    assert shell.user_ns["device"] == torch.device("neuron", 0)  # the old name is the user's variable now


def test_move_models_optimizers_tensors_and_containers_with_bytes(shell):
    run(shell, """
import torch
model = torch.nn.Linear(8, 4)
w = model.weight
opt = torch.optim.Adam(model.parameters())
model(torch.ones(2, 8)).sum().backward(); opt.step()
batch = [torch.ones(16), {"y": torch.zeros(4)}]
lonely = torch.ones(10)
""")
    _, cap = run(shell, "%neuron device neuron --move model opt batch batch")
    ns = shell.user_ns
    assert ns["model"].weight.device.type == "neuron"
    assert ns["w"] is ns["model"].weight  # parameters keep their identity
    st = ns["opt"].state[ns["model"].weight]
    assert st["exp_avg"].device.type == "neuron" and st["exp_avg_sq"].device.type == "neuron"
    assert st["step"].device.type == "cpu"  # as PyTorch keeps it for non-capturable Adam
    assert ns["batch"][0].device.type == "neuron" and ns["batch"][1]["y"].device.type == "neuron"
    out = cap.stdout
    assert "moved to neuron:0 (512 B)" in out  # 144 (model) + 288 (Adam moments) + 80 (batch)
    assert "model" in out and "Linear" in out and "144 B" in out
    assert "opt" in out and "288 B" in out and "80 B" in out
    assert "lonely" in out and "40 B" in out and "not moved" in out
    run(shell, "opt.step()")  # the optimizer still works on the device


def test_move_all_moves_everything_movable(shell):
    run(shell, "import torch\nm = torch.nn.Linear(2, 2)\nt = torch.ones(3, requires_grad=True)\nname = 'x'")
    _, cap = run(shell, "%neuron device neuron --all")
    assert shell.user_ns["m"].weight.device.type == "neuron"
    t = shell.user_ns["t"]
    assert t.device.type == "neuron" and t.is_leaf and t.requires_grad
    assert shell.user_ns["name"] == "x"
    assert "still elsewhere" not in cap.stdout
    run(shell, "opt = torch.optim.SGD(m.parameters(), lr=0.1)")
    _, cap = run(shell, "%neuron device neuron --all")  # again: nothing is listed as moved from where it is
    assert cap.stdout.splitlines()[1:] == ["nothing moved to neuron:0", "already on neuron:0: m, opt, t"]


def test_what_a_move_leaves_behind_is_freed_at_once(run_python):
    """Walkthrough 48: after `%neuron device cpu --all` the device copies stayed allocated until a garbage
    collection (the move's undo list held them in a cycle); a move frees what it replaced by reference counting."""
    out = run_python(in_child_shell("""
        import gc, json, torch
        gc.disable()
        with capture_output():
            sh.run_line_magic("load_ext", "neuron_lab")
            sh.run_cell("import torch\\nbig = torch.ones(1 << 18)\\nm = torch.nn.Linear(64, 64)", store_history=True)
            sh.run_cell("%neuron device neuron --all", store_history=True)
            on_device = torch.neuron.memory_allocated()
            sh.run_cell("%neuron device cpu --all", store_history=True)
        print(json.dumps({"on_device": on_device, "after": torch.neuron.memory_allocated(),
                          "where": [str(sh.user_ns["big"].device), str(sh.user_ns["m"].weight.device)]}))
    """), {})
    assert out["on_device"] >= 1 << 20 and out["where"] == ["cpu", "cpu"]
    assert out["after"] == 0


def test_a_move_that_runs_out_of_memory_puts_everything_back(run_python):
    out = run_python(in_child_shell("""
        import json, torch
        with capture_output():
            sh.run_line_magic("load_ext", "neuron_lab")
            sh.run_cell("import torch\\nsmall = torch.nn.Linear(4, 4)\\nbig = torch.ones(1 << 20)", store_history=True)
            res = sh.run_cell("%neuron device neuron --move small big", store_history=True)
        ns = sh.user_ns
        print(json.dumps({"error": str(res.error_in_exec), "small": str(ns["small"].weight.device),
                          "big": str(ns["big"].device), "device": str(ns["device"]),
                          "allocated": torch.neuron.memory_allocated()}))
    """), {"NEURON_LAB_DEVICE_MEMORY": "1MiB"})
    assert "moving to neuron:0 failed, and everything was put back where it was" in out["error"]
    assert "OutOfMemoryError" in out["error"]
    assert out["small"] == "cpu" and out["big"] == "cpu"
    assert out["allocated"] == 0


def test_a_failed_move_frees_its_partial_copies_at_once(run_python):
    """The copies made before the move ran out of memory are freed when it fails, not when the next exception
    replaces this one in IPython's last-traceback slots (no gc.collect() here: the user does not call it either)."""
    out = run_python(in_child_shell("""
        import json, torch
        with capture_output():
            sh.run_line_magic("load_ext", "neuron_lab")
            sh.run_cell("import torch\\nkept = torch.ones(1024, device='neuron')\\nm = torch.nn.Linear(512, 512)\\n"
                        "a = torch.ones(1 << 20)\\nb = torch.ones(1 << 20)\\nc = torch.ones(1 << 20)",
                        store_history=True)
            before = torch.neuron.memory_allocated()
            res = sh.run_cell("%neuron device neuron --move m a b c", store_history=True)
        ns = sh.user_ns
        print(json.dumps({"error": str(res.error_in_exec), "type": type(res.error_in_exec).__name__,
                          "where": [str(ns[n].device) for n in "abc"] + [str(ns["m"].weight.device)],
                          "before": before, "after": torch.neuron.memory_allocated()}))
    """), {"NEURON_LAB_DEVICE_MEMORY": "10MiB"})
    assert out["type"] == "UsageError"
    assert out["error"].startswith("%neuron device: moving to neuron:0 failed, and everything was put back where it "
                                   "was: OutOfMemoryError: neuron:0 out of memory")
    assert "\n" not in out["error"] and out["where"] == ["cpu"] * 4
    assert out["before"] == 4096 and out["after"] == out["before"]  # m (1 MiB), a and b (4 MiB each) freed


def test_move_keeps_a_dicts_own_type_defaultdict_included(shell):
    run(shell, """
import collections, torch
d = collections.defaultdict(list)
d["a"] = torch.ones(2)
od = collections.OrderedDict(b=torch.ones(3), a=torch.zeros(1))
""")
    _, cap = run(shell, "%neuron device neuron --move d od")
    d, od = shell.user_ns["d"], shell.user_ns["od"]
    assert type(d) is collections.defaultdict and d.default_factory is list and d["a"].device.type == "neuron"
    assert type(od) is collections.OrderedDict and list(od) == ["b", "a"]
    assert {t.device.type for t in od.values()} == {"neuron"}
    assert "d                    defaultdict" in cap.stdout
    run(shell, "%neuron device cpu --move d")
    assert type(shell.user_ns["d"]) is collections.defaultdict and shell.user_ns["d"]["a"].device.type == "cpu"


def test_a_dict_that_cannot_be_rebuilt_is_a_usage_error_and_nothing_moves(shell):
    run(shell, """
import torch
class Strict(dict):
    def __init__(self, owner, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.owner = owner
    def __reduce_ex__(self, protocol):
        raise TypeError("Strict cannot be copied")
t = torch.ones(3)
s = Strict("me", w=torch.ones(2))
""")
    s, t = shell.user_ns["s"], shell.user_ns["t"]
    msg = usage_error(shell, "%neuron device neuron --move t s")
    assert msg == ("%neuron device: moving to neuron:0 failed, and everything was put back where it was: TypeError: "
                   "Strict.__init__() missing 1 required positional argument: 'owner'")
    assert shell.user_ns["s"] is s and s["w"].device.type == "cpu" and shell.user_ns["t"] is t
    assert session_of(shell).device == torch.device("neuron", 0)


# -- modes ----------------------------------------------------------------------------------------------
MODEL = """import torch
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
    def forward(self, x):
        y = self.lin(x)
        if y.sum() > 0:
            y = y * 2
        return y.relu()
net = Net().to("neuron")
x = torch.ones(3, 4, device="neuron")
"""


def test_mode_compile_compiles_module_calls_and_eager_forces_compiled_functions_eager(shell):
    run(shell, MODEL)
    run(shell, "%neuron mode compile")
    run(shell, "out = net(x)")
    r = last_report(shell)
    assert r.mode == "compile"
    assert r.compiles.frames >= 1 and r.compiles.graphs >= 1
    assert len(r.compiles.breaks) == 1
    run(shell, "out = net(x)")
    assert last_report(shell).compiles.frames == 0  # cached: no recompile
    run(shell, "%neuron mode eager")
    run(shell, "f = torch.compile(lambda t: t.sin() + 1, backend='neuron')\nz = f(x)")
    r = last_report(shell)
    assert r.mode == "eager" and r.compiles.frames == 0
    run(shell, "%neuron mode default")
    run(shell, "z = f(x)")
    assert last_report(shell).compiles.frames == 1
    assert not modes.patched()


def test_compile_cell_reports_graph_break_line_and_keeps_cell_semantics(shell):
    run(shell, MODEL)
    res, cap = run(shell, "%%neuron compile\nout = net(x)\nout.shape")
    assert res.result == torch.Size([3, 4])  # the last expression reaches Out[]
    assert shell.user_ns["Out"][res.execution_count] == torch.Size([3, 4])
    assert "out" in shell.user_ns  # assignments land in the namespace
    r = last_report(shell)
    assert r.mode == "compile" and r.cell == res.execution_count
    (brk,) = r.compiles.breaks
    model_cell = res.execution_count - 1
    assert (brk.site.cell, brk.site.line, brk.site.source) == (model_cell, 8, "if y.sum() > 0:")
    assert brk.reason.startswith("Python `if`/`while` on a tensor's value")
    assert brk.note == "generic_jump TensorVariable()"
    assert r.compiles.compile_s > 0 and r.run_s >= 0 and r.compiles.compile_s <= r.wall_s
    assert f"graph break at In[{model_cell}] line 8: if y.sum() > 0:" in cap.stdout
    run(shell, "%%neuron compile\nout = net(x)\nout.shape")
    assert last_report(shell).compiles.frames == 0  # re-running the cell does not recompile
    assert not modes.patched()


def test_compile_cell_reports_recompile_with_the_failed_guard(shell):
    run(shell, MODEL)
    run(shell, "%%neuron compile\nnet(x)")
    run(shell, "%%neuron compile\nnet(torch.ones(5, 4, device='neuron'))")
    rc = last_report(shell).compiles.recompiles
    assert rc and "size mismatch" in rc[0].reason
    # the outermost module call is the compiled frame, named after its class, at the line that called it
    assert rc[0].code == "Net.__call__" and rc[0].site.source == "net(torch.ones(5, 4, device='neuron'))"


def test_compile_cell_compiles_the_outermost_module_call_of_a_torch_nn_container(shell):
    run(shell, "import torch\nseq = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))"
               ".to('neuron')\nxs = torch.ones(3, 4).to('neuron')")
    run(shell, "%%neuron compile\nseq(xs)")
    c = last_report(shell).compiles
    assert (c.frames, c.graphs, c.breaks, c.recompiles) == (1, 1, [], [])  # one graph, not one per layer
    run(shell, "%%neuron compile\nseq(xs)")
    assert not last_report(shell).compiles  # cached


def test_a_compiled_training_step_is_one_frame_compile_whose_backward_time_counts(shell):
    run(shell, "import torch\nm = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))"
               ".to('neuron')\nxs = torch.ones(16, 4).to('neuron')\nopt = torch.optim.SGD(m.parameters(), lr=0.1)")
    run(shell, "%%neuron compile\nfor _ in range(3):\n    opt.zero_grad()\n    loss = m(xs).pow(2).mean()\n"
               "    loss.backward()\n    opt.step()")
    c = last_report(shell).compiles
    # dynamo compiled one frame; aot_autograd's lazily compiled backward is that frame's compile time
    assert (c.frames, c.graphs, c.breaks, c.recompiles, c.failures) == (1, 1, [], [], []) and c.compile_s > 0


def test_each_cell_has_its_own_peak_and_the_users_peak_counter_is_left_alone(shell):
    # the process's peak starts here: earlier tests in this process (the widgets') may have gone higher
    run(shell, "import torch\ntorch.neuron.reset_peak_memory_stats()\nbase = torch.neuron.memory_allocated()")
    run(shell, "big = torch.ones(1024, 1024).to('neuron')\ndel big")  # 4 MiB, freed within the cell
    assert last_report(shell).memory.peak - shell.user_ns["base"] == 4 * 2**20
    run(shell, "small = torch.ones(256).to('neuron')")
    r = last_report(shell)
    assert r.memory.peak == r.memory.after  # this cell's own peak, not the previous cell's
    res, _ = run(shell, "torch.neuron.max_memory_allocated() - base")
    assert res.result == 4 * 2**20  # what the user reads is the session's peak, as without the extension


def test_clearing_the_op_tracking_mid_cell_keeps_the_cells_copies(shell):
    run(shell, "import torch, neuron_lab\nb = neuron_lab.backend.active()")
    run(shell, "a = torch.ones(256).to('neuron')\nb.clear_op_tracking()\nc = torch.ones(128).to('neuron')")
    r = last_report(shell)
    assert (r.h2d_bytes, r.d2h_bytes) == (1536, 0)  # both copies, the one before the clear too
    assert shell.user_ns["b"].transfer_bytes() == (512, 0)  # the user's own counter did clear


def test_cell_magic_tracebacks_point_at_the_cells_own_lines(shell):
    res, cap = run(shell, "%%neuron eager\na = 1\nb = 2\nc = 1 / 0\n", ok=False)
    err = res.error_in_exec
    assert isinstance(err, ZeroDivisionError)
    tb = err.__traceback__
    while tb.tb_next:
        tb = tb.tb_next
    assert tb.tb_lineno == 4
    assert shell.compile.format_code_name(tb.tb_frame.f_code.co_filename) == ("Cell", f"In[{res.execution_count}]")
    import re

    assert "----> 4 c = 1 / 0" in re.sub(r"\x1b\[[0-9;]*m", "", cap.stdout)
    assert shell.user_ns["b"] == 2


def test_cell_state_comes_back_after_exception_and_keyboard_interrupt(shell):
    run(shell, "import torch")
    for raiser in ("raise ValueError('boom')", "raise KeyboardInterrupt"):
        before = state(shell)
        res, _ = run(shell, "%%neuron compile --device cpu\ninside = (str(device), torch.nn.Module.__call__)\n"
                     + raiser, ok=False)
        assert shell.user_ns["inside"][0] == "cpu"
        assert shell.user_ns["inside"][1] is not torch.nn.Module._wrapped_call_impl
        assert state(shell) == before
        assert torch.nn.Module.__call__ is torch.nn.Module._wrapped_call_impl
        from torch._dynamo.eval_frame import _stance

        assert _stance.stance == "default"
    res, _ = run(shell, "%%neuron eager\nfrom torch._dynamo.eval_frame import _stance\ninside = _stance.stance\n"
                 "raise RuntimeError('x')", ok=False)
    from torch._dynamo.eval_frame import _stance

    assert shell.user_ns["inside"] == "force_eager" and _stance.stance == "default"


def test_an_eager_cell_loads_no_compiler_and_forces_a_compile_it_loads_eager(run_python):
    out = run_python(in_child_shell("""
        import json, sys
        with capture_output():
            sh.run_line_magic("load_ext", "neuron_lab")
            sh.run_cell("%%neuron eager\\nimport torch\\ny = torch.ones(2) * 2", store_history=True)
            plain = "torch._dynamo" in sys.modules
            res = sh.run_cell("%%neuron eager\\nseen = []\\ndef f(x):\\n    seen.append(torch.compiler.is_compiling())"
                              "\\n    return x * 2\\ny = torch.compile(f, backend='eager')(torch.ones(2))\\nseen",
                              store_history=True)
        from torch._dynamo.eval_frame import _stance
        print(json.dumps({"plain": plain, "compiling": res.result, "after": _stance.stance}))
    """), {})
    assert out == {"plain": False, "compiling": [False], "after": "default"}


def test_device_cell_runs_with_that_device_and_restores_it(shell):
    run(shell, "import torch")
    run(shell, "%%neuron device cpu\nseen = device\nt = torch.ones(2, device=device)\n"
               "u = torch.ones(2, device='neuron')")
    assert shell.user_ns["seen"] == torch.device("cpu") and shell.user_ns["t"].device.type == "cpu"
    assert shell.user_ns["device"] == torch.device("neuron", 0)
    assert last_report(shell).device == "cpu"


# -- the report --------------------------------------------------------------------------------------
def test_report_counts_fallbacks_exactly_with_their_cell_lines(shell):
    run(shell, "import torch\nx = torch.ones(64, 2, device='neuron')")
    res, cap = run(shell, "s = 0\nfor _ in range(3):\n    y = torch.atan2(x, x + 1)\nz = torch.atan2(x, x)\n"
                   "d = x.double().sum()")
    r = last_report(shell)
    n = res.execution_count
    assert r.title == f"In[{n}]" and r.cell == n
    (row,) = r.fallbacks
    assert (row.op, row.kind, row.count) == ("aten::atan2.out", "fallback", 4)
    assert r.ops == 9  # 3 adds, 4 atan2, the float64 copy and its sum
    assert row.shapes[0] == (64, 2) and row.dtypes[0] == "float32"
    assert [(sc.site.cell, sc.site.line, sc.site.source, sc.count) for sc in row.sites] == [
        (n, 3, "y = torch.atan2(x, x + 1)", 3), (n, 4, "z = torch.atan2(x, x)", 1)]
    assert row.unattributed == 0
    assert len(row.sites[0].stacks) == 1 and row.sites[0].stacks[0][-1].startswith(f"In[{n}] line 3")
    assert row.host_ns > 0 and "CPU_FALLBACK" in row.reason
    (down,) = r.downcasts
    assert down.op == "aten::sum" and down.sites[0].site.line == 5
    assert r.memory.after > r.memory.before and r.memory.peak >= r.memory.after
    assert r.memory.capacity == 24 * 2**30
    assert r.ops >= 6
    out = cap.stdout
    assert f"neuron_lab In[{n}] · neuron:0 · default" in out
    assert "4 CPU fallback calls (1 op)" in out
    assert f"at In[{n}] line 3: y = torch.atan2(x, x + 1)  (3×)" in out
    html = r._repr_html_()
    assert "aten::atan2.out" in html and f"In[{n}] line 3" in html and "<table" in html
    assert json.loads(json.dumps(r.as_dict()))["ops_not_native"][0]["count"] == 4


def test_backward_fallbacks_are_attributed_to_the_backward_line(shell):
    # linalg.solve's backward solves again with the LU factors: aten::linalg_lu_solve, a CPU fallback that
    # runs on autograd's device thread, where no cell frame is on the stack
    run(shell, "import torch\nA = (torch.eye(3) * 2).to('neuron').requires_grad_(True)\n"
               "b = torch.ones(3, 1, device='neuron')")
    res, _ = run(shell, "y = torch.linalg.solve(A, b).sum()\ny.backward()")
    rows = {row.op: row for row in last_report(shell).fallbacks}
    row = rows["aten::linalg_lu_solve.out"]
    assert row.count == 1 and row.unattributed == 0
    (sc,) = row.sites
    assert (sc.site.cell, sc.site.line, sc.site.source) == (res.execution_count, 2, "y.backward()")


def test_fallbacks_inside_functions_defined_in_cells_point_at_the_innermost_cell_line(shell):
    run(shell, "import torch\ndef angle(t):\n    return torch.atan2(t, t)")
    n_def = shell.execution_count - 1
    run(shell, "x = torch.ones(3, device='neuron')\nangle(x)")
    (row,) = last_report(shell).fallbacks
    (sc,) = row.sites
    assert (sc.site.cell, sc.site.line, sc.site.source) == (n_def, 3, "return torch.atan2(t, t)")
    (stack,) = sc.stacks
    assert stack[-2].startswith(f"In[{n_def + 1}] line 2 in <module>: angle(x)")


def test_call_sites_off_and_stack_limits_follow_the_config(shell):
    run(shell, "import torch\nx = torch.ones(4, device='neuron')")
    run(shell, "%config NeuronLab.callsites = False")
    _, cap = run(shell, "for _ in range(5):\n    y = torch.atan2(x, x)")
    (row,) = last_report(shell).fallbacks
    assert row.count == 5 and row.sites == [] and row.unattributed == 5
    assert "call sites are off" in cap.stdout
    run(shell, "%config NeuronLab.callsites = True")
    run(shell, "%config NeuronLab.callsite_stacks = 0")
    run(shell, "for _ in range(5):\n    y = torch.atan2(x, x)")
    (row,) = last_report(shell).fallbacks
    assert row.sites[0].count == 5 and row.sites[0].stacks == []


def test_auto_report_and_detail_follow_the_config(shell):
    run(shell, "import torch\nx = torch.ones(4, device='neuron')")
    run(shell, "%config NeuronLab.auto_report = False")
    _, cap = run(shell, "y = torch.atan2(x, x)")
    assert "neuron_lab In[" not in cap.stdout
    assert last_report(shell).fallback_calls == 1  # still kept for `%neuron report`
    run(shell, "%config NeuronLab.auto_report = True")
    run(shell, "%config NeuronLab.report_detail = 'summary'")
    _, cap = run(shell, "y = torch.atan2(x, x)")
    assert len(cap.stdout.strip().splitlines()) == 1 and "1 CPU fallback call " in cap.stdout
    config = session_of(shell).config
    run(shell, "%config NeuronLab.report_detail = 'loud'")  # %config logs the TraitError and keeps the value
    assert config.report_detail == "summary"
    run(shell, "%config NeuronLab.device_variable = 'not an identifier'")
    assert config.device_variable == "device"


def test_showing_a_value_or_a_traceback_is_not_counted_as_the_cells_work(shell):
    run(shell, "import torch\nx = torch.ones(1000, device='neuron')")
    run(shell, "y = x + 1\ny")  # the repr runs reductions and a copy to the host
    r = last_report(shell)
    assert r.ops == 1 and r.downcasts == [] and r.d2h_bytes == 0
    run(shell, "z = x * 2\nraise ValueError(z)", ok=False)
    r = last_report(shell)
    assert r.ops == 1 and r.downcasts == [] and r.error.startswith("ValueError")


def test_cells_that_do_not_touch_the_device_show_no_report(shell):
    _, cap = run(shell, "a = 1 + 1")
    assert "neuron_lab" not in cap.stdout


def test_report_history_subcommands(shell):
    run(shell, "import torch\nx = torch.ones(4, device='neuron')")
    res1, _ = run(shell, "y = torch.atan2(x, x)")
    res2, _ = run(shell, "y = torch.atan2(x, x)\ny = torch.atan2(x, x)")
    r, _ = run(shell, f"%neuron report {res1.execution_count}")
    assert r.result.fallback_calls == 1
    r, _ = run(shell, "%neuron report --last")
    assert r.result.fallback_calls == 2
    r, _ = run(shell, "%neuron report all")
    assert [x.cell for x in r.result.reports][-2:] == [res1.execution_count, res2.execution_count]
    r, _ = run(shell, f"%neuron report {res2.execution_count} --json")
    assert json.loads(str(r.result))["ops_not_native"][0]["count"] == 2
    r, _ = run(shell, f"%neuron report {res2.execution_count} --full")
    assert "stack:" in str(r.result)
    run(shell, "%neuron reset")
    assert not session_of(shell).history and session_of(shell).totals.fallback_calls == 0
    msg = usage_error(shell, f"%neuron report {res1.execution_count}")
    assert "no report for cell" in msg


def test_reports_hold_no_tensors_so_del_frees_device_memory(shell):
    run(shell, "import torch\nbig = torch.ones(1 << 16, device='neuron')\ny = torch.atan2(big, big)")
    ref = weakref.ref(shell.user_ns["big"])
    gc.collect()  # earlier tests' cycles (their shells) would otherwise be freed inside the measurement
    before = torch.neuron.memory_allocated()
    run(shell, "del big, y")
    gc.collect()
    assert ref() is None
    assert torch.neuron.memory_allocated() == before - 2 * (1 << 18)
    assert len(session_of(shell).history) >= 2


def test_nested_run_cell_is_part_of_the_outer_cell(shell):
    run(shell, "import torch\nx = torch.ones(4, device='neuron')")
    hist = len(session_of(shell).history)
    res, _ = run(shell, "%%capture captured\ny = torch.atan2(x, x)\nprint('hidden')")
    assert len(session_of(shell).history) == hist + 1
    r = last_report(shell)
    assert r.cell == res.execution_count and r.fallback_calls == 1
    (sc,) = r.fallbacks[0].sites
    assert (sc.site.cell, sc.site.line, sc.site.source) == (res.execution_count, 2, "y = torch.atan2(x, x)")
    assert session_of(shell)._depth == 0


def test_silent_and_unhistoried_executions_are_not_cells(shell):
    run(shell, "import torch\nx = torch.ones(4, device='neuron')")
    hist = list(session_of(shell).history)
    shell.run_cell("y = torch.atan2(x, x)", silent=True)
    with capture_output() as cap:
        shell.run_cell("y = torch.atan2(x, x)", store_history=False)
    assert list(session_of(shell).history) == hist
    assert "neuron_lab" not in cap.stdout


def test_free_drops_ipython_references_and_reports_bytes(shell):
    run(shell, "import torch\ntorch.ones(1 << 16, device='neuron')")  # displayed: held by Out, _ and _N
    n = shell.execution_count - 1
    run(shell, "def boom():\n    local = torch.ones(1 << 14, device='neuron')\n    raise ValueError('x')")
    run(shell, "boom()", ok=False)
    held = torch.neuron.memory_allocated()
    res, cap = run(shell, "%neuron free")
    fr = res.result
    assert fr.freed == (1 << 18) + (1 << 16)
    assert torch.neuron.memory_allocated() == held - fr.freed
    holders = dict(fr.dropped)
    assert holders[f"Out[{n}]"] == 1 << 18 and holders["_"] == 1 << 18
    assert any(h.endswith("frames") and b == 1 << 16 for h, b in fr.dropped)
    assert "freed 320.00 KiB" in str(fr)


def test_free_names_only_what_your_variables_do_not_also_hold(shell):
    """Walkthrough 47 point 13: after a cell raised at top level, a neuron_lab frame of its traceback held the
    namespace, and `%neuron free` listed your live variables as `sys.last_traceback frames`; an output that is one of
    your variables was listed too, though dropping it freed nothing."""
    run(shell, "import torch\nm = torch.nn.Linear(4, 4).to('neuron')\nx = torch.rand(8, 4).to('neuron')")
    run(shell, "%%neuron parity\ny = m(x)\nraise RuntimeError('boom')", ok=False)
    run(shell, "x")  # displayed: Out, _ and _N hold x's storage, and so does x
    run(shell, "def boom():\n    local = torch.ones(1 << 14, device='neuron')\n    raise ValueError('x')")
    run(shell, "boom()", ok=False)
    fr = run(shell, "%neuron free")[0].result
    assert fr.dropped == [("sys.last_traceback frames", 1 << 16)] and fr.freed == 1 << 16, str(fr)
    fr = run(shell, "%neuron free")[0].result
    assert (fr.dropped, fr.freed) == ([], 0)
    assert str(fr).splitlines()[1] == "IPython held no device tensors"
    run(shell, "x")
    fr = run(shell, "%neuron free")[0].result
    assert (fr.dropped, fr.freed, fr.shared) == ([], 0, True)
    assert str(fr).splitlines()[1] == "IPython held only device tensors your variables hold too"


def test_free_points_at_the_magic_that_lists_what_your_variables_hold():
    """`%neuron device` shows only the notebook's device; `%neuron tensors` lists the tensors left."""
    assert "(`%neuron tensors` lists them)" in str(FreeReport(allocated=4096))


def test_track_gives_the_same_report_in_a_script():
    x = torch.ones(8, device="neuron")
    with neuron_lab.track() as report:
        torch.atan2(x, x)
        torch.atan2(x, x)
    (row,) = report.fallbacks
    assert row.count == 2
    assert [(sc.site.filename, sc.count) for sc in row.sites] == [(__file__, 1), (__file__, 1)]
    assert "aten::atan2.out" in str(report) and report.cell is None and report.title == "track"
    with pytest.raises(ZeroDivisionError):
        with neuron_lab.track() as failing:
            print(1 / 0)
    assert failing.error == "ZeroDivisionError: division by zero"


def test_compile_mode_leaves_explicitly_compiled_functions_compiled(shell):
    run(shell, MODEL)
    run(shell, "%neuron mode compile")
    run(shell, "g = torch.compile(lambda t: net(t) + 1, backend='neuron')\nz = g(x)")
    r = last_report(shell)
    assert r.compiles.frames >= 1  # g's own frame compiled, net called inside it is traced, not wrapped again
    run(shell, "z = g(x)")
    assert last_report(shell).compiles.frames == 0


def test_fullgraph_compile_of_a_graph_break_is_a_clear_error_and_restores_state(shell):
    run(shell, MODEL)
    before = state(shell)
    res, _ = run(shell, "%%neuron compile --fullgraph\nout = net(x)", ok=False)
    err = res.error_in_exec
    assert "Data-dependent branching" in str(err), str(err)[:300]
    assert state(shell) == before and not modes.patched()
    assert last_report(shell).error.startswith(type(err).__name__)


@pytest.mark.parametrize("line", ["%neuron -h", "%neuron --help", "%neuron help"])
def test_asking_for_help_shows_the_commands(shell, line):
    """Walkthrough 48: `%neuron help`, `-h` and `--help` were usage errors ("invalid choice: 'help'")."""
    before = state(shell)
    res, cap = run(shell, line)
    assert res.result is None and "Commands:" in cap.stdout and "  device " in cap.stdout
    assert cap.stdout.rstrip().endswith("`%neuron COMMAND -h` shows one command's usage and options, `%neuron?` every "
                                        "command's.")
    assert state(shell) == before


@pytest.mark.parametrize("line", ["%neuron device -h", "%neuron help device", "%neuron device neuron --help"])
def test_asking_for_a_commands_help_shows_its_usage_and_options_and_runs_nothing(shell, line):
    before = state(shell)
    _, cap = run(shell, line)
    assert cap.stdout.startswith("usage: %neuron device ") and "--move NAME" in cap.stdout
    assert state(shell) == before


def test_a_cell_asking_for_help_shows_its_form_and_does_not_run(shell):
    _, cap = run(shell, "%%neuron compile -h\nran = True")
    assert cap.stdout.startswith("usage: %%neuron compile ") and "ran" not in shell.user_ns
