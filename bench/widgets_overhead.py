"""What the live dashboard costs a training loop in a real kernel, as ratios measured in one run, single-threaded.

The cost of a shown dashboard is the refresh thread's counter reads and the comm messages it
serializes onto IOPub while a cell runs, and the rebuild of every view's data after each cell. So
this runs a real IPython kernel (jupyter_client, this venv's python) and a client that drains IOPub
as a frontend does (``execute_interactive``). In the kernel: ``%load_ext neuron_lab`` (auto-report
on, so every cell ends with a report), one torch thread, a small MLP on ``neuron`` with AdamW whose
forward calls ``torch.atan2`` twice (a CPU fallback, so the fallback counter, and with it ``live``,
moves every tick). The training cell times its own loop with ``time.perf_counter`` and prints it.

Configurations: no dashboard (twice: the A/A control) and the full dashboard open and updating
(``neuron_lab.dashboard()`` shown with ``IPython.display.display``, so the kernel holds a displayed
widget whose messages the client receives). Fairness: the model, optimizer and data are the same
objects throughout; every configuration runs three cells, untimed-timed-untimed: a cell before
(``gc.collect()``, and for the dashboard its opening and display), the training cell, and a cell after
(for the dashboard, timing ``panel.refresh()`` and closing it; otherwise ``pass``), so history and
cell numbers grow alike and no dashboard outlives its configuration. Each configuration runs once
first untimed (which also sizes the loop to ``--seconds``); then every round runs each configuration
once, in an order that rotates per round. The dashboard cell's ratio is its time over the geometric
mean of the round's two no-dashboard cells; the second no-dashboard cell over the first is the A/A
control that shows the noise floor. Two times per cell: the loop (in the kernel; the kernel's process
CPU time, which includes the refresh and IOPub threads, is kept as a cross-check) and the whole cell
as the client sees it, from execute request to idle (the after-cell refresh and the report included).
The table shows medians over rounds, and best of the rounds over best without.

Also shown: the comm messages each training cell sends (``live`` updates, whose rate shows the
throttle at ``NeuronLab.widget_refresh_hz``, and the after-cell ``data`` update with its size), and the
after-cell refresh in milliseconds: ``panel.refresh()`` timed inside the kernel, after the training
cell, with the data made stale first so that it is sent as after a real cell. Finally the CPU time
the kernel's other threads (the refresh thread, IOPub) spent during the loop, as a share of it: a
load-independent estimate of what the loop waits for while they hold the GIL, for when the
machine is too busy for the wall-clock ratios to resolve 5%.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import figures  # bench/ is the script directory
from workload import MODEL

ROOT = Path(__file__).resolve().parents[1]

SETUP = """\
import gc, json, sys, threading, time
import torch
import torch.nn.functional as F
from IPython.display import display
import neuron_lab
%load_ext neuron_lab
%config NeuronLab.widget_refresh_hz = {hz}
torch.set_num_threads(1)

""" + MODEL + """
def _bench_thread_cpu():
    # CPU seconds of each thread but the main one (ipykernel's IOPub, the widgets' refresh thread, ...)
    out = {{}}
    for t in threading.enumerate():
        if t is not threading.main_thread():
            try:
                out[t.name] = out.get(t.name, 0.0) + time.clock_gettime(time.pthread_getcpuclockid(t.ident))
            except OSError:  # it ended meanwhile
                pass
    return out

print("BENCH", json.dumps({{"executable": sys.executable}}))
"""

LOOP = """\
_bench_th0 = _bench_thread_cpu()
_bench_t0, _bench_c0 = time.perf_counter(), time.process_time()
for _ in range({steps}):
    opt.zero_grad(set_to_none=True)
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
_bench_loss = loss.item()
_bench_loop_s, _bench_loop_cpu = time.perf_counter() - _bench_t0, time.process_time() - _bench_c0
_bench_th1 = _bench_thread_cpu()
print("BENCH", json.dumps({{"loop": _bench_loop_s, "loop_cpu": _bench_loop_cpu,
                           "threads": {{n: c - _bench_th0.get(n, 0.0) for n, c in _bench_th1.items()}}}}))
