"""Where a call came from, as every renderer writes it: the innermost library line it reached, then the user's
line that led to it (``modeling_gpt2.py:703 `loss = self.loss_function(` ← In[4] line 3: out = gpt(ids)``)."""

from __future__ import annotations

from html import escape

from neuron_lab.report.kept import ByIdentity
from neuron_lab.report.model import Site

LED_FROM = " ← "  # between a library's line and the user's line that led to it


def called_at(site: Site | None, via: Site | None = None) -> str:
    """The short form in plain text; "unknown line" when neither is known. Made once per line (kept by the sites'
    identity): a loop's cells report the same lines in every report, text and HTML."""
    hit = _TEXTS.texts.get((id(site), id(via)))
    return hit[2] if hit is not None else _TEXTS.keep(site, via, _text(site, via))


def called_at_html(site: Site | None, via: Site | None = None) -> str:
    """The short form in HTML, each line's label and source as code; "?" when neither is known (made once per
    line, as :func:`called_at`)."""
    hit = _HTMLS.texts.get((id(site), id(via)))
    return hit[2] if hit is not None else _HTMLS.keep(site, via, _html(site, via))


_TEXTS, _HTMLS = ByIdentity(), ByIdentity()


def _text(site: Site | None, via: Site | None) -> str:
    parts = [f"{via.short_label} `{via.source}`" if via.source else via.short_label] if via is not None else []
    if site is not None:
        parts.append(f"{site.label}: {site.source}")
    return LED_FROM.join(parts) or "unknown line"


def _html(site: Site | None, via: Site | None) -> str:
    parts = [f"<code>{escape(via.short_label)}</code> <code>{escape(via.source)}</code>"] if via is not None else []
    if site is not None:
        parts.append(f"<code>{escape(site.label)}</code> {escape(site.source)}")
    return escape(LED_FROM).join(parts) or "?"
