"""Plain-text rendering of a :class:`Report`: terminals, CI logs, ``print(report)``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from neuron_lab import kinds
from neuron_lab.kinds import FALLBACK
from neuron_lab.report.model import (
    GraphBreak,
    LineTime,
    OpRow,
    Profiled,
    ProfiledOp,
    ProfiledTimeline,
    Recompile,
    Report,
)
from neuron_lab.units import count, format_delta, format_seconds, format_size

FOLD = 8  # rows shown per list in "table" detail; "full" shows all


def shape_text(row: OpRow) -> str:
    """The first call's shapes and dtypes; for a collective, its bytes and group size first."""
    moved = f"{format_size(row.nbytes)} over {row.ranks} ranks  " if row.ranks else ""
    if not row.shapes:
        return moved.rstrip()
    return moved + ", ".join(f"{list(s)} {d}" for s, d in zip(row.shapes, row.dtypes))


def summary_line(r: Report) -> str:
    parts = [r.title, r.device, r.mode, format_seconds(r.wall_s)]
    if r.compiles.compile_s:
        parts[-1] += f" (compile {format_seconds(r.compiles.compile_s)}, run {format_seconds(r.run_s)})"
    parts.append(count(r.ops, "op"))
    fb = r.fallbacks
    parts.append(f"{count(r.fallback_calls, kinds.KINDS[FALLBACK].call)} ({count(len(fb), 'op')})" if fb
                 else "no CPU fallbacks")
    parts += [count(sum(x.count for x in rows), kind.call) for kind, rows in r.sections() if not kind.off_device]
    m = r.memory
    parts.append(f"mem {format_size(m.after)} ({format_delta(m.delta)}, peak {format_size(m.peak)})")
    if r.compiles:
        c = r.compiles
        parts.append(f"{count(c.graphs, 'graph')}, {count(len(c.breaks), 'break')}, "
                     f"{count(len(c.recompiles), 'recompile')}")
    if r.profiled is not None:
        p = r.profiled
        parts.append(f"profiled: device {format_seconds(p.device_ns / 1e9)}, host {format_seconds(p.host_ns / 1e9)}")
    if r.error:
        parts.append(f"raised {r.error.split(':')[0]}")
    return "neuron_lab " + " · ".join(parts)


def host_timed(rows: list[OpRow]) -> bool:
    """Whether the rows' host time is worth a column: kinds that run nothing on the host (a downcast is a note on a
    device call) would only show "0 µs"."""
    return any(r.host_ns for r in rows)


def reason_numbers(rows: list[OpRow]) -> dict[str, int]:
    """Each distinct reason of ``rows``, numbered from 1 in the order the rows show them: a report explains each
    once and its rows refer to the number."""
    refs: dict[str, int] = {}
    for r in rows:
        if r.reason:  # a collective needs no why
            refs.setdefault(r.reason, len(refs) + 1)
    return refs


def reason_lines(refs: dict[str, int]) -> list[str]:
    """The numbered reasons, each with its source as a note."""
    lines = ["why:"] if refs else []
    for reason, n in refs.items():
        row = OpRow("", "", reason)
        lines.append(f"  [{n}] {row.why}")
        if row.source:
            lines.append(f"      source: {row.source}")
    return lines


def one_line(kind: kinds.Kind, rows: list[OpRow]) -> str:
    """A section that ``kind.one_line`` folds: its calls, the dtypes involved and the busiest ops, in one line."""
    total = sum(r.count for r in rows)
    wide = sorted({d for r in rows for d in r.dtypes if d.endswith("64") and not d.startswith("complex")})
    dtypes = "/".join(f"{d}→{d.removesuffix('64')}32" for d in wide)
    busiest = sorted(rows, key=lambda r: (-r.count, r.op))
    ops = ", ".join(f"{r.op} ×{r.count:,}" for r in busiest[:3])
    if len(rows) > 3:
        ops += f", … {count(len(rows) - 3, 'more op')}"
    return f"{kind.title}: {total:,}{' ' + dtypes if dtypes else ''} ({ops}) — `%neuron report --full` lists them"


