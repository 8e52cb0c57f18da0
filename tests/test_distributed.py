"""The emulated `neuron` process group with real processes: every collective against gloo on CPU, DDP,
DTensor tensor parallelism and FSDP2 parity after 3 AdamW steps, the rank-to-device mapping, and torchrun.

Ranks get ``RANK``/``LOCAL_RANK``/... as torchrun sets them, bounded in time; a rank that fails or hangs gets every
rank killed. The tests whose ranks start the same way (the prelude below, two ranks, no variables of their own) share
one started group (``group``): each test's code runs in every rank of it, in a namespace of its own, where a test
that needs a fresh process (its own variables, another prelude, a launcher) starts its own ranks. Ranks compare
`neuron` results with the same code on CPU tensors over a gloo subgroup in the same process, and print JSON the test
asserts on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import core
from procs import Lines

from neuron_lab.session import launch

COMPILED = core() == "compiled"
RANKS = 2
VENV_BIN = Path(sys.executable).parent

PRELUDE = """
import json, os
import torch, torch.distributed as dist
import torch_neuronx  # registers the `neuron` device and process-group backend, as on a Trn instance

dist.init_process_group(backend="neuron")
rank, world = dist.get_rank(), dist.get_world_size()
dev = torch.device("neuron", torch.neuron.current_device())
cpu_group = dist.new_group(backend="gloo")

def report(**facts):
    print(json.dumps(facts), flush=True)
"""


def test_topology_maps_a_torchrun_rank_to_its_device_and_core() -> None:
    from neuron_lab.backend.emulator.topology import detect

    rank = {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    t = detect(rank)
    assert (t.local_rank, t.cores, len(t.capacities), t.problems) == (1, [0, 1], 2, [])
    assert t.summary.endswith("this rank owns neuron:1 (core 1)")
    assert detect({**rank, "NEURON_RT_VISIBLE_CORES": "3"}).cores == [0, 3]
    assert "exactly one per process" in detect({**rank, "NEURON_RT_VISIBLE_CORES": "2-3"}).problems[0]
    assert "could not start them" in detect({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "8"}).problems[0]
    bad = detect({"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"})
    assert bad.local_rank is None and "not mapping" in bad.problems[0] and len(bad.capacities) == 4


# the last collective on the neuron group: torch's own gloo group (the CPU reference) can abort a process at exit when
# its worker thread drops a finished work's Python-made tensors during finalization
TAIL = "\ndist.barrier()\ndist.destroy_process_group()\n"


def _script(tmp_path: Path, prelude: str, setup: str, body: str) -> Path:
    """``rank.py``: the ranks' whole script, the file whose lines their reports name."""
    script = tmp_path / "rank.py"
    script.write_text(prelude + setup + textwrap.dedent(body) + TAIL)
    return script


def _start_ranks(script: Path, ranks: int, env: dict[int, dict[str, str]], **pipes: Any) -> tuple[Any, list[Any]]:
    """``script`` as ``ranks`` ranks (``env``: extra variables per rank) and the store they meet at."""
    store = launch.AgentStore()  # the rendezvous, hosted here as torchrun's agent hosts it: no port to lose to a race
    procs = [subprocess.Popen([sys.executable, str(script)], env={**rank_env, **env.get(r, {})}, text=True, **pipes)
             for r, rank_env in enumerate(launch.rank_envs({**os.environ, "OMP_NUM_THREADS": "1"}, ranks,
                                                           store.port))]
    return store, procs


