"""Calls that a public report saw abort the process on TorchNeuron (issue 32): an op of the coverage's ``aborts``
applied to an ``nn.Parameter`` is an error-level row naming its reports, warned about, raised or silent per
``NEURON_LAB_ABORTS``; a plain tensor is not flagged. In a real IPython shell, on both cores (``make test`` runs
this file on the pure-Python core too)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from shells import run

from neuron_lab.backend import coverage
from neuron_lab.extension import session_of
from neuron_lab.kinds import ABORT, KINDS
from neuron_lab.runner import gates

PR = "https://github.com/huggingface/optimum-neuron/pull/1119"
ISSUE = "https://github.com/aws-neuron/aws-neuron-sdk/issues/1265"
EVIDENCE = Path(coverage.__file__).parent / "evidence" / "torchneuron-aborts.json"
SETUP = ("import torch\nimport torch.nn.functional as F\n"
         "w = torch.nn.Parameter(torch.randn(1, 1, 4, 4).to('neuron'))")
CALL = "y = F.interpolate(w, scale_factor=2, mode='bicubic')"


def _report(shell, code: str):
    res, cap = run(shell, code)
    return session_of(shell).history[res.execution_count], cap


def _aborts(r) -> list[tuple[str, int, list[int]]]:
    """(op without its overload: the cores may see the functional op or its ``.out``, count, lines), sorted."""
    return sorted((row.op.split(".")[0], row.count, [s.site.line for s in row.sites])
                  for row in r.ops_not_native if row.kind == ABORT)


def test_the_combined_default_carries_exactly_the_reported_ops_with_their_evidence():
    evidence = json.loads(EVIDENCE.read_text())
    named = {op for report in evidence["reports"] for op in report["ops"]}
    cov = coverage.load("torchneuron-combined")
    assert set(cov.aborts) == named == {"aten::_weight_norm_interface", "aten::upsample_bicubic2d", "aten::im2col"}
    rule = cov.abort_rule("aten::upsample_bicubic2d")
    assert rule.evidence == "xla report" and PR in rule.reason and ISSUE in rule.reason
    assert "seen on torch-neuronx's XLA trace path" in rule.shown
    assert "no public report for the native backend" in rule.shown and "Confidence: possible" in rule.shown
    assert all(r["stack"].startswith("torch-xla") for r in evidence["reports"])  # no native-backend report: not certain
    assert coverage.from_dict(cov.as_dict()).aborts == cov.aborts
    assert coverage.load("torchneuron-2.33").aborts == {}
    with pytest.raises(coverage.CoverageError, match=r"aborts\['aten::im2col'\]\.evidence: expected one of"):
        coverage.from_dict({**cov.as_dict(), "aborts": {"aten::im2col": {"reason": "", "evidence": "rumour"}}})


def _warned(recwarn) -> list[str]:
    return [str(w.message) for w in recwarn if w.category.__name__ == "AbortRiskWarning"]


def test_a_parameter_is_an_error_row_with_the_reports_and_a_warning_once_per_line(shell, monkeypatch, recwarn):
    monkeypatch.delenv("NEURON_LAB_ABORTS", raising=False)
    run(shell, SETUP)
    r, cap = _report(shell, f"for _ in range(3):\n    {CALL}\nz = F.unfold(w, 2)\nv = F.unfold(w.detach(), 2)")
    assert _aborts(r) == [("aten::im2col", 1, [3]), ("aten::upsample_bicubic2d", 3, [2])], _aborts(r)
    warned = _warned(recwarn)
    assert len(warned) == 2, warned  # once per op and line, not per call
    assert warned[0].startswith(f"aten::upsample_bicubic2d on a parameter at <ipython-input-{r.cell}-")
    assert PR in warned[0]
    text = str(r)
    sections = [line for line in text.splitlines() if not line.startswith(" ")]
    assert sections[2] == f"error: {KINDS[ABORT].title} (2 ops, 4 calls):", text  # first, after the memory line
    assert PR in text and "no public report for the native backend" in text
    d = r.as_dict()
    assert {row["kind"] for row in d["ops_not_native"] if "im2col" in row["op"]} >= {ABORT}
    assert "error: may abort the process on TorchNeuron" in r._repr_html_()
    gate = gates.kind_gate([r], ABORT, "--fail-on-abort")
    assert not gate.passed and gate.measured == "4 calls" and PR in gate.why


def test_a_plain_tensor_is_not_flagged(shell, monkeypatch, recwarn):
    monkeypatch.delenv("NEURON_LAB_ABORTS", raising=False)
    run(shell, SETUP)
    r, _ = _report(shell, "t = w.detach().clone()\ny = F.interpolate(t, scale_factor=2, mode='bicubic')")
    assert _aborts(r) == [] and _warned(recwarn) == []
    assert gates.kind_gate([r], ABORT, "--fail-on-abort").passed


def test_raise_stops_the_op_before_it_runs_naming_op_line_and_report(shell, monkeypatch):
    run(shell, SETUP)
    monkeypatch.setenv("NEURON_LAB_ABORTS", "raise")
    res, _ = run(shell, f"y = None\n{CALL}", ok=False)
    err = res.error_in_exec
    assert type(err).__name__ == "AbortRiskError" and isinstance(err, RuntimeError)
    assert str(err).startswith(f"aten::upsample_bicubic2d on a parameter at <ipython-input-{res.execution_count}-")
    assert ":2 may abort the process on TorchNeuron" in str(err) and PR in str(err) and ISSUE in str(err)
    assert shell.user_ns["y"] is None
    r = session_of(shell).history[res.execution_count]
    assert not any("upsample" in row.op for row in r.ops_not_native)  # it never ran: no fallback row either


def test_off_is_silent(shell, monkeypatch, recwarn):
    run(shell, SETUP)
    monkeypatch.setenv("NEURON_LAB_ABORTS", "off")
    r, _ = _report(shell, CALL)
    assert _aborts(r) == [] and _warned(recwarn) == []
    assert any("upsample" in row.op for row in r.ops_not_native)  # it ran, as a possible fallback
