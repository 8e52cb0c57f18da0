"""A cell report's facts as renderer-neutral rows and sentences, built once from the model.

The text (:mod:`~neuron_lab.report.text`) and the HTML (:mod:`~neuron_lab.report.html`) lay out the same rows, so a
terminal and a notebook show the same facts in the same words; a renderer adds only its layout (columns, tags).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from neuron_lab import kinds
from neuron_lab.kinds import FALLBACK
from neuron_lab.report.kept import ByIdentity
from neuron_lab.report.model import Compiles, OpRow, OutOfMemory, Report
from neuron_lab.report.sites import op_line
from neuron_lab.units import count, format_capacity, format_delta, format_seconds, format_size

FOLD = 8  # rows shown per list in "table" detail; "full" shows all
HOST_RSS_MATERIAL = 256 * 2**20  # the host process's growth a report names unasked ("full" always names it)
INT64_NOTE = ("neuron_lab: int64 tensors (indices, counts) compute as int32 on the device, as TorchNeuron's runtime "
              "does (values past int32 wrap; copies keep them): expected for indices, said once; reports name float64 "
              "downcasts, which can lose precision (`%neuron report --full` lists every downcast)")


@dataclass
class Table:
    """A table as data: a header and rows of text cells, laid out as aligned columns or as an HTML table."""

    header: list[str]
    rows: list[list[str]]


def summary_line(r: Report) -> str:
    """The report in one line: what every view shows first, and all that ``summary`` detail shows."""
    return r.kept("_summary_line", lambda: _summary_line(r))


def _summary_line(r: Report) -> str:
    parts = [r.title, r.device, r.mode, format_seconds(r.wall_s)]
    if r.compiles.compile_s or r.compiles.neff_compile_s:
        neff = f", NEFF {format_seconds(r.compiles.neff_compile_s)}" if r.compiles.neff_compile_s else ""
        parts[-1] += f" (compile {format_seconds(r.compiles.compile_s)}{neff}, run {format_seconds(r.run_s)})"
    parts.append(count(r.ops, "op"))
    fb = off_device(r)
    parts.append(f"{count(sum([x.count for x in fb]), kinds.KINDS[FALLBACK].call)} ({count(len(fb), 'op')})" if fb
                 else "no CPU fallbacks")
    parts += [count(sum([x.count for x in rows]), kind.call) for kind, rows in shown_sections(r)
              if not kind.off_device]
    m = r.memory
    parts.append(f"mem {format_size(m.after)} ({format_delta(m.delta)}, peak {format_size(m.peak)})")
    if r.compiles:
        c = r.compiles
        parts.append(f"{count(c.graphs, 'graph')}, {count(len(c.breaks), 'break')}, "
                     f"{count(len(c.recompiles), 'recompile')}")
    if r.profiled is not None:
        p = r.profiled
        device = f"{p.device_label} {format_seconds(p.device_ns / 1e9)}, " if p.device_timing else ""
        parts.append("profiled: none (taken over)" if p.taken_over else
                     f"profiled: {device}host {format_seconds(p.host_ns / 1e9)}")
    if r.error:
        parts.append(f"raised {r.error.split(':')[0]}")
    return "neuron_lab " + " · ".join(parts)


def off_device(r: Report) -> tuple[OpRow, ...]:
    """The report's CPU fallbacks and host ops (:attr:`Report.fallbacks`), found once for its summary, text and HTML."""
    return r.kept("_off_device", lambda: tuple(r.fallbacks))


def predicted(r: Report) -> bool:
    """Whether the report lists calls its coverage predicts off the device, for certain or possibly: what the
    "predicted by the coverage" line is about, under any coverage."""
    return bool(off_device(r)) or r.possible_calls > 0


def memory_table(r: Report) -> Table:
    """Device memory before, after and at its peak, and the copies, in one row."""
    return r.kept("_memory_table", lambda: _memory_table(r))


def _memory_table(r: Report) -> Table:
    m = r.memory
    return Table(["memory before", "after", "Δ", "peak", "capacity", "host→device", "device→host"],
                 [[format_size(m.before), format_size(m.after), format_delta(m.delta), format_size(m.peak),
                   format_capacity(m.capacity), format_size(r.h2d_bytes), format_size(r.d2h_bytes)]])


