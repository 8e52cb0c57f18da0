"""The example notebooks in notebooks/: each one runs top to bottom in a real python3 kernel on the emulator,
and shows its reader what its prose says it shows.

Each notebook is executed once, by nbclient, the way ``jupyter nbconvert --execute`` runs it: a cell that
raises stops the run unless it is tagged ``raises-exception`` (the tag JupyterLab honours too). Cells are
found by their tags, never by position; the facts are read from what a reader sees: printed text, a cell's
value, and the neuron_lab report under it (its text/plain). Every notebook needs an entry in ``CHECKS``:
a new notebook without assertions fails ``test_every_notebook_has_checks``.

Run with the project's venv (the "python3" kernelspec runs the interpreter running pytest):
``.venv/bin/python -m pytest tests/test_notebooks.py -n 2``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbclient
import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT = 180  # seconds per cell; the first torch.compile imports inductor
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Settings that change what the notebooks show; a notebook that needs one sets it itself (03: %env).
EMULATOR_SETTINGS = ("NEURON_LAB_PROFILE", "NEURON_LAB_DEVICE_MEMORY", "NEURON_LAB_EMULATE_DOWNCAST",
                     "NEURON_LAB_COMPILE_LOWERING")


def _execute(path: Path, tmp: Path) -> Any:
    """The notebook, run in a fresh kernel from its own folder, as Jupyter runs it."""
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT, startup_timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    env = {k: v for k, v in os.environ.items() if k not in EMULATOR_SETTINGS}
    # the emulator whatever is installed; a private IPython profile: no user startup files, no ~/.ipython
    env.update(NEURON_LAB_BACKEND="emulator", IPYTHONDIR=str(tmp / "ipython"))
    try:
        client.execute(env=env)
    except nbclient.exceptions.CellExecutionError as e:
        pytest.fail(f"{path.name} stopped at a cell that raised:\n{ANSI.sub('', str(e))[-4000:]}")
    return nb


class Ran:
    """An executed notebook, read by tag."""

    def __init__(self, nb: Any) -> None:
        self.nb = nb

    def tagged(self, tag: str) -> list[Any]:
        return [c for c in self.nb.cells if tag in c.metadata.get("tags", [])]

    def cell(self, tag: str) -> Any:
        cells = self.tagged(tag)
        assert len(cells) == 1, f"{len(cells)} cells tagged {tag!r}"
        return cells[0]

    def n(self, tag: str) -> int:
        """The cell's In[N]."""
        return self.cell(tag).execution_count

    def line(self, tag: str, text: str) -> int:
        """The 1-based line of the cell's source holding ``text`` (exactly one)."""
        hits = [i for i, s in enumerate(self.cell(tag).source.splitlines(), 1) if text in s]
        assert len(hits) == 1, (tag, text, hits)
        return hits[0]

    def stdout(self, tag: str) -> str:
        return "".join(o.text for o in self.cell(tag).outputs if o.output_type == "stream" and o.name == "stdout")

    def value(self, tag: str) -> str:
        """The text/plain of the cell's value (its Out[N])."""
        (out,) = [o for o in self.cell(tag).outputs if o.output_type == "execute_result"]
        return out.data["text/plain"]

    def report(self, tag: str) -> list[str]:
        """The lines of the neuron_lab report shown under the cell."""
        shown = [o.data["text/plain"] for o in self.cell(tag).outputs
                 if o.output_type == "display_data" and o.data.get("text/plain", "").startswith("neuron_lab In[")]
        assert len(shown) == 1, f"{tag}: {len(shown)} reports"
        return shown[0].splitlines()

    def has_report(self, tag: str) -> bool:
        return any(o.output_type == "display_data" for o in self.cell(tag).outputs)

    def says(self, *texts: str) -> None:
        """The prose states each of ``texts`` (so the numbers it quotes are the ones the outputs show)."""
        prose = " ".join(" ".join(c.source.split()) for c in self.nb.cells if c.cell_type == "markdown")
        missing = [t for t in texts if " ".join(t.split()) not in prose]
        assert not missing, f"the markdown no longer says {missing}"


def _ops(report: list[str], section: str) -> dict[str, tuple[int, list[str]]]:
    """A report section ("CPU fallbacks", "64-bit downcasts") as op -> (calls, ["In[N] line L: source  (k×)"])."""
    ops: dict[str, tuple[int, list[str]]] = {}
    inside, op = False, None
    for line in report:
        if not line.startswith(" "):
            inside = line.startswith(section + " (")
        elif inside and re.match(r"  \S", line):
            op, count = re.match(r"  (\S+) +([\d,]+)× ", line).groups()
            ops[op] = (int(count.replace(",", "")), [])
        elif inside and line.startswith("      at "):
            ops[op][1].append(line.removeprefix("      at "))
    return ops


