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
    assert {k: gather[k] for k in ("ops", "class", "path", "line", "dtypes", "conditions", "residue")} == {
        "ops": ["aten::gather.out"], "class": "GatherImpl", "path": "torch_neuronx/python_ops/gather.py", "line": 6,
        "dtypes": ["bfloat16", "float32"], "conditions": ["empty", "shape"], "residue": {"aten::gather.out": "cpu"}}
    assert (plain["ops"], plain["dtypes"], plain["conditions"]) == (None, ["complex128", "complex64"], [])
    assert plain["used"] == "no: no registered op uses the class"
    assert [(e["class"], e["dtypes"]) for e in data["expectations"]] == [
        ("TestA", []), ("TestA", ["float64"]), ("TestB", ["complex64", "int8"])]


TABLE = '''\
import torch
from .base import Operation


class NarrowImpl:
    def can_handle(self, x, dim):
        return x.dim() == 2


class WideImpl:
    def can_handle(self, x, dim):
        return x.device.type == "neuron"

    @property
    def priority(self):
        return super().priority - 10


class ScanOp(Operation):
    def _setup_implementations(self):
        self._implementations.append(NarrowImpl())
        self._implementations.append(WideImpl())

    @property
    def op_name(self):
        return "cumsum"


class StepOp(Operation):
    def _setup_implementations(self):
        self._implementations.append(NarrowImpl())

    @property
    def op_name(self):
        return "scan_step"


_scan = ScanOp()
_step = StepOp()


def cumsum_neuron(x, dim):
    return _scan(x, dim)


def cummax_neuron(x, dim):
    return _step(x, dim)
'''
INIT = '''\
aten_lib.impl("cumsum", cumsum_neuron, "PrivateUse1")
aten_lib.impl("cummax", cummax_neuron, "PrivateUse1")
'''


def test_a_gate_matters_only_where_no_other_implementation_of_its_op_takes_the_call(tmp_path):
    """Operation tables registered through aten_lib.impl: NarrowImpl is gated, but WideImpl (lower priority) takes
    every cumsum call, so cumsum has no residue; cummax's Operation has NarrowImpl alone and an op_name that is no ATen
    op, so what NarrowImpl turns away raises instead of falling back."""
    root = _tree(tmp_path)
    ops = root / "torch_neuronx" / "python_ops"
    (ops / "scan.py").write_text(TABLE)
    (ops / "__init__.py").write_text(INIT)
    out = tmp_path / "out.json"
    subprocess.run([sys.executable, str(SCRIPT), str(root), "--commit", HEAD, "-o", str(out)],
                   check=True, capture_output=True, text=True)
    narrow = next(g for g in json.loads(out.read_text())["gates"] if g["class"] == "NarrowImpl")
    assert narrow["ops"] == ["aten::cummax", "aten::cumsum"]
    assert narrow["residue"] == {"aten::cummax": "raises", "aten::cumsum": "none"}
    assert narrow["order"] == ["aten::cummax: NarrowImpl (50)", "aten::cumsum: NarrowImpl (50), WideImpl (40)"]
    assert "ScanOp (torch_neuronx/python_ops/scan.py) held by _scan, called by cumsum_neuron" in " ".join(narrow["via"])


def test_a_reading_whose_quote_left_the_source_stops_the_derivation(tmp_path):
    root = _tree(tmp_path)
    xla = root / "torch_neuronx" / "python_ops" / "xla_ops"
    xla.mkdir()
    (xla / "topk_xla.py").write_text('@neuron_op("aten::topk")\nclass TopKXLAImpl:\n    def can_handle(self, x, k):\n'
                                     '        return x.dim() > 0\n')
    proc = subprocess.run([sys.executable, str(SCRIPT), str(root), "--commit", HEAD, "-o", str(tmp_path / "o.json")],
                          capture_output=True, text=True)
    assert proc.returncode != 0
    assert ("the reading of TopKXLAImpl (torch_neuronx/python_ops/xla_ops/topk_xla.py) quotes "
            "'if dim != input.dim() - 1:'") in proc.stderr


def test_every_shape_and_empty_gate_is_tied_to_its_op_with_its_residue():
    """The bundled evidence: each of the 34 gates that test shapes or empty tensors says what it serves and whether
    it is used; topk's and _grouped_mm's residues are the CPU and carry their argument tests, gather's is none."""
    data = json.loads(resources.files("neuron_lab.backend.coverage").joinpath(
        "evidence/torchneuron-src-2026-04.json").read_text())
    shaped = [g for g in data["gates"] if g["conditions"]]
    assert len(shaped) == 34 and all(g.get("used") for g in shaped)
    by = {(g["class"], g["path"].removeprefix("torch_neuronx/python_ops/")): g for g in data["gates"]}
    topk = by["TopKXLAImpl", "xla_ops/topk_xla.py"]
    assert topk["residue"] == {"aten::topk": "cpu", "aten::topk.out": "cpu", "aten::topk.values": "cpu"}
    assert [t["test"] for t in topk["args"]["aten::topk"]] == ["below", "not_last_dim", "is"]
    assert by["GroupedMMMLIRImpl", "grouped_mm.py"]["residue"] == {"aten::_grouped_mm": "cpu"}
    assert by["GatherNKIImpl", "gather.py"]["residue"] == {"aten::gather": "none"}
    assert by["AllReduceXLAOp", "xla_ops/all_reduce_xla.py"]["residue"] == {"c10d::all_reduce": "raises"}
    assert by["TopKXLAImpl", "legacy/xla_ops/topk_xla.py"]["ops"] is None
    untied = [g for g in data["gates"] if g["ops"] is None and "/legacy/" not in g["path"]]
    assert len(untied) == 14
    assert all(g["used"].startswith("no") for g in untied if g["class"] != "OperationImplementation")


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
                    "--aborts", str(cov / "evidence" / "torchneuron-aborts.json"), "-o", str(out)],
                   check=True, capture_output=True, text=True)
    combined = json.loads(out.read_text())
    assert combined == json.loads((cov / "torchneuron-combined.json").read_text())
    certain = json.loads((cov / "torchneuron-2.33.json").read_text())["ops"]
    assert all(combined["ops"][op] == rule for op, rule in certain.items() if rule["kind"] != "native")
    kinds = [r["kind"] for r in combined["ops"].values()]
    assert (kinds.count("fallback"), kinds.count("host"), kinds.count("possible")) == (19, 22, 14)
    assert [a["arg"] for a in combined["ops"]["aten::_grouped_mm"]["args"]] == ["self", "mat2"]
    assert combined["default"]["kind"] == "possible"
