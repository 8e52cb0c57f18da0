"""The data model of the trust checks: ``%%neuron parity`` (device against a reference device) and
``%%neuron compare`` (eager against compiled), with their text and HTML renderings.

Like :class:`~neuron_lab.report.model.Report` these hold names, numbers and source text only, never a
tensor, so a cell's report can keep them in the session history.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from html import escape
from typing import Any

from neuron_lab.report.model import GraphBreak, Recompile, Site
from neuron_lab.units import count, format_seconds

FOLD = 12  # item rows shown before the rest are summarised


@dataclass
class Item:
    """One compared value: a tensor, a module's parameter or buffer, an optimizer state entry, a number.

    ``actual`` is the run under test (the device, the compiled run), ``expected`` the reference.
    """

    name: str  # "model.0.weight", "losses[3]", "last value"
    var: str  # the namespace variable it belongs to ("" for the last value)
    passed: bool
    problem: str | None = None  # "dtype float32 vs float64", "missing in the reference run", ...
    actual_dtype: str | None = None
    expected_dtype: str | None = None
    actual_shape: tuple[int, ...] | None = None
    expected_shape: tuple[int, ...] | None = None
    numel: int = 0
    mismatched: int = 0  # elements over tolerance
    max_abs: float | None = None
    max_rel: float | None = None
    worst: tuple[int, ...] | None = None  # index of the worst element
    actual_value: float | str | None = None  # at the worst element
    expected_value: float | str | None = None
    rtol: float = 0.0
    atol: float = 0.0


@dataclass
class Step:
    """The loss of one training step (the scalar ``backward()`` was called on) in both runs."""

    step: int  # 1-based: the n-th backward() of the run
    actual: float
    expected: float
    passed: bool
    site: Site | None = None  # the line that called backward()


@dataclass
class Divergence:
    """Where the two runs first parted, as far as can be found."""

    var: str | None = None  # the first variable (in cell order) with an item over tolerance
    item: str | None = None
    line: int | None = None  # where the cell first assigns or uses ``var``
    step: Step | None = None  # the first training step whose loss went over tolerance

    def __str__(self) -> str:
        parts = []
        if self.step is not None:
            s = self.step
            where = f" at {s.site.label}" if s.site else ""
            parts.append(f"step {s.step} (loss{where}: {s.actual:.7g} vs {s.expected:.7g})")
        if self.var is not None:
            item = f" ({self.item})" if self.item and self.item != self.var else ""
            parts.append(f"variable {self.var}{item}" + (f", line {self.line}" if self.line else ""))
        return "; ".join(parts) or "nowhere"


@dataclass
class Agreement:
    """What two runs of the same code produced, item by item."""

    actual: str  # "neuron:0", "compiled"
    expected: str  # "cpu", "eager"
    items: list[Item] = field(default_factory=list)
    steps: int = 0  # training steps (backward() calls) compared
    step_counts: tuple[int, int] = (0, 0)  # backward() calls in each run
    divergence: Divergence | None = None
    actual_error: str | None = None  # "RuntimeError: ..." when that run raised
    expected_error: str | None = None
    shared: list[str] = field(default_factory=list)  # read by both runs, not copied (could not be)
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[Item]:
        return [i for i in self.items if not i.passed]

    @property
    def passed(self) -> bool:
        return not (self.actual_error or self.expected_error or self.failed or
                    (self.divergence is not None and self.divergence.step is not None))

    def verdict(self) -> str:
        if self.actual_error or self.expected_error:
            who, err = (self.actual, self.actual_error) if self.actual_error else (self.expected, self.expected_error)
            return f"FAIL: the {who} run raised {err}"
        n = len(self.items)
        if self.passed:
            return f"agree ({n} item{'s' * (n != 1)}" + (f", {self.steps} steps" if self.steps else "") + ")"
        bad = len(self.failed)
        if bad:
            return f"FAIL ({bad} of {n} items over tolerance)"
        return f"FAIL (the loss went over tolerance at step {self.divergence.step.step})"


def _num(x: float | str | None) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    return "0" if x == 0 else f"{x:.3g}" if abs(x) >= 1e-3 and abs(x) < 1e4 else f"{x:.2e}"


def _val(x: float | str | None) -> str:
    return "-" if x is None else x if isinstance(x, str) else f"{x:.7g}"


def _dtype_shape(i: Item) -> str:
    def one(d, s):
        return f"{d or '?'} {list(s) if s is not None else ''}".strip()

    a, e = one(i.actual_dtype, i.actual_shape), one(i.expected_dtype, i.expected_shape)
    return a if a == e else f"{a} vs {e}"


def _item_rows(a: Agreement) -> list[list[str]]:
    return [[i.name, "ok" if i.passed else "FAIL", _num(i.max_abs), _num(i.max_rel),
             "-" if i.worst is None else str(list(i.worst)), _val(i.actual_value), _val(i.expected_value),
             f"{i.rtol:g}/{i.atol:g}", _dtype_shape(i) + (f"  {i.problem}" if i.problem else "")]
            for i in a.items]


def _header(a: Agreement) -> list[str]:
    return ["item", "result", "max abs", "max rel", "worst at", a.actual, a.expected, "rtol/atol", "dtype, shape"]


def _notes(a: Agreement) -> list[str]:
    """Everything but the divergence line and the item table."""
    lines = []
    if a.steps:
        lines.append(f"training steps compared: {a.steps} (the loss at each backward())")
    if a.step_counts[0] != a.step_counts[1]:
        lines.append(f"backward() calls differ: {a.step_counts[0]} in the {a.actual} run, "
                     f"{a.step_counts[1]} in the {a.expected} run")
    if not a.items and not (a.actual_error or a.expected_error):
        lines.append("nothing to compare: the cell produced no tensors, modules, optimizers or numbers")
    if a.shared:
        lines.append(f"not copied, so both runs used the same object: {', '.join(a.shared)}")
    return lines + a.notes


def _divergence(a: Agreement) -> list[str]:
    if a.divergence is None or a.actual_error or a.expected_error:
        return []
    return [f"first divergence: {a.divergence}"]


def _agreement_lines(a: Agreement) -> list[str]:
    lines = _divergence(a)
    if a.items:
        rows = _item_rows(a)
        shown = ([r for r in rows if r[1] != "ok"] + [r for r in rows if r[1] == "ok"])[:FOLD]  # failures first
        widths = [max(len(r[k]) for r in [_header(a), *shown]) for k in range(len(rows[0]))]
        for r in [_header(a), *shown]:
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if len(shown) < len(rows):
            ok = sum(1 for i in a.items if i.passed)
            lines.append(f"  … {len(rows) - len(shown)} more items ({ok} agree)")
    return lines + _notes(a)


def _agreement_html(a: Agreement) -> str:
    from neuron_lab.report.html import _folded

    parts = [f"<div>{escape(x)}</div>" for x in _divergence(a)]
    if a.items:
        rows = sorted(_item_rows(a), key=lambda r: r[1] == "ok")  # failures first, then the folded rest
        parts.append(_folded("", _header(a), [[escape(c) for c in r] for r in rows]))
    parts += [f"<div>{escape(x)}</div>" for x in _notes(a)]
    return "".join(parts)


class _Rendered:
    """The IPython display protocol over ``__str__`` / ``html()``."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.summary_line()}>"

    def _repr_pretty_(self, p, cycle: bool) -> None:
        p.text(str(self))

    def _repr_html_(self) -> str:
        return self.html()

    def html(self) -> str:
        raise NotImplementedError


