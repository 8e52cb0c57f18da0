"""Rewrites of the common CPU fallbacks in native ops: a snippet the user can copy, with its source.

Beside the coverage data because a rewrite is only worth suggesting where the ops it uses run natively: each lists
them (``uses``), and :func:`for_op` offers it only when the coverage in force says every one of them is native.
Each snippet is checked in the tests against the op it replaces, on the CPU (values, or the distribution for a
random op), and run on the emulated device without a fallback.

The random ones draw their noise on the host and copy it over in one step: TorchNeuron creates random tensors on
the host anyway (coverage "Random numbers are drawn on the CPU"), and what the rewrite saves is the fallback's
device-to-host copy of the op's input, and the wait for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from neuron_lab.backend.coverage import Coverage, _key
from neuron_lab.kinds import NATIVE


@dataclass(frozen=True)
class Rewrite:
    """How to compute one fallback op from native ones."""

    op: str  # the coverage key of the op it replaces: "aten::atan2"
    hint: str  # the rewrite in one line
    function: str  # the name the snippet defines
    code: str  # the snippet: imports and one function, ready to paste into a cell
    source: str  # where the identity or the method comes from
    uses: tuple[str, ...]  # the ATen ops (coverage keys) it runs on the device


_IMPORTS = "import math\n\nimport torch\n\n\n"

_ATAN2 = _IMPORTS + '''\
def atan2_native(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """torch.atan2(y, x) from arithmetic and torch.where: the smaller of |y|, |x| over the larger, brought under
    tan(pi/8), Cephes' atanf polynomial on it, then its octant and quadrant (a -0.0 for y counts as +0.0)."""
    ax, ay = x.abs(), y.abs()
    steep = ay > ax  # past 45 degrees: atan(|y| / |x|) = pi/2 - atan(|x| / |y|)
    lo, hi = torch.where(steep, ax, ay), torch.where(steep, ay, ax)
    t = lo / torch.where(hi > 0, hi, torch.ones_like(hi))  # in [0, 1]; 0 at the origin
    wide = t > 0.4142135623730950  # past tan(pi/8): atan(t) = pi/4 + atan((t - 1) / (t + 1))
    t = torch.where(wide, (t - 1) / (t + 1), t)
    z = t * t
    a = (((8.05374449538e-2 * z - 1.38776856032e-1) * z + 1.99777106478e-1) * z - 3.33329491539e-1) * z * t + t
    a = torch.where(wide, a + math.pi / 4, a)
    a = torch.where(steep, a.neg() + math.pi / 2, a)
    a = torch.where(x < 0, a.neg() + math.pi, a)
    return torch.where(y < 0, a.neg(), a)
'''

_ACOS = _IMPORTS + '''\
def acos_native(x: torch.Tensor) -> torch.Tensor:
    """torch.acos(x) from native ops: arccos x = pi/2 - arcsin x."""
    return (math.pi / 2) - torch.asin(x)