def op_lines(title: str, rows: list[OpRow], full: bool = False, refs: dict[str, int] | None = None,
             timed_as: str = "on the host") -> list[str]:
    """A titled list of ops that did not run natively, each with its call sites (stacks when ``full``) and the number
    of its reason in ``refs`` (the reason itself when ``refs`` is None)."""
    total = sum(x.count for x in rows)
    timed = host_timed(rows)
    host = f", {format_seconds(sum(x.host_ns for x in rows) / 1e9)} {timed_as}" if timed else ""
    lines = [f"{title} ({count(len(rows), 'op')}, {count(total, 'call')}{host}):"]
    shown = rows if full else rows[:FOLD]
    for row in shown:
        time = f"  {format_seconds(row.host_ns / 1e9):>9}" if timed else ""
        why = f"  why [{refs[row.reason]}]" if refs is not None and row.reason in refs else ""
        lines.append(f"  {row.op:<32} {row.count:>7,}×{time}  {shape_text(row)}{why}".rstrip())
        if refs is None and row.reason:
            lines.append(f"      why: {row.why}")
        sites = row.sites if full else row.sites[:3]
        for sc in sites:
            lines.append(f"      at {sc.site.label}: {sc.site.source}  ({sc.count:,}×)")
            if full:
                for stack in sc.stacks:
                    lines.append("        stack:")
                    lines.extend(f"          {frame}" for frame in stack)
        if len(row.sites) > len(sites):
            lines.append(f"      … {len(row.sites) - len(sites)} more sites")
        if row.unattributed:
            lines.append(f"      {row.unattributed:,} calls without a user line")
    if len(rows) > len(shown):
        lines.append(f"  … {len(rows) - len(shown)} more ops (`%neuron report --full`)")
    return lines


def section_refs(sections: list[tuple[kinds.Kind, list[OpRow]]], full: bool, limit: int | None) -> dict[str, int]:
    """The reasons of the rows shown in tables (the first ``limit`` of each section), numbered."""
    return reason_numbers([row for kind, rows in sections if not (kind.one_line and not full) for row in rows[:limit]])


def op_sections(sections: list[tuple[kinds.Kind, list[OpRow]]], full: bool = False) -> list[str]:
    """Sections of op rows (:meth:`Report.sections`) as every text view shows them: a table each (one line for a kind
    that ``one_line`` folds, unless ``full``), then each reason once."""
    refs = section_refs(sections, full, None if full else FOLD)
    lines = []
    for kind, rows in sections:
        lines += ([one_line(kind, rows)] if kind.one_line and not full
                  else op_lines(kind.title, rows, full, refs, kind.timed_as))
    return lines + reason_lines(refs)


def oom_lines(r: Report) -> list[str]:
    """What held the device when the window ran out of its memory, biggest first, and what was freed after."""
    o = r.oom
    if o is None:
        return []
    lines = [f"out of memory: {format_size(o.allocated)} held when the error unwound, by:"]
    for t in o.tensors:
        what = f"{t.storages} × " if t.storages > 1 else ""
        shape = f"{what}{list(t.shape) if t.shape is not None else '?'} {t.dtype or ''}".rstrip()
        lines.append(f"  {format_size(t.bytes):>12}  {', '.join(t.names) or '-'}  ({shape}; {t.held_by})")
    if o.more:
        lines.append(f"  {format_size(o.more):>12}  in smaller storages (`%neuron tensors` lists them all)")
    if o.freed:
        lines.append(f"freed after the error: {format_size(o.freed)} the failing frames held "
                     "(`%config NeuronLab.oom_traceback = 'full'` keeps them for %debug)")
    return lines


def compile_event_lines(breaks: list[GraphBreak], recompiles: list[Recompile], failures: list[str],
                        limit: int | None = None) -> list[str]:
    """Graph breaks and recompiles (``limit`` of each at most), where and why, then the compiles that failed."""
    lines = []
    for b in breaks[:limit]:
        where = f"{b.site.label}: {b.site.source}" if b.site else "unknown line"
        lines.append(f"  graph break at {where}\n      why: {b.reason}")
        if b.hint:
            lines.append(f"      fix: {b.hint}")
        if b.note and b.note != b.reason:
            lines.append(f"      dynamo: {b.note}")
    for rc in recompiles[:limit]:
        where = f" ({rc.site.label})" if rc.site else ""
        lines.append(f"  recompile of {rc.code}{where}\n      guard: {rc.reason}")
    return lines + [f"  compile failed: {f}" for f in failures]


