"""The combined coverage's ``possible`` kind: a real call is predicted per the dtype it was made with, on both cores.

``torchneuron-combined`` (``tools/derive_profile.py --combine``) keeps 2.33's documented fallbacks certain and adds
what the April 2026 source suggests as ``possible``: ``aten::topk`` has one implementation, gated by its
``can_handle`` to bfloat16/float16/float32, so a float32 call is native and a float64 call may fall back.
"""

from __future__ import annotations

import json

import pytest

from neuron_lab.backend import coverage
from neuron_lab.kinds import FALLBACK, NATIVE, POSSIBLE

PROBE = """
import json, torch, neuron_lab
x = torch.randn(8, device="neuron")
with neuron_lab.track() as r32:
    x.topk(2)
with neuron_lab.track() as r64:
    x.double().topk(2)
with neuron_lab.track() as rc:
    torch.randn(4, dtype=torch.complex64, device="neuron").abs()
d = rc.as_dict()
print(json.dumps({"r32": sorted({(o.op, o.kind) for o in r32.ops_not_native}),
                  "r64": sorted({(o.op, o.kind) for o in r64.ops_not_native}),
                  "counts64": [r64.fallback_calls, r64.possible_calls], "summary64": str(r64).splitlines()[0],
                  "json": [d["fallback_calls"], d["possible_calls"]]}))
"""


def test_combined_coverage_classifies_per_dtype():
    cov = coverage.load("torchneuron-combined")
    assert cov.classify("aten::topk", frozenset({"float32"}))[0] == NATIVE
    kind, reason = cov.classify("aten::topk", frozenset({"float64"}))
    assert kind == POSSIBLE and "TopKXLAImpl.can_handle" in reason
    assert cov.classify("aten::native_batch_norm", frozenset({"float32"}))[0] == POSSIBLE  # not registered in April
    assert cov.classify("aten::uniform_")[0] == FALLBACK  # documented for 2.33: certain


@pytest.mark.parametrize("core", ["python", "compiled"])
def test_a_real_call_is_native_in_float32_and_may_fall_back_in_float64(run_python, core):
    out = run_python(PROBE, {"NEURON_LAB_CORE": core, "NEURON_LAB_COVERAGE": "torchneuron-combined"}, timeout=120)
    assert ["aten::topk.values", POSSIBLE] not in out["r32"]
    assert ["aten::topk.values", POSSIBLE] in out["r64"]
    assert out["counts64"] == [0, 1]
    assert "no CPU fallbacks · 1 possible fallback call" in out["summary64"]
    assert out["json"][0] >= 1  # complex64 falls back for certain under 2.33's table


def test_a_cells_report_counts_certain_and_possible_fallbacks_apart(shell):
    """In a real IPython shell under the combined coverage: float32 atan2 falls back for certain (2.33's table),
    float64 topk may fall back; text, HTML and JSON each show both, under their own titles and counts."""
    from shells import run

    from neuron_lab import backend
    from neuron_lab.extension import session_of

    b = backend.active()
    before = b.coverage.name
    try:
        run(shell, "%neuron coverage torchneuron-combined")
        run(shell, "import torch\nx = torch.randn(8, device='neuron', dtype=torch.float64)\n"
                   "y = torch.randn(4, device='neuron')")
        res, _ = run(shell, "x.topk(2)\ntorch.atan2(y, y)")
        r = session_of(shell).history[res.execution_count]
        head = str(r).splitlines()[0]
        assert "1 CPU fallback call" in head and "1 possible fallback call" in head, head
        assert r.possible_calls == 1 and r.fallback_calls == 1
        text, html = str(r), r._repr_html_()
        for shown in (text, html):
            assert "may fall back on TorchNeuron" in shown and "CPU fallbacks" in shown
            assert "TopKXLAImpl.can_handle" in shown
            assert "Confidence: likely (dtype gate: " in shown and "Confidence: certain (documented: " in shown
        data = json.loads(json.dumps(r.as_dict()))  # the JSON renderer's data
        assert {o["op"]: o["reason"].split(" Confidence: ")[1].split(" (")[0] for o in data["ops_not_native"]
                if o["kind"] in (FALLBACK, POSSIBLE)} == {"aten::atan2.out": "certain", "aten::topk.values": "likely"}
        assert data["possible_calls"] == 1 and data["fallback_calls"] == r.fallback_calls
        assert {"aten::topk.values": POSSIBLE}.items() <= {o["op"]: o["kind"] for o in data["ops_not_native"]
                                                           if o["kind"] == POSSIBLE}.items()
    finally:
        b.set_coverage(before)


MINE = {"schema_version": 1, "name": "mine", "source": "a test", "date": "2026-12-07",
        "ops": {"aten::topk": {"kind": "possible", "reason": "our topk"}}}


@pytest.mark.parametrize("own", [True, False], ids=["a file of ones own", "bundled"])
def test_calls_that_may_fall_back_say_which_coverage_predicted_them(tmp_path, own):
    """Walkthrough 48 point 4: a cell whose only predictions were possible fallbacks named no coverage (the line came
    with certain fallbacks alone), and a file of one's own is named by its file too, as its name is what it says."""
    import torch

    import neuron_lab
    from neuron_lab import backend

    path = tmp_path / "mine.json"
    path.write_text(json.dumps(MINE))
    b = backend.active()
    before = b.coverage.name
    try:
        b.set_coverage(str(path) if own else "torchneuron-combined")
        x = torch.randn(8, device="neuron", dtype=torch.float64)  # combined: float64 topk may fall back
        with neuron_lab.track() as r:
            x.topk(2)
        assert r.possible_calls == 1 and r.fallback_calls == 0
        name = "mine from mine.json" if own else "torchneuron-combined"
        assert r.coverage == name
        assert f"predicted by the coverage {name} (`%neuron coverage NAME` switches)" in str(r).splitlines()
        assert f"<div>predicted by the coverage <code>{name}</code></div>" in r._repr_html_()
    finally:
        b.set_coverage(before)
