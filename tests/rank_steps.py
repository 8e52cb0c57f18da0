"""The training steps every engine kind's tests run on their ranks, and the report facts each step must show: a DDP
step and an FSDP2 step (``fully_shard`` on each layer and the model, one optimizer step) in one cell, so one started
group serves both."""

from __future__ import annotations

from neuron_lab.report.ranks import RanksReport

DDP_AND_FSDP2 = """%%neuron ranks --timeout 120
import torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP
rank = dist.get_rank()
torch.manual_seed(0)
ddp = DDP(torch.nn.Linear(8, 4).to(device))
ddp(torch.ones(2, 8, device=device) * (rank + 1)).sum().backward()
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)).to(device)
for layer in net:
    fully_shard(layer)
fully_shard(net)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
loss = net(torch.ones(2, 8, device=device) * (rank + 1)).sum()
loss.backward()
opt.step()
print(f"rank {rank}: {len(net[0].weight.to_local())} of 16 rows of net[0] here")
"""
DDP, DDP_BACKWARD, FORWARD, BACKWARD = 7, 8, 14, 15  # the cell's lines (its magic line is line 1)


def assert_ddp_and_fsdp2(rr: RanksReport, hosts: list[str], printed: str) -> None:
    """Each rank's row (its host, its device), and on each rank DDP's broadcast and all_reduce and FSDP2's all_gather
    and reduce_scatter at their lines of the cell, over every rank."""
    world = len(hosts)
    assert isinstance(rr, RanksReport) and not rr.failed, str(rr)
    assert [(r.rank, r.host) for r in rr.ranks] == list(enumerate(hosts))
    for rank in range(world):  # FSDP2 sharded net[0]'s 16 rows over the ranks
        assert f"[stdout:{rank}] rank {rank}: {16 // world} of 16 rows of net[0] here\n" in printed, printed
    for r in rr.ranks:
        rows = {row.op: row for row in r.report.ops_not_native if row.kind == "collective"}
        lines = {op: sorted({sc.site.line for sc in row.sites}) for op, row in rows.items()}
        assert {op: row.ranks for op, row in rows.items()} == {op: world for op in rows}, lines
        assert lines["c10d::broadcast"] == [DDP] and DDP_BACKWARD in lines["c10d::all_reduce.sum"], lines
        assert FORWARD in lines["c10d::all_gather_into_tensor"], lines
        assert lines["c10d::reduce_scatter_tensor.avg"] == [BACKWARD], lines