def render_text(r: Report, detail: str | None = None) -> str:
    detail = detail or r.detail
    head = summary_line(r)
    if detail == "summary":
        return head
    full = detail == "full"
    m = r.memory
    lines = [head,
             f"memory: {format_size(m.before)} → {format_size(m.after)} ({format_delta(m.delta)}), "
             f"peak {format_size(m.peak)} of {format_size(m.capacity)}; host RSS {format_delta(m.host_rss_delta)}"]
    if r.h2d_bytes or r.d2h_bytes:
        lines.append(f"copies: host→device {format_size(r.h2d_bytes)}, device→host {format_size(r.d2h_bytes)}")
    lines += op_sections(r.sections(), full)
    if r.coverage and r.fallbacks:
        lines.append(f"predicted by the coverage {r.coverage} (`%neuron coverage NAME` switches)")
    c = r.compiles
    if c:
        lines.append(f"compile: {count(c.frames, 'frame compile')}, {count(c.graphs, 'graph')}, "
                     f"{format_seconds(c.compile_s)} "
                     f"compiling, {format_seconds(r.run_s)} running")
        lines += compile_event_lines(c.breaks, c.recompiles, c.failures, None if full else FOLD)
    if not r.callsites and r.fallbacks:
        lines.append("call sites are off (`%config NeuronLab.callsites = True` turns them on)")
    if r.profiled is not None:
        lines += profiled_lines(r.profiled, full)
    lines += [render_check_text(c) if full else f"check: {check_summary_line(c)}" for c in r.checks]
    if r.error:
        lines.append(f"raised: {r.error}")
    lines += oom_lines(r)
    return "\n".join(lines)


# -- %%neuron profile / neuron_lab.profile(): torch.profiler's view (report.profiled) --------------------------------
PERFETTO = "https://ui.perfetto.dev"
PROFILED_HEADER = ["op", "ran", "calls", "device", "host", "first shapes", "issued at"]
LINE_HEADER = ["line", "calls", "device", "host", "source"]


def ran_text(kind: str) -> str:
    """Where a profiled op ran, in a word or two: "native", "CPU fallback", "host op"."""
    return "native" if kind == kinds.NATIVE else kinds.KINDS[kind].call.removesuffix(" call") \
        if kind in kinds.KINDS else kind


def profiled_head(p: Profiled) -> str:
    """The profile in one line: ops, device and host time, each lane's busy time."""
    lanes = ", ".join(f"{lane} busy {format_seconds(ns / 1e9)}" for lane, ns in p.lanes.items())
    return (f"profile: {count(len(p.rows), 'op')}, {count(sum(r.calls for r in p.rows), 'call')}, "
            f"device {format_seconds(p.device_ns / 1e9)}, host {format_seconds(p.host_ns / 1e9)}"
            + (f" ({lanes})" if lanes else " (no device activity in the profile)"))


def profiled_rows(p: Profiled) -> list[list[str]]:
    """The op table's rows (:data:`PROFILED_HEADER`), the most device + host time first."""
    def shapes(r: ProfiledOp) -> str:
        if r.dtypes:
            return ", ".join(f"{list(s)} {d}" for s, d in zip(r.shapes, r.dtypes))
        return ", ".join(str(list(s)) for s in r.shapes)

    def at(r: ProfiledOp) -> str:
        where = r.sites[0].site.label if r.sites else "no user line"
        more = len(r.sites) - 1 + (1 if r.sites and r.unattributed else 0)
        return where + (f" (+{count(more, 'more line')})" if more > 0 else "")

    return [[r.op, ran_text(r.kind), f"{r.calls:,}", format_seconds(r.device_ns / 1e9),
             format_seconds(r.host_ns / 1e9), shapes(r), at(r)] for r in p.rows]


def line_rows(p: Profiled) -> list[list[str]]:
    """Time per user line (:data:`LINE_HEADER`), the most device + host time first."""
    def one(x: LineTime) -> list[str]:
        return [x.site.label, f"{x.calls:,}", format_seconds(x.device_ns / 1e9), format_seconds(x.host_ns / 1e9),
                x.site.source]

    return [one(x) for x in p.lines]