'''

_CROSS = _IMPORTS + '''\
def cross_native(a: torch.Tensor, b: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """torch.linalg.cross(a, b, dim=dim) of 3-vectors from native ops: the definition, with torch.roll."""
    return a.roll(-1, dim) * b.roll(-2, dim) - a.roll(-2, dim) * b.roll(-1, dim)
'''

_SCATTER_REDUCE = _IMPORTS + '''\
def scatter_reduce_native(self: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor,
                          reduce: str, include_self: bool = True) -> torch.Tensor:
    """self.scatter_reduce(dim, index, src, reduce, include_self=...) for reduce 'sum' and 'mean' (floating
    point) from native ops: scatter_add, and the number of values each place received."""
    if reduce not in ("sum", "mean"):
        raise ValueError(f"reduce={reduce!r}: only 'sum' and 'mean' are rewritten")
    base = self if include_self else self.scatter(dim, index, 0.0)
    total = base.scatter_add(dim, index, src)
    if reduce == "sum":
        return total
    start = torch.ones_like(self) if include_self else torch.zeros_like(self)
    return total / start.scatter_add(dim, index, torch.ones_like(src)).clamp(min=1)
'''

_MULTINOMIAL = _IMPORTS + '''\
def multinomial_native(probs: torch.Tensor, num_samples: int,
                       generator: torch.Generator | None = None) -> torch.Tensor:
    """torch.multinomial(probs, num_samples) without replacement by the Gumbel-top-k trick: the indices of the
    num_samples largest log(probs) + Gumbel noise. The noise is drawn on the host and copied over in one step."""
    u = torch.rand(probs.shape, generator=generator, dtype=probs.dtype).clamp(min=torch.finfo(probs.dtype).tiny)
    gumbel = (-torch.log(-torch.log(u))).to(probs.device)
    return (probs.log() + gumbel).topk(num_samples, dim=-1).indices
'''

_BERNOULLI = _IMPORTS + '''\
def bernoulli_native(p: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """torch.bernoulli(p) by inversion: 1 where uniform noise (drawn on the host, copied over) is below p."""
    u = torch.rand(p.shape, generator=generator, dtype=p.dtype).to(p.device)
    return (u < p).to(p.dtype)
'''

REWRITES: dict[str, Rewrite] = {r.op: r for r in (
    Rewrite("aten::atan2", "a polynomial of min(|x|, |y|) / max(|x|, |y|) (Cephes' atanf), its octant and quadrant "
            "set with torch.where", "atan2_native", _ATAN2,
            "Cephes' atanf (S. L. Moshier, Cephes Math Library, https://www.netlib.org/cephes/, single/atanf.c): "
            "range reduction to tan(pi/8) and its degree-9 polynomial; atan2 by quadrant "
            "(https://en.wikipedia.org/wiki/Atan2#Definition_and_computation)",
            ("aten::abs", "aten::gt", "aten::where", "aten::ones_like", "aten::div", "aten::sub", "aten::add",
             "aten::mul", "aten::neg", "aten::lt")),
    Rewrite("aten::acos", "math.pi / 2 - torch.asin(x)", "acos_native", _ACOS,
            "arccos z = pi/2 - arcsin z, NIST DLMF section 4.23 (https://dlmf.nist.gov/4.23)",
            ("aten::asin", "aten::rsub")),
    Rewrite("aten::linalg_cross", "a.roll(-1, dim) * b.roll(-2, dim) - a.roll(-2, dim) * b.roll(-1, dim)",
            "cross_native", _CROSS,
            "the cross product's definition, (a1 b2 - a2 b1, a2 b0 - a0 b2, a0 b1 - a1 b0); torch.linalg.cross's "
            "documentation", ("aten::roll", "aten::mul", "aten::sub")),
    Rewrite("aten::scatter_reduce", "reduce='sum': self.scatter_add(dim, index, src); 'mean': divided by the counts",
            "scatter_reduce_native", _SCATTER_REDUCE,
            "Tensor.scatter_reduce_ and Tensor.scatter_add_ in PyTorch's documentation (a sum over the values sent to "
            "one place; the mean divides it by their count, self included)",
            ("aten::scatter", "aten::scatter_add", "aten::ones_like", "aten::zeros_like", "aten::clamp", "aten::div")),
    Rewrite("aten::multinomial", "without replacement (or one sample): the top k of probs.log() + Gumbel noise "
            "drawn on the host", "multinomial_native", _MULTINOMIAL,
            "W. Kool, H. van Hoof, M. Welling, Stochastic Beams and Where to Find Them: The Gumbel-Top-k Trick for "
            "Sampling Sequences Without Replacement, ICML 2019 (https://arxiv.org/abs/1903.06059)",
            ("aten::log", "aten::add", "aten::topk", "aten::_to_copy")),
    Rewrite("aten::bernoulli", "(uniform noise drawn on the host, copied over) < p", "bernoulli_native", _BERNOULLI,
            "the inversion method, L. Devroye, Non-Uniform Random Variate Generation, Springer 1986, chapter II "
            "(https://luc.devroye.org/rnbookindex.html); torch.bernoulli's documentation",
            ("aten::lt", "aten::_to_copy")),
)}


def for_op(op: str, coverage: Coverage | None) -> Rewrite | None:
    """The rewrite of ``op`` (any overload: ``aten::atan2.out``), when every op it uses is native under ``coverage``
    (None: the device decides what falls back, and reports it, so the rewrite is offered as it is)."""
    rewrite = REWRITES.get(_key(op.split(".")[0]))
    if rewrite is None or coverage is None:
        return rewrite
    return rewrite if all(coverage.classify(u)[0] == NATIVE for u in rewrite.uses) else None
