"""Where a call came from, as every renderer writes it: the innermost library line it reached, then the user's
line that led to it (``modeling_gpt2.py:703 `loss = self.loss_function(` ← In[4] line 3: out = gpt(ids)``)."""

from __future__ import annotations

from html import escape

from neuron_lab.kinds import HOST
from neuron_lab.report.kept import ByIdentity
from neuron_lab.report.model import OpRow, Site
from neuron_lab.units import count

LED_FROM = " ← "  # between a library's line and the user's line that led to it
SITES_SHOWN = 3  # call sites an op_line lists; the report's tables and its JSON have all


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


def op_line(row: OpRow, sites: int = SITES_SHOWN) -> str:
    """``aten::atan2.out ×5 at In[3] line 7 (3×), In[4] line 2 (2×)``: one op with its first call sites (each with its
    own count when there are several: the op's count is not one line's), how many more, and calls without a line."""
    where = [f"{sc.site.label} ({sc.count:,}×)" if len(row.sites) > 1 else sc.site.label for sc in row.sites[:sites]]
    if len(row.sites) > sites:
        where.append(count(len(row.sites) - sites, "more site"))
    if row.unattributed:
        where.append(f"{row.unattributed:,}× without a user line")
    host = " (host op)" if row.kind == HOST else ""
    return f"{row.op}{host} ×{row.count:,}" + (f" at {', '.join(where)}" if where else "")