def timeline_head(t: ProfiledTimeline) -> str:
    """The timeline in one line: its length, lanes and events, and what the cap merged or left out."""
    capped = [f"{t.merged:,} merged into neighbouring spans"] if t.merged else []
    capped += [f"{t.dropped:,} of the shortest left out"] if t.dropped else []
    return (f"timeline: {format_seconds(t.duration_ns / 1e9)}, {count(len(t.lanes), 'lane')}, "
            f"{count(t.events, 'event')}" + (f" ({', '.join(capped)})" if capped else ""))


def timeline_lines(t: ProfiledTimeline) -> list[str]:
    """The timeline in words (the HTML draws it): each lane's events and busy time, each device's memory."""
    if not t.lanes and not t.memory:
        return []
    lines = [timeline_head(t)]
    for lane in t.lanes:
        events, busy = sum(s.events for s in lane.spans), sum(s.busy_ns for s in lane.spans)
        lines.append(f"  {lane.name}: {count(events, 'event')}, busy {format_seconds(busy / 1e9)}")
    for m in t.memory:
        lines.append(f"  {m.device} memory: {format_size(m.points[0][1])} at the start, peak {format_size(m.peak)}, "
                     f"{format_size(m.points[-1][1])} at the end")
    return lines


def trace_line(p: Profiled) -> list[str]:
    return [f"trace: {p.trace_path} (open it in {PERFETTO})"] if p.trace_path else []


def profiled_lines(p: Profiled, full: bool = False, head: bool = True) -> list[str]:
    """The profile section: its head (unless ``head`` is False: the ranks' report heads it), the op table and the
    time per line (``row_limit`` rows each unless ``full``), the calls no user line issued, and the exported trace."""
    limit = None if full else p.row_limit
    lines = [profiled_head(p)] if head else []
    for title, header, rows, noun in (("ops by device + host time:", PROFILED_HEADER, profiled_rows(p), "op"),
                                      ("time per line:", LINE_HEADER, line_rows(p), "line")):
        if not rows:
            continue
        lines += [title, *_columns([header, *rows[:limit]])]
        if len(rows) > len(rows[:limit]):
            lines.append(f"  … {count(len(rows) - len(rows[:limit]), 'more ' + noun)} (`%neuron report --full`)")
    if p.unattributed_ns:
        lines.append(f"  {format_seconds(p.unattributed_ns / 1e9)} in calls without a user line")
    return lines + timeline_lines(p.timeline) + trace_line(p)


# -- checks: %%neuron parity / compare (neuron_lab.report.checks) -----------------------------------------
# The results are read by their fields (``kind`` says which): report.checks imports this module to render
# itself, so this one does not import it back.
CHECK_FOLD = 12  # item rows shown before the rest are summarised


def verdict(a: Any) -> str:
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


def divergence_text(d: Any) -> str:
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


def check_summary_line(result: Any) -> str:
    """One line of a :class:`~neuron_lab.report.checks.ParityResult` or ``CompareResult``."""
    a = result.agreement
    if result.kind == "parity":
        parts = [f"parity {result.device} vs {result.reference}: {verdict(a)}"]
        if a.divergence is not None and not a.passed and not (a.actual_error or a.expected_error):
            parts.append(f"first: {divergence_text(a.divergence)}")
        r = result.randomness
        if not a.passed and not r.complete:
            parts.append(f"random draws not replayed from op {r.replayed + 1} on")
        return " · ".join(parts)
    if result.eager is None or result.compiled is None:
        return f"compare eager vs compiled ({result.backend}): {verdict(a)}"
    be, noise = result.break_even, result.within_noise
    parts = [f"compare eager {format_seconds(result.eager.median_s)} vs compiled "
             f"{format_seconds(result.compiled.median_s)}: " +
             ("within noise" if noise else f"{result.speedup:.2f}×" + (", too few runs to tell from noise"
                                                                         if noise is None else "")),
             f"compile {format_seconds(result.compile_cost_s or 0.0)}"]
    if noise is False:
        parts.append("never breaks even" if be is None else f"breaks even after {be:,} runs")
    parts.append(f"outputs {verdict(a)}")
    if result.breaks or result.recompiles:
        parts.append(f"{count(len(result.breaks), 'graph break')}, {count(len(result.recompiles), 'recompile')}")
    return " · ".join(parts)


