"""``neuron-lab doctor --check``: a short self-test of what the workbench assumes about the device it runs on.

On a Trn instance it tries each assumption the TorchNeuron path rests on (research: torchneuron-conformance.md) on the
real package; on the emulator the same checks run and must pass. Each check runs where it measures something true: the
shell checks in one fresh interpreter (so "loading the extension starts no runtime" is not spoiled by this process),
the two ranks as two more, started as torchrun starts its workers. The report is plain text a user can paste into a
bug: versions, backend, then one line per check, ``ok`` or ``FAIL`` with what was seen.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass

TIMEOUT_S = 300  # for each child interpreter: a first compile on a Trn instance can take minutes

# The shell checks, in one interpreter: each prints a JSON line {"check", "ok", "seen"}; the order matters (the
# runtime check comes before anything touches the device).
_SHELL = r'''
import json, os, tempfile
import torch
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from neuron_lab import backend
from neuron_lab.backend.events import op_key
from neuron_lab.extension import session_of

def say(check, ok, seen):
    print(json.dumps({"check": check, "ok": bool(ok), "seen": seen}), flush=True)

def runtime_up():
    try:
        import torch_neuronx
        return bool(torch_neuronx.is_neuron_runtime_initialized())
    except Exception as e:  # noqa: BLE001
        return f"cannot tell ({type(e).__name__}: {e})"

sh = InteractiveShell()
with capture_output():
    sh.run_line_magic("load_ext", "neuron_lab")

def cell(code):
    with capture_output():
        res = sh.run_cell(code, store_history=True)
    return res, session_of(sh).history.get(res.execution_count)

cell("y = 1 + 1")
up = runtime_up()
say("runtime untouched by loading the extension", up is False,
    f"is_neuron_runtime_initialized() after %load_ext and a cell: {up}")

res, r = cell("import torch\nx = torch.ones(1024, device='neuron')")
reading = backend.active().memory_reading()
nested = torch.neuron.memory_stats()
grew = r.memory.after - r.memory.before if r is not None else None
current = nested.get("allocated_bytes", {}).get("current") if isinstance(nested.get("allocated_bytes"), dict) else None
say("memory read from the nested memory_stats",
    r is not None and grew and grew >= 4096 and current == reading.allocated,
    f"a 4 KiB tensor: the cell report grew by {grew} B; memory_stats()['allocated_bytes']['current'] {current}, "
    f"the workbench reads {reading.allocated}")

import torch_neuronx
res, r = cell("z = torch.atan2(x, x)")
rows = {row.op: row.kind for row in (r.ops_not_native if r is not None else [])}
reported = {op_key(n) for n in torch_neuronx.get_fallback_ops()}
mine = {op_key(op) for op, kind in rows.items() if kind == "fallback"}
say("a CPU fallback reported, as the device's own account says", "atan2" in mine and "atan2" in reported,
    f"report rows {sorted(rows.items())}; get_fallback_ops() {sorted(torch_neuronx.get_fallback_ops())}")

res, r = cell("%%neuron compile\nm = torch.nn.Linear(8, 8).to('neuron')\nout = m(torch.ones(2, 8, device='neuron'))")
c = r.compiles if r is not None else None
say("a compile timed", c is not None and c.graphs >= 1 and c.compile_s > 0 and res.error_in_exec is None,
    f"graphs {c and c.graphs}, compile {c and round(c.compile_s, 3)} s, device compiler (NEFF) "
    f"{c and round(c.neff_compile_s, 3)} s, cache {c and c.neff_cache}, error {res.error_in_exec!r}")

os.chdir(tempfile.mkdtemp(prefix="neuron-lab-check-"))
res, r = cell("%%neuron profile\nw = (x * 2).sum()")
p = r.profiled if r is not None else None
lanes = sorted(p.lanes) if p is not None else []
artefacts = list(getattr(p, "artefacts", None) or [])
# A device without lanes (the pure-Python core, whose ops are host work) shows host work, and its note says why.
host_only = p is not None and not p.device_timing and not artefacts
say("a profile with device activity or the device's own artefacts",
    p is not None and (lanes or artefacts or (host_only and len(p.rows) > 0)),
    f"{len(p.rows) if p else 0} profiled ops, device lanes {lanes}, device artefacts {artefacts[:6]}"
    + (f"; {p.lanes_note}" if host_only and p.lanes_note else ""))
'''

# One rank: the extension loaded first, then the process group joined (TorchNeuron's check: no runtime before it).
_RANK = r'''
import json
from datetime import timedelta
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
sh = InteractiveShell()
with capture_output():
    sh.run_line_magic("load_ext", "neuron_lab")
import torch, torch.distributed as dist
import torch_neuronx  # noqa: F401  (the neuron process-group backend)
dist.init_process_group(backend="neuron", timeout=timedelta(seconds=120))
dist.barrier()  # TorchNeuron's barrier runs on the default group (nrt_barrier)
print(json.dumps({"rank": dist.get_rank(), "world": dist.get_world_size(), "device": torch.neuron.current_device()}),
      flush=True)
dist.destroy_process_group()
'''


@dataclass
class Check:
    name: str
    ok: bool
    seen: str


def _python(code: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


def _lines(proc: subprocess.Popen, what: str) -> tuple[list[dict], str]:
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        err = f"{what} still running after {TIMEOUT_S} s; stopped\n" + err
    found = []
    for line in out.splitlines():
        try:
            found.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    tail = err.strip().splitlines()[-1] if err.strip() else f"exit {proc.returncode}"
    return found, tail


def shell_checks() -> list[Check]:
    found, tail = _lines(_python(textwrap.dedent(_SHELL)), "the shell checks")
    checks = [Check(d["check"], d["ok"], d["seen"]) for d in found if "check" in d]
    if len(checks) < 5:
        checks.append(Check("the shell checks ran to the end", False, f"stopped after {len(checks)}: {tail}"))
    return checks


def rank_check() -> Check:
    from neuron_lab.session.launch import AgentStore, rank_envs

    store = AgentStore()
    procs = [_python(textwrap.dedent(_RANK), env) for env in rank_envs(dict(os.environ), 2, store.port)]
    results = [_lines(p, f"rank {r}") for r, p in enumerate(procs)]
    joined = [(d.get("rank"), d.get("world")) for found, _ in results for d in found]
    ok = sorted(joined) == [(0, 2), (1, 2)]
    seen = "; ".join(f"rank {r}: {found[-1] if found else tail}" for r, (found, tail) in enumerate(results))
    return Check("two ranks join the neuron process group after loading the extension", ok, seen)


def run() -> int:
    """Print the self-test's report; 0 when every check passed, 1 otherwise."""
    import torch

    import neuron_lab
    from neuron_lab import backend

    d = backend.state()
    print("neuron-lab doctor --check")
    print(f"  neuron_lab   {neuron_lab.__version__}; torch {torch.__version__}; python {sys.version.split()[0]}")
    print(f"  backend      {d.kind}: {d.reason}")
    checks = [*shell_checks(), rank_check()]
    for c in checks:
        print(f"  {'ok  ' if c.ok else 'FAIL'}  {c.name}\n        {c.seen}")
    failed = sum(not c.ok for c in checks)
    print(f"  {len(checks) - failed} of {len(checks)} checks passed" + ("" if not failed else
          ": paste this report into a bug report"))
    return 1 if failed else 0
