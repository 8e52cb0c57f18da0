"""Argument conditions: a registered op that TorchNeuron runs on the CPU for some arguments is ``possible`` per call.

TorchNeuron's April 2026 source has one implementation of ``aten::topk`` (TopKXLAImpl, xla_ops/topk_xla.py:71),
which takes only the last dimension and ``largest=True``, and two of ``aten::_grouped_mm`` (a 2-D ``self`` with a
2-D or 3-D ``mat2``); the combined coverage carries what none takes as argument rules (``tools/gate_residue.py``).
Each call is tested on both cores: one meeting a condition is a possible fallback naming its gate, one that does not
is native. A coverage file of one's own may put the same tests on any op.
"""

from __future__ import annotations

import json

import pytest

from neuron_lab.backend import coverage
from neuron_lab.backend.coverage import CoverageError

PROBE = """
import json, torch, neuron_lab
x = torch.randn(4, 8, device="neuron")
bf = dict(dtype=torch.bfloat16, device="neuron")
offs = torch.tensor([16, 32], dtype=torch.int32, device="neuron")
calls = {
    "topk": lambda: x.topk(2), "topk_dim_last": lambda: x.topk(2, dim=1), "topk_dim0": lambda: x.topk(2, dim=0),
    "topk_smallest": lambda: x.topk(2, largest=False), "topk_k0": lambda: x.topk(0),
    "topk_out": lambda: torch.topk(x, 2, 0, out=(torch.empty(0, device="neuron"),
                                                 torch.empty(0, dtype=torch.long, device="neuron"))),
    "gmm_2d_3d": lambda: torch._grouped_mm(torch.randn(32, 16, **bf), torch.randn(2, 16, 16, **bf), offs=offs),
    "gmm_3d_3d": lambda: torch._grouped_mm(torch.randn(2, 16, 16, **bf), torch.randn(2, 16, 16, **bf)),
}
out = {}
for name, call in calls.items():
    with neuron_lab.track() as r:
        call()
    out[name] = sorted([o.op, o.reason] for o in r.ops_not_native if o.kind == "possible")
print(json.dumps(out))
"""


@pytest.mark.parametrize("core", ["python", "compiled"])
def test_a_call_meeting_a_gate_condition_may_fall_back_and_one_that_does_not_is_native(run_python, core):
    out = run_python(PROBE, {"NEURON_LAB_CORE": core, "NEURON_LAB_COVERAGE": "torchneuron-combined"}, timeout=120)
    for native in ("topk", "topk_dim_last", "gmm_2d_3d"):
        assert out[native] == [], native
    for name, says in {"topk_dim0": "dim is not the last dimension of self", "topk_smallest": "largest is False",
                       "topk_k0": "k is below 1", "topk_out": "dim is not the last dimension of self"}.items():
        (op, reason), = out[name]
        assert op == "aten::topk.values" and reason.startswith(says + ": no implementation of aten::topk"), name
        assert "TopKXLAImpl.can_handle, torch_neuronx/python_ops/xla_ops/topk_xla.py:71" in reason
        assert "Confidence: likely (shape gate: " in reason
    (op, reason), = out["gmm_3d_3d"]
    assert op == "aten::_grouped_mm" and reason.startswith("self is not 2-D")
    assert "GroupedMMNKIImpl.can_handle, torch_neuronx/python_ops/grouped_mm.py:31" in reason


OWN = {"schema_version": 1, "name": "own", "source": "a test", "date": "2026-12-06", "ops": {
    "aten::mm": {"kind": "native", "args": [{"kind": "fallback", "test": "empty", "arg": "self", "reason": "empty"}]},
    "aten::sum": {"kind": "native", "args": [
        {"kind": "possible", "test": "ndim_not_in", "arg": "self", "value": [2], "reason": "not 2-D"}]},
    "aten::cumsum": {"kind": "native", "args": [
        {"kind": "possible", "test": "not_last_dim", "arg": "dim", "of": "self", "reason": "not last"}]}}}