def check_context(result: Any) -> str:
    """What the numbers of a check depend on: the op coverage, the 64-bit downcast and its op calls."""
    parts = [f"coverage {result.coverage}" if result.coverage else "no op coverage"]
    if not result.coverage:  # the real device: no coverage, and it always computes 64-bit ops in 32 bits
        parts.append("float64 computed in float32 by the device")
    elif result.downcast_emulation:
        parts.append("64-bit downcast emulated (NEURON_LAB_EMULATE_DOWNCAST=1: float64 computed in float32)")
    else:
        parts.append("64-bit downcast not emulated (NEURON_LAB_EMULATE_DOWNCAST=1 emulates it)")
    if result.downcasts:
        ops = ", ".join(result.downcast_ops[:4]) + (" …" if len(result.downcast_ops) > 4 else "")
        parts.append(f"{result.downcasts:,} 64-bit op calls ({ops})")
    return " · ".join(parts)


def randomness_line(result: Any) -> list[str]:
    """How a parity check handled random ops, in one line ([] when neither run drew)."""
    r = result.randomness
    if not r.drawn and not r.own:
        return []
    ops = ", ".join(f"{op.removeprefix('aten::')} ×{n}" for op, n in r.ops)
    if r.complete:
        return [f"randomness: {count(r.drawn, 'random op')} ({ops}) replayed from the {result.device} run"]
    return [f"randomness: {r.replayed} of {count(r.drawn, 'random op')} replayed from the {result.device} run, "
            f"then the runs drew differently ({r.differs}); later draws come from each run's own generators, so "
            f"what depends on them can differ"]


def parity_head(result: Any) -> list[str]:
    """The lines above a parity check's items: verdict, first divergence, randomness, timings, seed, tolerances,
    context."""
    tol = "dtype defaults (as torch.testing.assert_close)" if result.rtol is None else \
        f"rtol {result.rtol:g}, atol {result.atol:g}"
    seed = "random generators as the cell found them" if result.seed is None else f"seed {result.seed}"
    return [f"neuron_lab {check_summary_line(result)}", *divergence_lines(result.agreement),
            *randomness_line(result),
            f"{result.device} {format_seconds(result.device_s)}, {result.reference} (eager, on copies) "
            f"{format_seconds(result.reference_s)} · {seed} · tolerances: {tol}",
            check_context(result)]


def timing_rows(result: Any) -> list[list[str]]:
    """A compare check's timings, a header and one row per mode."""
    rows = [["mode", "median", "min–max", "first run", "runs"]]
    for name, t in (("eager", result.eager), ("compiled", result.compiled)):
        if t is None:
            rows.append([name, "raised", "", "", ""])
        else:
            rows.append([name, format_seconds(t.median_s), f"{format_seconds(t.min_s)}–{format_seconds(t.max_s)}",
                         format_seconds(t.first_s), f"{len(t.runs_s)} after {result.warmup} warm-up"])
    return rows


def compare_facts(result: Any) -> list[str]:
    """What compiling cost and bought, the backend and the context (the compile events are listed apart)."""
    be = result.break_even
    out = []
    if result.speedup is not None:
        cost = (f"compile cost {format_seconds(result.compile_cost_s or 0.0)} (dynamo and backend "
                f"{format_seconds(result.compile_s)}, {count(result.frames, 'frame compile')}, "
                f"{count(result.graphs, 'graph')})")
        out.append(" · ".join([noise_text(result), cost] + (
            [] if result.within_noise is not False else
            ["never breaks even" if be is None else f"breaks even after {be:,} runs"])))
    out.append(f"backend {result.backend}" + (", fullgraph" if result.fullgraph else "") + " · " +
               check_context(result))
    return out


def noise_text(result: Any) -> str:
    """The speed-up of a compare check, or why there is none to claim: the interquartile ranges (the middle half of
    each mode's timed runs) overlap, or too few runs."""
    noise, ratio = result.within_noise, f"{result.speedup:.2f}×"
    if noise is None:
        return (f"median ratio {ratio} from {len(result.eager.runs_s)} and {len(result.compiled.runs_s)} runs, too "
                f"few to tell from noise (--runs 3 or more): no speed-up claimed")

    def iqr(t: Any) -> str:
        q1, q3 = t.quartiles_s
        return f"{format_seconds(q1)}–{format_seconds(q3)}"

    ranges = f"interquartile ranges eager {iqr(result.eager)}, compiled {iqr(result.compiled)}"
    if noise:
        return (f"within noise: the {ranges} overlap, so no speed-up or break-even is claimed "
                f"(median ratio {ratio}; more --runs may separate them)")
    return f"speedup {ratio} (the {ranges} do not overlap)"


