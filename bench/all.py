"""`make bench`: every bench script, each timed, then one table of every figure with its target (bench/table.py).

Two lanes run side by side. The scripts whose figures are times run one after another ("timed"): each measures
CPU time or interleaved rounds in a process of its own and wants the machine as quiet as it can be had. The scripts
whose figures are counts ("counted": instructions under callgrind, device syncs), which no load moves, run beside
them one after another: valgrind's minutes then overlap the timed scripts instead of adding to them. A script that
fails is said, with the end of its output, and leaves its figures out; the others and the table still run. Each
script's output goes to ``OUT/NAME.log`` and is printed when it ends; at the end, what each script took (wall and
CPU time, the load average), so a slow run shows where its time went (also written to ``OUT/steps.txt``).

    python bench/all.py [--callgrind-rounds 2] [--out out/bench] [--table out/bench.json] [--only NAME ...]
        [--compare main.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import table

HERE = Path(__file__).resolve().parent
DEADLINE_S = 3000  # one script's (callgrind.run's own); longer is a hang, said and killed
# the table's order: issue 31's figures first (the emulator against CPU eager, then the workbench's own cost)
RUNNING: set[int] = set()  # the scripts running now (each its own process group), stopped if make bench is interrupted
FIGURES = ["real_models", "cores", "extension_overhead", "extension_counts", "widgets_overhead", "workbench_syncs",
           "ranks_report", "dashboard_ranks"]


@dataclass(frozen=True)
class Script:
    name: str  # bench/NAME.py
    args: tuple[str, ...] = ()
    figures: bool = False  # writes its figures to OUT/NAME.json with --figures


@dataclass
class Ran:
    script: Script
    lane: str
    wall_s: float
    cpu_s: float
    load: tuple[float, float]  # the 1-minute load average at its start and its end
    verdict: str  # "ok", or why not


def lanes(callgrind_rounds: int) -> dict[str, list[Script]]:
    """The scripts of each lane, in order. The extension's CPU-time run leaves its instructions to the counted lane
    (bench/extension_counts.py); bench/run.py runs only what no other script measures (compiled inference)."""
    counted = [Script("workbench_syncs", figures=True)]
    if callgrind_rounds:
        counted.insert(0, Script("extension_counts", ("--rounds", str(callgrind_rounds)), figures=True))
    timed = [
        Script("cores", figures=True),
        Script("real_models", figures=True),
        Script("extension_overhead", ("--instructions", "0"), figures=True),
        Script("widgets_overhead", figures=True),
        Script("load_ext"),
        Script("run", ("--only-compiled",)),
        Script("checks_overhead", ("--steps", "50")),
        Script("compile_lm"),
        Script("profile_overhead"),
        Script("ranks_report", figures=True),
        Script("distributed"),
        Script("ranks_start"),
        Script("dashboard_ranks", figures=True),
    ]
    return {"timed": timed, "counted": counted}


def _run(script: Script, lane: str, out: Path, say: threading.Lock) -> Ran:
    argv = [sys.executable, str(HERE / f"{script.name}.py"), *script.args]
    if script.figures:
        argv += ["--figures", str(out / f"{script.name}.json")]
    log = out / f"{script.name}.log"
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    with log.open("w") as f:
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        RUNNING.add(p.pid)
        while True:  # wait4, not wait: the child's CPU time (its own children's included) comes with it
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                p.returncode = os.waitstatus_to_exitcode(status)
                break
            if time.perf_counter() - t0 > DEADLINE_S:
                os.killpg(p.pid, 9)
                _, status, usage = os.wait4(p.pid, 0)
                p.returncode = None
                break
            time.sleep(0.2)
        RUNNING.discard(p.pid)
    wall = time.perf_counter() - t0
    verdict = ("ok" if p.returncode == 0 else f"failed (exit {p.returncode})" if p.returncode is not None
               else f"killed after {DEADLINE_S} s")
    ran = Ran(script, lane, wall, usage.ru_utime + usage.ru_stime, (load0, os.getloadavg()[0]), verdict)
    text = log.read_text(errors="replace")
    with say:
        print(f"\n== bench/{script.name}.py {' '.join(script.args)} ({lane}): {verdict}, {wall:.0f} s", flush=True)
        print(text if verdict == "ok" else text[-4000:], end="" if text.endswith("\n") else "\n", flush=True)
    return ran


def _lane(name: str, scripts: list[Script], out: Path, say: threading.Lock, done: list[Ran]) -> None:
    for s in scripts:
        done.append(_run(s, name, out, say))


def timings(done: list[Ran], wall_s: float) -> str:
    lines = ["| script | lane | wall | CPU | load average (start → end) | exit |", "|---|---|---|---|---|---|"]
    for r in sorted(done, key=lambda r: -r.wall_s):
        lines.append(f"| {r.script.name} | {r.lane} | {r.wall_s:.0f} s | {r.cpu_s:.0f} s | "
                     f"{r.load[0]:.1f} → {r.load[1]:.1f} | {r.verdict} |")
    lines.append(f"| all (lanes side by side) | | {wall_s:.0f} s | {sum(r.cpu_s for r in done):.0f} s | | |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--callgrind-rounds", type=int, default=2,
                    help="rounds of the extension's cells counted under valgrind (0: none)")
    ap.add_argument("--out", default="out/bench", help="the figure files and logs")
    ap.add_argument("--table", default="out/bench.json", help="every figure in one JSON file")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="only these scripts (bench/NAME.py), in their lanes")
    ap.add_argument("--compare", metavar="OLD", help="an earlier run's out/bench.json (main's): this run beside it")
    args = ap.parse_args()
    chosen = {name: [s for s in scripts if args.only is None or s.name in args.only]
              for name, scripts in lanes(args.callgrind_rounds).items()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for f in (*out.glob("*.json"), *out.glob("*.log")):
        f.unlink()
    say, done, t0, load0 = threading.Lock(), [], time.perf_counter(), os.getloadavg()[0]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    threads = [threading.Thread(target=_lane, args=(name, scripts, out, say, done), daemon=True)
               for name, scripts in chosen.items()]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    except KeyboardInterrupt:
        for pid in list(RUNNING):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, 9)
        raise
    wall = time.perf_counter() - t0
    summary = timings(done, wall)
    (out / "steps.txt").write_text(summary + "\n")
    print(f"\n== what each script took ({os.cpu_count()} CPUs)\n{summary}")
    files = sorted(out.glob("*.json"), key=lambda p: FIGURES.index(p.stem) if p.stem in FIGURES else len(FIGURES))
    figs = table.gather([str(p) for p in files])
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True, cwd=HERE)
    table.write(args.table, figs, {"started": started, "commit": commit.stdout.strip(), "cpus": os.cpu_count(),
                                   "wall_s": round(wall), "load": [load0, os.getloadavg()[0]],
                                   "scripts": {r.script.name: [round(r.wall_s), r.verdict] for r in done}})
    print(f"\n== every figure (also in {args.table}; compare two runs: bench/table.py --compare OLD NEW)")
    print(table.table(figs))
    if args.compare:
        print(f"\n== against {args.compare}")
        print(table.compare(json.loads(Path(args.compare).read_text())["figures"], figs))
    failed = [r.script.name for r in done if r.verdict != "ok"]
    if failed:
        print(f"\nfailed: {', '.join(failed)} (their figures are left out)")


if __name__ == "__main__":
    main()