OWN_PROBE = """
import json, torch, neuron_lab
x = torch.randn(4, 8, device="neuron")
calls = {"mm": lambda: x @ x.T, "mm_empty": lambda: x[:0] @ x.T, "sum_2d": lambda: x.sum(),
         "sum_1d": lambda: x[0].sum(), "cumsum_last": lambda: x.cumsum(-1), "cumsum_0": lambda: x.cumsum(0)}
out = {}
for name, call in calls.items():
    with neuron_lab.track() as r:
        call()
    out[name] = sorted([o.op, o.kind, o.reason] for o in r.ops_not_native if o.kind in ("possible", "fallback"))
print(json.dumps(out))
"""


@pytest.mark.parametrize("core", ["python", "compiled"])
def test_a_coverage_of_ones_own_puts_the_tests_on_any_op(run_python, core, tmp_path):
    path = tmp_path / "own.json"
    path.write_text(json.dumps(OWN))
    out = run_python(OWN_PROBE, {"NEURON_LAB_CORE": core, "NEURON_LAB_COVERAGE": str(path)}, timeout=120)
    said = f". {coverage.NO_CONFIDENCE}"  # a rule that names no evidence says so, as every reason ends with one
    assert out == {"mm": [], "mm_empty": [["aten::mm", "fallback", "empty" + said]], "sum_2d": [],
                   "sum_1d": [["aten::sum", "possible", "not 2-D" + said]], "cumsum_last": [],
                   "cumsum_0": [["aten::cumsum.out", "possible", "not last" + said]]}


@pytest.mark.parametrize(("args", "message"), [
    ("x", "ops['aten::mm'].args: expected a list of argument rules, got str"),
    ([{"kind": "possible", "test": "odd", "arg": "self"}],
     "ops['aten::mm'].args[0].test: expected one of ndim_not_in, not_last_dim, below, is, empty"),
    ([{"kind": "possible", "test": "below", "arg": "self"}],
     "ops['aten::mm'].args[0]: the test 'below' needs value: an int"),
    ([{"kind": "possible", "test": "empty", "arg": "self", "when": 1}],
     "ops['aten::mm'].args[0]: unknown field 'when' (an argument rule has kind, test, arg, value, of, reason, "
     "evidence)"),
])
def test_a_malformed_argument_rule_is_one_line_naming_it(args, message):
    with pytest.raises(CoverageError, match="^own: " + message.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)").replace("]", r"\]") + "$"):
        coverage.from_dict({**OWN, "ops": {"aten::mm": {"kind": "native", "args": args}}}, "own")


@pytest.mark.parametrize(("rule", "message"), [
    ({"kind": "possible", "test": "empty", "arg": "selff"},
     "ops['aten::topk'].args[0].arg: expected an argument of the op (self, k, dim, largest, sorted, values, indices), "
     "got 'selff' (did you mean 'self'?)"),
    ({"kind": "possible", "test": "not_last_dim", "arg": "dim", "of": "tensor"},
     "ops['aten::topk'].args[0].of: expected an argument of the op (self, k, dim, largest, sorted, values, indices), "
     "got 'tensor'"),
])
def test_a_condition_on_an_argument_the_op_does_not_have_is_refused(rule, message):
    """Walkthrough 48 point 1: a misspelt argument name was never met, so its rule silently never fired. The names
    are every overload's, the in-place form's too (``topk``'s out arguments ``values`` and ``indices``)."""
    with pytest.raises(CoverageError) as e:
        coverage.from_dict({**OWN, "ops": {"aten::topk": {"kind": "native", "args": [rule]}}}, "own")
    assert str(e.value) == f"own: {message}"
    inplace = {"kind": "possible", "test": "below", "arg": "other", "value": 0}  # add_'s and add's argument
    assert coverage.from_dict({**OWN, "ops": {"aten::add_": {"kind": "native", "args": [inplace]}}}).arg_rules(
        "aten::add")


def test_a_coverage_keeps_its_argument_rules_through_save_and_load(tmp_path):
    cov = coverage.load("torchneuron-combined")
    rules = cov.arg_rules("aten::topk")
    assert [(r.test, r.arg) for r in rules] == [("below", "k"), ("not_last_dim", "dim"), ("is", "largest")]
    cov.save(tmp_path / "c.json")
    assert coverage.load(str(tmp_path / "c.json")).arg_rules("aten::topk_") == rules
    assert cov.arg_rules("aten::add") == ()
