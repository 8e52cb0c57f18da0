"""The profile's zoomable timeline (issue 19): a real profiled window's lanes (device kernels and copies on
`neuron:0`, the CPU fallback's host work on the host lane), its device memory curve, the cap on spans, the saved
report round trip, the text lines; and in Chromium the SVG the report's HTML draws, zoomed with the wheel, panned,
reset with a double-click, standalone and in a JupyterLab `%%neuron profile` cell, and what an untrusted output
shows instead.

The screenshot (``out/test-artifacts/profile_timeline.png``) is the one in ``docs/``; with
``NEURON_LAB_UPDATE_SCREENSHOTS=1`` it is copied there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict
from html import escape
from pathlib import Path

import nbformat
import pytest
import torch
from browser import ARTIFACTS, ROOT, cell_locator, open_notebook, run_all, wait_for, wait_idle
from conftest import core

import neuron_lab
from neuron_lab.kinds import FALLBACK
from neuron_lab.report.html import render_html
from neuron_lab.report.model import COPY, HOST_LANE, KERNEL, Profiled, Report
from neuron_lab.report.text import timeline_lines
from neuron_lab.report.timeline_html import UNTRUSTED, ticks
from neuron_lab.trace import profile_timeline
from neuron_lab.units import format_size

pytest_plugins = ["browser"]
pytestmark = pytest.mark.skipif(core() != "compiled", reason="the device lanes come from the compiled core's hooks")

DTOH, HTOD = "Memcpy DtoH (neuron -> host)", "Memcpy HtoD (host -> neuron)"
TICKS = "(svg) => [...svg.querySelectorAll('.nlt-tick')].map((t) => t.textContent)"
WIDTH_OF = "(r) => r.getBoundingClientRect().width"


def _operands() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    a, b, c = (torch.randn(32, 32, device="neuron"), torch.randn(32, 32, device="neuron"),
               torch.randn(32, device="neuron"))
    torch.atan2(torch.mm(a, b), torch.addmm(c, a, b)).cpu().to("neuron")  # warm: the first call classifies an op
    return a, b, c


def _window() -> tuple[Report, int, int]:
    """A profiled window of two kernels, a CPU fallback, a 4,000-byte tensor made and freed, and two copies; with
    the bytes allocated before and after it."""
    a, b, c = _operands()
    before = torch.neuron.memory_allocated()
    with neuron_lab.profile() as report:
        y = torch.addmm(c, a, b)
        z = torch.mm(a, b)
        w = torch.atan2(y, z)  # a CPU fallback in the coverage profile
        t = torch.empty(1000, device="neuron")
        del t
        back = w.cpu().to("neuron")
    assert back.shape == (32, 32)
    return report, before, torch.neuron.memory_allocated()


def test_lanes_hold_the_windows_kernels_copies_and_fallback_in_order() -> None:
    report, _, _ = _window()
    tl = report.profiled.timeline
    assert [(x.name, [(s.name, s.kind) for s in x.spans]) for x in tl.lanes] == [
        ("neuron:0", [("aten::addmm", KERNEL), ("aten::mm", KERNEL), (DTOH, COPY), (HTOD, COPY)]),
        (HOST_LANE, [("aten::atan2", FALLBACK)]),
    ]
    assert (tl.events, tl.merged, tl.dropped) == (5, 0, 0)
    spans = [s for x in tl.lanes for s in x.spans]
    assert all(0 <= s.start_ns and s.start_ns + s.dur_ns <= tl.duration_ns and s.events == 1 for s in spans)
    assert all(s.busy_ns == s.dur_ns >= 0 for s in spans)
    # the fallback's host work runs after the kernels that made its operands, the copies after it
    (fallback,) = tl.lanes[1].spans
    device = tl.lanes[0].spans
    assert device[1].start_ns + device[1].dur_ns <= fallback.start_ns <= device[2].start_ns
    # the device lane's spans are what the lane's busy time sums
    assert sum(s.dur_ns for s in device) == report.profiled.lanes["neuron:0"]


def test_the_memory_curve_rises_by_a_tensors_bytes_and_falls_when_it_is_freed() -> None:
    report, before, after = _window()
    (curve,) = report.profiled.timeline.memory
    assert curve.device == "neuron:0"
    values = [b for _, b in curve.points]
    assert values[0] == before and values[-1] == after
    steps = [b - a for a, b in zip(values, values[1:])]
    # addmm, mm and atan2 each make a 32x32 float32 result, then the 1,000-float tensor comes and goes, then the copy
    assert steps == [4096, 4096, 4096, 4000, -4000, 4096]
    times = [t for t, _ in curve.points]
    assert times == sorted(times) and times[-1] <= report.profiled.timeline.duration_ns


def test_a_long_memory_curve_is_thinned_keeping_its_ends_and_its_peak(monkeypatch) -> None:
    before = torch.neuron.memory_allocated()
    monkeypatch.setattr(profile_timeline, "MAX_POINTS", 20)
    with neuron_lab.profile() as report:
        for i in range(100):
            t = torch.empty(1000 + (i == 37) * 1000, device="neuron")  # the 38th is twice the size: the peak
            del t
    (curve,) = report.profiled.timeline.memory
    assert len(curve.points) <= 21
    assert curve.points[0] == (0, before) and curve.points[-1][1] == before
    assert curve.peak == before + 8000


def test_the_timeline_round_trips_through_a_saved_report() -> None:
    report, _, _ = _window()
    saved = json.loads(json.dumps(report.as_dict()))
    assert Report.from_dict(saved).profiled == report.profiled
    old = asdict(report.profiled)
    del old["timeline"]  # a report saved before the timeline existed reads back with an empty one
    assert Profiled.from_dict(old).timeline.lanes == []


def test_past_the_cap_short_neighbours_merge_and_every_event_is_accounted_for(monkeypatch) -> None:
    x = torch.zeros(64, device="neuron")
    y = torch.ones(64, device="neuron")
    x.add_(1)
    torch.atan2(x, y)
    monkeypatch.setattr(profile_timeline, "MAX_SPANS", 40)
    with neuron_lab.profile() as report:
        for i in range(300):
            x.add_(1)
            if i % 100 == 0:
                torch.atan2(x, y)
    tl = report.profiled.timeline
    spans = [s for lane in tl.lanes for s in lane.spans]
    assert (tl.events, tl.dropped) == (303, 0)
    assert len(spans) <= 40 and tl.merged == 303 - len(spans)
    assert sum(s.events for s in spans) == 303
    # the three fallbacks keep spans of their own between the runs of kernels; the busy time is kept whole
    assert [(s.name, s.events) for s in tl.lanes[1].spans] == [("aten::atan2", 1)] * 3
    assert sum(s.busy_ns for s in tl.lanes[0].spans) == report.profiled.lanes["neuron:0"]
    assert timeline_lines(tl)[0].endswith(f", 303 events ({tl.merged:,} merged into neighbouring spans)")


def test_when_kinds_alternate_too_often_to_merge_the_shortest_spans_go(monkeypatch) -> None:
    x = torch.zeros(64, device="neuron")
    x.add_(1).cpu()
    monkeypatch.setattr(profile_timeline, "MAX_SPANS", 10)
    with neuron_lab.profile() as report:
        for _ in range(50):
            x.add_(1).cpu()  # a kernel, then a copy: no two neighbours of one kind
    tl = report.profiled.timeline
    (lane,) = tl.lanes
    assert (tl.events, tl.merged, tl.dropped, len(lane.spans)) == (100, 0, 90, 10)
    assert timeline_lines(tl)[0].endswith(", 100 events (90 of the shortest left out)")
    assert [s.start_ns for s in lane.spans] == sorted(s.start_ns for s in lane.spans)


def test_the_text_report_has_a_line_per_lane_and_per_memory_curve() -> None:
    report, before, after = _window()
    tl = report.profiled.timeline
    lines = timeline_lines(tl)
    assert re.fullmatch(r"timeline: [\d.]+ [µm]?s, 2 lanes, 5 events", lines[0]), lines[0]
    assert re.fullmatch(r"  neuron:0: 4 events, busy [\d.]+ [µm]?s", lines[1]), lines[1]
    assert re.fullmatch(r"  host: 1 event, busy [\d.]+ [µm]?s", lines[2]), lines[2]
    assert lines[3] == (f"  neuron:0 memory: {format_size(before)} at the start, peak {format_size(after)}, "
                        f"{format_size(after)} at the end")
    assert lines == str(report).splitlines()[-4:]


def test_the_html_draws_every_span_with_its_tooltip_and_unique_ids() -> None:
    report, _, _ = _window()
    one, two = render_html(report), render_html(report)
    assert one.count("<rect class='nlt-span'") == 5
    assert "<title>aten::atan2 (CPU fallback): " in one and "<title>aten::addmm (native kernel): " in one
    assert f"<title>{escape(DTOH)} (copy): " in one
    ids = [set(re.findall(r"id='(nlt-[0-9a-f]+)'", html)) for html in (one, two)]
    assert len(ids[0]) == 1 and ids[0].isdisjoint(ids[1])


def test_axis_labels_use_the_unit_of_the_range_and_the_decimals_of_the_step() -> None:
    assert [label for _, label in ticks(0, 23.2e6)] == ["0 ms", "5 ms", "10 ms", "15 ms", "20 ms"]
    assert [label for _, label in ticks(7e6, 9.1e6)] == ["7.0 ms", "7.5 ms", "8.0 ms", "8.5 ms", "9.0 ms"]
    assert [label for _, label in ticks(1234, 5678)] == ["2 µs", "3 µs", "4 µs", "5 µs"]
    assert [label for _, label in ticks(0, 2.5e9)][:3] == ["0.0 s", "0.5 s", "1.0 s"]


# -- in Chromium ----------------------------------------------------------------------------------------------------
TRAINING = """
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256)).to("neuron")
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(64, 256, device="neuron")
"""
STEPS = """
for _ in range(3):
    opt.zero_grad()
    loss = torch.atan2(model(x), x).pow(2).mean()
    loss.backward()
    opt.step()
