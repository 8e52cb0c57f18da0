"""A profiled window's timeline: spans per lane and the device memory curves, bounded so any renderer can draw it.

:mod:`neuron_lab.trace.profile` hands over the profiled events already sorted into lanes; this module puts them
relative to the window's start and caps them. Past :data:`MAX_SPANS`, the neighbours of one kind with the
smallest gaps between them merge first (a run of back-to-back kernels becomes one busy stretch, which is what a
zoomed-out view shows anyway); only if kinds alternate too often for that do the shortest spans go.

Several ranks' windows of one cell become one timeline (:func:`merge_ranks`): one set of lanes per rank on the
wall clock they share, drawn by the same renderers as one rank's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from neuron_lab.report.model import HOST_LANE, Lane, MemoryCurve, ProfiledTimeline, Span

MAX_SPANS = 5000  # over all lanes: the zoom re-places that many rects in ~80 ms a frame (headless Chromium, 2 cores)
MAX_POINTS = 2000  # per memory curve


def _lane_order(name: str) -> tuple[bool, str, int]:
    """Device lanes by type and index ("neuron:2" before "neuron:10"), the host lane last."""
    kind, _, index = name.rpartition(":")
    return name == HOST_LANE, kind, int(index) if index.isdigit() else -1


def _merge(spans: list[Span], gap: int) -> list[Span]:
    """Neighbours of one kind at most ``gap`` ns apart, as one span (``spans`` in start order)."""
    out: list[Span] = []
    for s in spans:
        last = out[-1] if out else None
        if last is not None and last.kind == s.kind and s.start_ns - (last.start_ns + last.dur_ns) <= gap:
            end = max(last.start_ns + last.dur_ns, s.start_ns + s.dur_ns)
            last.dur_ns = end - last.start_ns
            last.events += s.events
            last.busy_ns += s.busy_ns
        else:
            out.append(Span(s.start_ns, s.dur_ns, s.name, s.kind, s.events, s.busy_ns))
    return out


def _cap(lanes: list[Lane], cap: int) -> tuple[int, int]:
    """Merge, then drop, spans until all lanes hold at most ``cap``; (events merged, events dropped)."""
    total = sum(len(x.spans) for x in lanes)
    if total <= cap:
        return 0, 0
    gaps = sorted(b.start_ns - (a.start_ns + a.dur_ns) for x in lanes
                  for a, b in zip(x.spans, x.spans[1:]) if a.kind == b.kind)
    if gaps:
        gap = gaps[min(total - cap, len(gaps)) - 1]
        for x in lanes:
            x.spans = _merge(x.spans, gap)
    merged = total - sum(len(x.spans) for x in lanes)
    over = total - merged - cap
    dropped = 0
    if over > 0:
        shortest = sorted(((s.dur_ns, i, j) for i, x in enumerate(lanes) for j, s in enumerate(x.spans)))[:over]
        gone = {(i, j) for _, i, j in shortest}
        dropped = sum(lanes[i].spans[j].events for i, j in gone)
        for i, x in enumerate(lanes):
            x.spans = [s for j, s in enumerate(x.spans) if (i, j) not in gone]
    return merged, dropped


def _thin(points: list[tuple[int, int]], limit: int) -> list[tuple[int, int]]:
    """At most ``limit`` points: the first and the last, and the lowest and the highest of each run of points
    between, so the start, the end and the peaks survive."""
    if len(points) <= limit:
        return points
    inner = points[1:-1]
    size = -(-len(inner) // max((limit - 2) // 2, 1))
    out: list[tuple[int, int]] = [points[0]]
    for k in range(0, len(inner), size):
        run = inner[k:k + size]
        lo, hi = min(run, key=lambda p: p[1]), max(run, key=lambda p: p[1])
        out += sorted({lo, hi})
    return out + [points[-1]]


def build(start_ns: int, lanes: dict[str, list[tuple[int, int, str, str]]],
          allocations: dict[str, Iterable[tuple[int, int]]], baselines: dict[str, int],
          max_spans: int | None = None) -> ProfiledTimeline:
    """The timeline of a window that began at ``start_ns`` (the profiler's clock).

    ``lanes``: lane name -> (start ns, end ns, name, kind) of its events; ``allocations``: device -> (ns, bytes
    allocated (+) or freed (-)); ``baselines``: device -> bytes allocated when the window began; ``max_spans``:
    the cap, :data:`MAX_SPANS` unless given.
    """
    out = ProfiledTimeline(start_ns=start_ns)
    end = start_ns
    for name in sorted(lanes, key=_lane_order):
        spans = [Span(s - start_ns, e - s, n, k, 1, e - s) for s, e, n, k in sorted(lanes[name])]
        out.lanes.append(Lane(name, spans))
        out.events += len(spans)
        end = max([end, *(e for _, e, _, _ in lanes[name])])
    for device in sorted(allocations, key=_lane_order):
        now = baselines.get(device, 0)
        points = [(0, now)]
        for t, delta in sorted(allocations[device]):
            now += delta
            points.append((t - start_ns, now))
            end = max(end, t)
        out.memory.append(MemoryCurve(device, _thin(points, MAX_POINTS)))
    out.duration_ns = end - start_ns
    out.merged, out.dropped = _cap(out.lanes, MAX_SPANS if max_spans is None else max_spans)
    return out


def merge_ranks(timelines: dict[int, ProfiledTimeline], max_spans: int | None = None) -> ProfiledTimeline:
    """One timeline of several ranks' windows: rank R's lanes and memory curves named "rank R neuron:R", "rank R
    host", in rank order, each rank's times moved by its window's start from the earliest one's (``start_ns``: the
    profiler's wall clock, which every process on the machine reads), so the ranks' spans of one collective line
    up; then capped as :func:`build` caps one window (``max_spans``, :data:`MAX_SPANS` unless given)."""
    start = min((t.start_ns for t in timelines.values()), default=0)
    out = ProfiledTimeline(start_ns=start)
    for rank in sorted(timelines):
        t = timelines[rank]
        shift = t.start_ns - start
        out.lanes += [Lane(f"rank {rank} {x.name}", [replace(s, start_ns=s.start_ns + shift) for s in x.spans])
                      for x in t.lanes]
        out.memory += [MemoryCurve(f"rank {rank} {m.device}", [(ns + shift, b) for ns, b in m.points])
                       for m in t.memory]
        out.events += t.events
        out.merged += t.merged
        out.dropped += t.dropped
        out.duration_ns = max(out.duration_ns, shift + t.duration_ns)
    merged, dropped = _cap(out.lanes, MAX_SPANS if max_spans is None else max_spans)
    out.merged += merged
    out.dropped += dropped
    return out
