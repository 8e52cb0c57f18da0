"""Preflight before init_process_group (session.preflight): real rank processes meet at the launcher's rendezvous
store; a planted mismatch stops every rank with the same table instead of a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from neuron_lab.session import launch, preflight

RANK = textwrap.dedent("""
    import json
    from neuron_lab.session import preflight
    try:
        ranks = preflight.check(60)
        print(json.dumps({"agree": [r["rank"] for r in ranks]}))
    except preflight.PreflightMismatch as e:
        print(json.dumps({"mismatch": str(e)}))
""")


def _ranks(tmp_path: Path, planted: dict[int, dict[str, str]]) -> list[dict]:
    store = launch.AgentStore()
    base = {k: v for k, v in os.environ.items() if not preflight.must_agree(k)}
    procs = [subprocess.Popen([sys.executable, "-c", RANK], env={**env, **planted.get(r, {})}, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r, env in enumerate(launch.rank_envs(base, 2, store.port))]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


def test_ranks_that_agree_pass_and_each_sees_every_rank(tmp_path: Path) -> None:
    assert _ranks(tmp_path, {}) == [{"agree": [0, 1]}] * 2


def test_a_planted_mismatch_stops_every_rank_with_one_table(tmp_path: Path) -> None:
    out = _ranks(tmp_path, {0: {"FI_PROVIDER": "efa"}, 1: {"FI_PROVIDER": "tcp", "NEURON_RT_LOG_LEVEL": "INFO"}})
    assert out[0] == out[1]
    lines = out[0]["mismatch"].splitlines()
    assert lines[0] == "neuron_lab preflight: 2 ranks differ in FI_PROVIDER, NEURON_RT_LOG_LEVEL"
    assert lines[1].split() == ["rank", "host", "cores", "torch", "torch-neuronx", "neuron_lab",
                                "NEURON_RT_ROOT_COMM_ID", "FI_PROVIDER", "NEURON_RT_LOG_LEVEL"]
    assert [line.split()[:3] + line.split()[-2:] for line in lines[2:]] == [["0", os.uname().nodename, "0", "efa", "-"],
                                                                            ["1", os.uname().nodename, "1", "tcp",
                                                                             "INFO"]]


def test_what_must_agree_and_what_is_a_ranks_own() -> None:
    names = ("FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "NEURON_RT_ROOT_COMM_ID", "TORCH_NEURONX_MLIR_ATEN_OPS",
             "NEURON_RT_VISIBLE_CORES", "RANK", "FI_LOG_LEVEL")
    assert [n for n in names if preflight.must_agree(n)] == [
        "FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "NEURON_RT_ROOT_COMM_ID", "TORCH_NEURONX_MLIR_ATEN_OPS"]
    ranks = [preflight.facts({"RANK": str(r), "NEURON_LAB_HOST": f"host{r}"}) for r in range(2)]
    ranks[1]["versions"]["torch-neuronx"] = "2.14.0"
    assert preflight.mismatches(ranks) == ["torch-neuronx"]
