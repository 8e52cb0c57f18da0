"""Where a call came from, as every renderer writes it: the innermost library line it reached, then the user's
line that led to it (``modeling_gpt2.py:703 `loss = self.loss_function(` ← In[4] line 3: out = gpt(ids)``)."""

from __future__ import annotations

import functools
from html import escape

from neuron_lab.report.model import Site

LED_FROM = " ← "  # between a library's line and the user's line that led to it


@functools.lru_cache(maxsize=1024)
def called_at(site: Site | None, via: Site | None = None) -> str:
    """The short form in plain text; "unknown line" when neither is known. Made once per line: a loop's cells
    report the same lines in every report, text and HTML."""
    parts = [f"{via.short_label} `{via.source}`" if via.source else via.short_label] if via is not None else []
    if site is not None:
        parts.append(f"{site.label}: {site.source}")
    return LED_FROM.join(parts) or "unknown line"


@functools.lru_cache(maxsize=1024)
def called_at_html(site: Site | None, via: Site | None = None) -> str:
    """The short form in HTML, each line's label and source as code; "?" when neither is known (made once per
    line, as :func:`called_at`)."""
    parts = [f"<code>{escape(via.short_label)}</code> <code>{escape(via.source)}</code>"] if via is not None else []
    if site is not None:
        parts.append(f"<code>{escape(site.label)}</code> {escape(site.source)}")
    return escape(LED_FROM).join(parts) or "?"