def _context(downcast_emulation: bool, downcasts: int, downcast_ops: list[str], profile: str | None) -> str:
    parts = [f"coverage profile {profile}" if profile else "no coverage profile"]
    if downcast_emulation:
        parts.append("64-bit downcast emulated (NEURON_LAB_EMULATE_DOWNCAST=1: float64 computed in float32)")
    else:
        parts.append("64-bit downcast not emulated (NEURON_LAB_EMULATE_DOWNCAST=1 emulates it)")
    if downcasts:
        ops = ", ".join(downcast_ops[:4]) + (" …" if len(downcast_ops) > 4 else "")
        parts.append(f"{downcasts:,} 64-bit op calls ({ops})")
    return " · ".join(parts)


@dataclass(repr=False)  # a generated __repr__ would shadow _Rendered._repr_pretty_ in IPython
class ParityResult(_Rendered):
    """``%%neuron parity``: the cell on the notebook device against a reference device."""

    device: str
    reference: str
    seed: int | None  # given with --seed; None: the generators as the cell found them
    agreement: Agreement
    rtol: float | None = None  # given tolerances; None: dtype defaults
    atol: float | None = None
    device_s: float = 0.0
    reference_s: float = 0.0
    downcast_emulation: bool = False
    downcasts: int = 0  # 64-bit op calls in the device run
    downcast_ops: list[str] = field(default_factory=list)
    profile: str | None = None
    kind: str = "parity"

    @property
    def passed(self) -> bool:
        return self.agreement.passed

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["passed"] = self.passed
        return d

    def summary_line(self) -> str:
        a = self.agreement
        parts = [f"parity {self.device} vs {self.reference}: {a.verdict()}"]
        if a.divergence is not None and not a.passed and not (a.actual_error or a.expected_error):
            parts.append(f"first: {a.divergence}")
        return " · ".join(parts)

    def _head(self) -> list[str]:
        tol = "dtype defaults (as torch.testing.assert_close)" if self.rtol is None else \
            f"rtol {self.rtol:g}, atol {self.atol:g}"
        return [f"neuron_lab {self.summary_line()}",
                f"{self.device} {format_seconds(self.device_s)}, {self.reference} (eager, on copies) "
                f"{format_seconds(self.reference_s)} · " +
                ("random generators as the cell found them" if self.seed is None else f"seed {self.seed}") +
                f" · tolerances: {tol}",
                _context(self.downcast_emulation, self.downcasts, self.downcast_ops, self.profile)]

    def __str__(self) -> str:
        return "\n".join(self._head() + _agreement_lines(self.agreement))

    def html(self) -> str:
        head = "".join(f"<div>{escape(x)}</div>" for x in self._head())
        return (f"<div class='neuron-lab-check' style='font-family:monospace;font-size:12px'>{head}"
                f"{_agreement_html(self.agreement)}</div>")