def _run_ranks(tmp_path: Path, body: str, env: dict[int, dict[str, str]] | None = None, setup: str = "",
               timeout: float = 120, ranks: int = RANKS, prelude: str = PRELUDE) -> list[Any]:
    """Run ``prelude + setup + body`` as ``ranks`` new ranks; each rank's last JSON line, in rank order."""
    _store, procs = _start_ranks(_script(tmp_path, prelude, setup, body), ranks, env or {},
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return _collect(procs, timeout)


# The shared group's ranks: the prelude, then each request's lines of a test's ``rank.py`` (the prelude's lines blank,
# so every line keeps its number) in a copy of the prelude's namespace, a collection (a test's device memory starts
# where the last one's garbage is gone) and the tail's barrier, then DONE. A rank whose code raised exits, its
# traceback on stderr.
DONE = "-- done --"
SERVE = PRELUDE + f"""
import gc, sys, traceback
base = dict(globals())
for request in sys.stdin:
    path, first, last = json.loads(request)
    with open(path) as f:
        code = "".join(line if first <= n < last else "\\n" for n, line in enumerate(f))
    try:
        exec(compile(code, path, "exec"), dict(base))
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    gc.collect()
    dist.barrier()
    print({DONE!r}, flush=True)
"""


class RankGroup:
    """Two ranks started once on ``SERVE``; :meth:`run` runs a test's code in each. A failure or a deadline kills
    them, and the next test starts them afresh."""

    def __init__(self, folder: Path) -> None:
        self._folder, self._procs, self._lines, self._store, self._err = folder, [], [], None, None

    def run(self, tmp_path: Path, body: str, setup: str = "", timeout: float = 120) -> list[Any]:
        """``setup + body`` in every rank; each rank's last JSON line, in rank order."""
        script = _script(tmp_path, PRELUDE, setup, body)
        first, last = PRELUDE.count("\n"), script.read_text().count("\n") - 2  # not the tail's barrier and teardown
        if not self._procs:
            self._start()
        deadline, results = time.monotonic() + timeout, []
        try:
            for p in self._procs:
                p.stdin.write(json.dumps([str(script), first, last]) + "\n")
                p.stdin.flush()
            for r, lines in enumerate(self._lines):
                last = ""
                while (line := lines.next(max(deadline - time.monotonic(), 0.1), f"rank {r}'s {DONE!r}")) != \
                        DONE + "\n":
                    assert line, f"rank {r} ended (rc {self._procs[r].wait()}):\n{last}{self._stderr()}"
                    last = line
                results.append(json.loads(last))
        except BaseException:
            self.close()
            raise
        return results

    def _start(self) -> None:
        serve = self._folder / "serve.py"
        serve.write_text(SERVE)
        self._err = (self._folder / "ranks.err").open("w")  # both ranks'; a pipe nobody read could fill up
        self._store, self._procs = _start_ranks(serve, RANKS, {}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                stderr=self._err)
        self._lines = [Lines(p.stdout) for p in self._procs]

    def _stderr(self) -> str:
        return (self._folder / "ranks.err").read_text()[-4000:]

    def close(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        if self._err is not None:
            self._err.close()
        self._procs, self._lines, self._store, self._err = [], [], None, None


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Any:
    g = RankGroup(tmp_path_factory.mktemp("group"))
    yield g
    g.close()


def _collect(procs: list[subprocess.Popen], timeout: float) -> list[Any]:
    """Every process's last stdout line as JSON; on a failure or the deadline, kill them all and fail."""
    deadline = time.monotonic() + timeout
    outs: list[tuple[str, str]] = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=max(deadline - time.monotonic(), 0.1)))
    except subprocess.TimeoutExpired:
        pytest.fail(f"ranks still running after {timeout}s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (p, (_out, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, f"rank {r} failed (rc {p.returncode}):\n{err[-4000:]}"
    return [json.loads(out.strip().splitlines()[-1]) for out, _err in outs]


def _communicate_group(proc: subprocess.Popen, out: Path, timeout: float = 120) -> list[Any]:
    """The ``rank{N}.json`` files the ranks of a launcher (started in its own session) wrote to ``out``, in
    rank order; past the deadline the launcher and its ranks are killed."""
    try:
        _stdout, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher's ranks too
        proc.wait()
        pytest.fail(f"launcher still running after {timeout}s")
    assert proc.returncode == 0, err[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(RANKS)]


def test_every_collective_equals_gloo_on_cpu(tmp_path: Path, group: RankGroup) -> None:
    ranks = group.run(tmp_path, """
        def run(device, group):
            t = lambda *v: torch.tensor(v, dtype=torch.float32, device=device)
            got = {}
            for name, op in [("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG), ("product", dist.ReduceOp.PRODUCT),
                             ("min", dist.ReduceOp.MIN), ("max", dist.ReduceOp.MAX),
                             ("premul_sum", dist._make_nccl_premul_sum(0.5))]:
                if name in ("avg", "premul_sum") and device.type == "cpu":
                    x = t(rank + 1.0, 2.0 * rank - 3)  # gloo has neither: the definition, by hand
                    dist.all_reduce(x, group=group)
                    x = x / world if name == "avg" else x * 0.5
                else:
                    x = t(rank + 1.0, 2.0 * rank - 3)
                    dist.all_reduce(x, op=op, group=group)
                got["all_reduce_" + name] = x.tolist()
            x = t(rank, rank) if rank else t(7.0, 8.0)
            dist.broadcast(x, src=0, group=group)
            got["broadcast"] = x.tolist()
            outs = [t(0, 0) for _ in range(world)]
            dist.all_gather(outs, t(rank, 10.0 + rank), group=group)
            got["all_gather"] = [o.tolist() for o in outs]
            out = torch.empty(2 * world, device=device)
            dist.all_gather_into_tensor(out, t(rank, -rank), group=group)
            got["all_gather_into_tensor"] = out.tolist()
            out = torch.empty(2, device=device)
            dist.reduce_scatter_tensor(out, torch.arange(4.0, device=device) * (rank + 1), group=group)
            got["reduce_scatter_tensor"] = out.tolist()
            out = torch.empty(4, device=device)
            dist.all_to_all_single(out, torch.arange(4.0, device=device) + 10 * rank, group=group)
            got["all_to_all_single"] = out.tolist()
            x = t(rank + 1.0)
            dist.reduce(x, dst=0, group=group)
            got["reduce_on_root"] = x.tolist() if rank == 0 else None
            outs = [t(0.0) for _ in range(world)] if rank == 1 else None
            dist.gather(t(rank + 4.0), outs, dst=1, group=group)
            got["gather_on_root"] = [o.tolist() for o in outs] if rank == 1 else None
            x = t(-1.0)
            dist.scatter(x, [t(20.0), t(21.0)] if rank == 0 else None, src=0, group=group)
            got["scatter"] = x.tolist()
            x = t(-1.0, -1.0)
            if rank == 0:
                dist.send(t(5.0, 6.0), dst=1, group=group)
            else:
                dist.recv(x, src=0, group=group)
            got["send_recv"] = x.tolist()
            y = t(0, 0)
            for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, t(rank, rank), 1 - rank, group=group),
                                             dist.P2POp(dist.irecv, y, 1 - rank, group=group)]):
                w.wait()
            got["isend_irecv"] = y.tolist()
            x = t(rank + 2.0)
            work = dist.all_reduce(x, async_op=True, group=group)
            work.wait()
            got["async_all_reduce"] = [x.tolist(), work.is_completed(), work.get_future().value()[0].device.type]
            objs = [None] * world
            dist.all_gather_object(objs, {"rank": rank}, group=group)
            got["all_gather_object"] = objs
            obj = [{"from": rank}]
            dist.broadcast_object_list(obj, src=1, group=group)
            got["broadcast_object_list"] = obj
            dist.barrier(group=group)
            return got

        sub = dist.new_group(list(range(world)))  # a subgroup of the default backend: `neuron` again
        x = torch.tensor([rank + 1.0], device=dev)
        dist.all_reduce(x, group=sub)
        report(neuron=run(dev, None), cpu=run(torch.device("cpu"), cpu_group),
               subgroup=[dist.get_backend(sub), x.tolist()])
    """)
    expected = [{
        "all_reduce_sum": [3.0, -4.0], "all_reduce_avg": [1.5, -2.0], "all_reduce_product": [2.0, 3.0],
        "all_reduce_min": [1.0, -3.0], "all_reduce_max": [2.0, -1.0], "all_reduce_premul_sum": [1.5, -2.0],
        "broadcast": [7.0, 8.0], "all_gather": [[0.0, 10.0], [1.0, 11.0]],
        "all_gather_into_tensor": [0.0, 0.0, 1.0, -1.0], "reduce_scatter_tensor": [[0.0, 3.0], [6.0, 9.0]][r],
        "all_to_all_single": [[0.0, 1.0, 10.0, 11.0], [2.0, 3.0, 12.0, 13.0]][r],
        "reduce_on_root": [3.0] if r == 0 else None, "gather_on_root": [[4.0], [5.0]] if r == 1 else None,
        "scatter": [20.0 + r], "send_recv": [[-1.0, -1.0], [5.0, 6.0]][r],
        "isend_irecv": [[1.0, 1.0], [0.0, 0.0]][r], "all_gather_object": [{"rank": 0}, {"rank": 1}],
        "broadcast_object_list": [{"from": 1}],
    } for r in range(RANKS)]
    for r, facts in enumerate(ranks):
        assert facts["subgroup"] == ["neuron", [3.0]]
        neuron, cpu = facts["neuron"], facts["cpu"]
        assert neuron.pop("async_all_reduce") == [[5.0], True, "neuron"]
        assert cpu.pop("async_all_reduce") == [[5.0], True, "cpu"]
        assert neuron == cpu == expected[r]


@pytest.mark.parametrize("backend", ["cpu:gloo,neuron:neuron", None])
def test_a_mixed_or_default_backend_and_functional_collectives(tmp_path: Path, backend: str | None) -> None:
    ranks = _run_ranks(tmp_path, prelude=PRELUDE.replace('backend="neuron"', f"backend={backend!r}"), body="""
        import torch.distributed._functional_collectives as fc
        x = torch.full((2,), rank + 1.0, device=dev)
        summed = fc.all_reduce(x, "sum", dist.group.WORLD)
        gathered = fc.all_gather_tensor(x, 0, dist.group.WORLD)
        c = torch.full((2,), rank + 1.0)  # a CPU tensor on the same group
        dist.all_reduce(c)
        parts = [torch.arange(4.0, device=dev) * (rank + 1), torch.arange(4.0, device=dev) * (rank + 1) * 10]
        averaged = fc.reduce_scatter_tensor_coalesced(parts, "avg", [0, 0], dist.group.WORLD)  # AVG on each tensor
        report(backend=dist.get_backend(), sum=summed.tolist(), gathered=gathered.tolist(), cpu=c.tolist(),
               device=str(summed.device), averaged=[t.tolist() for t in averaged])
    """)
    for r, facts in enumerate(ranks):
        # with no backend named, torch 2.13's get_backend() answers "undefined" for a group of two backends
        assert facts == {"backend": backend or "undefined", "sum": [3.0, 3.0],
                         "gathered": [1.0, 1.0, 2.0, 2.0], "cpu": [3.0, 3.0],
                         "averaged": [[[0.0, 1.5], [0.0, 15.0]], [[3.0, 4.5], [30.0, 45.0]]][r],
                         "device": f"neuron:{r}" if COMPILED else "neuron:0"}, facts


@pytest.mark.skipif(not COMPILED, reason="one device per rank needs the compiled core (the pure-Python core has "
                    "only neuron:0)")
def test_each_rank_owns_neuron_local_rank_on_its_visible_core(tmp_path: Path) -> None:
    ranks = _run_ranks(tmp_path, """
        from neuron_lab.backend.emulator import runtime
        x = torch.ones(2, device="neuron")
        report(current=torch.neuron.current_device(), count=torch.neuron.device_count(), tensor=str(x.device),
               core=runtime.get().topology.cores[torch.neuron.current_device()],
               visible=os.environ["NEURON_RT_VISIBLE_CORES"])
    """, env={1: {"NEURON_RT_VISIBLE_CORES": "3"}})
    assert ranks == [{"current": 0, "count": 2, "tensor": "neuron:0", "core": 0, "visible": "0"},
                     {"current": 1, "count": 2, "tensor": "neuron:1", "core": 3, "visible": "3"}]


TRAIN = """
def train(model, device, steps=3):
    torch.manual_seed(1)
    batches = [(torch.randn(8, 16), torch.randn(8, 4)) for _ in range(steps)]
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    for x, y in batches:
        x, y = x[rank * 4:(rank + 1) * 4].to(device), y[rank * 4:(rank + 1) * 4].to(device)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))

def sharded(model, mesh):
    from torch.distributed.fsdp import fully_shard

    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)

def full(p):
    return (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu()

def max_diff(a, b):
    return max((full(p) - full(q)).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))
"""


def test_ddp_three_adamw_steps_equal_gloo_on_cpu_with_and_without_a_comm_hook(tmp_path: Path, group: RankGroup) -> None:
    ranks = group.run(tmp_path, setup=TRAIN, body="""
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        from torch.nn.parallel import DistributedDataParallel as DDP
        on_neuron = DDP(mlp().to(dev), device_ids=[dev.index])
        on_cpu = DDP(mlp(), process_group=cpu_group)
        from neuron_lab.backend.emulator import runtime
        for model, device in ((on_neuron, dev), (on_cpu, "cpu")):
            train(model, device)
        hooked = None
        if runtime.get().core == "compiled":  # find_unused_parameters copies through pinned memory: C++ only
            hooked = DDP(mlp().to(dev), device_ids=[dev.index], find_unused_parameters=True)
            hooked.register_comm_hook(None, allreduce_hook)
            train(hooked, dev)
        report(diff=max_diff(on_neuron, on_cpu), hooked=None if hooked is None else max_diff(hooked, on_cpu),
               device=str(next(on_neuron.parameters()).device))
    """)
    assert [r["device"] for r in ranks] == (["neuron:0", "neuron:1"] if COMPILED else ["neuron:0", "neuron:0"])
    assert all(r["diff"] <= 1e-6 for r in ranks), ranks
    assert all((r["hooked"] <= 1e-6) if COMPILED else r["hooked"] is None for r in ranks), ranks


def test_dtensor_tensor_parallel_mlp_equals_gloo_on_cpu(tmp_path: Path, group: RankGroup) -> None:
    ranks = group.run(tmp_path, setup=TRAIN, body="""
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
        on_neuron = parallelize_module(mlp().to(dev), DeviceMesh("neuron", list(range(world))), plan)
        on_cpu = parallelize_module(mlp(), DeviceMesh.from_group(cpu_group, "cpu"), plan)
        train(on_neuron, dev)
        train(on_cpu, "cpu")
        w = on_neuron[0].weight
        report(diff=max_diff(on_neuron, on_cpu), local=[str(w.to_local().device), list(w.to_local().shape)])
    """)
    assert all(r["local"][1] == [16, 16] for r in ranks)
    assert all(r["diff"] <= 1e-6 for r in ranks), ranks


@pytest.mark.skipif(not COMPILED, reason="FSDP2 frees and refills parameter storage with storage.resize_, which only "
                    "the compiled core can do for a `neuron` storage")
def test_fsdp2_fully_shard_equals_gloo_on_cpu(tmp_path: Path, group: RankGroup) -> None:
    ranks = group.run(tmp_path, setup=TRAIN, body="""
        from torch.distributed.device_mesh import DeviceMesh

        on_neuron = sharded(mlp().to(dev), DeviceMesh("neuron", list(range(world))))
        on_cpu = sharded(mlp(), DeviceMesh.from_group(cpu_group, "cpu"))
        train(on_neuron, dev)
        train(on_cpu, "cpu")
        w = on_neuron[0].weight
        torch.neuron.synchronize()
        sharded = torch.neuron.memory_allocated()
        on_neuron[0].unshard()  # all-gathers the layer's full weights: device memory grows by them
        gathered = torch.neuron.memory_allocated()
        on_neuron[0].reshard()  # and frees them again
        report(diff=max_diff(on_neuron, on_cpu), local=[str(w.to_local().device), list(w.to_local().shape)],
               memory=[sharded, gathered, torch.neuron.memory_allocated()])
    """)
    assert [r["local"] for r in ranks] == [["neuron:0", [16, 16]], ["neuron:1", [16, 16]]]
    for r in ranks:  # layer 0 unsharded is its 32x16 weight and 32 biases in float32: 2,176 bytes more
        sharded, gathered, resharded = r["memory"]
        assert gathered - sharded == 2176 and resharded == sharded, r["memory"]
    assert all(r["diff"] <= 1e-6 for r in ranks), ranks


@pytest.mark.skipif(not COMPILED, reason="four devices in four processes need the compiled core")
def test_four_ranks_ddp_and_fsdp2_equal_gloo_on_cpu_each_on_its_own_device(tmp_path: Path) -> None:
    ranks = _run_ranks(tmp_path, setup=TRAIN.replace("x[rank * 4:(rank + 1) * 4]", "x[rank * 2:(rank + 1) * 2]")
                       .replace("y[rank * 4:(rank + 1) * 4]", "y[rank * 2:(rank + 1) * 2]"), ranks=4, timeout=240,
                       body="""
        from torch.distributed.device_mesh import DeviceMesh
        from torch.nn.parallel import DistributedDataParallel as DDP
        ddp, ddp_cpu = DDP(mlp().to(dev), device_ids=[dev.index]), DDP(mlp(), process_group=cpu_group)
        train(ddp, dev)
        train(ddp_cpu, "cpu")

        fsdp = sharded(mlp().to(dev), DeviceMesh("neuron", list(range(world))))
        fsdp_cpu = sharded(mlp(), DeviceMesh.from_group(cpu_group, "cpu"))
        train(fsdp, dev)
        train(fsdp_cpu, "cpu")
        w = fsdp[0].weight.to_local()
        report(ddp=max_diff(ddp, ddp_cpu), fsdp=max_diff(fsdp, fsdp_cpu), local=[str(w.device), list(w.shape)],
               count=torch.neuron.device_count())
    """)
    assert [r["local"] for r in ranks] == [[f"neuron:{r}", [8, 16]] for r in range(4)]
    assert all(r["count"] == 4 and r["ddp"] <= 1e-6 and r["fsdp"] <= 1e-6 for r in ranks), ranks


def test_torchrun_script_all_reduces_on_neuron(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import json, os, sys
        import torch, torch.distributed as dist
        import torch_neuronx, torch_neuronx.distributed

        dist.init_process_group(backend="neuron")
        local_rank = int(os.environ["LOCAL_RANK"])
        x = torch.full((3,), float(dist.get_rank() + 1), device="neuron")
        dist.all_reduce(x)
        facts = {"rank": dist.get_rank(), "backend": dist.get_backend(), "sum": x.tolist(), "device": str(x.device),
                 "count": torch.neuron.device_count(), "emulated": torch_neuronx.EMULATED,
                 "group": type(dist.group.WORLD) is torch_neuronx.distributed.ProcessGroupNeuron}
        with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as f:
            json.dump(facts, f)
        dist.destroy_process_group()
    """))
    # --standalone: torchrun's agent hosts the rendezvous on a port the OS picks as it listens (no free port to lose)
    proc = subprocess.Popen([str(VENV_BIN / "torchrun"), "--standalone", "--nproc_per_node", str(RANKS), str(script),
                             str(tmp_path)], env={**os.environ, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    facts = _communicate_group(proc, tmp_path)
    devices = ["neuron:0", "neuron:1"] if COMPILED else ["neuron:0", "neuron:0"]
    assert facts == [{"rank": r, "backend": "neuron", "sum": [3.0, 3.0, 3.0], "device": devices[r],
                      "count": RANKS if COMPILED else 1, "emulated": True, "group": True} for r in range(RANKS)]


def test_mp_spawn_workers_take_their_local_rank_device(tmp_path: Path) -> None:
    script = tmp_path / "spawn.py"
    script.write_text(textwrap.dedent("""
        import json, os, sys
        import torch, torch.distributed as dist, torch.multiprocessing as mp

        def worker(rank, port, out):  # the rendezvous is the test's store, as torchrun's agent hosts one
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, TORCHELASTIC_USE_AGENT_STORE="True",
                              WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2")
            dist.init_process_group(backend="neuron")
            x = torch.full((2,), float(rank), device="neuron")
            dist.all_reduce(x, op=dist.ReduceOp.MAX)
            with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
                json.dump({"rank": rank, "device": str(x.device), "max": x.tolist(),
                           "visible": os.environ["NEURON_RT_VISIBLE_CORES"]}, f)
            dist.destroy_process_group()

        if __name__ == "__main__":
            mp.spawn(worker, args=(sys.argv[1], sys.argv[2]), nprocs=2)
    """))
    store = launch.AgentStore()  # kept until the workers are done: no port for rank 0 to lose to another process
    proc = subprocess.Popen([sys.executable, str(script), str(store.port), str(tmp_path)],
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    facts = _communicate_group(proc, tmp_path)
    devices = ["neuron:0", "neuron:1"] if COMPILED else ["neuron:0", "neuron:0"]
    assert facts == [{"rank": r, "device": devices[r], "max": [1.0, 1.0], "visible": str(r)} for r in range(RANKS)]


def test_collectives_are_reported_with_bytes_ranks_lines_and_torchneuron_limits(tmp_path: Path,
                                                                                group: RankGroup) -> None:
    ranks = group.run(tmp_path, """
        import neuron_lab
        with neuron_lab.track() as rep:
            x = torch.ones(256, device=dev)
            dist.all_reduce(x)
            dist.all_reduce(x)
            dist.all_reduce(x, op=dist.ReduceOp.AVG)
            out = torch.empty(512, device=dev)
            dist.all_gather_into_tensor(out, x)
            dist.barrier()
            dist.barrier(group=dist.new_group([0, 1]))
            dist.broadcast(torch.ones(4, dtype=torch.float64, device=dev), src=0)
            splits = [2, 1] if rank == 0 else [1, 2]
            dist.all_to_all_single(torch.empty(3, device=dev), torch.ones(3, device=dev), splits, splits)
            if rank == 0:
                dist.send(x, 1)
            else:
                dist.recv(x, 0)
        from neuron_lab.runner.gates import kind_gate
        gate = kind_gate([rep], "unsupported", "--fail-on-unsupported")
        report(rows={f"{r.kind} {r.op}": [r.count, r.nbytes, r.ranks, [[s.site.line, s.count] for s in r.sites]]
                     for r in rep.ops_not_native if r.kind in ("collective", "unsupported")},
               why={r.op: r.why for r in rep.ops_not_native if r.kind == "unsupported"},
               text=str(rep), gate=[gate.passed, gate.why])
    """)
    lines = [line.strip() for line in (tmp_path / "rank.py").read_text().splitlines()]

    def at(text: str) -> list[list[int]]:
        return [[lines.index(text) + 1, 1]]

    for r, facts in enumerate(ranks):
        p2p, p2p_at = ("c10d::send", at("dist.send(x, 1)")) if r == 0 else ("c10d::recv", at("dist.recv(x, 0)"))
        reduce_at = [i + 1 for i, line in enumerate(lines) if line == "dist.all_reduce(x)"]
        sub_barrier, broadcast = at("dist.barrier(group=dist.new_group([0, 1]))"), at(
            "dist.broadcast(torch.ones(4, dtype=torch.float64, device=dev), src=0)")
        to_all = [[next(i + 1 for i, line in enumerate(lines) if "all_to_all_single" in line), 1]]
        assert facts["rows"] == {
            "collective c10d::all_reduce.sum": [2, 2048, 2, [[reduce_at[0], 1], [reduce_at[1], 1]]],
            "collective c10d::all_reduce.avg": [1, 1024, 2, at("dist.all_reduce(x, op=dist.ReduceOp.AVG)")],
            "collective c10d::all_gather_into_tensor": [1, 1024, 2, at("dist.all_gather_into_tensor(out, x)")],
            "collective c10d::barrier": [2, 0, 2, at("dist.barrier()") + sub_barrier],
            "collective c10d::broadcast": [1, 32, 2, broadcast],
            "collective c10d::all_to_all_single": [1, 12, 2, to_all],
            f"collective {p2p}": [1, 1024, 2, p2p_at],
            "unsupported c10d::barrier": [1, 0, 2, sub_barrier],
            "unsupported c10d::broadcast": [1, 32, 2, broadcast],
            "unsupported c10d::all_to_all_single": [1, 12, 2, to_all],
            f"unsupported {p2p}": [1, 1024, 2, p2p_at],
        }, facts["rows"]
        assert facts["why"]["c10d::barrier"] == ("TorchNeuron's barrier runs on the default group only (nrt_barrier), "
                                                 "not on a subgroup")
        assert facts["why"]["c10d::all_to_all_single"].startswith("TorchNeuron's all_to_all_single takes equal splits")
        assert facts["why"]["c10d::broadcast"].startswith("TorchNeuron does not broadcast float64 tensors")
        assert facts["why"][p2p].startswith("TorchNeuron's process group has no point-to-point send/recv")
        text = facts["text"]
        assert "4 unsupported calls" in text and "collectives (7 ops, 9 calls," in text, text
        assert "2.00 KiB over 2 ranks  [256] float32" in text, text
        passed, why = facts["gate"]
        assert not passed and why.startswith("4 unsupported calls of 4 ops: "), why


def test_an_empty_tensor_in_all_reduce_or_all_to_all_is_unsupported_as_the_april_gates_say(tmp_path: Path,
                                                                                           group: RankGroup) -> None:
    """AllReduceXLAOp's and AllToAllXlaOp's can_handle turn an empty tensor away; the same calls with elements run."""
    ranks = group.run(tmp_path, """
        import neuron_lab
        with neuron_lab.track() as rep:
            dist.all_reduce(torch.empty(0, device=dev))
            dist.all_reduce(torch.ones(4, device=dev))
            dist.all_to_all_single(torch.empty(0, device=dev), torch.empty(0, device=dev))
        report(why={r.op: r.why for r in rep.ops_not_native if r.kind == "unsupported"},
               counts={f"{r.kind} {r.op}": r.count for r in rep.ops_not_native})
    """)
    for facts in ranks:
        assert facts["why"] == {
            "c10d::all_reduce.sum": "TorchNeuron's all_reduce refuses an empty tensor (AllReduceXLAOp.can_handle: "
                                "\"cannot be empty\")",
            "c10d::all_to_all_single": "TorchNeuron's all_to_all_single refuses an empty tensor "
                                       "(AllToAllXlaOp.can_handle: \"cannot be empty\")"}, facts["why"]
        assert facts["counts"]["unsupported c10d::all_reduce.sum"] == 1  # the call with elements runs there
        assert facts["counts"]["collective c10d::all_reduce.sum"] == 2


@pytest.mark.skipif(not COMPILED, reason="the pure-Python core puts no device lanes into torch.profiler")
def test_collectives_are_device_work_in_torch_profiler_and_the_profile_report(tmp_path: Path, group: RankGroup) -> None:
    """As NCCL's kernels on CUDA: each collective is a kernel on its rank's device lane from call to completion, so
    a rank that waits for a late peer shows the wait there, at the line that issued it; a call from another thread
    and point-to-point calls (which TorchNeuron lacks, so each is also reported unsupported) pair up as well."""
    ranks = group.run(tmp_path, f"""
        import threading, time, neuron_lab
        from torch.profiler import profile, ProfilerActivity
        x = torch.ones(256, device=dev)
        dist.all_reduce(x)  # the group's first collective connects gloo's pairs: not what is measured
        with neuron_lab.profile(export=f"{tmp_path}/rank{{rank}}.json") as rep:
            dist.barrier(group=cpu_group)  # both profiling (gloo's own group: not a `neuron` collective)
            if rank == 1:
                time.sleep(0.5)
            dist.all_reduce(x)
            dist.all_gather_into_tensor(torch.empty(512, device=dev), x)
            worker = threading.Thread(target=dist.all_reduce, args=(x,))
            worker.start()
            worker.join()
            dist.all_reduce(x)
            if rank == 0:
                time.sleep(0.3)
                dist.send(x, 1)
            else:
                dist.recv(x, 0)
        p = rep.profiled
        mine = [r for r in p.rows if r.kind == "collective"]
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as raw:
            dist.all_reduce(x)
        report(rows={{r.op: [r.calls, r.shapes, sorted([s.site.line, s.calls] for s in r.sites)] for r in mine}},
               seconds={{r.op: r.device_ns / 1e9 for r in mine}},
               spans=[[lane.name, s.name] for lane in p.timeline.lanes for s in lane.spans if s.kind == "collective"],
               raw={{e.key: e.self_device_time_total > 0 for e in raw.key_averages() if e.key.startswith("c10d")}})
    """)
    lines = [line.strip() for line in (tmp_path / "rank.py").read_text().splitlines()]
    reduce_at = [i + 1 for i, line in enumerate(lines) if line == "dist.all_reduce(x)"]  # (the warm-up has a comment)
    gather_at = lines.index("dist.all_gather_into_tensor(torch.empty(512, device=dev), x)") + 1
    # the worker's call is the main thread's line when the worker issues it: start() returns once the worker runs,
    # so that is start's line or join's, as the two threads race
    worker_at = {lines.index("worker.start()") + 1, lines.index("worker.join()") + 1}
    for r, facts in enumerate(ranks):
        p2p, p2p_at = ("c10d::send", lines.index("dist.send(x, 1)") + 1) if r == 0 else \
            ("c10d::recv", lines.index("dist.recv(x, 0)") + 1)
        (worker,) = [at for at, _ in facts["rows"]["c10d::all_reduce.sum"][2] if at not in reduce_at]
        assert worker in worker_at, (worker, worker_at)
        assert facts["rows"] == {
            "c10d::all_reduce.sum": [3, [[256]], sorted([[reduce_at[0], 1], [worker, 1], [reduce_at[1], 1]])],
            "c10d::all_gather_into_tensor": [1, [[256]], [[gather_at, 1]]],
            p2p: [1, [[256]], [[p2p_at, 1]]]}, facts["rows"]
        assert facts["spans"] == [[f"neuron:{r}", name] for name in (
            "c10d::all_reduce.sum", "c10d::all_gather_into_tensor", "c10d::all_reduce.sum", "c10d::all_reduce.sum",
            p2p)]
        assert facts["raw"] == {"c10d::all_reduce.sum": True}
        trace = json.loads((tmp_path / f"rank{r}.json").read_text())["traceEvents"]
        kernels = [(e["name"], e["pid"], e["args"]["device"], e["args"]["bytes"]) for e in trace
                   if e.get("ph") == "X" and e.get("cat") == "kernel" and e["name"].startswith("c10d::")]
        assert kernels == [(name, r, f"neuron:{r}", 1024) for name in (
            "c10d::all_reduce.sum", "c10d::all_gather_into_tensor", "c10d::all_reduce.sum", "c10d::all_reduce.sum",
            p2p)]
    early, late = (ranks[k]["seconds"]["c10d::all_reduce.sum"] for k in (0, 1))
    assert early >= 0.45 and late < early - 0.2, (early, late)  # rank 0 waited at the all_reduce for rank 1
    assert ranks[1]["seconds"]["c10d::recv"] >= 0.25  # rank 1's recv ran until rank 0 sent, 0.3 s later


def test_a_rank_that_used_the_device_before_init_process_group_fails_as_on_hardware(tmp_path: Path) -> None:
    """TorchNeuron's first `neuron` group asserts the runtime is not up (distributed/backend.py:292-295); loading
    neuron_lab (the banner reads capacity) does not start it, touching the device does."""
    ranks = _run_ranks(tmp_path, """
        import json, os
        import torch, torch.distributed as dist
        import neuron_lab, torch_neuronx
        from neuron_lab import backend

        loaded = [backend.active().capacity() > 0, torch_neuronx.is_neuron_runtime_initialized()]
        x = torch.ones(2, device="neuron")
        try:
            dist.init_process_group(backend="neuron")
            error = None
        except AssertionError as e:
            error = str(e)
        print(json.dumps({"loaded": loaded, "error": error}), flush=True)
        os._exit(0)  # no group to tear down
    """, prelude="")
    assert ranks == [{"loaded": [True, False],
                      "error": "Neuron runtime should not be initialized before the init_process_group."}] * RANKS


def test_the_runtime_is_up_after_init_process_group(tmp_path: Path, group: RankGroup) -> None:
    ranks = group.run(tmp_path, """
        report(up=torch_neuronx.is_neuron_runtime_initialized(), init=torch.neuron.is_initialized())
    """)
    assert ranks == [{"up": True, "init": True}] * RANKS


def test_an_all_reduce_whose_shapes_differ_raises_on_every_rank_with_each_ranks_shape(tmp_path: Path,
                                                                                      group: RankGroup) -> None:
    """Gloo handed different sizes aborted rank 0's process; now every rank raises the same error, and the group
    still works after it."""
    ranks = group.run(tmp_path, """
        import json
        from neuron_lab.backend.emulator.mismatch import CollectiveMismatch
        rank = dist.get_rank()
        x = torch.ones(4 + rank, device="neuron")
        try:
            dist.all_reduce(x)
            error = None
        except CollectiveMismatch as e:
            error = str(e)
        y = torch.ones(3, device="neuron")
        dist.all_reduce(y)
        print(json.dumps({"error": error, "after": y.tolist()}), flush=True)
    """)
    assert ranks == [{"error": "all_reduce: the ranks' tensors differ (rank 0: [4] float32; rank 1: [5] float32); "
                               "every rank must pass the same shape and dtype", "after": [2.0] * 3}] * 2