def host_growth(r: Report, full: bool = False) -> str | None:
    """The host process's memory change, when it is material (or ``full``): imports, caches and CPU tensors grow
    it too, so a small change is no news and is not shown."""
    rss = r.memory.host_rss_delta
    if not full and rss < HOST_RSS_MATERIAL:
        return None
    return f"host process memory (RSS) {format_delta(rss)}: CPU tensors, caches, imports (device memory is above)"


# -- op rows: the sections of ops that did not run natively (Report.sections) -----------------------------------------
def shape_text(row: OpRow, full: bool = False) -> str:
    """The first call's shapes and dtypes (the first :data:`SHAPES_SHOWN` tensors' unless ``full``: an optimizer's
    ``_foreach`` call has three of every parameter); for a collective, its bytes and group size first."""
    moved = f"{format_size(row.nbytes)} over {row.ranks} ranks  " if row.ranks else ""
    if not row.shapes:
        return moved.rstrip()
    kept = _ALL_SHAPES if full else _SHAPES
    hit = kept.texts.get((id(row.shapes), id(row.dtypes)))  # the text's, for the HTML: no nested tuple hashed
    shapes = hit[2] if hit is not None else kept.keep(row.shapes, row.dtypes,
                                                      _shapes_text(tuple(row.shapes), tuple(row.dtypes), full))
    return moved + shapes


SHAPES_SHOWN = 4  # tensors whose shapes a row lists (``--full`` and the JSON: all of them)
_SHAPES, _ALL_SHAPES = ByIdentity(), ByIdentity()


@functools.lru_cache(maxsize=512)
def _shapes_text(shapes: tuple[tuple[int, ...], ...], dtypes: tuple[str, ...], full: bool) -> str:
    """Shapes and dtypes as text, made once per signature: every cell of a loop reports the same ones, in its text and
    its HTML."""
    shown = len(shapes) if full else SHAPES_SHOWN
    text = ", ".join(f"{list(s)} {d}" for s, d in zip(shapes[:shown], dtypes[:shown]))
    return text + (f", … {count(len(shapes) - shown, 'more tensor')}" if len(shapes) > shown else "")


def expected_downcast(row: OpRow) -> bool:
    """A downcast of int64 only (an index, a count): TorchNeuron computes every int64 tensor as int32 and says so
    once (:data:`INT64_NOTE`); a float64 one can lose precision, so reports name it."""
    return row.kind == kinds.DOWNCAST and "float64" not in row.dtypes


def shown_sections(r: Report, full: bool = False) -> list[tuple[kinds.Kind, list[OpRow]]]:
    """The report's sections as a view shows them: all rows when ``full``, else without expected downcasts."""
    if full:
        return r.sections()
    return list(r.kept("_shown_sections", lambda: _without_expected(r)))


def _without_expected(r: Report) -> tuple[tuple[kinds.Kind, list[OpRow]], ...]:
    out = [(kind, [row for row in rows if row.kind != kinds.DOWNCAST or not expected_downcast(row)])
           for kind, rows in r.sections()]
    return tuple((kind, rows) for kind, rows in out if rows)


def host_timed(rows: list[OpRow]) -> bool:
    """Whether the rows' host time is worth a column: kinds that run nothing on the host (a downcast is a note on a
    device call) would only show "0 µs"."""
    return any([r.host_ns for r in rows])


def reason_numbers(rows: list[OpRow]) -> dict[str, int]:
    """Each distinct reason of ``rows``, numbered from 1 in the order the rows show them: a report explains each
    once and its rows refer to the number."""
    refs: dict[str, int] = {}
    for r in rows:
        if r.reason:  # a collective needs no why
            refs.setdefault(r.reason, len(refs) + 1)
    return refs


def section_refs(sections: list[tuple[kinds.Kind, list[OpRow]]], full: bool, limit: int | None) -> dict[str, int]:
    """The reasons of the rows shown in tables (the first ``limit`` of each section), numbered."""
    return reason_numbers([row for kind, rows in sections if not (kind.one_line and not full) for row in rows[:limit]])


def reasons(refs: dict[str, int]) -> list[tuple[int, str, str]]:
    """The numbered reasons as (number, why, source): a reason's words for a newcomer, then where it comes from."""
    return [(n, *_explained(reason)) for reason, n in refs.items()]


@functools.lru_cache(maxsize=256)
def _explained(reason: str) -> tuple[str, str]:
    """A reason's words and source, split once: every report of a loop gives the same few."""
    row = OpRow("", "", reason)
    return row.why, row.source


