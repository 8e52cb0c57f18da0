"""tools/derive_profile.py reads TorchNeuron's can_handle gates and its expected upstream failures from source.

The synthetic tree below (written for this test, not copied from TorchNeuron) holds a gated op class, an ungated
one, a decoy method that is not can_handle, and two expectation files; the bundled evidence derived from the April
2026 source is checked against the counts the mirror's files hold (95 can_handle overrides, 708 failing tests).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "derive_profile.py"
HEAD = "0123456789abcdef0123456789abcdef01234567"

OPS = '''\
import torch


@neuron_op("aten::gather.out")
class GatherImpl:
    def can_handle(self, x, dim, index):
        if x.dtype not in (torch.float32, torch.bfloat16):
            return False
        if x.numel() == 0:
            return False
        return x.dim() <= 4


class PlainImpl:
    def can_handle(self, x):
        return not x.is_complex()

    def execute(self, x):
        return torch.float64
'''


def _tree(tmp_path: Path) -> Path:
    ops = tmp_path / "torch_neuronx" / "python_ops"
    ops.mkdir(parents=True)
    (ops / "gather.py").write_text(textwrap.dedent(OPS))
    exp = tmp_path / "tests" / "pytorch_tests" / "failing_test_methods"
    exp.mkdir(parents=True)
    (exp / "TestA.json").write_text(json.dumps({"failed_tests": ["test_x_neuron", "test_y_neuron_float64"]}))
    (exp / "TestB.json").write_text(json.dumps({"failed_tests": ["test_z_neuron_complex64_int8"]}))
    return tmp_path


def test_gates_and_expectations_from_a_synthetic_tree(tmp_path):
    out = tmp_path / "out.json"
    subprocess.run([sys.executable, str(SCRIPT), str(_tree(tmp_path)), "--commit", HEAD, "-o", str(out)],
                   check=True, capture_output=True, text=True)
    data = json.loads(out.read_text())
    assert data["provenance"]["commit"] == HEAD
    gather, plain = data["gates"]
    assert gather == {"ops": ["aten::gather.out"], "class": "GatherImpl", "path": "torch_neuronx/python_ops/gather.py",
                      "line": 6, "dtypes": ["bfloat16", "float32"], "conditions": ["empty", "shape"]}
    assert (plain["ops"], plain["dtypes"], plain["conditions"]) == (None, ["complex128", "complex64"], [])
    assert [(e["class"], e["dtypes"]) for e in data["expectations"]] == [
        ("TestA", []), ("TestA", ["float64"]), ("TestB", ["complex64", "int8"])]


def test_bundled_evidence_matches_the_mirror_files():
    text = resources.files("neuron_lab.backend.coverage").joinpath("evidence/torchneuron-src-2026-04.json").read_text()
    data = json.loads(text)
    assert data["provenance"]["commit"].startswith("98154b8")
    assert len(data["gates"]) == 95  # `git grep -c "def can_handle" 98154b8 -- torch_neuronx/python_ops`
    assert len(data["expectations"]) == 708
    per_class = {}
    for e in data["expectations"]:
        per_class[e["class"]] = per_class.get(e["class"], 0) + 1
    assert per_class == {"TestLikeTensorCreation": 1, "TestNNDeviceType": 495, "TestRandomTensorCreation": 11,
                         "TestScatterGather": 40, "TestTensorCreation": 115, "TestViewOps": 46}
    assert sum(1 for e in data["expectations"] if "float64" in e["dtypes"]) >= 36


def test_prediction_agreement_floor(tmp_path):
    """bench/prediction_agreement.py run as a script: the share of TorchNeuron's 708 expected upstream failures that
    either bundled coverage predicts (fallback/host op or 64-bit downcast for the test's op and dtypes) keeps its
    floor. The issue's target is 80%; today's figure is far below it (see docs/benchmarks.md)."""
    out = tmp_path / "agreement.json"
    subprocess.run([sys.executable, str(ROOT / "bench" / "prediction_agreement.py"), "--json", str(out)],
                   check=True, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                   timeout=240)
    data = json.loads(out.read_text())
    assert data["tests"] == 708
    assert data["coverages"]["either"]["share"] >= 0.23
    assert data["coverages"]["either"]["why"]["downcast"] == 51  # float64/int64 in the test name


def test_the_bundled_combined_coverage_is_what_combine_writes(tmp_path):
    """torchneuron-combined.json is reproducible from the three bundled files, and keeps 2.33's certain rows."""
    cov = ROOT / "neuron_lab" / "backend" / "coverage"
    out = tmp_path / "combined.json"
    subprocess.run([sys.executable, str(SCRIPT), "--combine", str(cov / "torchneuron-2.33.json"),
                    str(cov / "torchneuron-src-2026-04.json"), str(cov / "evidence" / "torchneuron-src-2026-04.json"),
                    "-o", str(out)], check=True, capture_output=True, text=True)
    combined = json.loads(out.read_text())
    assert combined == json.loads((cov / "torchneuron-combined.json").read_text())
    certain = json.loads((cov / "torchneuron-2.33.json").read_text())["ops"]
    assert all(combined["ops"][op] == rule for op, rule in certain.items() if rule["kind"] != "native")
    kinds = [r["kind"] for r in combined["ops"].values()]
    assert (kinds.count("fallback"), kinds.count("host"), kinds.count("possible")) == (19, 22, 12)
    assert combined["default"]["kind"] == "possible"
