"""bench/table.py gathers the bench scripts' figures into one table and sets two runs side by side."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import figures  # noqa: E402  (bench/ is a script directory, not a package)


def _table(*args: str) -> str:
    return subprocess.run([sys.executable, str(BENCH / "table.py"), *args], check=True, capture_output=True,
                          text=True, timeout=60).stdout


def test_figure_is_the_median_against_its_target():
    f = figures.figure("add", [1.2, 1.4, 1.3], "x", 1.3)
    assert (f["value"], f["holds"]) == (1.3, True)
    assert figures.figure("add", [1.5], "x", 1.3)["holds"] is False
    assert figures.figure("a/a", [1.0, 1.1], "x", None)["holds"] is None


def test_one_table_one_json_and_a_comparison(tmp_path):
    figures.write(str(tmp_path / "a.json"), [figures.figure("64x64 add", [2.0, 2.0], "x", 1.3),
                                             figures.figure("fallback, added", [2.5, 2.5], "us", 3.0)])
    figures.write(str(tmp_path / "b.json"), [figures.figure("64x64 add", [1.0, 1.0], "x", 1.3)])
    out = _table(str(tmp_path / "a.json"), "--out", str(tmp_path / "old.json"))
    assert "| 64x64 add | 2.000x | 2.000-2.000 | 2.000-2.000 | <= 1.3x | NO |" in out
    assert "| fallback, added | +2.5 us | 2.500-2.500 | 2.500-2.500 | <= 3 us | yes |" in out
    assert [f["source"] for f in json.loads((tmp_path / "old.json").read_text())["figures"]] == ["a", "a"]
    _table(str(tmp_path / "b.json"), "--out", str(tmp_path / "new.json"))
    out = _table("--compare", str(tmp_path / "old.json"), str(tmp_path / "new.json"))
    assert "| 64x64 add | 2.000x | 1.000x | -50% | <= 1.3x | NO → yes |" in out
    assert "| fallback, added | +2.5 us | - (not measured) | - | <= 3 us | yes → - |" in out


def test_a_change_inside_both_runs_spread_says_so(tmp_path):
    figures.write(str(tmp_path / "a.json"), [figures.figure("step", [1.0, 1.1, 1.2, 1.3], "x", 1.1)])
    figures.write(str(tmp_path / "b.json"), [figures.figure("step", [1.05, 1.15, 1.25, 1.35], "x", 1.1)])
    for name in "ab":
        _table(str(tmp_path / f"{name}.json"), "--out", str(tmp_path / f"{name}-all.json"))
    out = _table("--compare", str(tmp_path / "a-all.json"), str(tmp_path / "b-all.json"))
    assert "| step | 1.150x | 1.200x | +4% (within spread) | <= 1.1x | NO → NO |" in out


def test_a_figure_says_how_sure_its_median_is():
    # 10 rounds: leaving one out at each end misses the median with 2 * 11/1024 (2%); two, with 2 * 56/1024 (11%)
    assert figures.median_ci([float(x) for x in range(10)]) == [1.0, 8.0]
    assert figures.median_ci([float(x) for x in range(40)]) == [13.0, 26.0]
    assert figures.figure("a/a", [1.0, 1.1, 0.9], "x", None)["ci"] == [0.9, 1.1]  # 3 rounds: all of them


@pytest.mark.slow
def test_make_bench_runs_its_scripts_and_ends_with_one_table(tmp_path):
    # bench/all.py as `make bench` runs it, limited to one script whose figures are counts (the same on any machine),
    # set beside an earlier run that added two syncs a cell
    figures.write(str(tmp_path / "main-figures.json"),
                  [figures.figure("device syncs added per cell: extension", [2.0], "syncs", 1)])
    _table(str(tmp_path / "main-figures.json"), "--out", str(tmp_path / "main.json"))
    out = subprocess.run([sys.executable, str(BENCH / "all.py"), "--only", "workbench_syncs", "--out",
                          str(tmp_path / "bench"), "--table", str(tmp_path / "bench.json"), "--compare",
                          str(tmp_path / "main.json")], check=True, capture_output=True, text=True, timeout=600).stdout
    assert ("| device syncs added per cell: extension | 1.00 syncs | 1.000-1.000 | 1.000-1.000 | <= 1 syncs | yes |"
            in out)
    run = json.loads((tmp_path / "bench.json").read_text())["run"]
    assert [(name, verdict) for name, (_, verdict) in run["scripts"].items()] == [("workbench_syncs", "ok")]
    assert (tmp_path / "bench" / "workbench_syncs.log").exists() and (tmp_path / "bench" / "steps.txt").exists()
    assert "| device syncs added per cell: extension | 2.00 syncs | 1.00 syncs | -50% | <= 1 syncs | NO → yes |" in out
