"""An exported trace opens in a real trace viewer, offline: tools/render_trace.py loads it into speedscope in
headless Chromium, and the viewer shows the ``neuron:0`` lane with the kernels the trace holds, no more, no less.

What is compared is the viewer's own model (its lane list and the profile it exports), against the trace file
a script wrote with ``neuron_lab.profile(export=...)`` around one MLP training step with a CPU fallback. A viewer
that cannot parse a file, or a trace with no device lane, makes the tool exit 1 with the reason.

Skipped when Chromium, Playwright or the speedscope npm package is absent (the skip reason says how to install
it); the device lane needs the compiled core (torch.profiler's PrivateUse1 hooks are C++ only).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from browser import in_ci
from conftest import core

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "render_trace.py"
TIMEOUT = 180  # seconds for each child: the training step takes ~6 s here, the viewer ~5 s

_spec = importlib.util.spec_from_file_location("render_trace", SCRIPT)
render_trace = sys.modules["render_trace"] = importlib.util.module_from_spec(_spec)  # dataclasses look it up
_spec.loader.exec_module(render_trace)

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _viewer() -> None:
    """Skip (or, in CI, fail: `make test` installs speedscope) unless Chromium, Playwright and speedscope are here."""
    missing = render_trace.missing()
    if missing:
        message = "the trace viewer needs: " + "; ".join(missing)
        if in_ci():
            pytest.fail(f"CI never skips the trace viewer: {message}", pytrace=False)
        pytest.skip(message)

TRAIN_STEP = """\
import sys, torch, neuron_lab
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to("neuron")
opt = torch.optim.SGD(net.parameters(), lr=0.1)
x = torch.randn(8, 16, device="neuron")
target = torch.randn(8, 4, device="neuron")
torch.atan2(x, x)  # warm: the first call classifies the op
with neuron_lab.profile(export=sys.argv[1]):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(torch.atan2(net(x), x[:, :4]), target)  # atan2: a CPU fallback
    loss.backward()
    opt.step()
"""


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """Run a child Python; subprocess.run kills it if it outlives TIMEOUT."""
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=TIMEOUT,
                          cwd=ROOT, env={**os.environ})


def render(trace: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return run(SCRIPT, trace, out)


@pytest.mark.skipif(core() != "compiled", reason="the neuron:0 lane comes from the compiled core's profiler hooks")
def test_the_viewer_shows_the_device_lane_with_every_kernel_of_the_trace(tmp_path: Path) -> None:
    script, trace, shot = tmp_path / "step.py", tmp_path / "step.json", tmp_path / "step.png"
    script.write_text(TRAIN_STEP)
    made = run(script, trace)
    assert made.returncode == 0, made.stderr[-4000:]
    events = json.loads(trace.read_text())["traceEvents"]
    kernels = Counter(e["name"] for e in events if e.get("ph") == "X" and e.get("pid") == 0)
    assert kernels["aten::addmm"] == 2 and "aten::atan2" not in kernels  # the fallback ran on the host

    shown = render(trace, shot)
    assert shown.returncode == 0, shown.stderr[-4000:]
    lines = shown.stdout.splitlines()
    assert lines[0].startswith(f"speedscope@{render_trace.SPEEDSCOPE_VERSION} loaded {trace}: ")
    assert "  neuron:0 (pid 0), kernels (tid 0)" in lines
    lane = next(line for line in lines if line.startswith("neuron:0 (pid 0), kernels (tid 0): "))
    head, _, ops = lane.partition(" events: ")
    assert head == f"neuron:0 (pid 0), kernels (tid 0): {sum(kernels.values())}"
    assert dict(op.rsplit(" ×", 1) for op in ops.split(", ")) == {op: str(n) for op, n in kernels.items()}
    left_out = next(line for line in lines if line.startswith("left out before loading"))
    assert "aten::" not in left_out  # only Kineto's bookkeeping events are left out
    assert lines[-1] == f"screenshot: {shot}"
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("events", "message"), [
    ([], "speedscope did not load {trace}: Unrecognized format! See documentation about supported formats."),
    # a string tid trips speedscope's importer (the same bug as a string pid, speedscope#480)
    ([{"ph": "X", "name": "aten::mm", "pid": 0, "tid": "kernels", "ts": 0, "dur": 5}],
     "speedscope did not load {trace}: Something went wrong."),
    ([{"ph": "M", "name": "process_name", "pid": 7, "tid": 0, "args": {"name": "python"}},
      {"ph": "X", "name": "aten::mm", "pid": 7, "tid": 1, "ts": 0, "dur": 5}],
     "speedscope shows no neuron:0 lane in {trace}; its lanes: ['python (pid 7, tid 1)']"),
], ids=["unrecognized", "parse-error", "no-device-lane"])
def test_a_trace_the_viewer_cannot_show_fails_loudly(tmp_path: Path, events: list, message: str) -> None:
    trace, shot = tmp_path / "bad.json", tmp_path / "bad.png"
    trace.write_text(json.dumps({"traceEvents": events}))
    shown = render(trace, shot)
    assert shown.returncode == 1 and shown.stdout == ""
    assert shown.stderr.splitlines()[0] == f"render_trace: {message.format(trace=trace)}"
    assert not shot.exists()