"""

NONE, NONE_AGAIN, DASH = "no dashboard", "no dashboard, again", "dashboard shown"
CONFIGS = (NONE, DASH, NONE_AGAIN)  # the starting order; it rotates per round
BEFORE = {NONE: "gc.collect()", NONE_AGAIN: "gc.collect()",
          DASH: "_bench_panel = neuron_lab.dashboard()\ndisplay(_bench_panel)\ngc.collect()"}
AFTER_DASH = """\
_bench_ms = []
for _ in range({n}):
    _bench_panel.data = {{}}  # stale, so the timed refresh sends the whole data as after a cell
    _bench_t0 = time.perf_counter()
    _bench_panel.refresh()
    _bench_ms.append((time.perf_counter() - _bench_t0) * 1e3)
print("BENCH", json.dumps({{"refresh_ms": _bench_ms, "hub_error": repr(_bench_panel.hub.error)}}))
_bench_panel.close()
del _bench_panel
"""
AFTER = {NONE: "pass", NONE_AGAIN: "pass", DASH: AFTER_DASH}
TARGET = 1.05
REFRESH_THREAD = "neuron_lab-widgets"  # hub.py names it so
NOISY = 0.05  # an A/A interquartile range wider than this either side of 1 gets a note
MEASURES = (("loop", "loop (in cell)"), ("cell", "whole cell (client)"))


class Kernel:
    """A real kernel and a client that drains IOPub, counting the comm messages each cell sends."""

    def __init__(self, log: Path) -> None:
        from jupyter_client.manager import start_new_kernel

        self.log = log
        self._err = log.open("w")
        env = {**os.environ, "IPYTHONDIR": str(log.parent / "ipython")}
        # "python" in the kernelspec becomes this interpreter, so the kernel runs this venv
        self.km, self.kc = start_new_kernel(kernel_name="python3", cwd=str(ROOT), env=env,
                                            stdout=subprocess.DEVNULL, stderr=self._err)

    def run(self, code: str, timeout: float = 300) -> dict[str, Any]:
        """Execute ``code``; its ``BENCH`` lines, client-side wall seconds and comm messages (live / data, bytes)."""
        printed: list[str] = []
        comm = {"live": 0, "data": 0, "data_bytes": 0}

        def hook(msg: dict) -> None:
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream" and content["name"] == "stdout":
                printed.append(content["text"])
            elif kind == "comm_msg":
                state = content.get("data", {}).get("state", {})
                if "data" in state:
                    comm["data"] += 1
                    comm["data_bytes"] += len(json.dumps(state["data"]))
                elif "live" in state:
                    comm["live"] += 1
            elif kind == "error":
                printed.append("\n".join(content["traceback"]))

        t = time.perf_counter()
        reply = self.kc.execute_interactive(code, output_hook=hook, allow_stdin=False, timeout=timeout)
        wall = time.perf_counter() - t
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"the cell failed:\n{code}\n{''.join(printed)}")
        out: dict[str, Any] = {"cell": wall, **comm}
        for line in "".join(printed).splitlines():
            if line.startswith("BENCH "):
                out.update(json.loads(line[len("BENCH "):]))
        return out

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)
        self._err.close()


def measure(repeat: int = 20, steps: int | None = None, seconds: float = 1.5, hz: float = 4.0, batch: int = 64,
            width: int = 128, refreshes: int = 5) -> dict:
    """Per-round ratios of the dashboard configuration (and the A/A control), comm counts and refresh times."""
    with tempfile.TemporaryDirectory() as tmp:
        kernel = Kernel(Path(tmp) / "kernel.log")
        try:
            return _measure(kernel, repeat, steps, seconds, hz, batch, width, refreshes)
        except Exception:
            sys.stderr.write(f"kernel log:\n{kernel.log.read_text()[-4000:]}\n")
            raise
        finally:
            kernel.close()


def _measure(kernel: Kernel, repeat: int, steps: int | None, seconds: float, hz: float, batch: int, width: int,
             refreshes: int) -> dict:
    info = kernel.run(SETUP.format(hz=hz, batch=batch, width=width))
    if os.path.realpath(info["executable"]) != os.path.realpath(sys.executable):
        raise RuntimeError(f"the kernel runs {info['executable']}, not {sys.executable}: a python3 kernelspec "
                           "elsewhere takes precedence")
    after_dash = AFTER_DASH.format(n=refreshes)

    def config_cells(config: str, loop: str) -> dict[str, Any]:
        kernel.run(BEFORE[config])
        t = kernel.run(loop)
        a = kernel.run(after_dash if config == DASH else AFTER[config])
        if config == DASH:
            assert t["live"] > 0 and t["data"] == 1, f"the dashboard did not update while the cell ran: {t}"
            assert a["hub_error"] == "None", f"the refresh thread failed: {a['hub_error']}"
            t["refresh_ms"] = statistics.median(a["refresh_ms"])
        else:
            assert t["live"] == t["data"] == 0, f"a closed dashboard still sends: {t}"
        return t

    if steps is None:  # the loop's pace, warm
        probe = LOOP.format(steps=50)
        kernel.run(probe)
        steps = max(1, round(50 * seconds / kernel.run(probe)["loop"]))
    loop = LOOP.format(steps=steps)
    for config in CONFIGS:  # warm-up, untimed
        config_cells(config, loop)
    times: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGS}
    for r in range(repeat):
        for i in range(len(CONFIGS)):
            config = CONFIGS[(r + i) % len(CONFIGS)]
            times[config].append(config_cells(config, loop))
    keys = ("loop", "loop_cpu", "cell")
    base = [{k: (a[k] * b[k]) ** 0.5 for k in keys} for a, b in zip(times[NONE], times[NONE_AGAIN])]
    ratios = {DASH: {k: [t[k] / b[k] for t, b in zip(times[DASH], base)] for k in keys},
              NONE_AGAIN: {k: [b[k] / a[k] for a, b in zip(times[NONE], times[NONE_AGAIN])] for k in keys}}
    best = {k: min(t[k] for t in times[NONE] + times[NONE_AGAIN]) for k in keys}
    best_ratios = {DASH: {k: min(t[k] for t in times[DASH]) / best[k] for k in keys},
                   NONE_AGAIN: {k: min(t[k] for t in times[NONE_AGAIN]) / min(t[k] for t in times[NONE])
                                for k in keys}}
    return {"times": times, "ratios": ratios, "best_ratios": best_ratios, "steps": steps, "repeat": repeat,
            "hz": hz}


def rows(repeat: int = 20, seconds: float = 1.5) -> list[dict]:
    """Rows in bench/run.py's format (name, ratio, target, float details): medians of the wall-clock ratios."""
    m = measure(repeat=repeat, seconds=seconds)
    return [{"name": f"dashboard shown: {label}", "ratio": statistics.median(m["ratios"][DASH][what]),
             "target": f"<= {TARGET:.2f}x no dashboard"} for what, label in MEASURES]


