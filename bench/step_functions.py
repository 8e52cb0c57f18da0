"""Where one whole training step's extra instructions on `neuron` go, function by function: the step on `neuron`
against CPU eager running the same `_foreach_` AdamW, under callgrind, diffed by object (our ``_core*.so``,
libtorch_cpu, libc, libpython, ...) and by function, exclusive (self) cost.

bench/step_ops.py replays a step's ops one at a time; what that does not see (autograd's nodes over device
tensors, a class's first calls after another's, the optimizer's Python over device tensors) shows here, since the
whole step is counted. Each configuration runs its warm-up steps uncounted, one warm counted stretch, then
``COUNTED_STEPS`` steps dumped; a row is instructions a step. Outside callgrind (``--faults``) the same two steps
run interleaved with getrusage's CPU time, minor faults and context switches a step: hardware counters (cycles,
cache and TLB misses) are not supported by ``perf stat`` in this VM, so the caches are callgrind's simulation
(bench/step_counters.py --callgrind).

``--caches``: the same under bench/step_counters.py's cache and branch simulation, with the same tables for L1 data
misses, last-level misses and mispredicted branches: what makes a step's CPU time differ from its instructions.

    python bench/step_functions.py [--model llama] [--top 30] [--keep DIR] [--caches] [--faults]
"""

from __future__ import annotations

import argparse
import collections
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import callgrind
import model_zoo
import real_models
import step_counters
import torch

CONFIGS = {"cpu foreach": ("cpu", True), "cpu foreach, math SDPA": ("cpu", True), "neuron": ("neuron", None)}
# `neuron` runs scaled_dot_product_attention's math composite (the emulator registers no `_fused_sdp_choice`), the
# CPU its flash kernel: this configuration runs the CPU with the math one too, to tell that choice from the core's.
MATH_SDPA = "cpu foreach, math SDPA"
COUNTED_STEPS = 3


def _runs(name: str) -> dict:
    import neuron_lab  # noqa: F401  (activates the emulator when autoload is off)

    torch.manual_seed(0)
    built = real_models.mlp() if name == "mlp" else model_zoo.ZOO[name][1]()
    runs = {label: real_models.stepper(*built, dev, foreach) for label, (dev, foreach) in CONFIGS.items()}
    runs[MATH_SDPA] = _math_sdpa(runs[MATH_SDPA])
    for step in runs.values():
        for _ in range(3):
            step()  # first-call plans, caches, optimizer state
    return runs


def _math_sdpa(step):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def run() -> None:
        with sdpa_kernel(SDPBackend.MATH):
            step()

    return run


def counted(name: str) -> None:
    """The run under callgrind: each configuration's warm stretch, then its counted one."""
    for label, step in _runs(name).items():
        for stretch in ("warm", "counted"):
            with callgrind.count(f"{label}|{stretch}"):
                for _ in range(COUNTED_STEPS):
                    step()


_NAMED = re.compile(r"^\((\d+)\)(?: (.*))?$")


# The events a table shows: callgrind's names summed under one heading (the cache simulation's only with --caches).
EVENTS = {"instructions": ("Ir",), "L1d misses": ("D1mr", "D1mw"), "LL misses": ("DLmr", "DLmw"),
          "mispredicted branches": ("Bcm", "Bim")}


def exclusive(path: Path, event: str) -> collections.Counter:
    """A callgrind dump's self cost of one of EVENTS by (object, function), read from its raw lines (a call's
    inclusive cost, the line after ``calls=``, is not the caller's own)."""
    names: dict[tuple[str, str], str] = {}
    cost: collections.Counter = collections.Counter()
    ob = fn = ""
    after_call = False
    columns: list[int] = []

    def named(kind: str, value: str) -> str:
        m = _NAMED.match(value)
        if not m:
            return value
        if m.group(2) is not None:
            names[(kind, m.group(1))] = m.group(2)
        return names.get((kind, m.group(1)), value)

    for line in path.read_text(errors="replace").splitlines():
        if line[:1].isdigit() or line[:1] in "+-*":
            if after_call:
                after_call = False
                continue
            parts = line.split()
            cost[(ob, fn)] += sum(int(parts[1 + i]) for i in columns if 1 + i < len(parts))
        elif line.startswith("events:"):
            listed = line.split()[1:]
            columns = [listed.index(e) for e in EVENTS[event] if e in listed]
        elif line.startswith("ob="):
            ob = named("ob", line[3:])
        elif line.startswith("fn="):
            fn = named("fn", line[3:])
        elif line.startswith(("cob=", "cfn=")):
            named(line[1:3], line[4:])  # a called function's or object's name shares the table
        elif line.startswith("calls="):
            after_call = True
    return cost


