"""The rewrites of common CPU fallbacks (neuron_lab.backend.coverage.rewrites): each equals the op it replaces on the
CPU (the same values, or for a random op the same distribution, by a seeded check with a bound of six standard
errors), runs on the device from native ops only (those it declares, native under the active coverage), and the
report's fallback row shows it: a hint by default, the code and its source with --full and in HTML.

A rewrite is offered where every op it uses is native: 2.33's table (``DOCUMENTED``) says so of asin, roll and the
rest; the combined default does not for most, as the April source registers none of them (they may fall back), so
these tests run under 2.33's table and one states what the default offers (atan2's, from arithmetic and where)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from shells import loaded_shell, run
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import neuron_lab
from neuron_lab import backend
from neuron_lab.backend import coverage
from neuron_lab.backend.coverage.rewrites import REWRITES, for_op
from neuron_lab.extension import session_of
from neuron_lab.kinds import NATIVE

DOCUMENTED = "torchneuron-2.33"


@pytest.fixture(autouse=True)
def documented():
    backend.active().set_coverage(DOCUMENTED)
    yield
    backend.active().set_coverage(coverage.DEFAULT_COVERAGE)


def function(op: str):
    """The function the rewrite's snippet defines, run as a user would paste it."""
    ns: dict = {}
    exec(REWRITES[op].code, ns)  # noqa: S102  (our own snippet: what the user is told to copy)
    return ns[REWRITES[op].function]


def test_atan2_from_arithmetic_and_where_equals_atan2_in_every_quadrant_octant_and_on_the_axes() -> None:
    g = torch.Generator().manual_seed(0)
    y, x = torch.randn(10_000, generator=g), torch.randn(10_000, generator=g)
    axes = torch.tensor([[0.0, 0.0], [1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0], [2.0, -3.0], [-2.0, -3.0],
                         [3.0, 3.0], [-3.0, 3.0], [1e-30, 1e30], [1e30, -1e-30], [0.41421356, 1.0]])
    y, x = torch.cat([y, axes[:, 0]]), torch.cat([x, axes[:, 1]])
    torch.testing.assert_close(function("aten::atan2")(y, x), torch.atan2(y, x), rtol=1e-6, atol=1e-6)


def test_acos_from_asin_equals_acos_on_its_whole_domain() -> None:
    x = torch.linspace(-1, 1, 10_001)
    torch.testing.assert_close(function("aten::acos")(x), torch.acos(x), rtol=0, atol=1e-6)


def test_cross_from_roll_equals_linalg_cross_on_any_dim() -> None:
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(64, 3, 5, generator=g), torch.randn(64, 3, 5, generator=g)
    torch.testing.assert_close(function("aten::linalg_cross")(a, b, dim=1), torch.linalg.cross(a, b, dim=1))
    torch.testing.assert_close(function("aten::linalg_cross")(a.mT, b.mT), torch.linalg.cross(a.mT, b.mT))


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_from_scatter_add_equals_scatter_reduce(reduce: str, include_self: bool) -> None:
    g = torch.Generator().manual_seed(2)
    self, src = torch.randn(4, 9, generator=g), torch.randn(4, 30, generator=g)
    index = torch.randint(0, 7, (4, 30), generator=g)  # places 7 and 8 receive nothing
    got = function("aten::scatter_reduce")(self, 1, index, src, reduce, include_self=include_self)
    torch.testing.assert_close(got, self.scatter_reduce(1, index, src, reduce, include_self=include_self))


def _within(counts: torch.Tensor, n: int, p: torch.Tensor) -> None:
    """Frequencies within six standard errors of the probabilities (a seeded draw: the same every run)."""
    bound = 6 * torch.sqrt(p * (1 - p) / n)
    assert ((counts / n - p).abs() <= bound).all(), (counts / n, p, bound)


def test_multinomial_by_gumbel_top_k_draws_what_multinomial_draws() -> None:
    """First draws follow p; ordered pairs without replacement follow p_i p_j / (1 - p_i); so do multinomial's own."""
    n, p = 40_000, torch.tensor([0.1, 0.2, 0.3, 0.4])
    pairs = torch.tensor([[p[i] * p[j] / (1 - p[i]) if i != j else 0.0 for j in range(4)] for i in range(4)])
    probs = p.expand(n, 4)
    for draws in (function("aten::multinomial")(probs, 2, torch.Generator().manual_seed(3)),
                  torch.multinomial(probs, 2, generator=torch.Generator().manual_seed(3))):
        assert draws.shape == (n, 2) and (draws[:, 0] != draws[:, 1]).all()  # without replacement
        _within(torch.bincount(draws[:, 0], minlength=4).float(), n, p)
        _within(torch.bincount(draws[:, 0] * 4 + draws[:, 1], minlength=16).float(), n, pairs.flatten())