def _num(x: float | str | None) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    return "0" if x == 0 else f"{x:.3g}" if abs(x) >= 1e-3 and abs(x) < 1e4 else f"{x:.2e}"


def _val(x: float | str | None) -> str:
    return "-" if x is None else x if isinstance(x, str) else f"{x:.7g}"


def _dtype_shape(i: Any) -> str:
    def one(d, s):
        return f"{d or '?'} {list(s) if s is not None else ''}".strip()

    a, e = one(i.actual_dtype, i.actual_shape), one(i.expected_dtype, i.expected_shape)
    return a if a == e else f"{a} vs {e}"


def item_header(a: Any) -> list[str]:
    return ["item", "result", "max abs", "max rel", "worst at", a.actual, a.expected, "rtol/atol", "dtype, shape"]


def item_rows(a: Any, items: list[Any] | None = None) -> list[list[str]]:
    """One row of text per compared item (``items``, else the agreement's, in its order); ``result`` is ``ok`` or
    ``FAIL``."""
    return [[i.name, "ok" if i.passed else "FAIL", _num(i.max_abs), _num(i.max_rel),
             "-" if i.worst is None else str(list(i.worst)), _val(i.actual_value), _val(i.expected_value),
             f"{i.rtol:g}/{i.atol:g}", _dtype_shape(i) + (f"  {i.problem}" if i.problem else "")]
            for i in (a.items if items is None else items)]


def ordered_items(a: Any) -> tuple[list[Any], list[Any]]:
    """(the items over tolerance, the agreeing ones): each in the agreement's order, what the run left unchanged
    (inputs, parameters nothing stepped) after what it made or changed."""
    return a.failed, [i for i in a.items if i.passed and not i.unchanged] + [i for i in a.items if i.unchanged
                                                                              and i.passed]


def agreeing_text(items: list[Any]) -> str:
    """Agreeing items folded to one line: how many, by variable, the changed ones first."""
    def by_var(group: list[Any]) -> str:
        n: dict[str, int] = {}
        for i in group:
            n[i.var or i.name] = n.get(i.var or i.name, 0) + 1
        names = [v if k == 1 else f"{v} ({k})" for v, k in n.items()]
        return ", ".join(names[:8]) + (f", … {len(names) - 8} more" if len(names) > 8 else "")

    changed, unchanged = [i for i in items if not i.unchanged], [i for i in items if i.unchanged]
    parts = [by_var(changed)] if changed else []
    parts += [f"unchanged by the run: {by_var(unchanged)}"] if unchanged else []
    return f"{count(len(items), 'item')} agree: " + "; ".join(parts)


def divergence_lines(a: Any) -> list[str]:
    if a.divergence is None or a.actual_error or a.expected_error:
        return []
    return [f"first divergence: {divergence_text(a.divergence)}"]


def agreement_notes(a: Any) -> list[str]:
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


