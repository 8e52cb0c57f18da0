"""The real-browser rig itself: JupyterLab in Chromium shows a widget's updates while its cell is still busy.

This is the fact the live dashboard rests on (research note §4.1), checked end to end: an anywidget counter
set from a busy cell's loop changes in the DOM while Lab reports the kernel busy, and the next cell's
output arrives once the loop is done.
"""

from __future__ import annotations

from browser import (
    JS_CELL_RUNNING,
    JS_EXECUTION_STATE,
    cell_output_text,
    open_notebook,
    run_all,
    screenshot,
    wait_for,
    wait_for_output,
    wait_idle,
)

pytest_plugins = ["browser"]

STEPS = 20  # 0.25 s apart: ~5 s of a busy kernel to observe

COUNTER_CELL = f'''\
import time

import anywidget
import traitlets


class Counter(anywidget.AnyWidget):
    _esm = """
    export default {{
      render({{ model, el }}) {{
        const span = document.createElement("span");
        span.className = "rig-counter";
        const show = () => {{ span.textContent = String(model.get("value")); }};
        show();
        model.on("change:value", show);
        el.appendChild(span);
        return () => model.off("change:value", show);
      }}
    }};
    """
    value = traitlets.Int(0).tag(sync=True)


counter = Counter()
display(counter)
for i in range(1, {STEPS} + 1):
    time.sleep(0.25)
    counter.value = i
'''

# The counter's value, the kernel's execution state and whether the counter's cell runs, read in one JS turn
# so that they describe the same instant; truthy only while that cell is busy and the counter is past `above`.
BUSY_VALUE = f"""(above) => {{
    const span = document.querySelector('.jp-Notebook .jp-Cell .rig-counter');
    const value = span ? Number(span.textContent) : NaN;
    const state = ({JS_EXECUTION_STATE})(), running = ({JS_CELL_RUNNING})(0);
    return state === 'busy' && running && value > above ? {{value, state, running}} : null;
}}"""


def test_widget_updates_while_the_cell_is_busy(jupyter_lab, lab_page):
    page = lab_page
    open_notebook(page, jupyter_lab, "rig_counter.ipynb", [COUNTER_CELL, "print('after', counter.value)"])
    run_all(page)

    first = wait_for(page, BUSY_VALUE, timeout=15, arg=0)
    later = wait_for(page, BUSY_VALUE, timeout=10, arg=first["value"])
    assert 0 < first["value"] < later["value"] < STEPS, (first, later)

    wait_idle(page, timeout=20)
    assert wait_for_output(page, 1, f"after {STEPS}", timeout=10).strip() == f"after {STEPS}"
    assert page.locator(".rig-counter").inner_text(timeout=5_000) == str(STEPS)
    assert cell_output_text(page, 1).strip() == f"after {STEPS}"
    shot = screenshot(page, "browser-rig-counter")
    assert shot is not None and shot.stat().st_size > 0
