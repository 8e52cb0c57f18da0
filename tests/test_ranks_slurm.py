"""`%neuron ranks start N --engines slurm`: engines in a real Slurm job (ipyparallel's Slurm launcher, `sbatch` and
`srun`), as ranks of one `neuron` process group; a DDP step's merged report on 2 emulated hosts × 2 ranks, stop
cancelling the job, ranks numbered by srun, a job cancelled outside the notebook said so on the next cell, a planted
mismatch's preflight table with the job cancelled, and `neuron-lab run --engines slurm` on a notebook.

Needs a Slurm that answers (`tools/slurm_local.sh` starts one on this machine; `.ci/run` does): skipped without one,
failed in CI. The 4 engines start once for the module (about 50 s on a loaded 2-core machine). Every wait is bounded
(`--timeout 120` at start and on the cells), and whatever a test started is cancelled and killed on its way out.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
import slurm
from conftest import neuron_lab_run
from IPython.core.interactiveshell import InteractiveShell
from rank_steps import DDP_AND_FSDP2, assert_ddp_and_fsdp2
from shells import loaded_shell, run
from test_ranks import ALL_REDUCE_AND_DDP, _children, _gone, _kill, ranks_error

from neuron_lab.extension import session_of
from neuron_lab.report.ranks import RanksReport
from neuron_lab.session.slurm_job import UP, job_state

START = "%neuron ranks start {n} --engines slurm --partition {partition} --time 10 --timeout 120"


def _cancel(job_id: str | None) -> None:
    if job_id:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=30, check=False)


@pytest.fixture(scope="module")
def slurm_shell() -> Iterator[tuple[InteractiveShell, str, str]]:
    """A shell with 4 ranks on 2 emulated hosts in one Slurm job; the start's output and the job's id."""
    partition, before, job_id = slurm.default_partition(), _children(), None
    with loaded_shell(instance=True) as sh:
        try:
            _, cap = run(sh, START.format(n=4, partition=partition) + " --hosts 2")
            job_id = session_of(sh).ranks.job.job_id
            yield sh, cap.stdout, job_id
        finally:
            _cancel(job_id)
            _kill(_children() - before)


def test_a_ddp_step_on_two_hosts_in_a_slurm_job_is_one_report_with_each_ranks_facts(slurm_shell) -> None:
    sh, started, job_id = slurm_shell
    assert f"neuron_lab: Slurm job {job_id} submitted" in started and "neuron_lab: 4 ranks ready in" in started
    status = str(run(sh, "%neuron ranks")[0].result).splitlines()
    assert status[1] == f"  Slurm job {job_id}: RUNNING"
    assert [line.split()[:3] + line.split()[5:] for line in status[2:]] == [
        ["rank", "0", "host0", "neuron:0", "up"], ["rank", "1", "host0", "neuron:1", "up"],
        ["rank", "2", "host1", "neuron:0", "up"], ["rank", "3", "host1", "neuron:1", "up"]]
    res, cap = run(sh, ALL_REDUCE_AND_DDP.replace("--timeout 60", "--timeout 120"))
    rr, n = res.result, res.execution_count
    assert isinstance(rr, RanksReport) and not rr.failed
    for rank in range(4):  # 1 + 2 + 3 + 4 on every rank
        assert f"[stdout:{rank}] rank {rank}: sum 10\n" in cap.stdout
    assert [(r.rank, r.host, r.report.device) for r in rr.ranks] == [
        (0, "host0", "neuron:0"), (1, "host0", "neuron:1"), (2, "host1", "neuron:0"), (3, "host1", "neuron:1")]
    for r in rr.ranks:
        rows = {row.op: row for row in r.report.ops_not_native if row.kind == "collective"}
        assert {op: (row.count, row.nbytes, row.ranks) for op, row in rows.items()} == {
            "c10d::all_reduce.sum": (2, 1168, 4), "c10d::broadcast": (2, 192, 4), "c10d::all_gather": (1, 8, 4)}
        assert [(sc.site.line, sc.count) for sc in rows["c10d::all_reduce.sum"].sites] == [(6, 1), (10, 1)]
        assert r.report.memory.after > 0 and r.report.memory.peak >= r.report.memory.after  # each rank's own
    text = str(rr).splitlines()
    assert text[1].split()[:5] == ["rank", "host", "device", "time", "memory"]
    assert f"        at In[{n}] line 6: dist.all_reduce(x)  (4×)" in text  # one line for the 4 ranks
    assert f"        at In[{n}] line 9: model = DDP(torch.nn.Linear(8, 4).to(device))  (8×)" in text


def test_a_ddp_and_an_fsdp2_step_in_a_slurm_job_on_two_hosts_show_their_collectives_at_their_lines(
        slurm_shell) -> None:
    sh, _, _ = slurm_shell
    res, cap = run(sh, DDP_AND_FSDP2)
    assert_ddp_and_fsdp2(res.result, ["host0", "host0", "host1", "host1"], cap.stdout)


def test_stop_cancels_the_job_and_leaves_no_engine(slurm_shell) -> None:
    sh, _, job_id = slurm_shell
    pids = [e.pid for e in session_of(sh).ranks.engines]  # this machine is the job's node: its pids are here
    assert str(run(sh, "%neuron ranks stop")[0].result).startswith("neuron_lab ranks: stopped 4 ranks")
    assert job_state(job_id) not in (*UP, "COMPLETING") and _gone(pids)


def test_srun_numbers_the_ranks_and_a_job_cancelled_outside_is_said_on_the_next_cell() -> None:
    partition, before, job_id = slurm.default_partition(), _children(), None
    with loaded_shell(instance=True) as sh:
        try:
            run(sh, START.format(n=2, partition=partition))
            assert not Path("slurm_engine.sbatch").exists()  # the batch script is the cluster's, not the notebook's
            ranks = session_of(sh).ranks
            job_id, pids = ranks.job.job_id, [e.pid for e in ranks.engines]
            _, cap = run(sh, "%%neuron ranks --timeout 120\nimport os, torch.distributed as dist\n"
                             "print(os.environ['SLURM_JOB_ID'], os.environ['SLURM_PROCID'], dist.get_rank())\n")
            for rank in (0, 1):  # the group's rank is the one srun gave the engine
                assert f"[stdout:{rank}] {job_id} {rank} {rank}\n" in cap.stdout
            _cancel(job_id)
            assert ranks_error(sh, "%%neuron ranks\nx = 1\n") == (
                f"%%neuron ranks: the Slurm job {job_id} was cancelled outside the notebook (state CANCELLED): "
                f"`%neuron ranks start 2 --engines slurm --partition {partition} --time 10 --restart`")
            run(sh, "%neuron ranks stop")
            assert job_state(job_id) not in (*UP, "COMPLETING") and _gone(pids) and _gone(_children() - before)
        finally:
            _cancel(job_id)
            _kill(_children() - before)


def test_a_planted_mismatch_stops_a_slurm_start_with_the_preflight_table_and_cancels_the_job(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from neuron_lab.session import launch

    def planted(*args: object, **kwargs: object) -> list[dict[str, str]]:  # host1 set up another way
        envs = rank_envs(*args, **kwargs)
        return [{**env, "FI_PROVIDER": "tcp" if r else "efa"} for r, env in enumerate(envs)]

    rank_envs = launch.rank_envs
    monkeypatch.setattr(launch, "rank_envs", planted)
    partition, before = slurm.default_partition(), _children()
    with loaded_shell(instance=True) as sh:
        try:
            res, cap = run(sh, START.format(n=2, partition=partition) + " --hosts 2", ok=False)
            msg = str(res.error_in_exec).splitlines()
            assert msg[0] == ("%neuron ranks start: the ranks differ, so none joined the process group; nothing is "
                              "left running")
            assert msg[1] == "neuron_lab preflight: 2 ranks differ in FI_PROVIDER"
            job_id = re.search(r"Slurm job (\d+) submitted", cap.stdout)[1]
            assert job_state(job_id) not in (*UP, "COMPLETING") and session_of(sh).ranks is None
            assert _gone(_children() - before)
        finally:
            _kill(_children() - before)


def test_neuron_lab_run_engines_slurm_starts_a_notebooks_ranks_in_a_slurm_job(tmp_path) -> None:
    slurm.default_partition()  # skip (fail in CI) without a Slurm
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (
        "%load_ext neuron_lab", "%neuron ranks start 2 --timeout 120",
        "%%neuron ranks --timeout 120\nimport os, torch, torch.distributed as dist\n"
        "x = torch.ones(2, device=device)\ndist.all_reduce(x)\n"
        "print('job', os.environ['SLURM_JOB_ID'], 'rank', dist.get_rank(), int(x[0]))\n",
        "%neuron ranks stop")]
    nbformat.write(nb, tmp_path / "slurm.ipynb")
    code, text = neuron_lab_run(tmp_path, "slurm.ipynb", "--engines", "slurm", "--output", "out.ipynb", timeout=400)
    assert code == 0, text
    outputs = nbformat.read(tmp_path / "out.ipynb", as_version=4).cells[2].outputs
    printed = "".join(o.get("text") or o.get("data", {}).get("text/plain", "") for o in outputs)  # kernel: display data
    jobs = set(re.findall(r"job (\d+) rank (\d) 2", printed))
    assert {rank for _, rank in jobs} == {"0", "1"} and len({job for job, _ in jobs}) == 1, text
    assert job_state(jobs.pop()[0]) not in (*UP, "COMPLETING")  # the notebook's stop cancelled it
