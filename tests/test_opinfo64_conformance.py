"""OpInfo conformance in float64 under TorchNeuron's 64-bit rule: op_db's float64 samples on `neuron` compute what
TorchNeuron computes (float64 tensors with dimensions in float32, op by op: tests/opinfo64_sweep.py).

The sweep runs as NSHARDS tests so that `pytest -n 2` spreads it over workers. Each shard pins its verdicts exactly:
its failing entries are the listed known failures and its CPU-side errors are EXPECTED_CPU_ERRORS, no more and no
fewer. With every shard pinned, the rate is fixed by those two lists, which test_the_lists_fix_the_floor checks
before anything runs. Each shard's report (out/opinfo64/shard_N.json) also counts the entries that differ from
exact float64 only because of the rule.
"""

from __future__ import annotations

from pathlib import Path

import moduleinfo_sweep
import opinfo64_sweep as sweep
import opinfo_sweep as common
import pytest
from test_opinfo_conformance import EXPECTED_CPU_ERRORS as FLOAT32_CPU_ERRORS

NSHARDS = 2
FLOOR = 0.995  # of the entries that run on the CPU, the fraction that must agree with TorchNeuron's reference
OUT = Path(__file__).resolve().parents[1] / "out"
KNOWN = common.load_known_failures(sweep.KNOWN_FAILURES)
# Entries whose float64 samples cannot run on the CPU at all; they are outside the rate's denominator.
EXPECTED_CPU_ERRORS = dict(FLOAT32_CPU_ERRORS)


@pytest.fixture(scope="module")
def ops() -> list:
    return sweep.entries()


def test_the_lists_fix_the_floor(ops) -> None:
    common.check_lists(ops, KNOWN, EXPECTED_CPU_ERRORS, FLOOR, minimum=600)  # op_db as of torch 2.13: 676 entries
    assert sorted(sweep.AUTOCAST_DISABLED - {op.name for op in ops}) == []
    assert len({common.entry_key(op) for op in ops}) == len(ops), "entry keys must be unique for the lists to be exact"


@pytest.mark.parametrize("shard", range(NSHARDS))
def test_opinfo64_shard(shard: int, ops) -> None:
    assert moduleinfo_sweep.emulates_downcast(), "the 64-bit rule is the default (NEURON_LAB_EMULATE_DOWNCAST unset)"
    common.sweep_shard(sweep.sweep, common.shard_of(ops, shard, NSHARDS), OUT / "opinfo64" / f"shard_{shard}.json",
                       KNOWN, sweep.KNOWN_FAILURES.name, EXPECTED_CPU_ERRORS, sweep.summarize, shard=shard, floor=FLOOR)
