"""What ``%load_ext neuron_lab`` costs on top of ``import torch``, as a difference and a ratio measured in one run.

Issue 28: loading the extension took 5.6–10.8 s with nothing shown, 3.3 s of it importing ``torch._dynamo``
eagerly. Import costs are paid once per process, so every sample is a fresh interpreter, two kinds of them:

- ``torch``: ``import torch``, then a real IPython shell (history off);
- ``torch + load_ext``: the same, then ``%load_ext neuron_lab`` in that shell.

Rounds alternate which kind starts first. Each child times ``import torch`` and the load with
``time.perf_counter`` and names which of the heavy modules it has imported by the end. The load's cost is its
own time after ``import torch`` (target: at most 1 s), and the ratio of ``import torch`` plus the load to the
same round's ``import torch`` alone; medians and bests over rounds.

    .venv/bin/python bench/load_ext.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

HEAVY = ("torch._dynamo", "torch._inductor", "torch._functorch.aot_autograd", "sympy", "ipywidgets", "matplotlib")
TARGET_S = 1.0
KINDS = ("torch", "torch + load_ext")


def child(load: bool) -> dict:
    """One process: seconds to ``import torch``, to make a shell and to load the extension into it."""
    t0 = time.perf_counter()
    import torch  # noqa: F401

    t1 = time.perf_counter()
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output
    from traitlets.config import Config

    c = Config()
    c.HistoryAccessor.enabled = False
    sh = InteractiveShell(config=c)
    t2 = time.perf_counter()
    banner = ""
    if load:
        with capture_output() as cap:
            sh.run_line_magic("load_ext", "neuron_lab")
        banner = cap.stdout.strip()
    t3 = time.perf_counter()
    return {"import_torch_s": t1 - t0, "shell_s": t2 - t1, "load_s": t3 - t2, "banner": banner,
            "heavy": [m for m in HEAVY if m in sys.modules]}


def run_child(load: bool) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", "load" if load else "torch"],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7, help="rounds, each one fresh process of each kind")
    ap.add_argument("--child", choices=("torch", "load"), help=argparse.SUPPRESS)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child == "load")))
        return 0
    rounds = []
    for i in range(args.rounds):
        order = (False, True) if i % 2 == 0 else (True, False)
        got = {load: run_child(load) for load in order}
        rounds.append({KINDS[load]: got[load] for load in (False, True)})
    torch_s = [r[KINDS[0]]["import_torch_s"] for r in rounds]
    load_s = [r[KINDS[1]]["load_s"] for r in rounds]
    ratios = [(r[KINDS[1]]["import_torch_s"] + r[KINDS[1]]["load_s"]) / r[KINDS[0]]["import_torch_s"] for r in rounds]
    last = rounds[-1][KINDS[1]]
    print(f"%load_ext neuron_lab against import torch, {args.rounds} interleaved rounds of fresh processes")
    print(f"import torch: {statistics.median(torch_s):.2f} s median, {min(torch_s):.2f} s min")
    print(f"%load_ext neuron_lab after it: {statistics.median(load_s):.2f} s median, {min(load_s):.2f} s min")
    print(f"(import torch + %load_ext) / the round's import torch: {statistics.median(ratios):.2f}x median, "
          f"{min(ratios):.2f}x min")
    print(f"heavy modules imported by the load: {', '.join(last['heavy']) or 'none'}")
    print(f"shown at load: {last['banner'] or '(nothing)'}")
    verdict = "met" if statistics.median(load_s) <= TARGET_S else "MISSED"
    print(f"target at most {TARGET_S:.0f} s beyond import torch: {verdict}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rounds, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