def one_line(kind: kinds.Kind, rows: list[OpRow]) -> str:
    """A section that ``kind.one_line`` folds: its calls, the dtypes involved and the busiest ops, in one line."""
    total = sum(r.count for r in rows)
    wide = sorted({d for r in rows for d in r.dtypes if d.endswith("64") and not d.startswith("complex")}
                  if kind.name == kinds.DOWNCAST else ())  # a sync's int64 item is read as it is
    dtypes = "/".join(f"{d}→{d.removesuffix('64')}32" for d in wide)
    busiest = sorted(rows, key=lambda r: (-r.count, r.op))
    if kind.why:  # a sync: its busiest line, with that line's own count when there are more
        ops = "; ".join([op_line(r, sites=1) for r in busiest[:3]])
    else:
        ops = ", ".join([f"{r.op} ×{r.count:,}" for r in busiest[:3]])
    if len(rows) > 3:
        ops += f"{'; ' if kind.why else ', '}… {count(len(rows) - 3, 'more op')}"
    return f"{kind.title}: {total:,}{' ' + dtypes if dtypes else ''} ({ops}) — `%neuron report --full` lists them"


# -- compiles and out of memory ----------------------------------------------------------------------------------------
def compile_counts(c: Compiles) -> str:
    return f"{count(c.frames, 'frame compile')}, {count(c.graphs, 'graph')}"


def compile_timing(r: Report) -> str:
    """Compile and run time; the device compiler's (NEFF compile) apart, and its cache, where the backend gives them."""
    c = r.compiles
    neff = f", {format_seconds(c.neff_compile_s)} NEFF compile" if c.neff_compile_s else ""
    hits, misses = c.neff_cache or (0, 0)
    cache = f" (NEFF cache: {count(hits, 'hit')}, {misses:,} miss{'' if misses == 1 else 'es'})" if c.neff_cache else ""
    what = "the rest of PyTorch's compiler, AOTAutograd" if c.loading_rest else "PyTorch's compiler"
    loading = f" ({format_seconds(c.loading_s)} of it loading {what}, once a session)" if c.loading_s else ""
    return f"{format_seconds(c.compile_s)} compiling{loading}{neff}{cache}, {format_seconds(r.run_s)} running"


def imported_line(c: Compiles) -> str | None:
    """Where a library loaded the compiler in a cell that compiled nothing: the cell's time it took, and whose."""
    if not c.imported_by or not c.loading_s:
        return None
    return (f"time: {format_seconds(c.loading_s)} of it {c.imported_by} importing PyTorch's compiler (once a "
            "session); nothing compiled")


def oom_head(o: OutOfMemory) -> str:
    """What was asked, what was free, what was held: the short answer's first line."""
    asked = f"asked {format_size(o.asked)}, " if o.asked is not None else ""
    free = f"{format_size(o.free)} free; " if o.free is not None else ""
    return f"out of memory: {asked}{free}{format_size(o.allocated)} held when the error unwound, by:"


def handled_oom_lines(r: Report) -> list[str]:
    """Out-of-memory errors the window caught: how many, at which line, what the first asked for and found free."""
    lines = []
    for h in r.ooms_handled:
        where = f" at {h.site.label}" if h.site is not None else " (the device does not say where)"
        sizes = [f"asked {format_size(h.asked)}"] if h.asked is not None else []
        sizes += [f"{format_size(h.free)} free"] if h.free is not None else []
        lines.append(f"{count(h.count, 'out-of-memory error')} handled{where}" + (f": {', '.join(sizes)}"
                                                                                  if sizes else ""))
    return lines


def held_table(o: OutOfMemory) -> Table:
    """What held the device, biggest first: bytes, names, the shape of one storage, storages, who held them."""
    return Table(["bytes", "names", "shape", "storages", "held by"],
                 [[format_size(t.bytes), ", ".join(t.names) or "-",
                   f"{list(t.shape) if t.shape is not None else '?'} {t.dtype or ''}".rstrip(), f"{t.storages:,}",
                   t.held_by] for t in o.tensors])


def oom_freed(o: OutOfMemory) -> list[str]:
    """What was given back after the error, and how to keep it for ``%debug``."""
    return [f"freed after the error: {format_size(o.freed)} the failing frames held "
            "(`%config NeuronLab.oom_traceback = 'full'` keeps them for %debug)"] if o.freed else []
