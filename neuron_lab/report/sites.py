"""Where a call came from, as every renderer writes it: the innermost library line it reached, then the user's
line that led to it (``modeling_gpt2.py:703 `loss = self.loss_function(` ← In[4] line 3: out = gpt(ids)``)."""

from __future__ import annotations

from html import escape

from neuron_lab.report.model import Site

LED_FROM = " ← "  # between a library's line and the user's line that led to it


KEPT = 1024  # lines kept per form; past it, the forms are made afresh


def called_at(site: Site | None, via: Site | None = None) -> str:
    """The short form in plain text; "unknown line" when neither is known. Made once per line: a loop's cells
    report the same lines in every report, text and HTML."""
    hit = _TEXTS.get((id(site), id(via)))
    return hit[2] if hit is not None else _keep(_TEXTS, site, via, _text(site, via))


def called_at_html(site: Site | None, via: Site | None = None) -> str:
    """The short form in HTML, each line's label and source as code; "?" when neither is known (made once per
    line, as :func:`called_at`)."""
    hit = _HTMLS.get((id(site), id(via)))
    return hit[2] if hit is not None else _keep(_HTMLS, site, via, _html(site, via))


# (id of the site, id of the via): (the site, the via, the form). Keyed by identity, not by a site's value, whose
# dataclass hash is a Python call per look-up; an entry holds its sites, so their ids are not reused while it is kept.
_TEXTS: dict[tuple[int, int], tuple[Site | None, Site | None, str]] = {}
_HTMLS: dict[tuple[int, int], tuple[Site | None, Site | None, str]] = {}


def _keep(forms: dict, site: Site | None, via: Site | None, text: str) -> str:
    if len(forms) >= KEPT:
        forms.clear()
    forms[(id(site), id(via))] = (site, via, text)
    return text


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
