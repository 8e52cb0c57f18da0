"""bench/upstream_agreement.py's harness on a tiny device-generic test class of ours, instantiated for `neuron` as
PyTorch instantiates its own for a PrivateUse1 device: what each test ran is recorded from the backend's reports, and
recall, flag rate and the emulator's own failures are counted from them (no PyTorch test files needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import neuron_lab.backend as backend

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import upstream_agreement as ua  # noqa: E402  (bench/ is a script directory, not a package)

CLASS = "TestTiny"


def _instantiated() -> type:
    backend.activate()  # before PyTorch's device-type bases are read, so PrivateUse1TestBase is one of them
    from torch.testing import make_tensor
    from torch.testing._internal.common_device_type import dtypes, instantiate_device_type_tests
    from torch.testing._internal.common_utils import TestCase

    class TestTiny(TestCase):
        def test_add(self, device):
            self.assertEqual((torch.ones(3, device=device) + 1).cpu(), torch.full((3,), 2.0))

        def test_roll(self, device):  # aten::roll: not registered in TorchNeuron's source (possible)
            torch.arange(4.0, device=device).roll(1)

        @dtypes(torch.float64)
        def test_mul(self, device, dtype):  # float64: computed in 32 bits on the device (downcast)
            torch.ones(2, device=device, dtype=dtype).mul(3)

        def test_wrong(self, device):
            self.assertEqual(torch.zeros(2, device=device).cpu(), torch.ones(2))

        def test_made(self, device):  # make_tensor fills its input with uniform_, a documented CPU fallback
            self.assertEqual(make_tensor((2,), device=device, dtype=torch.float32).abs().shape, (2,))

        def test_skipped(self, device):
            self.skipTest("not here")

    scope: dict = {"TestTiny": TestTiny}  # PyTorch takes the generic class out of the scope it instantiates into
    instantiate_device_type_tests(TestTiny, scope, only_for="privateuse1")
    return next(iter(scope.values()))


def test_counts_recall_flag_rate_and_failures_from_the_backends_reports():
    cls = _instantiated()
    names = sorted(n for n in dir(cls) if n.startswith("test_") and "_neuron" in n)
    assert names == ["test_add_neuron", "test_made_neuron", "test_mul_neuron_float64", "test_roll_neuron",
                     "test_skipped_neuron", "test_wrong_neuron"]
    tests = {t["test"]: t for t in ua.run_tests(cls, names)}
    assert {n: t["outcome"] for n, t in tests.items()} == {
        "test_add_neuron": "pass", "test_made_neuron": "pass", "test_mul_neuron_float64": "pass",
        "test_roll_neuron": "pass", "test_skipped_neuron": "skip", "test_wrong_neuron": "fail"}
    assert "aten::add" in tests["test_add_neuron"]["ops"]["native"]
    assert not set(tests["test_add_neuron"]["ops"]) & ua.PREDICTING
    assert tests["test_roll_neuron"]["ops"]["possible"] == ["aten::roll"]
    assert "aten::mul" in tests["test_mul_neuron_float64"]["ops"]["downcast"]
    made = tests["test_made_neuron"]
    assert made["ops"]["fallback"] == ["aten::uniform_"]  # reported, but made by the harness, not by the test
    assert "fallback" not in made["own"] and "aten::abs" in made["own"]["native"]

    expected = [{"class": CLASS, "test": n, "dtypes": []}
                for n in ("test_roll_neuron", "test_wrong_neuron", "test_skipped_neuron", "test_gone_neuron")]
    result = {"listed": {CLASS: len(names)}, "tests": [{"class": CLASS, **t} for t in tests.values()]}
    s = ua.summarize(result, expected)["per_class"][CLASS]
    assert (s["expected"], s["ran_expected"], s["skipped_expected"], s["missing"]) == (4, 2, 1, 1)
    assert (s["predicted"], s["recall"], s["by_group"]) == (1, 50.0, {"possible": 1})
    assert (s["ran_others"], s["flagged"], s["flag_rate"]) == (3, 2, 200 / 3)  # mul: a downcast; made: uniform_
    assert s["others_by_group"] == {"downcast": 1, "certain": 1}
    own = ua.summarize(result, expected, field="own")["per_class"][CLASS]
    assert (own["flagged"], own["others_by_group"]) == (1, {"downcast": 1})
    assert (s["failed_expected"], s["failed_others"]) == (1, 0)
    assert [t["test"] for t in ua.misses(result, expected)] == ["test_wrong_neuron"]


SYNTHETIC = '''
import os

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_utils import TestCase


class TestScatterGather(TestCase):
    def test_a_gather(self, device):
        torch.zeros(3, device=device).gather(0, torch.tensor([0, 1], device=device))

    def test_b_dies(self, device):
        os._exit(3)

    def test_c_after(self, device):
        torch.ones(2, device=device).add(1)


instantiate_device_type_tests(TestScatterGather, globals())
'''


def test_the_driver_runs_a_class_in_workers_and_goes_on_after_a_worker_dies(tmp_path):
    """The script end to end on a class of ours standing in for PyTorch's file: the test whose worker died is a
    crash with the worker's exit, and a new worker runs the tests after it."""
    import json
    import os
    import subprocess

    (tmp_path / "test_scatter_gather_ops.py").write_text(SYNTHETIC)
    out = tmp_path / "run.json"
    root = Path(__file__).resolve().parent.parent
    subprocess.run([sys.executable, str(root / "bench" / "upstream_agreement.py"), "--pytorch-tests", str(tmp_path),
                    "--classes", "TestScatterGather", "--out", str(out), "--deadline", "300"],
                   check=True, capture_output=True, timeout=400, env={**os.environ, "PYTHONPATH": str(root)})
    tests = {t["test"]: t for t in json.loads(out.read_text())["tests"]}
    assert {n: t["outcome"] for n, t in tests.items()} == {
        "test_a_gather_neuron": "pass", "test_b_dies_neuron": "crash", "test_c_after_neuron": "pass"}
    assert "aten::gather" in tests["test_a_gather_neuron"]["own"]["downcast"]  # its int64 index
    assert tests["test_b_dies_neuron"]["detail"].startswith("exit status 3")
