"""A trust check's facts (``%%neuron parity``, ``%%neuron compare``: :mod:`neuron_lab.report.checks`) as
renderer-neutral rows and sentences: the verdict, the first divergence, the timings, the compared items.

Each function takes the result's own class, and the two kinds are told apart by their type.
"""

from __future__ import annotations

import math

from neuron_lab.report.checks import (
    MIN_RUNS,
    Agreement,
    CheckResult,
    CompareResult,
    Divergence,
    Item,
    ParityResult,
    Timing,
)
from neuron_lab.report.model import Check
from neuron_lab.report.rows import Table
from neuron_lab.units import count, format_seconds

CHECK_FOLD = 12  # item rows shown before the rest are summarised

def verdict(a: Agreement) -> str:
    """An :class:`~neuron_lab.report.checks.Agreement` in a few words: ``agree (12 items)``, ``FAIL (…)``."""
    if a.actual_error or a.expected_error:
        who, err = (a.actual, a.actual_error) if a.actual_error else (a.expected, a.expected_error)
        return f"FAIL: the {who} run raised {err}"
    n = len(a.items)
    if a.passed:
        return f"agree ({count(n, 'item')}" + (f", {count(a.steps, 'step')}" if a.steps else "") + ")"
    bad = len(a.failed)
    if bad:
        return f"FAIL ({bad} of {n} items over tolerance)"
    return f"FAIL (the loss went over tolerance at step {a.divergence.step.step})"


def drift_64bit_verdict(a: Agreement) -> str:
    """A parity difference that TorchNeuron's 64-bit rule explains, named as such and not as a generic mismatch."""
    floats = [i for i in a.failed if not i.int32_wrap]
    said, rule = [], []
    if floats:
        said.append("float64, " + ("within float32's tolerances" if all(i.within_float32 for i in floats)
                                   else "past float32's tolerances too: the code magnifies float32's rounding"))
        rule.append("float64 in float32")
    if len(floats) < len(a.failed):
        said.append("int64, values past int32 wrapped")
        rule.append("int64 in int32")
    return (f"64-bit drift ({len(a.failed)} of {count(len(a.items), 'item')}, {'; '.join(said)}): TorchNeuron's "
            f"64-bit rule computes {' and '.join(rule)}, so a Trn instance differs alike; "
            f"NEURON_LAB_EMULATE_DOWNCAST=0 checks exact 64-bit")


def divergence_text(d: Divergence) -> str:
    """Where two runs first parted (a :class:`~neuron_lab.report.checks.Divergence`): the step, the variable."""
    parts = []
    if d.step is not None:
        s = d.step
        where = f" at {s.site.label}" if s.site else ""
        parts.append(f"step {s.step} (loss{where}: {s.actual:.7g} vs {s.expected:.7g})")
    if d.var is not None:
        item = f" ({d.item})" if d.item and d.item != d.var else ""
        parts.append(f"variable {d.var}{item}" + (f", line {d.line}" if d.line else ""))
    return "; ".join(parts) or "nowhere"


def as_result(check: Check) -> CheckResult:
    """A report's check as the class it is, which decides how it is laid out."""
    if isinstance(check, (ParityResult, CompareResult)):
        return check
    raise TypeError(f"no layout for a {type(check).__name__}: a check is a ParityResult or a CompareResult")


def check_summary_line(check: Check) -> str:
    """A check in one line: what a cell's report shows of it, and its ``repr``."""
    result = as_result(check)
    return parity_summary(result) if isinstance(result, ParityResult) else compare_summary(result)


def parity_summary(result: ParityResult) -> str:
    a = result.agreement
    said = drift_64bit_verdict(a) if result.drift_64bit else verdict(a)
    parts = [f"parity {result.device} vs {result.reference}: {said}"]
    if a.divergence is not None and not a.passed and not (a.actual_error or a.expected_error):
        parts.append(f"first: {divergence_text(a.divergence)}")
    r = result.randomness
    if not a.passed and not r.complete:
        parts.append("the runs drew differently")
    return " · ".join(parts)


