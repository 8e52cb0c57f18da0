"""Silent waits: `%load_ext neuron_lab` loads no compiler stack and says at once that it loaded; a long compile
says what it does while it does it."""

from __future__ import annotations

from html import escape

from shells import in_child_shell

from neuron_lab.units import format_seconds

HEAVY = ("torch._dynamo", "torch._inductor", "ipywidgets", "matplotlib")  # each loads at its first use, not at load


def test_loading_the_extension_imports_no_compiler_or_widgets_and_prints_its_banner(run_python) -> None:
    out = run_python(in_child_shell("""
        import json, os, sys
        import torch
        with capture_output() as cap:
            sh.run_line_magic("load_ext", "neuron_lab")
        print(json.dumps({"loaded": [m for m in os.environ["HEAVY"].split() if m in sys.modules], "out": cap.stdout}))
    """), {"HEAVY": " ".join(HEAVY)}, timeout=120)
    assert out["loaded"] == []
    assert out["out"].startswith("neuron_lab ") and "device neuron:0" in out["out"]


def test_a_cell_that_compiles_nothing_loads_no_compiler_and_a_first_compile_says_each_step_once(run_python) -> None:
    """The first device cell after `%load_ext` does not load dynamo (its 2 s and 70 MiB wait for a compile); the
    first compile then prints its steps in plain lines in a plain shell (no carriage returns, no dynamo names),
    counts loading the compiler as compile time, and a second compile of the same cell (cached) prints nothing."""
    out = run_python(in_child_shell("""
        import json, sys
        import torch
        outs = []
        for code in ["%load_ext neuron_lab\\n%config NeuronLab.compile_progress_s = 0",
                     "import torch\\nnet = torch.nn.Linear(4, 2).to('neuron')\\nx = torch.ones(3, 4, device='neuron')",
                     "%%neuron compile\\nout = net(x)", "%%neuron compile\\nout = net(x)"]:
            with capture_output() as cap:
                sh.run_cell(code, store_history=True)
            shown = "\\n".join(o.data["text/plain"] for o in cap.outputs)
            outs.append({"out": cap.stdout, "shown": shown, "dynamo": "torch._dynamo" in sys.modules})
        from neuron_lab.extension import session_of

        c = session_of(sh).history[3].compiles
        print(json.dumps({"outs": outs, "loading_s": c.loading_s, "compile_s": c.compile_s}))
    """), {}, timeout=300)
    outs = out["outs"]
    assert [o["dynamo"] for o in outs] == [False, False, True, True]
    said = [x for x in outs[2]["out"].splitlines() if x.startswith("neuron_lab: ")]
    assert said[0] == "neuron_lab: loading PyTorch's compiler (once a session)…", said
    assert len(said) == len(set(said)) and "\r" not in outs[2]["out"] and "dynamo" not in " ".join(said)
    assert all(x.startswith("neuron_lab: compiling Linear: ") for x in said[1:]), said
    report = outs[2]["shown"].splitlines()
    compile_line = next(x for x in report if x.startswith("compile: "))
    assert "of it loading PyTorch's compiler, once a session)" in compile_line
    assert report.index(compile_line) == report.index(next(x for x in report if x.startswith("memory: "))) - 1
    assert 0 < out["loading_s"] <= out["compile_s"]
    assert not [x for x in outs[3]["out"].splitlines() if x.startswith("neuron_lab: ")]  # cached: nothing to wait for


def test_torch_loading_its_compiler_for_no_compile_is_no_compile_time(run_python) -> None:
    """An optimizer's constructor makes torch load dynamo (torch.optim keeps its own code from being compiled): the
    cell says whose load it waits for, not a compile's (walkthrough 47 point 5), its report counts no compile and says
    where its time went, and the first compile after it says it loaded only the rest of the compiler."""
    out = run_python(in_child_shell("""
        import json, sys
        import torch
        with capture_output():
            sh.run_cell("%load_ext neuron_lab\\n%config NeuronLab.compile_progress_s = 0", store_history=True)
            sh.run_cell("import torch\\nemb = torch.nn.Embedding(10, 4).to('neuron')\\n"
                        "ids = torch.tensor([1, 2], device='neuron')", store_history=True)
            refused = sh.run_cell("%neuron mode compile --dynamic", store_history=True)
        dynamo_after_refusal = "torch._dynamo" in sys.modules
        with capture_output() as cap:
            sh.run_cell("opt = torch.optim.SGD(emb.parameters(), lr=0.1)\\ny = emb(ids).sum()", store_history=True)
        with capture_output():
            sh.run_cell("%%neuron compile\\nz = torch.nn.Linear(4, 2).to('neuron')(emb(ids))", store_history=True)
        from neuron_lab.extension import session_of

        r, later = session_of(sh).history[4], session_of(sh).history[5]
        print(json.dumps({"out": cap.stdout, "report": str(r).splitlines(), "html": r._repr_html_(),
                          "compile_s": r.compiles.compile_s, "loading_s": r.compiles.loading_s,
                          "by": r.compiles.imported_by, "later": str(later).splitlines()[1],
                          "refused": type(refused.error_in_exec).__name__, "dynamo": dynamo_after_refusal}))
    """), {}, timeout=300)
    assert (out["refused"], out["dynamo"]) == ("UsageError", False)  # refused before any second of loading
    assert out["out"].splitlines()[0] == "neuron_lab: torch.optim imports PyTorch's compiler (once a session)…"
    assert out["compile_s"] == 0 and out["loading_s"] > 0 and out["by"] == "torch.optim"
    assert "compile" not in out["report"][0], out
    said = f"time: {format_seconds(out['loading_s'])} of it torch.optim importing PyTorch's compiler (once a " \
           "session); nothing compiled"
    assert said in out["report"] and f"<div>{escape(said)}</div>" in out["html"]
    assert out["later"].startswith("compile: ") and "of it loading the rest of PyTorch's compiler, AOTAutograd, " \
           "once a session)" in out["later"], out["later"]
