"""The `neuron` process group against gloo on CPU, on 2 ranks of this machine (issue 18's ratios).

Each rank is a process, started as torchrun starts them (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``...), with
``init_process_group(backend="neuron")`` and a gloo group on the same ranks for the CPU runs. Within a rank the
device and CPU runs alternate round by round, single-threaded; rank 0 reports the median of the per-round
ratios (absolute times differ 2-3x between machines, ratios measured in one run do not):

- a 1 MiB float32 all_reduce (SUM), 50 per round: target <= 1.2x gloo on CPU;
- a DDP training step (3x256 MLP, batch 64, AdamW), 10 per round: target <= 1.3x the same on CPU/gloo.

    .venv/bin/python bench/distributed.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap

from neuron_lab.session import launch

RANK_SCRIPT = textwrap.dedent("""
    import json, statistics, sys, time
    import torch, torch.distributed as dist
    import torch_neuronx  # the `neuron` device and process-group backend, as on a Trn instance
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    rounds = int(sys.argv[1])
    dist.init_process_group(backend="neuron")
    cpu_group = dist.new_group(backend="gloo")
    dev = torch.device("neuron", torch.neuron.current_device())

    def timed(fn, n):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.neuron.synchronize()
        return time.perf_counter() - t

    x_dev, x_cpu = torch.ones(2**18, device=dev), torch.ones(2**18)  # 1 MiB of float32
    reduce_dev = lambda: dist.all_reduce(x_dev)
    reduce_cpu = lambda: dist.all_reduce(x_cpu, group=cpu_group)

    def ddp_step(device, group):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                              nn.Linear(256, 256)).to(device)
        ddp = DDP(model, process_group=group)
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
        x = torch.randn(64, 256).to(device)

        def step():
            opt.zero_grad()
            ddp(x).pow(2).mean().backward()
            opt.step()
        return step

    step_dev, step_cpu = ddp_step(dev, None), ddp_step(torch.device("cpu"), cpu_group)
    for fn in (reduce_dev, reduce_cpu, step_dev, step_cpu):  # warm-up: first calls allocate and connect
        timed(fn, 3)
    ratios = {"all_reduce": [], "ddp": []}
    for _ in range(rounds):
        ratios["all_reduce"].append(timed(reduce_dev, 50) / timed(reduce_cpu, 50))
        ratios["ddp"].append(timed(step_dev, 10) / timed(step_cpu, 10))
    if dist.get_rank() == 0:
        print(json.dumps({k: statistics.median(v) for k, v in ratios.items()}), flush=True)
    dist.destroy_process_group()
""")
RANKS = 2
TARGETS = {"all_reduce": ("1 MiB all_reduce, 2 ranks", 1.2), "ddp": ("DDP AdamW step, 2 ranks", 1.3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    store = launch.AgentStore()  # the ranks' rendezvous, hosted here on a port the OS picks: none to lose to a race
    procs = []
    for r in range(RANKS):
        env = {**os.environ, "MASTER_ADDR": store.address, "MASTER_PORT": str(store.port),
               "TORCHELASTIC_USE_AGENT_STORE": "True", "WORLD_SIZE": str(RANKS),
               "RANK": str(r), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(RANKS), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, str(args.rounds)], env=env,
                                      stdout=subprocess.PIPE, text=True))
    try:
        outs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(p.returncode for p in procs):
        sys.exit(f"a rank failed: return codes {[p.returncode for p in procs]}")
    result = json.loads(outs[0].strip().splitlines()[-1])
    print(f"neuron process group / gloo on CPU, {RANKS} ranks on this machine, median of {args.rounds} rounds")
    print("| workload | ratio | target | met? |\n|---|---|---|---|")
    for key, (name, target) in TARGETS.items():
        print(f"| {name} | {result[key]:.2f}x | <= {target}x | {'yes' if result[key] <= target else 'no'} |")


if __name__ == "__main__":
    main()