def compare_summary(result: CompareResult) -> str:
    a = result.agreement
    if result.eager is None or result.compiled is None:
        return f"compare eager vs compiled ({result.backend}): {verdict(a)}"
    be, noise = result.break_even, result.within_noise
    parts = [f"compare eager {format_seconds(result.eager.min_s)} vs compiled {format_seconds(result.compiled.min_s)}"
             f" ({min_of(result)}): " + ("within noise" if noise else "too few runs to tell from noise" if noise is None
                                         else f"{result.speedup:.2f}×")]
    if result.timing_note:
        parts.append(result.timing_note)
    if result.compiled_nothing:
        parts.append("nothing compiled")
    else:
        parts.append(f"compile {format_seconds(result.compile_cost_s)}")
        if noise is False:
            parts.append(break_even_text(be))
    parts.append(f"outputs {verdict(a)}")
    if result.breaks or result.recompiles:
        parts.append(f"{count(len(result.breaks), 'graph break')}, {count(len(result.recompiles), 'recompile')}")
    return " · ".join(parts)


def min_of(result: CompareResult) -> str:
    """What the figures a compare check leads with are: each mode's fastest run, of its first and its timed ones
    (``min of 6`` for ``--runs 5``)."""
    n = {len(result.eager.runs_s) + 1, len(result.compiled.runs_s) + 1}
    return f"min of {'/'.join(str(k) for k in sorted(n))}"


def timed_runs(result: CompareResult) -> str:
    """How many timed runs each mode made (``5``; ``2/3`` when they differ)."""
    n = {len(result.eager.runs_s), len(result.compiled.runs_s)}
    return "/".join(str(k) for k in sorted(n))


def break_even_text(be: int | None) -> str:
    return "never breaks even" if be is None else f"breaks even after {count(be, 'run')}"


def check_context(result: CheckResult) -> str:
    """What the numbers of a check depend on: the op coverage, the 64-bit downcast and its op calls."""
    parts = [f"coverage {result.coverage}" if result.coverage else "no op coverage"]
    if not result.coverage:  # the real device: no coverage, and it always computes 64-bit ops in 32 bits
        parts.append("float64 computed in float32 by the device")
    elif result.downcast_emulation:
        parts.append("64-bit downcast emulated (float64 computed in float32, int64 in int32, as TorchNeuron; "
                     "NEURON_LAB_EMULATE_DOWNCAST=0 keeps it exact)")
    else:
        parts.append("64-bit downcast not emulated (NEURON_LAB_EMULATE_DOWNCAST=0; TorchNeuron computes float64 in "
                     "float32, int64 in int32)")
    if result.downcasts:
        ops = ", ".join(result.downcast_ops[:4]) + (" …" if len(result.downcast_ops) > 4 else "")
        parts.append(f"{count(result.downcasts, '64-bit op call')} ({ops})")
    return " · ".join(parts)


def randomness_line(result: ParityResult) -> list[str]:
    """How a parity check handled random ops, in one line ([] when neither run drew)."""
    r = result.randomness
    if not r.drawn and not r.own:
        return []
    ops = ", ".join(f"{op.removeprefix('aten::')} ×{n}" for op, n in r.ops)
    if r.complete:
        return [f"randomness: {count(r.drawn, 'random op')} ({ops}) replayed from the {result.device} run"]
    unmatched = [count(r.drawn - r.replayed, "device draw") + " not matched in the reference"] \
        if r.replayed < r.drawn else []
    unmatched += [count(r.own, "reference draw") + " from its own generator"] if r.own else []
    return [f"randomness: {r.replayed} of {count(r.drawn, 'random op')} replayed from the {result.device} run; the "
            f"runs drew differently ({r.differs}): {', '.join(unmatched)}, so what depends on "
            f"{'those' if r.drawn - r.replayed + r.own > 1 else 'it'} can differ"]


