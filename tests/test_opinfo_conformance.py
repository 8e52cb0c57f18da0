"""OpInfo conformance: PyTorch's own op_db, in float32 on `neuron`, agrees with the CPU.

The sweep (tests/opinfo_sweep.py) runs as NSHARDS tests so that `pytest -n 2` spreads it over workers.
Each shard pins its verdicts exactly: its failing entries are the listed known failures and its CPU-side
errors are EXPECTED_CPU_ERRORS, no more and no fewer. With every shard pinned, the overall rate is fixed
by those two lists, which test_the_lists_fix_the_floor checks before anything runs; whichever shard
completes a run's set (out/opinfo/<run>/shard_N.json) also merges them into out/opinfo.json and checks the
measured rate.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import opinfo_sweep as sweep
import pytest

NSHARDS = 8
FLOOR = 0.995  # of the entries that run on the CPU, the fraction that must agree on `neuron`
OUT = Path(__file__).resolve().parents[1] / "out"
SHARDS_DIR = OUT / "opinfo"
# Entries whose samples cannot run on the CPU at all; they are outside the rate's denominator.
EXPECTED_CPU_ERRORS = {
    name: "Jiterator compiles CUDA kernels at run time: CUDA/ROCm only"
    for name in ("jiterator_2inputs_2outputs", "jiterator_4inputs_with_extra_args", "jiterator_binary",
                 "jiterator_binary_return_by_ref", "jiterator_unary")
}
KNOWN = sweep.load_known_failures()


@pytest.fixture(scope="module")
def ops() -> list:
    return sweep.entries()


def test_the_lists_fix_the_floor(ops) -> None:
    sweep.check_lists(ops, KNOWN, EXPECTED_CPU_ERRORS, FLOOR, minimum=600)  # op_db as of torch 2.13: 677 entries
    assert len({sweep.entry_key(op) for op in ops}) == len(ops), "entry keys must be unique for the lists to be exact"


def _merge_if_complete(run_dir: Path) -> dict | None:
    """The whole run's report, once every shard of the run has written its own; else None.

    Each run has its own directory, so concurrent runs in one checkout never mix their shards. The
    merged report keeps every shard's counts, so the directory is removed once merged; of two shards
    that finish together, the one that finds it gone leaves the merging to the other.
    """
    try:
        shards = [json.loads((run_dir / f"shard_{i}.json").read_text()) for i in range(NSHARDS)]
    except FileNotFoundError:
        return None
    counts = ("total", "cpu_ok", "pass", "fail", "error", "cpu_error")
    merged: dict = {k: sum(s[k] for s in shards) for k in counts}
    merged["rate"] = merged["pass"] / merged["cpu_ok"]
    merged["floor"] = FLOOR
    merged["shards"] = [{k: s[k] for k in ("shard", *counts, "wall_seconds")} for s in shards]
    merged["entries"] = {k: v for s in shards for k, v in sorted(s["entries"].items())}
    merged["run_id"] = run_dir.name
    sweep.write_json(OUT / "opinfo.json", merged)
    shutil.rmtree(run_dir, ignore_errors=True)
    return merged


@pytest.mark.slow
@pytest.mark.parametrize("shard", range(NSHARDS))
def test_opinfo_shard(shard: int, ops, testrun_uid: str) -> None:
    shard_ops = sweep.shard_of(ops, shard, NSHARDS)
    t0 = time.perf_counter()
    results = sweep.sweep(shard_ops)
    report = sweep.summarize(results)
    report.update(shard=shard, wall_seconds=round(time.perf_counter() - t0, 2))
    run_dir = SHARDS_DIR / testrun_uid
    sweep.write_json(run_dir / f"shard_{shard}.json", report)

    problems = sweep.problems(results, KNOWN, sweep.KNOWN_FAILURES.name, set(EXPECTED_CPU_ERRORS))
    merged = _merge_if_complete(run_dir)
    if merged is not None and merged["rate"] < FLOOR:
        problems.append(f"overall rate {merged['rate']:.4f} is under the floor {FLOOR}")
    assert not problems, "\n".join(problems)
    assert report["pass"] == report["cpu_ok"] - sum(r.key in KNOWN for r in results)
