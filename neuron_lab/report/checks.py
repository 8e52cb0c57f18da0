"""The data model of the trust checks: ``%%neuron parity`` (device against a reference device) and
``%%neuron compare`` (eager against compiled).

Like :class:`~neuron_lab.report.model.Report` these hold names, numbers and source text only, never a
tensor, so a cell's report can keep them in the session history (:class:`~neuron_lab.report.model.Check`). They are
rendered where every report is: :func:`neuron_lab.report.text.render_check_text` and
:func:`neuron_lab.report.html.render_check_html`, which tell the two kinds apart by their class.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from neuron_lab.report.model import GraphBreak, Recompile, Site
from neuron_lab.units import ShownAsText, seconds_as_shown


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
    over: float | None = None  # the worst element's difference over what the tolerances allow it (> 1: failed)
    atol_needed: float | None = None  # the smallest atol that, with this rtol, lets every element pass
    unchanged: bool = False  # the run left it as it found it (an input, a parameter nothing stepped)
    within_float32: bool = False  # float64 over tolerance, but within float32's: what TorchNeuron's 64-bit rule makes
    int32_wrap: bool = False  # int64 apart where the expected values go past int32: what the 64-bit rule wraps


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


class _Rendered(ShownAsText):
    """The IPython display protocol, by the renderers (imported when called: they import this model)."""

    def __repr__(self) -> str:
        from neuron_lab.report.checks_rows import check_summary_line

        return f"<{type(self).__name__}: {check_summary_line(self)}>"

    def __str__(self) -> str:
        from neuron_lab.report.text import render_check_text

        return render_check_text(self)

    def _repr_html_(self) -> str:
        from neuron_lab.report.html import render_check_html

        return render_check_html(self)


@dataclass
class Randomness:
    """How a parity check made the random draws of its two runs comparable (:mod:`neuron_lab.checks.randomness`)."""

    drawn: int = 0  # random op calls in the device run
    replayed: int = 0  # of them, served to the reference run in the same order
    ops: list[tuple[str, int]] = field(default_factory=list)  # the device run's random ops, most called first
    own: int = 0  # random op calls of the reference run that drew from its own generators
    unrecorded: int = 0  # device draws past the recording limit
    differs: str | None = None  # where the two runs stopped drawing alike

    @property
    def complete(self) -> bool:
        """Every random draw of either run was the device run's."""
        return self.replayed == self.drawn and not self.own and self.differs is None


@dataclass(repr=False)  # _Rendered.__repr__: the one-line summary
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
    coverage: str | None = None
    kind: str = "parity"
    randomness: Randomness = field(default_factory=Randomness)

    @property
    def passed(self) -> bool:
        return self.agreement.passed

    @property
    def drift_64bit(self) -> bool:
        """Whether the difference is TorchNeuron's 64-bit rule's: the device computed float64 in float32 and int64 in
        int32, and every item over tolerance is a float64 value or an int64 one past int32 (no error, no other dtype,
        no loss step apart)."""
        a = self.agreement
        return (self.downcast_emulation and self.downcasts > 0 and bool(a.failed)
                and all(i.problem is None and (i.actual_dtype == "float64" or i.int32_wrap) for i in a.failed)
                and not (a.actual_error or a.expected_error or (a.divergence and a.divergence.step)))

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["passed"] = self.passed
        d["drift_64bit"] = self.drift_64bit
        return d


MIN_RUNS = 3  # timed runs per mode before a difference is told from noise


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two closed ranges share a point: the one rule by which compare tells a difference from noise."""
    return a[0] <= b[1] and b[0] <= a[1]


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
        """The fastest run, the first one's included: what the code costs when nothing else on the machine got in its
        way (timeit's reasoning), so the figure a speed-up and a break-even are reckoned from. A first run faster than
        every timed one says the machine slowed those, and the spread must show it (a first run that compiled is
        never the fastest)."""
        return min([self.first_s, *self.runs_s])

    @property
    def max_s(self) -> float:
        return max(self.runs_s, default=self.first_s)

    @property
    def spread_s(self) -> tuple[float, float] | None:
        """min..median: from the best run to a typical timed one, the noise the machine added. A slow outlier cannot
        narrow it, and one lucky fast run widens it, as it should. None under :data:`MIN_RUNS` timed runs."""
        if len(self.runs_s) < MIN_RUNS:
            return None
        return self.min_s, self.median_s


@dataclass(repr=False)  # _Rendered.__repr__: the one-line summary
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
    coverage: str | None = None
    timing_note: str | None = None  # what the times measure, where not the device itself (the backend says)
    kind: str = "compare"

    @property
    def within_noise(self) -> bool | None:
        """Whether the two modes' spreads (:attr:`Timing.spread_s`) overlap, as shown (two ends shown alike touch):
        their difference is within the runs' own noise. None: a mode raised, or too few runs to tell."""
        e = self.eager.spread_s if self.eager is not None else None
        c = self.compiled.spread_s if self.compiled is not None else None
        if e is None or c is None:
            return None
        return overlap(tuple(map(seconds_as_shown, e)), tuple(map(seconds_as_shown, c)))

    @property
    def compiled_nothing(self) -> bool:
        """The compiled runs ran, and none of them compiled a frame (dynamo's cache held the code, or there was no
        module to compile): there is no compile cost, and nothing to break even on."""
        return self.compiled is not None and self.frames == 0

    @property
    def speedup(self) -> float | None:
        """Eager's fastest run over compiled's (> 1: compiled is faster); None unless the spreads are apart
        (:attr:`within_noise` is False), so no ratio is claimed from noise."""
        if self.within_noise is not False or self.compiled.min_s <= 0:
            return None
        return self.eager.min_s / self.compiled.min_s

    @property
    def compile_cost_s(self) -> float | None:
        """What the compiled first run cost beyond its fastest run; None when nothing compiled."""
        if self.compiled is None or self.compiled_nothing:
            return None
        return max(self.compiled.first_s - self.compiled.min_s, 0.0)

    @property
    def break_even(self) -> int | None:
        """Runs of the cell after which compiling has paid for itself (None: it never does, the timings cannot tell
        (:attr:`within_noise` is not False), or nothing compiled)."""
        e, c = self.eager, self.compiled
        if self.within_noise is not False or self.compiled_nothing or c.min_s >= e.min_s:
            return None
        # n runs cost first + (n-1) * fastest in each mode
        extra = c.first_s - e.first_s
        if extra <= 0:
            return 1
        return 1 + int(-(-extra // (e.min_s - c.min_s)))

    @property
    def passed(self) -> bool:
        return self.agreement.passed

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(passed=self.passed, speedup=self.speedup, compile_cost_s=self.compile_cost_s,
                 break_even=self.break_even, within_noise=self.within_noise)
        return d


CheckResult = ParityResult | CompareResult  # what a cell's report carries in ``checks``; renderers tell them by type