def parity_head(result: ParityResult) -> list[str]:
    """The lines above a parity check's items: verdict, first divergence, randomness, timings, seed, tolerances,
    context."""
    tol = "dtype defaults (as torch.testing.assert_close)" if result.rtol is None else \
        f"rtol {result.rtol:g}, atol {result.atol:g}"
    seed = "random generators as the cell found them" if result.seed is None else f"seed {result.seed}"
    return [f"neuron_lab {check_summary_line(result)}", *divergence_lines(result.agreement),
            *(tolerance_lines(result.agreement) if result.randomness.complete else []), *randomness_line(result),
            f"{result.device} {format_seconds(result.device_s)}, {result.reference} (eager, on copies) "
            f"{format_seconds(result.reference_s)} · {seed} · tolerances: {tol}",
            check_context(result)]


def timing_table(result: CompareResult) -> Table:
    """A compare check's timings, a row per mode: the fastest run (the cold one included), the typical and slowest
    timed runs, and the cold one."""
    rows = []
    for name, t in (("eager", result.eager), ("compiled", result.compiled)):
        if t is None:
            rows.append([name, "raised", "", "", "", ""])
        else:
            rows.append([name, format_seconds(t.min_s), format_seconds(t.median_s), format_seconds(t.max_s),
                         format_seconds(t.first_s), f"{len(t.runs_s)} after {result.warmup} warm-up"])
    return Table(["mode", "min", "median", "max", "first run", "runs"], rows)


def compare_facts(result: CompareResult) -> list[str]:
    """What compiling cost and bought, the backend and the context (the compile events are listed apart)."""
    out = []
    if result.compiled_nothing:  # a note says why
        out.append(noise_text(result))
    elif result.eager is not None and result.compiled is not None:
        cost = (f"compile cost {format_seconds(result.compile_cost_s)} (dynamo and backend "
                f"{format_seconds(result.compile_s)}, {count(result.frames, 'frame compile')}, "
                f"{count(result.graphs, 'graph')})")
        out.append(" · ".join([noise_text(result), cost] + (
            [] if result.within_noise is not False else [break_even_text(result.break_even)])))
    out.append(f"backend {result.backend}" + (", fullgraph" if result.fullgraph else "") + " · " +
               check_context(result))
    return out + tolerance_lines(result.agreement)


def noise_text(result: CompareResult) -> str:
    """The speed-up of a compare check, or why there is none to claim: the two modes' spreads (each mode's min to its
    timed runs' median, :attr:`~neuron_lab.report.checks.Timing.spread_s`) overlap, or too few runs."""
    noise = result.within_noise
    if noise is None:
        return (f"too few timed runs to tell from noise ({timed_runs(result)} per mode; --runs {MIN_RUNS} or more): "
                f"no speed-up or break-even claimed")

    def spread(t: Timing) -> str:
        lo, hi = t.spread_s
        return f"{format_seconds(lo)}–{format_seconds(hi)}"

    spreads = f"spreads (min–median) eager {spread(result.eager)}, compiled {spread(result.compiled)}"
    if noise:
        return (f"within noise: the {spreads} overlap, so no speed-up or break-even is claimed "
                f"(more --runs may separate them)")
    return f"speedup {result.speedup:.2f}× ({min_of(result)}; the {spreads} do not overlap)"


def _num(x: float | str | None) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    return "0" if x == 0 else f"{x:.3g}" if abs(x) >= 1e-3 and abs(x) < 1e4 else f"{x:.2e}"


def _val(x: float | str | None) -> str:
    return "-" if x is None else x if isinstance(x, str) else f"{x:.7g}"


def _dtype_shape(i: Item) -> str:
    def one(d: str | None, s: tuple[int, ...] | None) -> str:
        return f"{d or '?'} {list(s) if s is not None else ''}".strip()

    a, e = one(i.actual_dtype, i.actual_shape), one(i.expected_dtype, i.expected_shape)
    return a if a == e else f"{a} vs {e}"