def _object(ob: str) -> str:
    base = ob.rsplit("/", 1)[-1]
    for short in ("_core", "libtorch_cpu", "libtorch_python", "libc10", "libc.so", "libpython", "libgomp",
                  "ld-linux", "libstdc++", "libm.so"):
        if base.startswith(short) or short in base:
            return short.removesuffix(".so")
    return "python" if base.startswith("python") else base


def simulated(name: str, top: int, keep: str | None, with_caches: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(keep or tmp)
        d.mkdir(parents=True, exist_ok=True)
        p = subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={d}/cg",
                            *(step_counters.CACHES if with_caches else ()), sys.executable, __file__, "--counted",
                            "--model", name], capture_output=True, text=True, timeout=3000)
        if p.returncode:
            sys.exit(f"the run under callgrind failed:\n{p.stderr[-3000:]}")
        dumps: dict[str, Path] = {}
        for f in d.glob("cg.*"):
            trigger = re.search(r"^desc: Trigger: Client Request: (.+)$", f.read_text(errors="replace"), re.M)
            if trigger and trigger.group(1).strip().endswith("|counted"):
                dumps[trigger.group(1).strip().split("|")[0]] = f
                if keep:
                    print(f"kept: {f} ({trigger.group(1).strip()})")
        events = list(EVENTS) if with_caches else ["instructions"]
        by_event = {e: {label: exclusive(f, e) for label, f in dumps.items()} for e in events}
    per = COUNTED_STEPS * 1e3
    print(f"\n| configuration | {' | '.join(f'{e} a step (k)' for e in events)} |\n|---|{'---|' * len(events)}")
    for label in CONFIGS:
        print(f"| {label} | {' | '.join(f'{sum(by_event[e][label].values()) / per:,.1f}' for e in events)} |")
    for e in events:
        for base in ("cpu foreach", MATH_SDPA):
            print(f"\n### {e}: `neuron` over {base}")
            _diff(by_event[e][base], by_event[e]["neuron"], top)


def _diff(cpu: collections.Counter, dev: collections.Counter, top: int) -> None:
    per = COUNTED_STEPS * 1e3

    def table(title: str, key) -> None:
        a: collections.Counter = collections.Counter()
        b: collections.Counter = collections.Counter()
        for k, v in cpu.items():
            a[key(k)] += v
        for k, v in dev.items():
            b[key(k)] += v
        rows = sorted(set(a) | set(b), key=lambda k: -abs(b[k] - a[k]))[:top]
        print(f"\n| {title} | CPU eager (k a step) | `neuron` (k) | extra (k) |\n|---|---|---|---|")
        for k in rows:
            print(f"| {k} | {a[k] / per:,.1f} | {b[k] / per:,.1f} | {(b[k] - a[k]) / per:+,.1f} |")
        print(f"| **total** | {sum(a.values()) / per:,.1f} | {sum(b.values()) / per:,.1f} | "
              f"{(sum(b.values()) - sum(a.values())) / per:+,.1f} |")

    table("object", lambda k: _object(k[0]))
    table("function (object)", lambda k: f"`{k[1][:90]}` ({_object(k[0])})")


def faults(name: str, rounds: int) -> None:
    """CPU time, minor faults and context switches a step, the two configurations interleaved."""
    runs = _runs(name)
    samples: dict[str, list[tuple[float, ...]]] = {label: [] for label in runs}
    for _ in range(rounds):
        for label, step in runs.items():
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time()
            for _ in range(4):
                step()
            t1, r1 = time.process_time(), resource.getrusage(resource.RUSAGE_SELF)
            samples[label].append(((t1 - t0) / 4 * 1e3, (r1.ru_utime - r0.ru_utime) / 4 * 1e3,
                                   (r1.ru_stime - r0.ru_stime) / 4 * 1e3, (r1.ru_minflt - r0.ru_minflt) / 4,
                                   (r1.ru_nivcsw - r0.ru_nivcsw + r1.ru_nvcsw - r0.ru_nvcsw) / 4))
    print("| configuration | CPU ms a step | user ms | system ms | minor faults | context switches |")
    print("|---|---|---|---|---|---|")
    for label, xs in samples.items():
        cols = [statistics.median(x[i] for x in xs) for i in range(5)]
        print(f"| {label} | {cols[0]:.2f} | {cols[1]:.2f} | {cols[2]:.2f} | {cols[3]:.1f} | {cols[4]:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--keep", help="keep the callgrind dumps in this folder (for callgrind_annotate)")
    ap.add_argument("--faults", action="store_true", help="CPU time, faults and switches instead (no callgrind)")
    ap.add_argument("--caches", action="store_true", help="cache misses and mispredicted branches too (simulated)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--counted", action="store_true", help=argparse.SUPPRESS)  # the run under callgrind
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.counted:
        counted(args.model)
    elif args.faults:
        faults(args.model, args.rounds)
    elif why := callgrind.missing():
        sys.exit(why)
    else:
        simulated(args.model, args.top, args.keep, args.caches)


if __name__ == "__main__":
    main()
