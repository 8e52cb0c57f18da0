"""Ranks beyond one machine: the address the engines reach the notebook at (``session.ranks_address``), and, for
real, 2 ranks started over ssh at this machine's non-loopback address (`--ssh-hosts 192.0.2.2:2222`), as engines on
another host are: the controller listens there and its connection files name it, every rank's ``MASTER_ADDR`` and
``NEURON_RT_ROOT_COMM_ID`` name it, a DDP and an FSDP2 step's report is right, and stop leaves nothing.

Needs tools/ssh_local.sh's sshd on the non-loopback address (skipped without one, failed in CI); one engine start,
every wait bounded (`--timeout 120`).
"""

from __future__ import annotations

import glob
import json
import os
import socket

import pytest
import sshd
from rank_steps import DDP_AND_FSDP2, assert_ddp_and_fsdp2
from shells import loaded_shell, run
from test_ranks import _kill
from test_ranks_ssh import _cluster_procs, _none_left

from neuron_lab.extension import session_of
from neuron_lab.session import ranks_address
from neuron_lab.session.ranks import Ranks, RanksError
from neuron_lab.session.ranks_address import LOOPBACK, choose


@pytest.fixture
def no_address_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NEURON_LAB_RANKS_ADDRESS", raising=False)


def test_engines_on_this_machine_reach_the_notebook_on_loopback(no_address_variable) -> None:
    for engines in ("local", "mpi", "attach"):
        assert choose("", engines) == LOOPBACK
    assert choose("", "ssh", ["localhost", "127.0.0.1", "::1"]) == LOOPBACK


def test_ssh_engines_elsewhere_reach_it_at_the_interface_that_routes_to_the_first_of_their_hosts(
        no_address_variable) -> None:
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.77", 22))  # a documentation address: a route, no packet
    except OSError:
        pytest.skip("this machine has no route to a non-loopback address")
    finally:
        mine = probe.getsockname()[0]
        probe.close()
    assert choose("", "ssh", ["localhost", "192.0.2.77", "10.9.9.9"]) == mine == ranks_address.route_to("192.0.2.77")


def test_slurm_engines_reach_it_at_its_fqdn_and_the_setting_wins_over_the_variable_over_the_rule(
        monkeypatch: pytest.MonkeyPatch, no_address_variable) -> None:
    assert choose("", "slurm") == socket.getfqdn()
    monkeypatch.setenv("NEURON_LAB_RANKS_ADDRESS", "10.0.0.9")
    assert [choose("", "local"), choose(" head-node ", "slurm")] == ["10.0.0.9", "head-node"]


def test_loopback_is_told_by_address_or_name() -> None:
    assert [ranks_address.is_loopback(a) for a in ("127.0.0.1", "localhost", "::1", "192.0.2.2",
                                                   "no-such-host.invalid")] == [True, True, True, False, False]
    assert ranks_address.ip_of("localhost") == "127.0.0.1"


def test_an_address_that_does_not_resolve_stops_the_start_before_anything_starts() -> None:
    with pytest.raises(RanksError) as e:
        Ranks.start(2, address="no-such-host.invalid")
    assert str(e.value).startswith("the ranks' address 'no-such-host.invalid' does not resolve (")
    assert str(e.value).endswith("); `%config NeuronLab.ranks_address = 'IP'` sets it")


def test_ssh_engines_at_a_non_loopback_address_reach_the_controller_and_store_there_and_run_a_ddp_step(
        no_address_variable) -> None:
    address = sshd.non_loopback()
    assert choose("", "ssh", [address]) == address  # the rule finds the address the test starts engines at
    profile_dir = ""
    with loaded_shell(instance=True) as sh:
        try:
            _, cap = run(sh, f"%neuron ranks start 2 --engines ssh --ssh-hosts {address}:{sshd.PORT} --timeout 120")
            ranks = session_of(sh).ranks
            profile_dir = ranks._profile_dir
            assert f"(MASTER_ADDR={address} MASTER_PORT={ranks.store.port})" in cap.stdout, cap.stdout
            assert f"neuron_lab: rank 1 ready: pid {ranks.engines[1].pid}, neuron:1 on {address}" in cap.stdout
            # the controller's connection file for engines, and the copy the launcher made for its host's engines
            files = glob.glob(os.path.join(profile_dir, "**", "ipcontroller-*engine.json"), recursive=True)
            assert len(files) == 2, files
            for name in files:
                with open(name) as f:
                    assert json.load(f)["interface"] == f"tcp://{address}", name  # where the engines connect
            assert f"MASTER_ADDR={address} MASTER_PORT={ranks.store.port}," in str(ranks)
            _, cap = run(sh, "%%neuron ranks --timeout 120\nimport os\n"
                             "print(os.environ['MASTER_ADDR'], os.environ['NEURON_RT_ROOT_COMM_ID'].split(':')[0])\n")
            assert f"{address} {address}" in cap.stdout and LOOPBACK not in cap.stdout, cap.stdout
            res, cap = run(sh, DDP_AND_FSDP2)
            assert_ddp_and_fsdp2(res.result, [address, address], cap.stdout)
            assert str(run(sh, "%neuron ranks stop")[0].result).startswith("neuron_lab ranks: stopped 2 ranks")
            assert _none_left(profile_dir) == set()
        finally:
            if profile_dir:
                _kill(_cluster_procs(profile_dir))