def test_bernoulli_by_inversion_draws_what_bernoulli_draws() -> None:
    n = 40_000
    p = torch.tensor([0.0, 0.1, 0.5, 0.9, 1.0]).repeat_interleave(n).view(5, n)
    for draws in (function("aten::bernoulli")(p, torch.Generator().manual_seed(4)),
                  torch.bernoulli(p, generator=torch.Generator().manual_seed(4))):
        assert draws.dtype == p.dtype and set(draws.unique().tolist()) <= {0.0, 1.0}
        _within(draws.sum(1), n, p[:, 0])


class _DeviceOps(TorchDispatchMode):
    """The ATen ops that touch a device tensor (an argument or a result), as the device sees them."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(isinstance(t, torch.Tensor) and t.device.type == "neuron" for t in tree_leaves((args, kwargs, out))):
            self.ops.add(func._schema.name)
        return out


_ON_DEVICE = {
    "aten::atan2": lambda d: (torch.randn(8).to(d), torch.randn(8).to(d)),
    "aten::acos": lambda d: (torch.rand(8).to(d),),
    "aten::linalg_cross": lambda d: (torch.randn(4, 3).to(d), torch.randn(4, 3).to(d)),
    "aten::scatter_reduce": lambda d: (torch.randn(3, 6).to(d), 1, torch.tensor([[0, 1, 1, 3]] * 3).to(d),
                                       torch.randn(3, 4).to(d), "mean", False),
    "aten::multinomial": lambda d: (torch.rand(3, 5).to(d), 2),
    "aten::bernoulli": lambda d: (torch.rand(8).to(d),),
}


@pytest.mark.parametrize("op", sorted(REWRITES))
def test_a_rewrite_runs_on_the_device_from_the_native_ops_it_declares(op: str) -> None:
    assert set(_ON_DEVICE) == set(REWRITES)  # every rewrite is run here
    active = backend.active().coverage
    rewrite = REWRITES[op]
    assert active.classify(op)[0] != NATIVE  # it replaces a fallback of the active coverage
    assert [u for u in rewrite.uses if active.classify(u)[0] != NATIVE] == []
    args = _ON_DEVICE[op]("neuron")
    with neuron_lab.track() as report, _DeviceOps() as seen:
        function(op)(*args)
    assert report.fallbacks == [], [r.op for r in report.fallbacks]
    assert seen.ops == set(rewrite.uses)


def test_a_rewrite_is_offered_only_where_the_coverage_makes_its_ops_native() -> None:
    base = coverage.load(DOCUMENTED)
    assert for_op("aten::atan2.out", base) is REWRITES["aten::atan2"]
    combined = coverage.load("torchneuron-combined")  # the April source registers atan2's ops, not asin (acos's)
    assert for_op("aten::atan2.out", combined) is REWRITES["aten::atan2"]
    assert combined.classify("aten::asin")[0] == "possible" and for_op("aten::acos.out", combined) is None
    strict = coverage.from_dict({**base.as_dict(), "name": "no-where",
                                 "ops": {**base.as_dict()["ops"], "aten::where": {"kind": "fallback", "reason": "x"}}})
    assert for_op("aten::atan2.out", strict) is None
    assert for_op("aten::exp", base) is None  # no rewrite for an op without one


CELL = "import torch\ny, x = torch.randn(64, device='neuron'), torch.randn(64, device='neuron')\nz = torch.atan2(y, x)"


def test_the_fallback_row_shows_the_rewrite_hint_then_the_code_with_full_and_in_html(tmp_path: Path) -> None:
    rewrite = REWRITES["aten::atan2"]
    with loaded_shell() as sh:
        res, cap = run(sh, CELL)
        lines = cap.stdout.splitlines()
        row = next(i for i, x in enumerate(lines) if x.startswith("  aten::atan2"))
        assert lines[row + 1] == f"      rewrite: {rewrite.hint} (`%neuron report --full` shows the code)"
        assert "def atan2_native(" not in cap.stdout
        _, full = run(sh, f"%neuron report {res.execution_count} --full")
        code = [f"        {x}".rstrip() for x in rewrite.code.splitlines()]
        lines = full.stdout.splitlines()
        at = lines.index(f"      rewrite: {rewrite.hint}")
        assert lines[at + 1:at + 1 + len(code)] == code
        assert lines[at + 1 + len(code)] == f"        source: {rewrite.source}"
        html = session_of(sh).history[res.execution_count]._repr_html_()
        assert "<summary>rewrite: a polynomial of min(|x|, |y|)" in html and "def atan2_native(y: torch.Tensor" in html
        assert "atan2 by quadrant (https://en.wikipedia.org/wiki/Atan2#Definition_and_computation)" in html
        # a coverage under which where falls back too: no rewrite is offered
        strict = coverage.load(DOCUMENTED).as_dict()
        strict["name"], strict["ops"]["aten::where"] = "no-where", {"kind": "fallback", "reason": "no where"}
        (tmp_path / "no-where.json").write_text(json.dumps(strict))
        try:
            run(sh, f"%neuron coverage {tmp_path / 'no-where.json'}")
            _, cap = run(sh, CELL)
            assert "  aten::atan2" in cap.stdout and "rewrite:" not in cap.stdout, cap.stdout
        finally:
            backend.active().set_coverage(DOCUMENTED)