def _calls(report: list[str], section: str = "CPU fallbacks") -> dict[str, int]:
    return {op: count for op, (count, _) in _ops(report, section).items()}


# -- 01: quickstart ------------------------------------------------------------------------------------
def check_quickstart(r: Ran) -> None:
    assert r.stdout("load").startswith("neuron_lab "), r.stdout("load")
    assert "emulator backend, coverage torchneuron-combined · device neuron:0 · 24.00 GiB" in r.stdout("load")
    assert "  model                PolarNet                520 B  from cpu" in r.stdout("move")

    # the fallback report: both ops, with the cell and line behind each
    n, model = r.n("check-fallback"), r.n("model")
    line = r.line("model", "return torch.atan2(")
    rep = r.report("check-fallback")
    assert rep[0].startswith(f"neuron_lab In[{n}] · neuron:0 · default · "), rep[0]
    assert "· 6 CPU fallback calls (2 ops) ·" in rep[0], rep[0]
    assert _ops(rep, "CPU fallbacks") == {
        "aten::atan2.out": (5, [f"In[{model}] line {line}: return torch.atan2(xy[:, 1:], xy[:, :1])  (5×)"]),
        "aten::normal_": (1, [f"In[{n}] line 1: xy = torch.randn(256, 2, device=device)  (1×)"]),
    }, rep
    r.says("6 CPU fallback calls of 2 ops", "`aten::atan2.out`, 5 calls", f"`In[{model}] line {line}`",
           "`aten::normal_`, 1 call")
    # atan2's rewrite, from ops the April source registers, is offered under the default; AdamW's step may not fall
    # back (its _foreach_ composites reach TorchNeuron as native per-tensor ops)
    assert "      rewrite: a polynomial of min(|x|, |y|) / max(|x|, |y|) (Cephes' atanf), its octant and quadrant " \
           "set with torch.where (`%neuron report --full` shows the code)" in rep, rep
    assert set(_ops(rep, "may fall back on TorchNeuron")) == {"aten::mse_loss", "aten::mse_loss_backward"}, rep

    # the fix: checked against atan2 on the CPU, touching no device tensor, so no report
    assert r.stdout("fix") == "polar_angle matches torch.atan2\n"
    assert not r.has_report("fix")
    clean = r.report("check-clean")
    assert "· no CPU fallbacks ·" in clean[0] and _ops(clean, "CPU fallbacks") == {}, clean
    assert set(_ops(clean, "may fall back on TorchNeuron")) == {"aten::mse_loss", "aten::mse_loss_backward"}, clean
    assert "copies: host→device 2.00 KiB, device→host 4 B" in clean, clean  # xy, moved once
    losses = [float(re.search(r"loss (\d+\.\d+)", r.stdout(t)).group(1))
              for t in ("check-fallback", "check-clean", "check-compile")]
    assert losses == sorted(losses, reverse=True), losses  # the training the notebook shows goes down

    # the compile cell
    comp = r.report("check-compile")
    assert f"In[{r.n('check-compile')}] · neuron:0 · compile · " in comp[0], comp[0]
    assert "· no CPU fallbacks ·" in comp[0] and comp[0].endswith(" · 1 graph, 0 breaks, 0 recompiles"), comp[0]
    assert any(x.startswith("compile: ") and " 1 graph, " in x for x in comp), comp

    # the dashboard: a widget, with the same views as text for frontends without widgets, as of its last update
    dash = r.n("check-dashboard")
    (shown,) = [o for o in r.cell("check-dashboard").outputs
                if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    text = shown.data["text/plain"]
    assert text.startswith("neuron_lab · neuron:0 · mode default · "), text
    # the compile cell's: no fallbacks, and its one .item()
    assert "running" not in text.splitlines()[0] and text.splitlines()[0].endswith(": 0 CPU fallback calls, 1 sync"), \
        text
    assert text.splitlines()[-1] == f"snapshot at the end of In[{dash}], not live"
    assert "CPU fallbacks, all cells" in text and f"In[{model}] line {line}: return torch.atan2(" in text
    assert "  model.inp.weight" in text and f"  In[{r.n('check-compile')}] 1 graph, compile " in text, text


# -- 02: finding fallbacks ------------------------------------------------------------------------------------
def _host(stdout: str, when: str) -> tuple[int, float]:
    calls, ms = re.search(rf"^{when}: (\d+) CPU fallback calls, (\d+\.\d+) ms on the host$", stdout, re.M).groups()
    return int(calls), float(ms)


def check_finding_fallbacks(r: Ran) -> None:
    model, data = r.n("model"), r.n("data")
    assert _ops(r.report("data"), "CPU fallbacks") == {
        "aten::random_.from": (2, [f"In[{data}] line 4: src = torch.randint(0, n_nodes, (n_edges,), device=device)"
                                   "  (1×)",
                                   f"In[{data}] line 5: dst = (src + torch.randint(1, n_nodes, (n_edges,), "
                                   "device=device)) % n_nodes  (1×)"]),
        "aten::normal_": (1, [f"In[{data}] line 3: pos = torch.randn(n_nodes, 3, device=device)  (1×)"]),
    }
    r.says("`aten::normal_` for `torch.randn`", "`aten::random_.from` for each `torch.randint`, 3 calls")

    # before: the four geometric ops, each at its line
    calls_before, ms_before = _host(r.stdout("check-before"), "before")
    assert calls_before == 50 and ms_before > 0
    rep, n = r.report("check-before"), r.n("check-before")
    assert "· 50 CPU fallback calls (4 ops) ·" in rep[0], rep[0]
    ops = _ops(rep, "CPU fallbacks")
    assert {op: count for op, (count, _) in ops.items()} == {
        "aten::linalg_cross.out": 20, "aten::acos.out": 10, "aten::atan2.out": 10, "aten::scatter_reduce.two_out": 10}
    assert ops["aten::linalg_cross.out"][1] == [
        f"In[{model}] line {r.line('model', 'torch.linalg.cross(')}: "
        "normal = torch.linalg.cross(unit, axis, dim=1)  (10×)",
        f"In[{n}] line {r.line('check-before', 'loss.backward()')}: loss.backward()  (10×)"]
    assert ops["aten::acos.out"][1] == [f"In[{model}] line {r.line('model', 'torch.acos(')}: "
                                        "theta = torch.acos((unit * axis).sum(1).clamp(-0.999, 0.999))  (10×)"]
    assert ops["aten::scatter_reduce.two_out"][1] == [
        f"In[{model}] line {r.line('model', '.scatter_reduce(')}: "
        'return nodes.scatter_reduce(0, index, msg, "mean", include_self=False)  (10×)']
    r.says("counts 50 calls of 4 ops")
    assert r.value("report").splitlines() == rep  # %neuron report: the last report again

    everything = r.value("fallbacks-view")
    for op in ("aten::linalg_cross.out", "aten::acos.out", "aten::atan2.out", "aten::scatter_reduce.two_out",
               "aten::random_.from", "aten::normal_"):
        assert re.search(rf"^ +{re.escape(op)} ", everything, re.M), (op, everything)  # a row of the view
    by_time = [line.split()[0] for line in r.stdout("by-time").splitlines()]
    assert sorted(by_time) == ["aten::acos.out", "aten::atan2.out", "aten::linalg_cross.out",
                               "aten::scatter_reduce.two_out"], by_time

    # after the rewrites: the same ten steps, no fallback at all
    assert r.stdout("equivalence").startswith("NativeEdgeNet matches EdgeNet\n")
    calls_after, ms_after = _host(r.stdout("check-after"), "after")
    assert (calls_after, ms_after) == (0, 0.0)
    after = r.report("check-after")
    assert "· no CPU fallbacks ·" in after[0] and _ops(after, "CPU fallbacks") == {}, after
    summary = r.stdout("check-summary").splitlines()
    assert summary[0] == "CPU fallback calls: 50 -> 0", summary
    before_ms, after_ms = map(float, re.fullmatch(r"host time in fallbacks: (\S+) ms -> (\S+) ms", summary[1]).groups())
    assert before_ms > after_ms == 0.0, summary


# -- 03: memory -----------------------------------------------------------------------------------------
def check_memory(r: Ran) -> None:
    assert " · device neuron:0 · 64.00 MiB · " in r.stdout("check-capacity"), r.stdout("check-capacity")
    train = r.report("train")
    assert any(x.startswith("memory: 4.01 MiB → 12.02 MiB (+8.01 MiB), peak ") for x in train), train
    r.says("grows by 8.01 MiB", "model's 4.01 MiB")
    assert r.stdout("check-stats").splitlines()[-1].split() == ["num_ooms", "0"]

    # a displayed slice keeps its batch alive through Out/_; its autograd graph keeps the input alive
    out = r.n("out-value")
    assert r.stdout("check-del") == "freed by del: 0 bytes\n"
    rows = r.value("check-tensors-out").splitlines()
    assert f"     8.00 MiB  2048×1024      float32   IPython output cache Out[{out}], _, _{out}" in rows, rows
    assert (f"     4.00 MiB  2048×512       float32   autograd graph       Out[{out}].grad_fn…AddmmBackward0."
            "_saved_mat1") in rows, rows
    r.says(f"(`Out[{out}]`, `_`, `_{out}`)", "keeps the 4 MiB input batch")

    # the failing cell raised, and its traceback holds the function's locals
    (err,) = [o for o in r.cell("check-traceback").outputs if o.output_type == "error"]
    assert "raises-exception" in r.cell("check-traceback").metadata["tags"]
    assert (err.ename, err.evalue) == ("RuntimeError", "mat1 and mat2 shapes cannot be multiplied "
                                                       "(2048x1024 and 2048x512)")
    held = {line.split("IPython traceback    ")[1].split(",")[0]: line.split()[0]
            for line in r.value("check-tensors-tb").splitlines() if "IPython traceback    " in line}
    at = f"in evaluate at In[{r.n('check-traceback')}] line {r.line('check-traceback', 'return h @ x')}"
    assert held == {f"h {at}": "8.00", f"x {at}": "4.00"}, held
    assert f"IPython output cache Out[{out}], __, _{out}" in r.value("check-tensors-tb")

    # %neuron free
    freed = r.value("check-free").splitlines()
    assert freed[0] == "freed 24.00 MiB of device memory; 12.02 MiB still allocated", freed
    dropped = [x.split() for x in freed[2:5]]
    assert freed[1] == "dropped IPython's references:" and dropped == [
        [f"Out[{out}]", "8.00", "MiB"], ["___", "8.00", "MiB"], ["sys.last_traceback", "frames", "12.00", "MiB"]], freed
    assert "mem 12.02 MiB (-24.00 MiB, " in r.report("check-free")[0]
    r.says("24 MiB came back", "the traceback's 12 MiB", "12.02 MiB, is the model")

    # out of memory, caught: the batch halves until it fits, and nothing stays behind
    lines = r.stdout("check-oom").splitlines()
    assert [x.split(":")[0] for x in lines[:3]] == ["batch 16384", "batch 8192", "batch 4096"], lines
    assert all(" neuron:0 out of memory (emulated): tried to allocate " in x for x in lines[:3]), lines
    assert lines[3].startswith("trained with batch 2048, loss "), lines
    allocated, baseline, ooms = re.fullmatch(r"allocated ([\d,]+) bytes \(baseline ([\d,]+)\); num_ooms (\d+)",
                                             lines[4]).groups()
    assert allocated == baseline == "12,601,344" and int(ooms) == 3, lines[4]
    r.says("Batches of 16384, 8192 and 4096", "2048 trained", "counts the 3 failures")
    assert "memory:  12.02 MiB allocated" in r.value("status")


# -- 04: eager against compiled ----------------------------------------------------------------------------------
def check_eager_vs_compile(r: Ran) -> None:
    model = r.n("model-break")
    line = r.line("model-break", "if h.mean() > 0.5:")
    rep = r.report("check-break")
    assert " · compile · " in rep[0] and rep[0].endswith(" · 2 graphs, 1 break, 0 recompiles"), rep[0]
    i = rep.index(f"  graph break at In[{model}] line {line}: if h.mean() > 0.5:")
    assert rep[i + 1].startswith("      why: Python `if`/`while` on a tensor's value"), rep[i + 1]
    assert rep[i + 2].startswith("      fix: ") and rep[i + 3] == "      dynamo: generic_jump TensorVariable()", rep
    r.says("2 graphs and 1 graph break", f"`In[{model}] line {line}`, the `if`", "`generic_jump TensorVariable()`")

    fixed = r.report("check-nobreak")
    assert " · compile · " in fixed[0] and fixed[0].endswith(" · 1 graph, 0 breaks, 0 recompiles"), fixed[0]
    assert not any("graph break" in x for x in fixed), fixed

    assert r.stdout("mode-compile") == "mode for the cells that follow: compile\n"
    mode = r.report("check-mode")[0]  # compiled again: the cache is per module class and compile options
    assert " · compile · " in mode and mode.endswith(" · 1 graph, 0 breaks, 0 recompiles"), mode
    eager = r.report("check-eager")[0]
    assert " · eager · " in eager and " · 7 ops · " in eager and " · 7 ops · " in mode, (eager, mode)
    # walkthrough 47 point 8: the prose said the compiled cell ran 0 ops
    r.says("shows `GatedMLP` compiled once more, to 1 graph", "its report counts 7 ops, as the compiled cell's does")
    assert r.stdout("mode-default") == "mode for the cells that follow: default\n"

    # compare: the table of both modes, the compile it measured, agreement
    cmp = r.value("check-compare").splitlines()
    assert cmp[0].startswith("neuron_lab compare eager ") and cmp[0].endswith(" · outputs agree (14 items)"), cmp[0]
    assert " (min of 6): " in cmp[0] and " · emulator: host CPU timings · compile " in cmp[0], cmp[0]
    assert cmp[1].split() == ["mode", "min", "median", "max", "first", "run", "runs"], cmp[1]
    assert [x.split()[0] for x in cmp[2:4]] == ["eager", "compiled"], cmp
    assert all(x.endswith("5 after 1 warm-up") for x in cmp[2:4]), cmp
    assert cmp[4].startswith(("within noise: the spreads (min–median) eager ", "speedup ")), cmp[4]
    assert "(dynamo and backend " in cmp[4] and ", 1 frame compile, 1 graph)" in cmp[4], cmp[4]
    assert "numeric agreement, compiled against eager: agree (14 items)" in cmp
    assert not any(x.startswith("nothing compiled") for x in cmp), cmp
    assert not any(x.startswith("check: ") for x in r.report("check-compare"))  # the Out above said it: once
    r.says("14 items", "min of 6", "host CPU timings", "\"it does not use TorchInductor\"")

    par = r.value("check-parity").splitlines()
    assert par[0] == "neuron_lab parity neuron:0 vs cpu: agree (6 items)", par[0]
    items = {x.split()[0]: x.split()[1] for x in par if x.startswith("  ") and not x.startswith("  item ")}
    assert items == dict.fromkeys(["y", "model.up.weight", "model.up.bias", "model.down.weight", "model.down.bias",
                                   "x"], "ok"), items
    assert not any(x.startswith("check: ") for x in r.report("check-parity"))  # the Out above said it: once
    r.says("6 items, all in agreement")


# -- 05: on Trainium ------------------------------------------------------------------------------------------
def check_on_trainium(r: Ran) -> None:
    doctor = r.stdout("check-doctor").splitlines()
    assert doctor[0].startswith("neuron_lab ") and doctor[0].endswith(" doctor"), doctor
    facts = {x.split()[0]: " ".join(x.split()[1:]) for x in doctor[1:] if re.match(r"  \w", x)}
    assert facts["backend"] == "emulator: NEURON_LAB_BACKEND=emulator", facts
    assert facts["devices"].startswith("4 (neuron:0..neuron:3)") and facts["problems"] == "none", facts
    assert r.stdout("check-backend").splitlines()[1] == \
        "on the emulator: cells marked 'on hardware only' will say so"

    hardware_only = r.tagged("hardware-only")
    assert len(hardware_only) == 2
    for c in hardware_only:
        assert "if on_hardware:" in c.source
        out = "".join(o.text for o in c.outputs if o.output_type == "stream")
        assert out.startswith("on hardware only: "), out
    r.says("marked **on hardware only**")

    specs = json.loads("[" + r.stdout("check-kernelspec").replace("}\n{", "},\n{") + "]")
    assert [s["env"] for s in specs] == [{"NEURON_RT_VISIBLE_CORES": "0-1"}, {"NEURON_RT_VISIBLE_CORES": "2-3"}]
    assert all(s["argv"][1:] == ["-m", "ipykernel_launcher", "-f", "{connection_file}"] for s in specs)
    assert "allocated 2,097,152 bytes" in r.stdout("check-sync")

    n = r.n("check-fallback-ops")
    assert r.value("check-fallback-ops") == "['aten::atan2']"
    assert _ops(r.report("check-fallback-ops"), "CPU fallbacks") == {
        "aten::atan2.out": (1, [f"In[{n}] line 2: angle = torch.atan2(w[:, 1], w[:, 0])  (1×)"])}
    r.says("`['aten::atan2']`")


# -- 06: Hugging Face -----------------------------------------------------------------------------------
def check_huggingface(r: Ran) -> None:
    assert r.stdout("check-device").splitlines() == [
        "torch_neuronx 2.13.3.0+neuronlab.emulator, emulated: True",
        "is_torch_neuron_available(): True; TrainingArguments().device: neuron:0"]
    assert "trained on neuron:0: loss " in r.stdout("train")
    gpt2 = r.report("train")
    assert "no CPU fallbacks" in gpt2[0] and _calls(gpt2) == {}
    assert "possible fallback" not in gpt2[0] and not _ops(gpt2, "may fall back on TorchNeuron"), gpt2  # fused AdamW
    assert not any(x.startswith("64-bit downcasts") for x in gpt2)  # int64 ids: said once a session, not per cell
    t5 = r.report("train-derived")
    assert _calls(t5) == {"aten::minimum": 12}  # 3 per step, 4 steps
    line = r.line("train-derived", "result = trainer.train()")
    sites = _ops(t5, "CPU fallbacks")["aten::minimum"][1]  # T5's two torch.min lines, each led to from the cell's
    led = f" ← In[{r.n('train-derived')}] line {line}: result = trainer.train()  ("
    assert len(sites) == 2 and all(s.startswith("t5/modeling_t5.py:") and led in s for s in sites), sites
    assert sorted(int(s.rpartition("(")[2].rstrip("×)")) for s in sites) == [4, 8]
    assert "predicted by the coverage torchneuron-src-2026-04" in "\n".join(t5)
    nki = r.report("nki")
    assert _calls(nki, "NKI kernels") == {"demo::gelu_tanh": 1} and "aten::tanh" not in _calls(nki)
    r.says("falls back on `aten::minimum` (T5's relative-position buckets) three times per step",
           "The bundled coverage predicts no CPU fallback for it, certain or possible:",
           "one `aten::_fused_adamw_` call per step")  # walkthrough 47 point 8: it said some were listed apart


# -- 07: a language model, end to end -------------------------------------------------------------------
def check_language_model(r: Ran) -> None:
    assert "device neuron:0 · 256.00 MiB" in r.stdout("load")
    train = r.report("train")
    # nothing may fall back: the default foreach AdamW's composites reach TorchNeuron as native per-tensor ops (they
    # were four "may fall back" rows at the step's line); the report is a few lines
    assert "no CPU fallbacks" in train[0] and "possible fallback" not in train[0], train[0]
    assert _ops(train, "may fall back on TorchNeuron") == {} and len(train) <= 4, train
    assert not any(x.startswith("64-bit downcasts") for x in train), train  # int64 indices: expected, said once

    sample = r.report("sample")
    line = r.line("sample", "nxt = torch.multinomial(probs, 1)")
    assert _ops(sample, "CPU fallbacks") == {
        "aten::multinomial": (24, [f"In[{r.n('sample')}] line {line}: nxt = torch.multinomial(probs, 1)  (24×)"])}
    assert "no CPU fallbacks" in r.report("sample-fixed")[0]

    parity = _shown(r, "parity", "neuron_lab parity ")
    assert re.fullmatch(r"neuron_lab parity neuron:0 vs cpu: agree \(\d+ items, 1 step\)", parity[0]), parity[0]
    assert parity[1] == ("randomness: 5 random ops (_scaled_dot_product_fused_attention_overrideable ×2, "
                         "native_dropout ×2, randint ×1) replayed from the neuron:0 run")  # MHA calls SDPA
    sdpa = _shown(r, "parity-sdpa", "neuron_lab parity ")  # nanoGPT's attention: SDPA with is_causal and dropout
    assert re.fullmatch(r"neuron_lab parity neuron:0 vs cpu: agree \(\d+ items, 1 step\)", sdpa[0]), sdpa
    assert sdpa[1] == ("randomness: 7 random ops (native_dropout ×4, _scaled_dot_product_fused_attention_overrideable "
                       "×2, randint ×1) replayed from the neuron:0 run")

    compiled = r.report("compile")
    assert " · compile · " in compiled[0] and "1 graph, 0 breaks, 0 recompiles" in compiled[0], compiled[0]
    ops = int(re.search(r" · ([\d,]+) ops · ", compiled[0])[1].replace(",", ""))
    assert ops > 300, compiled[0]  # the graphs ran op by op on the device, and the report saw each op

    broke = r.report("graph-break")
    assert "1 graph, 1 break, 0 recompiles" in broke[0], broke[0]
    at = r.line("chatty", "if logits.mean() > 0:")
    i = broke.index(f"  graph break at In[{r.n('chatty')}] line {at}: if logits.mean() > 0:")
    assert broke[i + 1].startswith("      why: Python `if`/`while` on a tensor's value")
    assert broke[i + 2].startswith("      fix: compute both sides and choose with `torch.where(cond, a, b)`")
    assert [o for o in r.cell("graph-break").outputs if o.output_type == "stream" and o.name == "stderr"] == []

    (error,) = [o for o in r.cell("oom").outputs if o.output_type == "error"]
    assert error.ename == "OutOfMemoryError"
    assert "neuron_lab" not in ANSI.sub("", "\n".join(error.traceback))
    answer = _shown(r, "oom", "out of memory: asked 96.00 MiB, ")  # the short answer, above the traceback
    kinds = [o.output_type for o in r.cell("oom").outputs]
    assert kinds.index("display_data") < kinds.index("error"), kinds
    assert "Module._wrapped_call_impl" not in ANSI.sub("", "\n".join(error.traceback))
    # the biggest holder: attention's projections, named by the module and the user's line they ran under
    assert any("activation in model.blocks.0.attn at In[" in x and "[32, 4096, 192] float32" in x for x in answer)
    assert "<locals>.args" not in "\n".join(answer), answer
    oom = r.report("oom")
    assert answer == oom[oom.index(answer[0]):oom.index(answer[0]) + len(answer)]  # the report keeps the answer
    assert any(x.startswith("freed after the error: ") for x in oom)
    before = re.search(r"^memory: (\S+) MiB → ", "\n".join(oom), re.M)[1]
    after = re.fullmatch(r"allocated after the OOM: (\S+) MiB\n", r.stdout("after-oom"))[1]
    assert float(after) <= float(before), (after, before)

    view = r.value("memory-view").splitlines()  # the view's text; its widget and HTML draw the same timeline
    assert any(x.lstrip().startswith(f"In[{r.n('oom')}] ") and x.endswith("peak 199.62 MiB") for x in view), view
    r.says("the CPU run replays the device run's draws", "dynamo's own warnings do not flood the cell")


# -- 08: distributed training on 4 emulated cores ----------------------------------------------------------
def _rank_lines(report: list[str]) -> dict[str, list[str]]:
    """The rank table of a ``%%neuron ranks`` report: rank -> its cells (device, time, memory, peak, fallbacks,
    collectives)."""
    return {cells[0]: cells[1:] for cells in (re.split(r"  +", line.strip()) for line in report[2:])
            if cells[0].isdigit()}


def _starting(lines: list[str], prefix: str) -> int:
    """The index of the one line starting with ``prefix``."""
    hits = [i for i, line in enumerate(lines) if line.startswith(prefix)]
    assert len(hits) == 1, (prefix, lines)
    return hits[0]


def _matching(lines: list[str], pattern: str) -> int:
    """The index of the one line that ``pattern`` matches at its start."""
    hits = [i for i, line in enumerate(lines) if re.match(pattern, line)]
    assert len(hits) == 1, (pattern, lines)
    return hits[0]


def _ranks_out(r: Ran, tag: str) -> str:
    """What the ranks printed in a ``%%neuron ranks`` cell: a line alike once as ``[ranks 0-3] ...``, a rank's own
    (one naming its rank) as ``[stdout:RANK] ...``, as ``%%px`` prefixes it."""
    return "".join(o.text for o in r.cell(tag).outputs if o.output_type == "stream" and o.name == "stdout")


def check_distributed(r: Ran) -> None:
    start = r.stdout("start")
    assert [f"neuron_lab: rank {k} ready: pid" in start for k in range(4)] == [True] * 4, start
    assert "4 ranks ready in " in start
    setup = _ranks_out(r, "setup")
    assert all(f"[stdout:{k}] rank {k} of 4 on neuron:{k}, 4 devices in this process" in setup for k in range(4)), setup

    ddp = _shown(r, "ddp", "neuron_lab In[")
    assert ddp[0].startswith(f"neuron_lab In[{r.n('ddp')}] · 4 ranks · slowest rank ")
    assert " · 32 collective calls · no CPU fallbacks" in ddp[0], ddp[0]
    ranks = _rank_lines(ddp)
    assert [ranks[str(k)][0] for k in range(4)] == ["neuron:0", "neuron:1", "neuron:2", "neuron:3"]
    assert {ranks[str(k)][2] for k in range(4)} == {"2.19 MiB"}  # the same model and optimizer state on each rank
    assert all(ranks[str(k)][5].startswith("8 calls, 1.75 MiB, ") for k in range(4)), ranks
    backward = r.line("ddp", "loss.backward()")
    reduce = _starting(ddp, "    c10d::all_reduce.sum                  12× ")
    assert ddp[reduce].endswith("5.24 MiB over 4 ranks  [114400] float32"), ddp[reduce]
    assert ddp[reduce + 1] == f"        at In[{r.n('ddp')}] line {backward}: loss.backward()  (12×)"
    printed = _ranks_out(r, "ddp")
    losses = [re.search(rf"\[stdout:{k}\] rank {k}: loss (\S+), parameters on this rank 457,600 bytes", printed)
              for k in range(4)]
    assert all(losses), printed

    fsdp = _shown(r, "fsdp", "neuron_lab In[")
    assert " · 96 collective calls · no CPU fallbacks" in fsdp[0], fsdp[0]
    ranks = _rank_lines(fsdp)
    assert {ranks[str(k)][2] for k in range(4)} == {"450.88 KiB"}  # a quarter of each weight, and its optimizer state
    out = _ranks_out(r, "fsdp")
    for k in range(4):  # FSDP2 trains the same model to the same loss as DDP, on each rank's own data
        assert f"[stdout:{k}] rank {k}: loss {losses[k][1]}, parameters on this rank 114,400 bytes (0.25 of DDP's)" \
            in out, out
    _starting(fsdp, "    c10d::reduce_scatter_tensor.avg       36× ")
    assert f"        at In[{r.n('fsdp')}] line {r.line('fsdp', 'loss.backward()')}: loss.backward()  (36×)" in fsdp
    _starting(fsdp, "    c10d::all_gather_into_tensor          60× ")

    profiled = _shown(r, "profile", "neuron_lab In[")  # one FSDP2 step under torch.profiler on every rank
    assert " · 32 collective calls · no CPU fallbacks" in profiled[0], profiled[0]
    assert "profiled on 4 ranks: op table and time per line of rank 0, the timeline of all ranks on one clock" \
        in profiled
    # the op and kind columns are as wide as the longest shown (the optimizer's possible fallbacks are there too)
    gathers = profiled[_matching(profiled, r"  c10d::all_gather_into_tensor +collective +5 ")]
    # device work, no host time of its own; the columns' widths depend on the times measured, so not the spacing
    assert re.search(r" 0 µs +\[3608\] float32 ", gathers), gathers
    scatters = profiled[_matching(profiled, r"  c10d::reduce_scatter_tensor\.avg +collective +3 ")]
    assert re.search(rf"\[49984\] float32 +In\[{r.n('profile')}\] line {r.line('profile', 'loss.backward()')}$",
                     scatters), scatters
    lanes = [x for x in profiled if x.startswith("  rank ") and " events, busy " in x]
    assert [x.split(": ")[0] for x in lanes] == [f"  rank {k} neuron:{k}" for k in range(4)], lanes
    html = next(o.data["text/html"] for o in r.cell("profile").outputs if "text/html" in o.get("data", {}))
    assert html.count("data-kind='collective'") >= 4 * 8, "each rank's 8 collectives on its lane"
    assert not [o for o in r.cell("profile").outputs if "USDT" in o.get("text", "")]  # Kineto's session lines

    flagged = _shown(r, "unsupported", "neuron_lab In[")
    assert " · 6 collective calls · no CPU fallbacks · 2 unsupported calls" in flagged[0], flagged[0]
    i = _starting(flagged, "  not supported on TorchNeuron (1 op, 2 calls, ")
    assert flagged[i + 1].startswith("    c10d::barrier                          2×") and flagged[i + 1].endswith(
        "0 B over 2 ranks  why [1]"), flagged[i + 1]
    assert flagged[i + 2].startswith(f"        at In[{r.n('unsupported')}] line 4: dist.barrier(group=pair)")
    assert "    [1] TorchNeuron's barrier runs on the default group only (nrt_barrier), not on a subgroup" in flagged
    barriers = [x for x in flagged if x.startswith("    c10d::barrier ")]  # a row per group size
    assert [x[x.index("0 B over"):] for x in barriers] == [
        "0 B over 2 ranks  why [1]", "0 B over 4 ranks", "0 B over 2 ranks"], barriers
    assert r.value("stop").startswith("neuron_lab ranks: stopped 4 ranks (pids ")
    r.says("all 114,400 gradients", "64 logical NeuronCores")


def _shown(r: Ran, tag: str, prefix: str) -> list[str]:
    """The lines of the one display under the cell whose text/plain starts with ``prefix``."""
    shown = [o.data["text/plain"] for o in r.cell(tag).outputs
             if "data" in o and o.data.get("text/plain", "").startswith(prefix)]
    assert len(shown) == 1, f"{tag}: {len(shown)} outputs starting {prefix!r}"
    return shown[0].splitlines()


CHECKS: dict[str, Callable[[Ran], None]] = {
    "01_quickstart.ipynb": check_quickstart,
    "02_finding_fallbacks.ipynb": check_finding_fallbacks,
    "03_memory.ipynb": check_memory,
    "04_eager_vs_compile.ipynb": check_eager_vs_compile,
    "05_on_trainium.ipynb": check_on_trainium,
    "06_huggingface.ipynb": check_huggingface,
    "07_language_model.ipynb": check_language_model,
    "08_distributed.ipynb": check_distributed,
}


def test_every_notebook_has_checks() -> None:
    assert NOTEBOOKS, "no notebooks found"
    assert set(CHECKS) == {p.name for p in NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_and_shows_what_it_says(path: Path, tmp_path: Path) -> None:
    check = CHECKS.get(path.name)
    assert check is not None, f"{path.name} has no checks in CHECKS"
    check(Ran(_execute(path, tmp_path)))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_notebook_has_no_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code
    assert [i for i, c in enumerate(code) if c.outputs or c.execution_count is not None] == []
    assert "widgets" not in nb.metadata
    assert [i for i, c in enumerate(nb.cells) if "execution" in c.metadata] == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_has_the_python3_kernel_and_ends_on_a_trn_instance(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    last = nb.cells[-1]  # the closing section: what a user on Trainium sees differently
    assert last.cell_type == "markdown" and last.source.startswith("## On a Trn instance"), last.source[:80]
