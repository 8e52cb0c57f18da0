"""Plain-text rendering of a :class:`Report`: terminals, CI logs, ``print(report)``."""

from __future__ import annotations

from typing import Any

from neuron_lab import kinds
from neuron_lab.kinds import FALLBACK
from neuron_lab.report.model import GraphBreak, OpRow, Recompile, Report
from neuron_lab.units import count, format_delta, format_seconds, format_size

FOLD = 8  # rows shown per list in "table" detail; "full" shows all


def _shape(row: OpRow) -> str:
    if not row.shapes:
        return ""
    return ", ".join(f"{list(s)} {d}" for s, d in zip(row.shapes, row.dtypes))


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
    if r.error:
        parts.append(f"raised {r.error.split(':')[0]}")
    return "neuron_lab " + " · ".join(parts)


def op_lines(title: str, rows: list[OpRow], full: bool = False) -> list[str]:
    """A titled list of ops that did not run natively, each with its reason and call sites (stacks when ``full``)."""
    total = sum(x.count for x in rows)
    host = sum(x.host_ns for x in rows) / 1e9
    lines = [f"{title} ({count(len(rows), 'op')}, {count(total, 'call')}, {format_seconds(host)} on the host):"]
    shown = rows if full else rows[:FOLD]
    for row in shown:
        lines.append(f"  {row.op:<32} {row.count:>7,}×  {format_seconds(row.host_ns / 1e9):>9}  {_shape(row)}")
        lines.append(f"      why: {row.reason}")
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


def compile_event_lines(breaks: list[GraphBreak], recompiles: list[Recompile], failures: list[str],
                        limit: int | None = None) -> list[str]:
    """Graph breaks and recompiles (``limit`` of each at most), where and why, then the compiles that failed."""
    lines = []
    for b in breaks[:limit]:
        where = f"{b.site.label}: {b.site.source}" if b.site else "unknown line"
        lines.append(f"  graph break at {where}\n      why: {b.reason}")
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
    for kind, rows in r.sections():
        lines += op_lines(kind.title, rows, full)
    if r.profile and r.fallbacks:
        lines.append(f"predicted by the coverage profile {r.profile} (`%neuron profile NAME` switches)")
    c = r.compiles
    if c:
        lines.append(f"compile: {count(c.frames, 'frame compile')}, {count(c.graphs, 'graph')}, "
                     f"{format_seconds(c.compile_s)} "
                     f"compiling, {format_seconds(r.run_s)} running")
        lines += compile_event_lines(c.breaks, c.recompiles, c.failures, None if full else FOLD)
    if not r.callsites and r.fallbacks:
        lines.append("call sites are off (`%config NeuronLab.callsites = True` turns them on)")
    lines += [render_check_text(c) if full else f"check: {check_summary_line(c)}" for c in r.checks]
    if r.error:
        lines.append(f"raised: {r.error}")
    return "\n".join(lines)


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
        return f"agree ({n} item{'s' * (n != 1)}" + (f", {a.steps} steps" if a.steps else "") + ")"
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
        return " · ".join(parts)
    if result.eager is None or result.compiled is None:
        return f"compare eager vs compiled ({result.backend}): {verdict(a)}"
    be = result.break_even
    parts = [f"compare eager {format_seconds(result.eager.median_s)} vs compiled "
             f"{format_seconds(result.compiled.median_s)}: {result.speedup:.2f}×",
             f"compile {format_seconds(result.compile_cost_s or 0.0)}",
             "never breaks even" if be is None else f"breaks even after {be:,} runs",
             f"outputs {verdict(a)}"]
    if result.breaks or result.recompiles:
        parts.append(f"{count(len(result.breaks), 'graph break')}, {count(len(result.recompiles), 'recompile')}")
    return " · ".join(parts)


def check_context(result: Any) -> str:
    """What the numbers of a check depend on: the coverage profile, the 64-bit downcast and its op calls."""
    parts = [f"coverage profile {result.profile}" if result.profile else "no coverage profile"]
    if not result.profile:  # the real device: no profile, and it always computes 64-bit ops in 32 bits
        parts.append("float64 computed in float32 by the device")
    elif result.downcast_emulation:
        parts.append("64-bit downcast emulated (NEURON_LAB_EMULATE_DOWNCAST=1: float64 computed in float32)")
    else:
        parts.append("64-bit downcast not emulated (NEURON_LAB_EMULATE_DOWNCAST=1 emulates it)")
    if result.downcasts:
        ops = ", ".join(result.downcast_ops[:4]) + (" …" if len(result.downcast_ops) > 4 else "")
        parts.append(f"{result.downcasts:,} 64-bit op calls ({ops})")
    return " · ".join(parts)


def parity_head(result: Any) -> list[str]:
    """The lines above a parity check's items: verdict, timings, seed, tolerances, context."""
    tol = "dtype defaults (as torch.testing.assert_close)" if result.rtol is None else \
        f"rtol {result.rtol:g}, atol {result.atol:g}"
    seed = "random generators as the cell found them" if result.seed is None else f"seed {result.seed}"
    return [f"neuron_lab {check_summary_line(result)}",
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
        out.append(f"speedup {result.speedup:.2f}× · compile cost {format_seconds(result.compile_cost_s or 0.0)} "
                   f"(dynamo and backend {format_seconds(result.compile_s)}, "
                   f"{count(result.frames, 'frame compile')}, {count(result.graphs, 'graph')}) · " +
                   ("never breaks even" if be is None else f"breaks even after {be:,} runs"))
    out.append(f"backend {result.backend}" + (", fullgraph" if result.fullgraph else "") + " · " +
               check_context(result))
    return out


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


def item_rows(a: Any) -> list[list[str]]:
    """One row of text per compared item, in the agreement's order (``result`` is ``ok`` or ``FAIL``)."""
    return [[i.name, "ok" if i.passed else "FAIL", _num(i.max_abs), _num(i.max_rel),
             "-" if i.worst is None else str(list(i.worst)), _val(i.actual_value), _val(i.expected_value),
             f"{i.rtol:g}/{i.atol:g}", _dtype_shape(i) + (f"  {i.problem}" if i.problem else "")]
            for i in a.items]


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


def _agreement_lines(a: Any) -> list[str]:
    lines = divergence_lines(a)
    if a.items:
        rows = item_rows(a)
        shown = ([r for r in rows if r[1] != "ok"] + [r for r in rows if r[1] == "ok"])[:CHECK_FOLD]  # failures first
        lines += _columns([item_header(a), *shown])
        if len(shown) < len(rows):
            ok = sum(1 for i in a.items if i.passed)
            lines.append(f"  … {len(rows) - len(shown)} more items ({ok} agree)")
    return lines + agreement_notes(a)


def render_check_text(result: Any) -> str:
    """A :class:`~neuron_lab.report.checks.ParityResult` or ``CompareResult`` in full."""
    a = result.agreement
    if result.kind == "parity":
        return "\n".join(parity_head(result) + _agreement_lines(a))
    return "\n".join([f"neuron_lab {check_summary_line(result)}", *_columns(timing_rows(result)),
                      *compare_facts(result),
                      *compile_event_lines(result.breaks, result.recompiles, result.failures),
                      f"numeric agreement, compiled against eager: {verdict(a)}", *_agreement_lines(a)])