@dataclass
class Timing:
    """Wall times of one mode: the first run (where compiling happens) and N steady-state runs."""

    first_s: float
    runs_s: list[float] = field(default_factory=list)  # after the warm-ups

    @property
    def median_s(self) -> float:
        return statistics.median(self.runs_s) if self.runs_s else self.first_s

    @property
    def min_s(self) -> float:
        return min(self.runs_s, default=self.first_s)

    @property
    def max_s(self) -> float:
        return max(self.runs_s, default=self.first_s)

    def __str__(self) -> str:
        return (f"{format_seconds(self.median_s)} median ({format_seconds(self.min_s)}–{format_seconds(self.max_s)}, "
                f"n={len(self.runs_s)}), first run {format_seconds(self.first_s)}")


@dataclass(repr=False)  # a generated __repr__ would shadow _Rendered._repr_pretty_ in IPython
class CompareResult(_Rendered):
    """``%%neuron compare``: the cell in eager mode against compile mode, on copies."""

    device: str
    backend: str
    fullgraph: bool
    warmup: int
    runs: int
    agreement: Agreement
    eager: Timing | None = None  # None when that mode raised
    compiled: Timing | None = None
    compile_s: float = 0.0  # time dynamo and the backend spent compiling (their own callbacks)
    frames: int = 0
    graphs: int = 0
    breaks: list[GraphBreak] = field(default_factory=list)
    recompiles: list[Recompile] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    downcast_emulation: bool = False
    downcasts: int = 0
    downcast_ops: list[str] = field(default_factory=list)
    profile: str | None = None
    kind: str = "compare"

    @property
    def speedup(self) -> float | None:
        """Eager median over compiled median (> 1: compiled is faster)."""
        if self.eager is None or self.compiled is None or self.compiled.median_s <= 0:
            return None
        return self.eager.median_s / self.compiled.median_s

    @property
    def compile_cost_s(self) -> float | None:
        """What the compiled first run cost beyond a steady-state run."""
        if self.compiled is None:
            return None
        return max(self.compiled.first_s - self.compiled.median_s, 0.0)

    @property
    def break_even(self) -> int | None:
        """Runs of the cell after which compiling has paid for itself (None: it never does)."""
        e, c = self.eager, self.compiled
        if e is None or c is None or c.median_s >= e.median_s:
            return None
        # n runs cost first + (n-1) * median in each mode
        extra = c.first_s - e.first_s
        if extra <= 0:
            return 1
        return 1 + int(-(-extra // (e.median_s - c.median_s)))

    @property
    def passed(self) -> bool:
        return self.agreement.passed

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(passed=self.passed, speedup=self.speedup, compile_cost_s=self.compile_cost_s,
                 break_even=self.break_even)
        return d

    def summary_line(self) -> str:
        if self.eager is None or self.compiled is None:
            return f"compare eager vs compiled ({self.backend}): {self.agreement.verdict()}"
        be = self.break_even
        parts = [f"compare eager {format_seconds(self.eager.median_s)} vs compiled "
                 f"{format_seconds(self.compiled.median_s)}: {self.speedup:.2f}×",
                 f"compile {format_seconds(self.compile_cost_s or 0.0)}",
                 "never breaks even" if be is None else f"breaks even after {be:,} runs",
                 f"outputs {self.agreement.verdict()}"]
        if self.breaks or self.recompiles:
            parts.append(f"{count(len(self.breaks), 'graph break')}, {count(len(self.recompiles), 'recompile')}")
        return " · ".join(parts)

    def _table(self) -> list[list[str]]:
        rows = [["mode", "median", "min–max", "first run", "runs"]]
        for name, t in (("eager", self.eager), ("compiled", self.compiled)):
            if t is None:
                rows.append([name, "raised", "", "", ""])
            else:
                rows.append([name, format_seconds(t.median_s), f"{format_seconds(t.min_s)}–{format_seconds(t.max_s)}",
                             format_seconds(t.first_s), f"{len(t.runs_s)} after {self.warmup} warm-up"])
        return rows

    def _facts(self) -> list[str]:
        be = self.break_even
        out = []
        if self.speedup is not None:
            out.append(f"speedup {self.speedup:.2f}× · compile cost {format_seconds(self.compile_cost_s or 0.0)} "
                       f"(dynamo and backend {format_seconds(self.compile_s)}, {count(self.frames, 'frame compile')}, "
                       f"{count(self.graphs, 'graph')}) · " +
                       ("never breaks even" if be is None else f"breaks even after {be:,} runs"))
        out.append(f"backend {self.backend}" + (", fullgraph" if self.fullgraph else "") + " · " +
                   _context(self.downcast_emulation, self.downcasts, self.downcast_ops, self.profile))
        for b in self.breaks:
            where = f"{b.site.label}: {b.site.source}" if b.site else "unknown line"
            out.append(f"graph break at {where}\n    why: {b.reason}")
        for r in self.recompiles:
            where = f" ({r.site.label})" if r.site else ""
            out.append(f"recompile of {r.code}{where}\n    guard: {r.reason}")
        out += [f"compile failed: {f}" for f in self.failures]
        return out

    def __str__(self) -> str:
        rows = self._table()
        widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
        table = ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        return "\n".join([f"neuron_lab {self.summary_line()}", *table, *self._facts(),
                          f"numeric agreement, compiled against eager: {self.agreement.verdict()}",
                          *_agreement_lines(self.agreement)])

    def html(self) -> str:
        from neuron_lab.report.html import _table

        rows = self._table()
        facts = "".join(f"<div>{escape(x)}</div>".replace("\n", "<br>") for x in self._facts())
        return (f"<div class='neuron-lab-check' style='font-family:monospace;font-size:12px'>"
                f"<div><b>{escape(self.summary_line())}</b></div>"
                f"{_table(rows[0], [[escape(c) for c in r] for r in rows[1:]])}{facts}"
                f"<div>numeric agreement, compiled against eager: {escape(self.agreement.verdict())}</div>"
                f"{_agreement_html(self.agreement)}</div>")
