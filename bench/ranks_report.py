"""The merged report's cost per `%%neuron ranks` cell at 4 and 16 ranks (issue 30: <= 10% of the cell's time at 16).

Sixteen engines do not start on a 2-core machine in useful time, so this measures the notebook's side alone, on
real reports: one rank's report of a real training cell (20 DDP steps of a 3x256 MLP, batch 64, AdamW, an atan2
that falls back to the CPU, on a 1-rank `neuron` group: its collectives, fallbacks and call sites), sent as the
engines send it (JSON), N times with each rank's own device and time. Per cell the notebook then does, for each
rank, what ``Ranks._fetch`` does (decode, ``Report.from_dict``, rename its sites to the notebook's), collapses the
ranks' printed lines (``rank_lines.collapse``), builds the ``RanksReport`` and renders its text and HTML. The
figure is that CPU time (median of the rounds) over the cell's own wall time on one rank (a rank runs the cell in
parallel with the others, so the cell takes at least that long on N ranks).

    .venv/bin/python bench/ranks_report.py [--rounds 15] [--figures out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from dataclasses import replace

RANKS = (4, 16)
TARGET_PCT = 10.0  # at 16 ranks
STEPS = 20


def _cell_report() -> dict:
    """A real cell's report on a 1-rank `neuron` group: DDP steps, their all-reduces at this file's lines."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                      LOCAL_WORLD_SIZE="1")
    import torch
    import torch.distributed as dist
    import torch_neuronx  # noqa: F401  (the `neuron` device and process-group backend)
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    import neuron_lab

    torch.set_num_threads(1)
    dist.init_process_group(backend="neuron")
    dev = torch.device("neuron", torch.neuron.current_device())
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                              nn.Linear(256, 256)).to(dev))
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(64, 256).to(dev)
    with neuron_lab.track() as report:
        for _ in range(STEPS):
            opt.zero_grad()
            y = model(x)
            torch.atan2(y, x).square().mean().backward()  # a CPU fallback per step: its rows and lines too
            opt.step()
        loss = model(x).square().mean().item()
        print(f"loss {loss:.4f}")
    dist.destroy_process_group()
    return report.as_dict()


def _notebook_side(sent: list[str], printed: dict[int, list[str]]) -> int:
    """What the notebook does with N ranks' reports of one cell; its output's length (so nothing is optimized away)."""
    from neuron_lab.report.model import Report, Site
    from neuron_lab.report.rank_lines import collapse
    from neuron_lab.report.ranks import RankResult, RanksReport

    def site(s: Site) -> Site:  # as Ranks._fetch renames an engine's lines to the notebook cell's
        return replace(s, filename="In[5]", cell=5, line=s.line + 1)

    results = []
    for rank, data in enumerate(sent):
        report = Report.from_dict(json.loads(data))
        report.map_sites(site, lambda f: f)
        results.append(RankResult(rank, replace(report, title="In[5]"), where=f"engine {rank}",
                                  host=f"host{rank // 8}"))
    rr = RanksReport("In[5]", results)
    shown = collapse(printed)
    return len(str(rr)) + len(rr._repr_html_()) + len(shown)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--figures", metavar="FILE", help="write the figures as JSON (bench/figures.py)")
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(__file__))
    from figures import figure, write

    base = _cell_report()
    cell_s = base["wall_s"]
    figs = []
    print(f"one rank's cell: {STEPS} DDP steps, {cell_s * 1e3:.1f} ms wall; notebook-side merge per cell, "
          f"median of {args.rounds} rounds (CPU time)")
    print("| ranks | merge + render | % of the cell | target |\n|---|---|---|---|")
    for n in RANKS:
        sent = [json.dumps({**base, "device": f"neuron:{r % 8}", "wall_s": cell_s * (1 + r / 100)}) for r in range(n)]
        printed = {r: [f"step {s} loss {0.5 + s / 100 + r / 1000:.4f}" for s in range(STEPS)] + [f"rank {r} done"]
                   for r in range(n)}  # a per-rank loss each step: shown once per step with each rank's value
        samples = []
        for _ in range(args.rounds):
            t = time.process_time()
            _notebook_side(sent, printed)
            samples.append(time.process_time() - t)
        ms = [s * 1e3 for s in samples]
        pct = [100 * s / cell_s for s in samples]
        target = TARGET_PCT if n == 16 else None
        figs += [figure(f"ranks report: merge + render per cell, {n} ranks", ms, "ms", None),
                 figure(f"ranks report: merge + render, % of the cell, {n} ranks", pct, "%", target)]
        print(f"| {n} | {statistics.median(ms):.1f} ms | {statistics.median(pct):.1f}% | "
              f"{'<= ' + str(TARGET_PCT) + '%' if target else '-'} |")
    write(args.figures, figs)


if __name__ == "__main__":
    main()
