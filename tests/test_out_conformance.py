"""``out=`` conformance: test_out's cases over PyTorch's op_db behave on `neuron` as on the CPU.

The sweep (tests/out_sweep.py) runs as NSHARDS tests so that `pytest -n 2` spreads it over workers. Each
shard pins its verdicts exactly: its failing entries are the listed known failures, no more and no fewer. With
every shard pinned, the rate over the entries whose ``out=`` runs on the CPU is fixed by the list and the
CPU-side errors, which test_the_lists_fix_the_floor checks before anything runs.
"""

from __future__ import annotations

from pathlib import Path

import opinfo_sweep as common
import out_sweep as sweep
import pytest

NSHARDS = 2
FLOOR = 0.99  # of the entries whose out= runs on the CPU, the fraction that must behave alike on `neuron`
OUT = Path(__file__).resolve().parents[1] / "out"
KNOWN = common.load_known_failures(sweep.KNOWN_FAILURES)
# Entries whose out= cannot be judged on the CPU; they are outside the rate's denominator.
EXPECTED_CPU_ERRORS = {
    "equal": "returns a bool, not a tensor: test_out skips it",
    "histogramdd": "returns a tuple of a tensor and a list of tensors: test_out skips it",
}


@pytest.fixture(scope="module")
def ops() -> list:
    return sweep.entries()


def test_the_lists_fix_the_floor(ops) -> None:
    # op_db as of torch 2.13: 325 float32 entries take out= and are not exempt from test_out
    common.check_lists(ops, KNOWN, EXPECTED_CPU_ERRORS, FLOOR, minimum=300)


@pytest.mark.parametrize("shard", range(NSHARDS))
def test_out_shard(shard: int, ops) -> None:
    common.sweep_shard(sweep.sweep, common.shard_of(ops, shard, NSHARDS), OUT / "out_sweep" / f"shard_{shard}.json",
                       KNOWN, sweep.KNOWN_FAILURES.name, EXPECTED_CPU_ERRORS, shard=shard, floor=FLOOR)
