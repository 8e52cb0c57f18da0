"""`%neuron ranks start N --engines ssh`: engines started over ssh by ipyparallel's own SSH launcher, on two ssh hosts
that are this machine (`localhost` and `127.0.0.1`, so two emulated hosts × 2 ranks), as ranks of one `neuron`
process group numbered host by host; a DDP and an FSDP2 step's merged report, a lost host named with its ranks, and
nothing left running after stop.

Needs an sshd that answers on localhost:2222 (`tools/ssh_local.sh` starts one; `.ci/run` does): skipped without one,
failed in CI. The 4 engines start once for the module. Every wait is bounded (`--timeout 120` at start and on the
cells), and whatever a test started is killed on its way out.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import psutil
import pytest
import sshd
from IPython.core.interactiveshell import InteractiveShell
from rank_steps import DDP_AND_FSDP2, assert_ddp_and_fsdp2
from shells import loaded_shell, run
from test_ranks import _kill, ranks_error

from neuron_lab.extension import session_of
from neuron_lab.session.ssh_engines import HOST_INDEX, SSHOptions

START = "%neuron ranks start {n} --engines ssh --ssh-hosts {hosts} --timeout 120"
GONE_S = 30.0  # an engine's nanny sees its engine killed and ends within this


def _cluster_procs(profile_dir: str) -> set[int]:
    """Every process of the cluster in ``profile_dir``, wherever it was started from (an ssh engine is not this
    process's child): the controller, the engines and their nannies all have it as ``IPP_PROFILE_DIR``."""
    found = set()
    for p in psutil.process_iter():
        try:
            if p.environ().get("IPP_PROFILE_DIR", "").startswith(profile_dir):
                found.add(p.pid)
        except psutil.Error:
            pass
    return found


def _none_left(profile_dir: str) -> set[int]:
    """The cluster's processes still there after :data:`GONE_S` (none, once it stopped)."""
    deadline = time.monotonic() + GONE_S
    while (left := _cluster_procs(profile_dir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


@pytest.fixture(scope="module")
def ssh_shell() -> Iterator[tuple[InteractiveShell, str, str]]:
    """A shell with 4 ranks on the 2 ssh hosts; the start's output and the cluster's profile folder."""
    hosts, profile_dir = sshd.hosts(), ""
    with loaded_shell(instance=True) as sh:
        try:
            _, cap = run(sh, START.format(n=4, hosts=hosts))
            profile_dir = session_of(sh).ranks._profile_dir
            yield sh, cap.stdout, profile_dir
        finally:
            if profile_dir:
                _kill(_cluster_procs(profile_dir))


def test_a_ddp_and_an_fsdp2_step_over_ssh_on_two_hosts_are_one_report_with_each_ranks_host(ssh_shell) -> None:
    sh, started, _ = ssh_shell
    assert "neuron_lab: 4 ranks ready in" in started
    pids = [e.pid for e in session_of(sh).ranks.engines]
    for rank, host, device in ((0, "host0", 0), (1, "host0", 1), (2, "host1", 0), (3, "host1", 1)):
        assert f"neuron_lab: rank {rank} ready: pid {pids[rank]}, neuron:{device} on {host}" in started
    res, cap = run(sh, "%%neuron ranks --timeout 120\nimport os\n"
                       "print(os.environ['RANK'], os.environ['NEURON_LAB_SSH_HOST'], os.environ['GROUP_RANK'], "
                       "os.environ['LOCAL_RANK'])\n")  # each rank's own line: it names its rank
    for rank in range(4):  # the ssh host the launcher started it on, in --ssh-hosts order, is its node
        assert f"[stdout:{rank}] {rank} {rank // 2} {rank // 2} {rank % 2}\n" in cap.stdout, cap.stdout
    res, cap = run(sh, DDP_AND_FSDP2)
    assert_ddp_and_fsdp2(res.result, ["host0", "host0", "host1", "host1"], cap.stdout)


def test_a_lost_ssh_host_is_named_with_its_ranks(ssh_shell) -> None:
    sh, _, _ = ssh_shell
    lost = [e for e in session_of(sh).ranks.engines if e.host == "host1"]
    procs = [psutil.Process(e.pid) for e in lost]
    for p in procs:  # every engine of host1
        p.kill()
    psutil.wait_procs(procs, timeout=30)
    assert ranks_error(sh, "%%neuron ranks\nprint('never')\n") == (
        f"%%neuron ranks: host host1 is lost, with its ranks 2-3 (pids {lost[0].pid}, {lost[1].pid}): the others "
        f"would wait for it at their first collective; `{session_of(sh).ranks.restart}` starts the group afresh")


def test_stop_ends_every_engine_over_ssh_and_leaves_nothing(ssh_shell) -> None:
    sh, _, profile_dir = ssh_shell
    assert _cluster_procs(profile_dir)
    assert str(run(sh, "%neuron ranks stop")[0].result).startswith("neuron_lab ranks: stopped 4 ranks")
    assert _none_left(profile_dir) == set()


def test_each_ssh_hosts_engines_get_its_index_the_notebooks_settings_and_a_profile_folder_of_their_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FI_PROVIDER", "efa")  # a setting the preflight compares: the remote engines get it
    monkeypatch.setenv("PYTHONPATH", "/src")
    traits = SSHOptions.parse("node1, ops@node2:2222").traits(4, "/tmp/p")
    assert {host: (e["n"], e["environment"][HOST_INDEX], e["environment"]["FI_PROVIDER"],
                   e["environment"]["PYTHONPATH"], e["remote_profile_dir"])
            for host, e in traits["engines"].items()} == {"node1": (2, "0", "efa", "/src", "/tmp/p/ssh0"),
                                                          "ops@node2:2222": (2, "1", "efa", "/src", "/tmp/p/ssh1")}
    assert SSHOptions.parse("node1,ops@node2:2222").host_name(1) == "node2"
