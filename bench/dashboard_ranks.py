"""What the live dashboard costs a `%%neuron ranks` cell when it shows the ranks (issue 30: <= 5% of the cell's time).

With ranks started and a dashboard open, each rank's side thread answers the notebook's question a few times a second
(``NeuronLab.widget_refresh_hz``) with its counters (``session.rank_pulse``): that work shares the rank's GIL with the
cell. So this starts 2 real ranks on 2 emulated hosts in an in-process IPython shell and runs one training cell on
them (an MLP on ``neuron`` with AdamW whose forward calls ``torch.atan2``, a CPU fallback, so the counters move),
which times its own loop on each rank; the cell's time is the slower rank's. Configurations: no dashboard (twice: the
A/A control) and the dashboard open (a widget, so the refresh thread asks the ranks while the cell runs), in an
order that rotates per round. The ratio is the dashboard's cell over the geometric mean of the round's two
no-dashboard cells; the A/A ratio is the noise floor. A load-independent figure beside it: the CPU time one answer
takes on a rank (``rank_pulse.reading`` and its JSON), times the answers per second, as a share of a second.

    .venv/bin/python bench/dashboard_ranks.py [--rounds 5] [--seconds 2] [--figures out.json]
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from traitlets.config import Config

TARGET_PCT = 5.0
HZ = 4.0  # the dashboard's default pace (NeuronLab.widget_refresh_hz)
RANKS = 2

TRAIN = """%%neuron ranks --timeout 300
import os, time, torch
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256)).to(device)
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(64, 256, device=device)
t0 = time.perf_counter()
for _ in range({steps}):
    opt.zero_grad()
    torch.atan2(model(x), x).square().mean().backward()
    opt.step()
loop_s = time.perf_counter() - t0
with open(f"{out}/loop-{{os.getpid()}}", "w") as f:
    f.write(repr(loop_s))
"""
ANSWER = """%%neuron ranks
import json, os, time
from neuron_lab.extension import session_of
from neuron_lab.session import rank_pulse
session = session_of(get_ipython())
t0 = time.process_time()
for _ in range(200):
    json.dumps(rank_pulse.reading(session))
with open(f"{out}/answer-{{os.getpid()}}", "w") as f:
    f.write(repr((time.process_time() - t0) / 200))
"""


def _cell(sh: InteractiveShell, code: str, what: str, out: Path) -> float:
    """Run ``code`` on the ranks; the slowest rank's ``what`` figure. Each rank writes its own to a file in ``out``
    (the ranks share this machine): their printed lines are collapsed and shown as the frontend shows them, not
    read back."""
    with capture_output() as cap:
        res = sh.run_cell(code, store_history=True)
    if not res.success:
        raise SystemExit(f"the cell failed: {res.error_in_exec}\n{cap.stdout}")
    files = list(out.glob(f"{what}-*"))
    if len(files) != RANKS:
        raise SystemExit(f"{len(files)} of {RANKS} ranks wrote their {what} figure:\n{cap.stdout[-2000:]}")
    values = [float(f.read_text()) for f in files]
    for f in files:
        f.unlink()
    return max(values)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0, help="the training loop's length, about")
    ap.add_argument("--figures", metavar="FILE", help="write the figures as JSON (bench/figures.py)")
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(__file__))
    from figures import figure, write

    c = Config()
    c.HistoryAccessor.enabled = False
    sh = InteractiveShell.instance(config=c)
    with capture_output():
        sh.run_line_magic("load_ext", "neuron_lab")
        sh.run_cell(f"%config NeuronLab.display_as = 'widget'\n%config NeuronLab.widget_refresh_hz = {HZ}")
        sh.run_cell(f"%neuron ranks start {RANKS} --hosts 2 --timeout 300")
    out = Path(tempfile.mkdtemp(prefix="dashboard_ranks-"))
    try:
        steps = 20
        per_step = _cell(sh, TRAIN.format(steps=steps, out=out), "loop", out) / steps  # warm-up, and sizes the loop
        steps = max(20, int(args.seconds / per_step))
        configs = {"none": "pass", "none again": "pass", "dashboard": "panel = %neuron dashboard"}
        after = {"none": "pass", "none again": "pass", "dashboard": "panel.close()\ndel panel"}
        times: dict[str, list[float]] = {k: [] for k in configs}
        order = list(configs)
        for r in range(args.rounds):
            for name in order[r % 3:] + order[:r % 3]:
                with capture_output():
                    sh.run_cell(configs[name])
                times[name].append(_cell(sh, TRAIN.format(steps=steps, out=out), "loop", out))
                with capture_output():
                    sh.run_cell(after[name])
        answer_s = _cell(sh, ANSWER.format(out=out), "answer", out)
    finally:
        with capture_output():
            sh.run_cell("%neuron ranks stop")
        shutil.rmtree(out, ignore_errors=True)
    base = [math.sqrt(a * b) for a, b in zip(times["none"], times["none again"], strict=True)]
    pct = [100 * (d / b - 1) for d, b in zip(times["dashboard"], base, strict=True)]
    aa = [100 * (b / a - 1) for a, b in zip(times["none"], times["none again"], strict=True)]
    share = 100 * answer_s * HZ
    print(f"2 ranks on 2 emulated hosts, {steps} steps a cell (~{statistics.median(base):.2f} s), "
          f"{args.rounds} rounds, dashboard at {HZ:g} Hz")
    print("| figure | median | target |\n|---|---|---|")
    print(f"| the dashboard's cost, % of the cell | {statistics.median(pct):+.1f}% | <= {TARGET_PCT:g}% |")
    print(f"| A/A (no dashboard, twice) | {statistics.median(aa):+.1f}% | - |")
    print(f"| one answer on a rank (CPU) | {answer_s * 1e6:.0f} µs | - |")
    print(f"| answers' CPU, % of a rank's second at {HZ:g} Hz | {share:.3f}% | <= {TARGET_PCT:g}% |")
    write(args.figures, [figure("dashboard with ranks: % of the cell", pct, "%", TARGET_PCT),
                         figure("dashboard with ranks: A/A control", aa, "%", None),
                         figure("dashboard with ranks: answers' CPU share", [share], "%", TARGET_PCT)])


if __name__ == "__main__":
    main()