def _columns(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def _agreement_lines(a: Any, divergence: bool = True) -> list[str]:
    """The items: all of them when they are few, else those over tolerance and a count of the agreeing rest."""
    lines = divergence_lines(a) if divergence else []
    failed, agreeing = ordered_items(a)
    if len(a.items) <= CHECK_FOLD:
        lines += _columns([item_header(a), *item_rows(a, failed + agreeing)]) if a.items else []
    else:
        lines += _columns([item_header(a), *item_rows(a, failed)]) if failed else []
        lines += [f"  {'+ ' if failed else ''}{agreeing_text(agreeing)}"] if agreeing else []
    return lines + agreement_notes(a)


def render_check_text(result: Any) -> str:
    """A :class:`~neuron_lab.report.checks.ParityResult` or ``CompareResult`` in full."""
    a = result.agreement
    if result.kind == "parity":
        return "\n".join(parity_head(result) + _agreement_lines(a, divergence=False))
    return "\n".join([f"neuron_lab {check_summary_line(result)}", *_columns(timing_rows(result)),
                      *compare_facts(result),
                      *compile_event_lines(result.breaks, result.recompiles, result.failures),
                      f"numeric agreement, compiled against eager: {verdict(a)}", *_agreement_lines(a)])


# -- several ranks: %%neuron ranks, neuron-lab run --nproc (neuron_lab.report.ranks) ---------------------------------
def ranks_summary_parts(rr: Any) -> list[str]:
    """The facts of a :class:`~neuron_lab.report.ranks.RanksReport`'s one line after its title: ranks, the slowest
    and the skew, collectives, and what any rank did off the device or failed at."""
    parts = [count(len(rr.ranks), "rank")]
    slow = rr.slowest
    if slow is not None and len(rr.reports) > 1:
        parts.append(f"slowest rank {slow.rank} ({format_seconds(slow.report.wall_s)}, skew "
                     f"{format_seconds(rr.skew_s)})")
    elif slow is not None:
        parts.append(format_seconds(slow.report.wall_s))
    calls = sum(r.collectives()[0] for r in rr.ranks)
    if calls:  # none observed says nothing on a backend that does not observe them
        parts.append(count(calls, kinds.KINDS[kinds.COLLECTIVE].call))
    fallback = sum(r.fallback_calls for r in rr.reports)
    parts.append(count(fallback, kinds.KINDS[FALLBACK].call) if fallback else "no CPU fallbacks")
    unsupported = sum(r.unsupported_calls() for r in rr.ranks)
    if unsupported:
        parts.append(count(unsupported, kinds.KINDS[kinds.UNSUPPORTED].call))
    if rr.failed:
        parts.append(f"{count(len(rr.failed), 'rank')} failed ({', '.join(str(r.rank) for r in rr.failed)})")
    return parts


def ranks_summary_line(rr: Any) -> str:
    return "neuron_lab " + " · ".join([rr.title, *ranks_summary_parts(rr)])


def rank_rows(rr: Any) -> list[list[str]]:
    """One row per rank, as the text table and the HTML table show them."""
    out = []
    for r in rr.ranks:
        rep = r.report
        if rep is None:
            out.append([str(r.rank), "", "", "", "", "", "", r.problem or ""])
            continue
        calls, nbytes, ns = r.collectives()
        coll = f"{count(calls, 'call')}, {format_size(nbytes)}, {format_seconds(ns / 1e9)}" if calls else ""
        out.append([str(r.rank), rep.device, format_seconds(rep.wall_s), format_size(rep.memory.after),
                    format_size(rep.memory.peak), f"{rep.fallback_calls:,}", coll, r.problem or ""])
    return out


RANK_HEADER = ["rank", "device", "time", "memory", "peak", "fallbacks", "collectives", "error"]


def render_ranks_text(rr: Any) -> str:
    """The summary line, every rank's line (its error in one line), then the rows of all ranks, summed over them;
    when profiled, each rank's profile in one line, one rank's op table and the timeline of all ranks."""
    rows = [RANK_HEADER, *rank_rows(rr)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(RANK_HEADER))]
    lines = [ranks_summary_line(rr),
             *("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)]
    merged = rr.merged()
    if merged.ops_not_native:
        lines.append(f"summed over {count(len(rr.reports), 'rank')}:")
        lines += ["  " + line for line in op_sections(merged.sections())]
    shown = ranks_profile(rr)
    if shown is not None:
        lines += ranks_profile_heads(rr) + profiled_lines(shown, head=False)
    return "\n".join(lines)


def ranks_profile_heads(rr: Any) -> list[str]:
    """A profiled ranks window: whose tables follow, then each rank's profile in one line, or why it has none."""
    shown = rr.table_rank
    lines = [f"profiled on {count(len(rr.ranks), 'rank')}: op table and time per line of rank {shown.rank}, the "
             "timeline of all ranks on one clock" if shown else "profiled: no rank gave back a profile"]
    for r in rr.ranks:
        p = r.report.profiled if r.report is not None else None
        lines.append(f"  rank {r.rank}: " + (profiled_head(p) if p is not None else
                                             f"no profile, no lanes ({r.problem or 'none was made'})"))
    return lines


def ranks_profile(rr: Any) -> Profiled | None:
    """What the profile section below the heads shows: the table rank's op table and time per line, with the timeline
    of all ranks and the merged trace (None when the window was not profiled)."""
    if rr.timeline is None:
        return None
    shown = rr.table_rank
    p = shown.report.profiled if shown is not None else Profiled()
    return replace(p, timeline=rr.timeline, trace_path=rr.trace_path)