def _over(i: Item) -> str:
    return "" if i.passed or i.over is None else "∞" if math.isinf(i.over) else f"{i.over:.3g}×"


def item_table(a: Agreement, items: list[Item]) -> Table:
    """A row per compared item of ``items``, in their order; ``result`` is ``ok`` or ``FAIL``, ``over`` how many
    times its tolerance the worst element's difference is."""
    header = ["item", "result", "over", "max abs", "max rel", "worst at", a.actual, a.expected, "rtol/atol",
              "dtype, shape"]
    return Table(header, [[i.name, "ok" if i.passed else "FAIL", _over(i), _num(i.max_abs), _num(i.max_rel),
                           "-" if i.worst is None else str(list(i.worst)), _val(i.actual_value),
                           _val(i.expected_value), f"{i.rtol:g}/{i.atol:g}",
                           _dtype_shape(i) + (f"  {i.problem}" if i.problem else "")] for i in items])


def ordered_items(a: Agreement) -> tuple[list[Item], list[Item]]:
    """(the items over tolerance, the agreeing ones): each in the agreement's order, what the run left unchanged
    (inputs, parameters nothing stepped) after what it made or changed."""
    return a.failed, [i for i in a.items if i.passed and not i.unchanged] + [i for i in a.items if i.unchanged
                                                                              and i.passed]


def agreeing_text(items: list[Item]) -> str:
    """Agreeing items folded to one line: how many, by variable, the changed ones first."""
    def by_var(group: list[Item]) -> str:
        n: dict[str, int] = {}
        for i in group:
            n[i.var or i.name] = n.get(i.var or i.name, 0) + 1
        names = [v if k == 1 else f"{v} ({k})" for v, k in n.items()]
        return ", ".join(names[:8]) + (f", … {len(names) - 8} more" if len(names) > 8 else "")

    changed, unchanged = [i for i in items if not i.unchanged], [i for i in items if i.unchanged]
    parts = [by_var(changed)] if changed else []
    parts += [f"unchanged by the run: {by_var(unchanged)}"] if unchanged else []
    return f"{count(len(items), 'item')} agree: " + "; ".join(parts)


ROUNDING = 100.0  # times its tolerance past which a difference is not rounding: no tolerance is suggested


def _round_up(x: float) -> float:
    """``x`` rounded up to two significant digits: a tolerance a person can type."""
    if x <= 0:
        return 0.0
    step = 10.0 ** (math.floor(math.log10(x)) - 1)
    return math.ceil(x / step - 1e-9) * step


def tolerance_lines(a: Agreement) -> list[str]:
    """For items over tolerance: how far over, and the ``--rtol``/``--atol`` that would pass them, when the gap is
    the size of rounding (at most :data:`ROUNDING` times the tolerance); else that it is not."""
    failed = [i for i in a.failed if i.problem is None]
    if not failed or any(i.over is None for i in failed):
        return []
    worst = max(failed, key=lambda i: i.over)
    if worst.over > ROUNDING and not math.isinf(worst.over):
        return [f"over tolerance by up to {worst.over:.3g}× ({worst.name}): far more than rounding, so no "
                f"tolerance is suggested; the first divergence is where to look"]
    rtol = max(i.rtol for i in failed)
    atol = _round_up(max(max(i.atol_needed or 0.0, i.atol) for i in failed) * 1.01)
    over = "" if math.isinf(worst.over) else f" by up to {worst.over:.3g}×"
    return [f"over tolerance{over} ({worst.name}): --rtol {rtol:g} --atol {atol:.2g} would pass "
            f"{'every item' if len(failed) == len(a.failed) else 'these items'}; widen only if this gap is rounding "
            f"you accept"]


def divergence_lines(a: Agreement) -> list[str]:
    if a.divergence is None or a.actual_error or a.expected_error:
        return []
    return [f"first divergence: {divergence_text(a.divergence)}"]


def agreement_notes(a: Agreement) -> list[str]:
    """Everything of an agreement but the divergence line and the item table."""
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


