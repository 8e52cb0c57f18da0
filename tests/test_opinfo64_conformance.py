"""OpInfo conformance in float64 under TorchNeuron's 64-bit rule: op_db's float64 samples on `neuron` compute what
TorchNeuron computes (float64 tensors with dimensions in float32, op by op: tests/opinfo64_sweep.py).

The sweep runs as NSHARDS tests so that `pytest -n 2` spreads it over workers. Each shard pins its verdicts exactly:
its failing entries are the listed known failures and its CPU-side errors are EXPECTED_CPU_ERRORS, no more and no
fewer. With every shard pinned, the rate is fixed by those two lists, which test_the_lists_fix_the_floor checks
before anything runs. Each shard's report (out/opinfo64/shard_N.json) also counts the entries that differ from
exact float64 only because of the rule.

The pure-Python pass sweeps each entry's first PYTHON_CORE_SAMPLES samples, not all MAX_SAMPLES: that core applies
the rule in one function every op's call goes through (``_run_downcast`` in backend/emulator/ops.py), and the first
5 samples of each entry run every line and branch of the backend's code that all 20 run but for one (a
channels_last allocation's strides, not the rule's, which that pass's float32 sweep runs), measured with a line
tracer over the whole sweep; the verdicts are the same (the listed failures fail at their first sample). The
compiled pass sweeps all 20 through the C++ core's own rule. On the pure-Python core both shards took 26 s instead of
61 s (back to back on a loaded 2-core machine).
"""

from __future__ import annotations

from pathlib import Path

import moduleinfo_sweep
import opinfo64_sweep as sweep
import opinfo_sweep as common
import pytest
from conftest import core
from test_opinfo_conformance import EXPECTED_CPU_ERRORS as FLOAT32_CPU_ERRORS

NSHARDS = 2
FLOOR = 0.995  # of the entries that run on the CPU, the fraction that must agree with TorchNeuron's reference
OUT = Path(__file__).resolve().parents[1] / "out"
KNOWN = common.load_known_failures(sweep.KNOWN_FAILURES)
# Entries whose float64 samples cannot run on the CPU at all; they are outside the rate's denominator.
EXPECTED_CPU_ERRORS = dict(FLOAT32_CPU_ERRORS)
PYTHON_CORE_SAMPLES = 5  # per entry on the pure-Python core (see above)


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
    samples = sweep.MAX_SAMPLES if core() == "compiled" else PYTHON_CORE_SAMPLES
    common.sweep_shard(lambda entries: sweep.sweep(entries, samples), common.shard_of(ops, shard, NSHARDS),
                       OUT / "opinfo64" / f"shard_{shard}.json", KNOWN, sweep.KNOWN_FAILURES.name, EXPECTED_CPU_ERRORS,
                       sweep.summarize, shard=shard, floor=FLOOR, samples_per_entry=samples)