big = torch.empty(1 << 20, device="neuron")
del big
loss.item()
"""


def _zoom_pan_reset(page, svg) -> None:
    """Wheel-zoom at a kernel: the axis and the kernel's width change; drag pans; a double-click resets."""
    assert page.locator(".nlt-untrusted").count() == 0  # the script ran: no note that the output is untrusted
    lanes = svg.locator("g.nlt-lane").evaluate_all("(gs) => gs.map((g) => g.dataset.lane)")
    assert lanes == ["neuron:0", HOST_LANE]
    assert svg.locator("g.nlt-memory-lane").get_attribute("data-lane") == "neuron:0 memory"
    longest = svg.locator("rect.nlt-span[data-kind=kernel]").evaluate_all(
        "(rs) => rs.map((r) => +r.dataset.d).reduce((best, d, i, ds) => d > ds[best] ? i : best, 0)")
    kernel = svg.locator("rect.nlt-span[data-kind=kernel]").nth(longest)
    first_ticks, first_width = svg.evaluate(TICKS), kernel.evaluate(WIDTH_OF)
    assert first_ticks[0].startswith("0 ") and len(first_ticks) >= 4
    box = kernel.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.wheel(0, -600)
    zoomed = wait_for(page, "([svg, before]) => { const t = (" + TICKS + ")(svg);"
                      " return JSON.stringify(t) !== JSON.stringify(before) ? t : null; }", 10,
                      arg=[svg.element_handle(), first_ticks])
    assert kernel.evaluate(WIDTH_OF) > 2 * first_width
    assert zoomed[0] != "0 ms"
    # drag towards the side with more of the window beyond the view (the zoom kept the kernel under the pointer)
    plot = svg.bounding_box()
    dx = 200 if box["x"] + box["width"] / 2 > plot["x"] + plot["width"] / 2 else -200
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] / 2 + dx, box["y"] + box["height"] / 2, steps=5)
    page.mouse.up()
    wait_for(page, "([svg, before]) => JSON.stringify((" + TICKS + ")(svg)) !== JSON.stringify(before)", 10,
             arg=[svg.element_handle(), zoomed])
    page.mouse.dblclick(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    wait_for(page, "([svg, before]) => JSON.stringify((" + TICKS + ")(svg)) === JSON.stringify(before)", 10,
             arg=[svg.element_handle(), first_ticks])
    assert kernel.evaluate(WIDTH_OF) == pytest.approx(first_width, abs=0.01)


@pytest.mark.slow
def test_the_timeline_zooms_pans_and_resets_in_chromium(chromium, tmp_path: Path) -> None:
    ns: dict = {"torch": torch}
    exec(TRAINING, ns)
    exec(STEPS, ns)  # warm
    with neuron_lab.profile() as report:
        exec(STEPS, ns)
    path = tmp_path / "report.html"
    path.write_text(f"<!doctype html><meta charset='utf-8'><body style='font-family:sans-serif'>"
                    f"{render_html(report)}</body>")
    page = chromium.new_page(viewport={"width": 1000, "height": 800})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(path.as_uri(), timeout=30_000)
        svg = page.locator("svg.nlt-svg")
        spans = sum(len(x.spans) for x in report.profiled.timeline.lanes)
        assert svg.locator("rect.nlt-span").count() == spans
        assert svg.locator("rect.nlt-span[data-kind=fallback]").count() == 3
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.locator(".neuron-lab-timeline").screenshot(path=str(ARTIFACTS / "profile_timeline.png"), timeout=15_000)
        _zoom_pan_reset(page, svg)
        assert errors == []
    finally:
        page.close()
    if os.environ.get("NEURON_LAB_UPDATE_SCREENSHOTS") == "1":
        shutil.copy(ARTIFACTS / "profile_timeline.png", ROOT / "docs" / "profile_timeline.png")


@pytest.mark.slow
def test_a_profile_cell_in_jupyterlab_shows_a_zoomable_timeline(jupyter_lab, lab_page) -> None:
    page = lab_page
    open_notebook(page, jupyter_lab, "profile_timeline.ipynb",
                  ["%load_ext neuron_lab", "import torch\n" + TRAINING.strip() + STEPS,
                   "%%neuron profile\n" + STEPS.strip()])
    run_all(page)
    wait_idle(page, timeout=120)
    svg = cell_locator(page, 2).locator("svg.nlt-svg")
    svg.wait_for(state="visible", timeout=30_000)
    assert svg.locator("rect.nlt-span[data-kind=fallback]").count() == 3
    svg.scroll_into_view_if_needed()
    _zoom_pan_reset(page, svg)


@pytest.mark.slow
def test_an_untrusted_output_says_why_no_timeline_is_drawn_and_shows_no_stray_text(jupyter_lab, lab_page) -> None:
    """JupyterLab sanitizes an untrusted output (a notebook opened from disk): the SVG goes, and its labels and
    tooltips must not spill out as text."""
    report, _, _ = _window()
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    cell = nbformat.v4.new_code_cell("%%neuron profile\n...")
    cell.outputs = [nbformat.v4.new_output("display_data", data={"text/html": render_html(report),
                                                                 "text/plain": str(report)})]
    nb.cells = [cell]
    nbformat.write(nb, jupyter_lab.root_dir / "untrusted_timeline.ipynb")
    page = lab_page
    page.goto(jupyter_lab.notebook_url("untrusted_timeline.ipynb"), wait_until="domcontentloaded")
    timeline = page.locator(".jp-OutputArea-output .neuron-lab-timeline")
    timeline.wait_for(state="attached", timeout=60_000)
    assert timeline.locator("svg").count() == 0
    note = timeline.locator(".nlt-untrusted")
    assert note.inner_text() == UNTRUSTED and note.is_visible()
    box = timeline.locator(".nlt-box")
    assert "aten::addmm (native kernel)" in box.text_content()  # the sanitizer kept the SVG's text ...
    assert box.evaluate("(b) => b.getBoundingClientRect().height") == 0  # ... where it takes no room


def test_thinning_keeps_the_starting_value_even_when_it_is_neither_the_lowest_nor_the_highest() -> None:
    points = [(0, 1000)] + [(t, 0 if t % 2 else 2000) for t in range(1, 5000)] + [(5000, 1000)]
    thinned = profile_timeline._thin(points, 2000)
    assert thinned[0] == (0, 1000) and thinned[-1] == (5000, 1000) and len(thinned) <= 2000
    assert {v for _, v in thinned[1:-1]} == {0, 2000}
