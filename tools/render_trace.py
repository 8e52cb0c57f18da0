"""Open an exported Chrome/Perfetto trace in a real trace viewer, offline, and save a screenshot of it.

``--export PATH`` writes a Chrome Trace Event file for ui.perfetto.dev, which cannot be reached from a machine
without internet. speedscope (https://github.com/jlfwong/speedscope, npm ``speedscope``) is a kept, static viewer
that imports the same format and runs from ``file://``: this script opens its ``index.html`` with
``#localProfilePath=``, the way speedscope's own CLI hands it a file, in headless Chromium::

    python tools/render_trace.py TRACE.json OUT.png [--lane neuron:0]

It fails (exit 1) when the viewer reports a parse error, shows no lane named ``LANE`` or shows no events on it.
What it reports comes from the viewer, not from the file: the lanes and the ops on each are read from the model
speedscope itself exports (its Export button, speedscope's JSON format), and the screenshot shows the lane in the
viewer's Time Order view.

One change is made to the trace before the viewer sees it: events whose ``pid`` is not a number are left out.
Kineto writes a few bookkeeping events that way (``"pid": "Spans"``: the profiler's own span, ``"pid": "Traces"``:
iteration markers); speedscope fails on them with "Could not find events for key: undefined"
(jlfwong/speedscope#480, open). They are never ops; the script lists them.

Needs Playwright, Debian's Chromium and speedscope, installed outside git with
``npm install --prefix .venv/speedscope --no-audit --no-fund --ignore-scripts speedscope@1.25.0``
(another place: set ``NEURON_LAB_SPEEDSCOPE`` to the package directory).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEEDSCOPE_VERSION = "1.25.0"
SPEEDSCOPE_INSTALL = (f"npm install --prefix .venv/speedscope --no-audit --no-fund --ignore-scripts "
                      f"speedscope@{SPEEDSCOPE_VERSION}")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
EXPORT_TAB = re.compile(r"^\W*Export$")  # "⤴️Export": an emoji span, then the word
TIMEOUT_MS = 60_000  # every wait: page load, import, export; the import of a 0.5 MB trace took ~0.1 s here

# JS run in the page. speedscope reports an unrecognized file with alert(); record it instead of blocking.
_CATCH_ALERTS = "window.alert = (message) => { window.__viewerAlert = String(message); };"
# Truthy once the import ended: {loaded: true} with the profile view up, or {error: text}.
_IMPORT_DONE = """() => {
    const text = document.body?.innerText ?? '';
    if (window.__viewerAlert) return {error: window.__viewerAlert};
    if (text.includes('Something went wrong')) return {error: 'Something went wrong.'};
    return text.includes('Sandwich') ? {loaded: true} : null; }"""
# The lane in view, from the toolbar: "name (i/n)" (only when there is more than one).
_CURRENT_LANE = """() => { const s = [...document.querySelectorAll('span')]
    .find(s => /\\(\\d+\\/\\d+\\)$/.test(s.textContent)); return s ? s.textContent : null; }"""
_TWO_FRAMES = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(true))))"


class ViewerError(RuntimeError):
    """The viewer could not be run, did not load the trace, or does not show what the trace should show."""


@dataclass
class Rendered:
    """What the viewer showed: its version, its lanes, the lane asked for, and the ops on that lane."""

    viewer: str  # "speedscope@1.25.0", from the viewer's own export
    lanes: list[str]  # speedscope's profile names, e.g. "neuron:0 (pid 0), kernels (tid 0)"
    lane: str  # the one whose name starts with the lane asked for
    ops: Counter[str]  # op name -> events the viewer has on that lane
    dropped: list[str]  # names of the events left out before the viewer saw the trace
    screenshot: Path


def speedscope_dir() -> Path:
    """Where the speedscope npm package is: $NEURON_LAB_SPEEDSCOPE, else .venv/speedscope/node_modules."""
    default = ROOT / ".venv" / "speedscope" / "node_modules" / "speedscope"
    return Path(os.environ.get("NEURON_LAB_SPEEDSCOPE", default))


def missing() -> list[str]:
    """What this script needs and cannot find, each with how to get it; empty when all is there."""
    gaps = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        gaps.append("the playwright package (pip install -e '.[test]')")
    if not os.access(CHROMIUM, os.X_OK):
        gaps.append(f"{CHROMIUM} (apt-get install -y chromium)")
    if not (speedscope_dir() / "dist" / "release" / "index.html").is_file():
        gaps.append(f"speedscope at {speedscope_dir()} ({SPEEDSCOPE_INSTALL})")
    return gaps


def viewer_input(trace: Path) -> tuple[bytes, list[str]]:
    """The trace as the viewer gets it, and the names of the events left out (non-numeric pid, see above)."""
    try:
        data = json.loads(trace.read_text())
        events = data["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ViewerError(f"{trace}: not a Chrome trace ({type(error).__name__}: {error})") from None
    kept = [e for e in events if isinstance(e.get("pid"), int)]
    dropped = [str(e.get("name")) for e in events if not isinstance(e.get("pid"), int)]
    return json.dumps({**data, "traceEvents": kept}).encode(), dropped


def op_name(frame: str) -> str:
    """speedscope names a trace event ``name + " " + JSON(args)``; the op is the part before the args."""
    return frame.split(" {", 1)[0]


def render(trace: Path, out: Path, lane: str = "neuron:0") -> Rendered:
    """Load ``trace`` into speedscope in headless Chromium, check ``lane`` has events, screenshot it to ``out``."""
    gaps = missing()
    if gaps:
        raise ViewerError("cannot run the viewer; missing: " + "; ".join(gaps))
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    payload, dropped = viewer_input(trace)
    index = speedscope_dir() / "dist" / "release" / "index.html"
    with tempfile.TemporaryDirectory(prefix="render_trace-") as tmp:
        # speedscope's file:// entry point: a script calling speedscope.loadFileFromBase64(name, data).
        loader = Path(tmp) / "trace.js"
        loader.write_text(f"speedscope.loadFileFromBase64({json.dumps(trace.name)}, "
                          f"{json.dumps(base64.b64encode(payload).decode())})")
        errors: list[str] = []
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True,
                                                 timeout=TIMEOUT_MS)
            try:
                page = browser.new_page(viewport={"width": 1600, "height": 400})
                page.set_default_timeout(TIMEOUT_MS)
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" or m.text.startswith(
                    "Failed to load format") else None)  # speedscope logs its import errors with console.log
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.add_init_script(_CATCH_ALERTS)
                page.goto(f"{index.as_uri()}#localProfilePath={loader}", wait_until="load")
                done = page.wait_for_function(_IMPORT_DONE, polling=100).json_value()
                if "error" in done:
                    raise ViewerError(f"speedscope did not load {trace}: {done['error']}"
                                      + "".join(f"\n  console: {e}" for e in errors))
                with page.expect_download() as download:
                    page.locator("div", has_text=EXPORT_TAB).last.click()  # the toolbar's Export tab
                model = json.loads(Path(download.value.path()).read_text())
                lanes = [profile["name"] for profile in model["profiles"]]
                wanted = [i for i, name in enumerate(lanes) if name.startswith(f"{lane} ")]
                if not wanted:
                    raise ViewerError(f"speedscope shows no {lane} lane in {trace}; its lanes: {lanes}")
                frames = [frame["name"] for frame in model["shared"]["frames"]]
                ops = Counter(op_name(frames[e["frame"]]) for e in model["profiles"][wanted[0]]["events"]
                              if e["type"] == "O")  # "O": a frame opens, once per trace event
                if not ops:
                    raise ViewerError(f"speedscope shows the {lane} lane of {trace} with no events")
                # With more than one lane the toolbar names the one in view as "name (i/n)", and its "n" key
                # steps to the next; wait for it to name each one.
                for i in range(wanted[0]):
                    page.wait_for_function(f"() => ({_CURRENT_LANE})()?.endsWith('({i + 1}/{len(lanes)})')")
                    page.keyboard.press("n")
                if len(lanes) > 1:
                    page.wait_for_function(f"() => ({_CURRENT_LANE})()?.endsWith('({wanted[0] + 1}/{len(lanes)})')")
                page.mouse.move(0, 399)  # off the Export tab, which stays highlighted under the pointer
                page.evaluate(_TWO_FRAMES)  # the flame chart is drawn on animation frames
                out.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(out))
            except PlaywrightError as error:
                raise ViewerError(f"speedscope did not finish with {trace}: {error}"
                                  + "".join(f"\n  console: {e}" for e in errors)) from None
            finally:
                browser.close()
    return Rendered(viewer=model.get("exporter", "speedscope"), lanes=lanes, lane=lanes[wanted[0]],
                    ops=ops, dropped=dropped, screenshot=out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path, help="a Chrome Trace Event JSON file (neuron_lab's --export writes one)")
    ap.add_argument("out", type=Path, help="where to write the screenshot (PNG)")
    ap.add_argument("--lane", default="neuron:0", help="the process lane that must show events (default neuron:0)")
    args = ap.parse_args(argv)
    try:
        shown = render(args.trace, args.out, args.lane)
    except ViewerError as error:
        print(f"render_trace: {error}", file=sys.stderr)
        return 1
    print(f"{shown.viewer} loaded {args.trace}: {len(shown.lanes)} lanes")
    for name in shown.lanes:
        print(f"  {name}")
    print(f"{shown.lane}: {sum(shown.ops.values())} events: "
          + ", ".join(f"{op} ×{n}" for op, n in shown.ops.most_common()))
    if shown.dropped:
        print(f"left out before loading (non-numeric pid, speedscope#480): {', '.join(shown.dropped)}")
    print(f"screenshot: {shown.screenshot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
