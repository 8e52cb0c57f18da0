"""`%neuron ranks attach`: the engines of an ipyparallel cluster that runs already (`ipcluster start -n 2`, started
here as a team would start it) become ranks 0 and 1 of one `neuron` process group; a DDP step's report; `stop`
detaches and leaves the engines running, for their owner to stop.

The cluster starts once, in a process group of its own, with a deadline; it is stopped (`ipcluster stop`, then killed
by its group) whatever happened.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from rank_steps import DDP_AND_FSDP2, assert_ddp_and_fsdp2
from shells import loaded_shell, run
from test_ranks import ALL_REDUCE_AND_DDP, _gone

from neuron_lab.extension import session_of
from neuron_lab.report.ranks import RanksReport

IPCLUSTER = [sys.executable, "-m", "ipyparallel.cluster"]  # `ipcluster`, with this interpreter
START_S = 120.0  # the cluster's engines register within this


def _engine_pids(cluster_file: Path) -> list[int]:
    """The engines' pids, as the cluster file says (its engine set's engines)."""
    try:
        sets = json.loads(cluster_file.read_text()).get("engines", {}).get("sets", {})
    except (OSError, ValueError):  # not there yet, or being written
        return []
    return [launcher["pid"] for s in sets.values() for launcher in s.get("engines", {}).values()
            if launcher.get("pid", -1) > 0]


@pytest.fixture(scope="module")
def ipcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """`ipcluster start -n 2` in a profile of its own; its cluster file, once both engines registered."""
    profile_dir = tmp_path_factory.mktemp("ipcluster-profile")
    proc = subprocess.Popen([*IPCLUSTER, "start", "-n", "2", f"--profile-dir={profile_dir}", "--cluster-id=team",
                             "--log-level=ERROR"], start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
    cluster_file = profile_dir / "security" / "cluster-team.json"
    try:
        deadline = time.monotonic() + START_S
        while len(_engine_pids(cluster_file)) < 2:
            assert proc.poll() is None, f"ipcluster exited (rc {proc.returncode})"
            assert time.monotonic() < deadline, f"ipcluster's 2 engines did not start within {START_S:g} s"
            time.sleep(0.5)
        yield cluster_file
    finally:
        subprocess.run([*IPCLUSTER, "stop", f"--profile-dir={profile_dir}", "--cluster-id=team"],
                       capture_output=True, timeout=60, check=False)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


def test_attached_engines_are_ranks_of_a_ddp_step_and_stop_leaves_them_running(ipcluster: Path) -> None:
    engines = _engine_pids(ipcluster)
    with loaded_shell(instance=True) as sh:
        _, cap = run(sh, f"%neuron ranks attach --cluster-file {ipcluster} --timeout 120")
        where = f"cluster file {ipcluster}"
        assert f"neuron_lab: attached to the 2 engines of the ipyparallel cluster at {where}" in cap.stdout
        assert "neuron_lab: 2 ranks ready in" in cap.stdout
        status = str(run(sh, "%neuron ranks")[0].result).splitlines()
        assert status[0].startswith(f"neuron_lab ranks: 2 of 2 ranks up on the ipyparallel cluster at {where} "
                                    "(attached)")
        res, cap = run(sh, ALL_REDUCE_AND_DDP.replace("--timeout 60", "--timeout 120"))
        rr = res.result
        assert isinstance(rr, RanksReport) and not rr.failed
        assert [(r.rank, r.report.device) for r in rr.ranks] == [(0, "neuron:0"), (1, "neuron:1")]
        for rank in (0, 1):
            assert f"[stdout:{rank}] rank {rank}: sum 3\n" in cap.stdout
        for r in rr.ranks:
            rows = {row.op: (row.count, row.nbytes) for row in r.report.ops_not_native if row.kind == "collective"}
            assert rows == {"c10d::all_reduce.sum": (2, 1168), "c10d::broadcast": (2, 192), "c10d::all_gather": (1, 8)}
        res, cap = run(sh, DDP_AND_FSDP2)  # the team's cluster is on this one host
        assert_ddp_and_fsdp2(res.result, [socket.gethostname()] * 2, cap.stdout)
        assert str(run(sh, "%neuron ranks stop")[0].result) == (
            f"neuron_lab ranks: detached from 2 ranks; their engines keep running (the cluster at {where} was not "
            "started here)")
        assert session_of(sh).ranks is None
    assert not _gone(engines) and all(psutil.Process(pid).is_running() for pid in engines)  # left for their owner