def _iqr(xs: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return q[0], q[2]


def _quartiles(xs: list[float]) -> str:
    return "{:.3f}-{:.3f}".format(*_iqr(xs))


def own_share(dash: list[dict], nodash: list[dict]) -> list[float]:
    """Per dashboard round, in percent of its loop's CPU time: the CPU time the kernel's other threads spent beyond
    what they spend without the dashboard (the median share of those rounds), and the after-cell refresh (timed by
    the clock: an upper bound). A direct count of the dashboard's work, which a busy machine inflates far less than
    it spreads two whole cells' times."""
    base = statistics.median(sum(t["threads"].values()) / t["loop_cpu"] for t in nodash)
    return [100 * (sum(t["threads"].values()) - base * t["loop_cpu"] + t["refresh_ms"] / 1e3) / t["loop_cpu"]
            for t in dash]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=20, help="rounds (each runs every configuration once)")
    ap.add_argument("--steps", type=int, help="training steps per cell (default: as many as --seconds takes)")
    ap.add_argument("--seconds", type=float, default=1.5, help="the training loop's length, without --steps")
    ap.add_argument("--hz", type=float, default=4.0, help="NeuronLab.widget_refresh_hz")
    ap.add_argument("--json", help="also write the measurements to this file")
    ap.add_argument("--figures", help="also write the CPU-time figures here (bench/table.py)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    m = measure(repeat=args.repeat, steps=args.steps, seconds=args.seconds, hz=args.hz)
    dash = m["times"][DASH]
    own = own_share(dash, m["times"][NONE] + m["times"][NONE_AGAIN])
    figures.write(args.figures, [
        figures.figure("live dashboard, per tracked cell (CPU time)", m["ratios"][DASH]["loop_cpu"], "x", TARGET),
        figures.figure("no dashboard, A/A control (CPU time)", m["ratios"][NONE_AGAIN]["loop_cpu"], "x", None),
        figures.figure("live dashboard's own work, share of the cell's loop", own, "%", (TARGET - 1) * 100)])
    loop_s = statistics.median(t["loop"] for t in m["times"][NONE] + m["times"][NONE_AGAIN])
    print(f"real kernel, 1 torch thread, {m['steps']} AdamW steps per cell ({loop_s:.2f} s without the dashboard, "
          f"2 atan2 CPU fallbacks per step), full dashboard at {m['hz']:g} Hz; medians of {args.repeat} "
          "interleaved rounds after a warm-up")
    print("ratio: the cell with the dashboard shown / the same cell without, by wall clock, median over rounds; "
          "IQR: interquartile range of the rounds' ratios; best: best of the rounds / best without; CPU: median "
          "ratio of the kernel's process CPU time over the loop (all its threads)\n")
    print(f"| {'configuration':<19} | {'measured':<19} | {'ratio (median)':>14} | {'IQR':>11} | {'best':>6} | "
          f"{'CPU':>6} | {'target':>7} | met? |")
    print(f"|{'-' * 21}|{'-' * 21}|{'-' * 16}|{'-' * 13}|{'-' * 8}|{'-' * 8}|{'-' * 9}|------|")
    aa = _iqr(m["ratios"][NONE_AGAIN]["loop"])
    noisy = aa[0] < 1 - NOISY or aa[1] > 1 + NOISY
    for config in (DASH, NONE_AGAIN):
        for what, label in MEASURES:
            rs = m["ratios"][config]
            med = statistics.median(rs[what])
            cpu = f"{statistics.median(rs['loop_cpu']):>5.3f}x" if what == "loop" else f"{'-':>6}"
            if config == DASH:
                target, verdict = f"<= {TARGET:.2f}", ("yes" if med <= TARGET else "NO") + ("?" if noisy else "")
            else:
                target, verdict = "(A/A)", "-"
            print(f"| {config:<19} | {label:<19} | {med:>13.3f}x | {_quartiles(rs[what])} | "
                  f"{m['best_ratios'][config][what]:>5.3f}x | {cpu} | {target:>7} | {verdict:<4} |")
    if noisy:
        print(f"\n?: the A/A control's IQR ({aa[0]:.3f}-{aa[1]:.3f}) is wider than +-{NOISY:.0%}: the machine is busy, "
              "so these timings cannot resolve the target")
    live = statistics.median(t["live"] for t in dash)
    rate = statistics.median(t["live"] / t["cell"] for t in dash)
    print(f"\ncomm messages per training cell with the dashboard: {live:g} `live` updates (median; {rate:.2f} per "
          f"second of cell at {m['hz']:g} Hz), then 1 `data` update of {dash[0]['data_bytes'] / 1e3:.1f} kB in the "
          f"first round, {dash[-1]['data_bytes'] / 1e3:.1f} kB in the last")
    nodash = m["times"][NONE] + m["times"][NONE_AGAIN]

    def share(ts: list[dict], names: tuple[str, ...] | None = None) -> float:
        return statistics.median(sum(c for n, c in t["threads"].items() if names is None or n in names) / t["loop"]
                                 for t in ts)

    print(f"CPU time of the kernel's other threads during the loop, as a share of it (median; while they hold the "
          f"GIL the loop waits): the refresh thread {share(dash, (REFRESH_THREAD,)):.2%}, IOPub "
          f"{share(dash, ('IOPub',)):.2%} ({share(nodash, ('IOPub',)):.2%} without the dashboard), all of them "
          f"{share(dash):.2%} ({share(nodash):.2%} without)")
    refresh = [t["refresh_ms"] for t in dash]
    print(f"after-cell refresh (`panel.refresh()` in the kernel, data rebuilt and sent): "
          f"{statistics.median(refresh):.1f} ms median over rounds ({refresh[0]:.1f} ms in the first round, "
          f"{refresh[-1]:.1f} ms in the last), {statistics.median(refresh) / 1e3 / loop_s:.2%} of the loop")
    lo, hi = figures.median_ci(own)
    print(f"the dashboard's own work per cell (the CPU time its refresh thread and IOPub add during the loop, and the "
          f"after-cell refresh), as a share of the loop's CPU time: {statistics.median(own):.2f}% (95% CI {lo:.2f}-"
          f"{hi:.2f}%, {len(own)} rounds; target <= {(TARGET - 1) * 100:.0f}%: "
          f"{'holds' if hi <= (TARGET - 1) * 100 else 'does not hold' if lo > (TARGET - 1) * 100 else 'not resolved'})")
    print(f"\n({time.perf_counter() - t0:.0f} s in all)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(m, f, indent=1)


if __name__ == "__main__":
    main()
